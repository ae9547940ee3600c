"""``httpx`` without its command-line tool, for the agent and the ``gpuroster`` commands.

``httpx/__init__.py`` runs ``from ._main import main`` (httpx's own command-line client)
and falls back to a stub ``main`` on ``ImportError``. ``httpx._main`` imports click, rich
and pygments, so wherever those are installed (typer installs rich and click) importing
httpx costs about 5 MiB of RSS and 20 ms of start for a tool that neither the agent nor
the CLI ever runs. A ``None`` entry in :data:`sys.modules` makes that import raise
``ImportError``, so httpx takes its own fallback. Import httpx from here::

    from agent.httpx_lean import httpx

It lives in ``agent`` because the agent may not import ``app`` while ``app`` may import
``agent`` (tests/test_structure.py), so both use this one copy.
"""

from __future__ import annotations

import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

import httpx  # noqa: E402

__all__ = ["httpx"]
