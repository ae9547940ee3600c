"""OpenID Connect sign-in with authlib: authorization code with PKCE (S256), discovery.

:func:`begin` builds the provider's authorization URL with a fresh ``state``, ``nonce`` and
PKCE ``code_verifier`` (all random, kept by the caller in a signed cookie, see
``app/web/oidc.py``). :func:`finish` exchanges the code (sending the verifier), verifies the
ID token's signature (joserfc) against the provider's JWKS and its ``iss``, ``aud``, ``exp`` and
``nonce`` claims, adds the UserInfo claims for the same ``sub``, and maps the claims named by
``settings.oidc_username_claim`` / ``oidc_email_claim`` / ``oidc_groups_claim`` onto a
:class:`~app.services.directory.DirectoryAccount`. The discovery document and the JWKS are
cached per process for ``DISCOVERY_TTL_S`` seconds. HTTP calls are blocking: call from sync
routes (which FastAPI runs in a thread pool).
"""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
from authlib.common.security import generate_token
from authlib.oauth2 import OAuth2Error

with warnings.catch_warnings():
    # Authlib prefers the httpx2 package and, when only httpx is installed (as here:
    # the service and agent are built on httpx), warns at import that this fallback is
    # deprecated. The warning is addressed to this project, not to the lab running the
    # service, whose log it opened with; pyproject.toml keeps Authlib below 2.
    warnings.filterwarnings("ignore", message="The httpx module is deprecated")
    from authlib.integrations.httpx_client import OAuth2Client
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from app.config import Settings
from app.errors import AppError, Unauthorized
from app.services.directory import DirectoryAccount

DISCOVERY_TTL_S = 3600.0
CLOCK_LEEWAY_S = 60

_cache: dict[str, tuple[float, dict[str, Any], dict[str, Any]]] = {}
_cache_lock = threading.Lock()


class ProviderUnavailable(AppError):
    """503: the OpenID provider (discovery, token or key endpoint) cannot be reached."""

    status, title = 503, "Sign-in provider unavailable"


class OidcRefused(Unauthorized):
    """401: the provider refused the sign-in, or its answer did not verify."""

    title = "Single sign-on failed"


@dataclass(frozen=True)
class Started:
    """An authorization request: where to send the browser, and what to remember until the callback."""

    url: str
    state: str
    nonce: str
    code_verifier: str


def enabled(settings: Settings) -> bool:
    """True when OIDC sign-in is configured (discovery URL and client id)."""
    return bool(settings.oidc_discovery_url and settings.oidc_client_id)


