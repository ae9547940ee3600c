"""Sign in and sign out (``/login``, ``/logout``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import RedirectResponse, Response

from app.api.deps import SessionDep, SettingsDep, WriteSessionDep
from app.models import utcnow
from app.services import ldap_auth
from app.services import oidc as oidc_service
from app.web import sessions as web_sessions
from app.web.deps import FormBody, FormViewer, form_str, viewer_for
from app.web.render import page
from app.web.routing import page_router

router = page_router()

SIGNIN_COOKIE_SECONDS = 3600


def is_https(request: Request) -> bool:
    """True when the browser reached us over HTTPS (directly or through a proxy that says so)."""
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return request.url.scheme == "https" or forwarded == "https"


def safe_next(value: str | None) -> str:
    """A local path to return to after sign-in; anything else (other sites, ``//host``) becomes ``/``."""
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")) or "\n" in value or "\r" in value:
        return "/"
    return value


def _login_form(request: Request, settings, *, next_url: str, username: str = "", error: str | None = None,
                error_title: str | None = None, error_field: str | None = None, status: int = 200) -> Response:
    nonce = web_sessions.new_signin_nonce()
    resp = page(
        request,
        "login.html",
        {
            "viewer": None, "signin_token": web_sessions.signin_token(settings, nonce), "next": next_url,
            "username": username, "error": error, "error_title": error_title, "error_field": error_field,
            "ldap": ldap_auth.enabled(settings), "oidc_label": settings.oidc_label if oidc_service.enabled(settings) else None,
        },
        status=status,
    )
    resp.set_cookie(
        web_sessions.LOGIN_COOKIE, nonce, max_age=SIGNIN_COOKIE_SECONDS, path="/login", httponly=True,
        samesite="lax", secure=is_https(request),
    )
    return resp


@router.get("/login")
def login_page(
    request: Request, session: SessionDep, settings: SettingsDep,
    next_url: Annotated[str | None, Query(alias="next", max_length=2048)] = None,
) -> Response:
    """The sign-in form (signed-in visitors go straight on)."""
    target = safe_next(next_url)
    if viewer_for(request, session) is not None:
        return RedirectResponse(target, status_code=303)
    return _login_form(request, settings, next_url=target)


@router.post("/login")
def login(request: Request, session: WriteSessionDep, settings: SettingsDep, form: FormBody) -> Response:
    """Check the password, open a server-side session and set its cookie; 401/429 with a message otherwise."""
    username = form_str(form, "username")
    target = safe_next(form_str(form, "next"))
    if not web_sessions.signin_token_ok(settings, request.cookies.get(web_sessions.LOGIN_COOKIE), form_str(form, "csrf_token")):
        return _login_form(
            request, settings, next_url=target, username=username, status=403, error_title="Form refused",
            error="the sign-in form had no valid security token (cookies off, or it was open too long); try again",
        )
    address = request.client.host if request.client else None
    try:
        signed = web_sessions.sign_in(
            session, username=username, password=form_str(form, "password"), address=address, settings=settings,
            now=utcnow(),
        )
    except web_sessions.TooManyAttempts as e:
        resp = _login_form(request, settings, next_url=target, username=username, status=429,
                           error_title=e.title, error=e.detail, error_field="username")
        resp.headers["Retry-After"] = str(e.extra.get("retry_after", settings.login_window_seconds))
        return resp
    except ldap_auth.DirectoryUnavailable as e:
        return _login_form(request, settings, next_url=target, username=username, status=503,
                           error_title=e.title, error=e.detail + "; local accounts can still sign in",
                           error_field="username")
    except web_sessions.SignInFailed as e:
        # the failed attempt was recorded in this transaction: returning (not raising) commits it
        return _login_form(request, settings, next_url=target, username=username, status=401,
                           error_title=e.title, error=e.detail, error_field="password")
    resp = RedirectResponse(target, status_code=303)
    resp.set_cookie(
        web_sessions.SESSION_COOKIE, signed.cookie_value, max_age=settings.session_hours * 3600, path="/",
        httponly=True, samesite="lax", secure=is_https(request),
    )
    resp.delete_cookie(web_sessions.LOGIN_COOKIE, path="/login")
    return resp


@router.post("/logout")
def logout(request: Request, viewer: FormViewer, session: WriteSessionDep, settings: SettingsDep) -> Response:
    """End the session (its row is deleted) and clear the cookie."""
    web_sessions.sign_out(session, cookie_value=request.cookies.get(web_sessions.SESSION_COOKIE))
    after = settings.base_url.rstrip("/") + "/login"
    # single sign-on accounts also end the provider's session, else the next sign-in is silent
    provider_logout = oidc_service.logout_url(settings, after=after) if (
        viewer.user.auth_source == "oidc" and oidc_service.enabled(settings)) else None
    resp = RedirectResponse(provider_logout or "/login", status_code=303)
    resp.delete_cookie(web_sessions.SESSION_COOKIE, path="/", httponly=True, samesite="lax", secure=is_https(request))
    return resp
