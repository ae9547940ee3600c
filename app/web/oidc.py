"""Single sign-on pages: ``/login/oidc`` (to the provider) and ``/login/oidc/callback`` (back).

Between the two the browser keeps the request's ``state``, ``nonce``, PKCE verifier and the
page to return to in a cookie limited to ``/login/oidc``, HttpOnly, SameSite=Lax (the
provider's redirect back is a top-level GET, which Lax lets through), signed with HMAC-SHA-256
under ``settings.secret_key`` and valid for ``FLOW_SECONDS``. The callback refuses a
``state`` that does not match that cookie (CSRF on the callback, RFC 6749 §10.12).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import RedirectResponse, Response

from app.api.deps import SettingsDep, WriteSessionDep
from app.errors import AppError
from app.models import utcnow
from app.security import constant_time_equal
from app.services import oidc as oidc_service
from app.services.directory import provision
from app.web import sessions as web_sessions
from app.web.auth import _login_form, is_https, safe_next
from app.web.routing import page_router

router = page_router()

FLOW_COOKIE = "gpuroster_oidc"
FLOW_SECONDS = 600


def callback_url(settings) -> str:
    """The redirect URI registered at the provider: ``<base_url>/login/oidc/callback``."""
    return settings.base_url.rstrip("/") + "/login/oidc/callback"


def _sign(settings, payload: dict) -> str:
    body = base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode()
    mac = hmac.new(settings.secret_key.encode(), body.encode(), hashlib.sha256).hexdigest()
    return f"{body}.{mac}"


def _unsign(settings, value: str | None) -> dict | None:
    if not value or "." not in value or len(value) > 4096:
        return None
    body, mac = value.rsplit(".", 1)
    expected = hmac.new(settings.secret_key.encode(), body.encode(), hashlib.sha256).hexdigest()
    if not constant_time_equal(expected, mac):
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(body.encode()))
    except ValueError:
        return None
    return data if isinstance(data, dict) and time.time() - float(data.get("t", 0)) < FLOW_SECONDS else None


@router.get("/login/oidc")
def oidc_start(
    request: Request, settings: SettingsDep,
    next_url: Annotated[str | None, Query(alias="next", max_length=2048)] = None,
) -> Response:
    """Send the browser to the provider's login page (404 when single sign-on is not configured)."""
    target = safe_next(next_url)
    if not oidc_service.enabled(settings):
        return _login_form(request, settings, next_url=target, status=404, error_title="Not configured",
                           error="single sign-on is not configured on this server")
    try:
        started = oidc_service.begin(settings, redirect_uri=callback_url(settings))
    except AppError as e:
        return _login_form(request, settings, next_url=target, status=e.status, error_title=e.title, error=e.detail)
    resp = RedirectResponse(started.url, status_code=303)
    flow = {"s": started.state, "n": started.nonce, "v": started.code_verifier, "next": target, "t": time.time()}
    resp.set_cookie(FLOW_COOKIE, _sign(settings, flow), max_age=FLOW_SECONDS, path="/login/oidc", httponly=True,
                    samesite="lax", secure=is_https(request))
    return resp


@router.get("/login/oidc/callback")
def oidc_callback(
    request: Request, session: WriteSessionDep, settings: SettingsDep,
    code: Annotated[str | None, Query(max_length=2048)] = None,
    state: Annotated[str | None, Query(max_length=512)] = None,
    error: Annotated[str | None, Query(max_length=256)] = None,
    error_description: Annotated[str | None, Query(max_length=1024)] = None,
) -> Response:
    """Finish single sign-on: verify state and tokens, provision the account, open a session."""
    flow = _unsign(settings, request.cookies.get(FLOW_COOKIE))
    target = safe_next(flow.get("next")) if flow else "/"

    def refuse(status: int, title: str, detail: str) -> Response:
        resp = _login_form(request, settings, next_url=target, status=status, error_title=title, error=detail)
        resp.delete_cookie(FLOW_COOKIE, path="/login/oidc")
        return resp

    if error:
        return refuse(401, "Single sign-on failed", f"the provider answered {error}: {error_description or 'no reason given'}")
    if flow is None or not state or not code or not constant_time_equal(str(flow.get("s", "")), state):
        return refuse(403, "Form refused", "the sign-in came back without its matching state (expired or from "
                                           "another browser); start again")
    try:
        account = oidc_service.finish(settings, code=code, redirect_uri=callback_url(settings), nonce=str(flow["n"]),
                                      code_verifier=str(flow["v"]))
        user = provision(session, account=account, group_map=settings.oidc_groups, admin_group=settings.oidc_admin_group,
                         manager_map=settings.oidc_manager_groups)
    except AppError as e:
        session.rollback()
        return refuse(e.status, e.title, e.detail)
    if not user.active:
        session.rollback()
        return refuse(401, "Single sign-on failed", "this account is deactivated")
    opened = web_sessions.open_session(session, user=user, settings=settings, now=utcnow())
    resp = RedirectResponse(target, status_code=303)
    resp.set_cookie(web_sessions.SESSION_COOKIE, opened.cookie_value, max_age=settings.session_hours * 3600, path="/",
                    httponly=True, samesite="lax", secure=is_https(request))
    resp.delete_cookie(FLOW_COOKIE, path="/login/oidc")
    return resp
