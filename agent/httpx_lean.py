"""``httpx`` without its command-line tool, for the agent and the ``gpuroster`` commands.

``httpx/__init__.py`` runs ``from ._main import main`` (httpx's own command-line client)
and falls back to a stub ``main`` on ``ImportError``. ``httpx._main`` imports click, rich
and pygments, so wherever those are installed (typer installs rich and click) importing
httpx costs about 5 MiB of RSS and 20 ms of start for a tool that neither the agent nor
the CLI ever runs. A ``None`` entry in :data:`sys.modules` makes that import raise
``ImportError``, so httpx takes its own fallback. Import httpx from here::

    from agent.httpx_lean import httpx

:func:`tls_verify` is the ``verify`` both pass to their clients.

It lives in ``agent`` because the agent may not import ``app`` while ``app`` may import
``agent`` (tests/test_structure.py), so both use this one copy.
"""

from __future__ import annotations

import ssl
import sys
from urllib.request import getproxies

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

import httpx  # noqa: E402

__all__ = ["httpx", "tls_verify"]


def tls_verify(server: str) -> ssl.SSLContext | bool:
    """What to pass as ``verify`` to an ``httpx.Client`` of ``server`` (a base URL).

    ``True`` (httpx's default: a context loaded with certifi's CA bundle) whenever TLS can be
    spoken: an ``https://`` server, or any HTTP proxy named by the environment (httpx uses
    ``HTTP_PROXY``, ``HTTPS_PROXY`` and ``ALL_PROXY`` through ``urllib.request.getproxies``,
    and a proxy may be ``https://``). Otherwise every connection is plain HTTP (redirects are
    not followed) and the context is never used; loading the bundle into it would still cost
    about 1 MiB of RSS for the agent's whole life and about 40 ms of each
    ``gpuroster`` command's start (a client of an ``http://`` server: 0.5 MiB
    with this context, 1.5 MiB with the bundle), so it gets a verifying context with no CA at
    all: a TLS handshake it were ever asked for would fail verification, never go unchecked.
    """
    proxies = getproxies()
    if server.startswith("https://") or any(proxies.get(k) for k in ("http", "https", "all")):
        return True
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname by default