def provider(settings: Settings, *, refresh: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """The discovery document and the JWKS of the configured provider (cached); raises
    :class:`ProviderUnavailable` (503)."""
    url = settings.oidc_discovery_url or ""
    with _cache_lock:
        hit = _cache.get(url)
    if hit and not refresh and time.monotonic() - hit[0] < DISCOVERY_TTL_S:
        return hit[1], hit[2]
    try:
        with httpx.Client(timeout=settings.oidc_timeout_seconds) as c:
            meta = c.get(url).raise_for_status().json()
            jwks = c.get(meta["jwks_uri"]).raise_for_status().json()
    except (httpx.HTTPError, ValueError, KeyError) as e:
        raise ProviderUnavailable(f"OpenID provider {url}: {type(e).__name__}: {e}") from e
    with _cache_lock:
        _cache[url] = (time.monotonic(), meta, jwks)
    return meta, jwks


def _client(settings: Settings, redirect_uri: str) -> OAuth2Client:
    return OAuth2Client(
        client_id=settings.oidc_client_id, client_secret=settings.oidc_client_secret, scope=settings.oidc_scopes,
        redirect_uri=redirect_uri, code_challenge_method="S256", timeout=settings.oidc_timeout_seconds,
    )


def begin(settings: Settings, *, redirect_uri: str) -> Started:
    """A new authorization request (code flow, PKCE S256, state, nonce); raises ProviderUnavailable."""
    meta, _ = provider(settings)
    state, nonce, verifier = generate_token(32), generate_token(32), generate_token(64)
    with _client(settings, redirect_uri) as client:
        url, _ = client.create_authorization_url(meta["authorization_endpoint"], state=state, nonce=nonce,
                                                 code_verifier=verifier)
    return Started(url=url, state=state, nonce=nonce, code_verifier=verifier)


def finish(settings: Settings, *, code: str, redirect_uri: str, nonce: str, code_verifier: str) -> DirectoryAccount:
    """Exchange ``code`` and verify the ID token; the account its claims describe.

    Raises :class:`OidcRefused` (401) when the token endpoint refuses the code or the ID
    token does not verify (signature, issuer, audience, expiry, nonce) or lacks the username
    claim; :class:`ProviderUnavailable` (503) when the provider cannot be reached.
    """
    meta, jwks = provider(settings)
    try:
        with _client(settings, redirect_uri) as client:
            token = client.fetch_token(meta["token_endpoint"], code=code, code_verifier=code_verifier,
                                       grant_type="authorization_code")
            userinfo: dict[str, Any] = {}
            if meta.get("userinfo_endpoint"):
                userinfo = client.get(meta["userinfo_endpoint"]).raise_for_status().json()
    except OAuth2Error as e:
        raise OidcRefused(f"the provider refused the code: {e.error} {e.description or ''}".strip()) from e
    except (httpx.HTTPError, ValueError) as e:
        raise ProviderUnavailable(f"OpenID provider: {type(e).__name__}: {e}") from e
    if "id_token" not in token:
        raise OidcRefused("the provider sent no ID token (is 'openid' in GPUROSTER_OIDC_SCOPES?)")
    registry = jwt.JWTClaimsRegistry(
        leeway=CLOCK_LEEWAY_S, iss={"essential": True, "value": meta.get("issuer")},
        aud={"essential": True, "value": settings.oidc_client_id}, exp={"essential": True},
        sub={"essential": True}, nonce={"essential": True, "value": nonce},
    )
    try:
        claims = jwt.decode(token["id_token"], KeySet.import_key_set(jwks)).claims
        registry.validate(claims)
    except (JoseError, ValueError) as e:
        raise OidcRefused(f"the ID token did not verify: {e}") from e
    merged = dict(claims)
    if userinfo.get("sub") == claims.get("sub"):
        merged.update(userinfo)
    return account_from_claims(settings, merged)


def account_from_claims(settings: Settings, claims: dict[str, Any]) -> DirectoryAccount:
    """Map provider claims to an account with the configured claim names; raises OidcRefused
    without the username claim. A groups claim may be a list or one space/comma-separated string."""
    username = claims.get(settings.oidc_username_claim)
    if not isinstance(username, str) or not username:
        raise OidcRefused(f"the provider's claims have no {settings.oidc_username_claim!r} (GPUROSTER_OIDC_USERNAME_CLAIM)")
    groups = claims.get(settings.oidc_groups_claim) or []
    if isinstance(groups, str):
        groups = groups.replace(",", " ").split()
    email = claims.get(settings.oidc_email_claim)
    name = claims.get("name")
    return DirectoryAccount(
        source="oidc", username=username,
        email=email if isinstance(email, str) else None, display_name=name if isinstance(name, str) else None,
        groups=tuple(str(g).strip("/") for g in groups if isinstance(g, str)),
    )


def logout_url(settings: Settings, *, after: str) -> str | None:
    """The provider's RP-initiated logout URL returning to ``after``, or ``None`` without one."""
    try:
        meta, _ = provider(settings)
    except ProviderUnavailable:
        return None
    end = meta.get("end_session_endpoint")
    if not end:
        return None
    sep = "&" if "?" in end else "?"
    return end + sep + urlencode({"client_id": settings.oidc_client_id, "post_logout_redirect_uri": after})


__all__ = ["OidcRefused", "ProviderUnavailable", "Started", "account_from_claims", "begin", "enabled", "finish",
           "logout_url", "provider"]
