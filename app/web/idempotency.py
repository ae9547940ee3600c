"""The ``Idempotency-Key`` dependency for pages' creating forms.

Each render of a booking form carries a fresh key in the hidden ``idempotency_key`` field
(:func:`new_form_key`), so a double click, or a resubmission after a lost response, books
once: the second post gets the first one's redirect (see :mod:`app.api.idempotency`).
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request

from app.api.deps import WriteSessionDep
from app.api.idempotency import Idempotency, RequestKeyDep, guard
from app.web.deps import FormViewer


def new_form_key() -> str:
    """A fresh key for one render of a form (32 URL-safe characters, 192 bits)."""
    return secrets.token_urlsafe(24)


def form_idempotency(request: Request, viewer: FormViewer, session: WriteSessionDep, found: RequestKeyDep) -> Idempotency:
    """The dependency for form posts (the viewer's CSRF token already checked)."""
    return guard(request, session, viewer.user, found)


FormIdempotencyDep = Annotated[Idempotency, Depends(form_idempotency)]
