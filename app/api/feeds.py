"""ICS calendar feeds (secret URLs, no Authorization header) and the URLs to subscribe to."""

from __future__ import annotations

from fastapi import Response

from app.routes import api_router
from app.api.deps import AdminUser, SessionDep, SettingsDep, WriteSessionDep, WriteUser
from app.schemas.rules import FeedRead
from app.services import calendar as calendar_service
from app.services import hosts as host_service

router = api_router(tags=["feeds"])

ICS = "text/calendar; charset=utf-8"
_ICS_RESPONSE = {200: {"content": {"text/calendar": {}}, "description": "an iCalendar document"}, 404: {}}


@router.get("/feeds/users/{token}.ics", response_class=Response, responses=_ICS_RESPONSE)
def user_feed(token: str, session: SessionDep, settings: SettingsDep) -> Response:
    """A user's reservations (and those shared with them) as iCalendar; the token is the secret."""
    body = calendar_service.user_feed(session, token=token, settings=settings)
    return Response(body, media_type=ICS, headers={"Cache-Control": "private, max-age=300"})


@router.get("/feeds/hosts/{token}.ics", response_class=Response, responses=_ICS_RESPONSE)
def host_feed(token: str, session: SessionDep, settings: SettingsDep) -> Response:
    """Every reservation on a host as iCalendar; the token is the secret."""
    body = calendar_service.host_feed(session, token=token, settings=settings)
    return Response(body, media_type=ICS, headers={"Cache-Control": "private, max-age=300"})


_SHOWN_ONCE = "a feed exists; its URL was shown once when it was made (only a hash is kept): rotate for a new URL"


def _feed(settings, kind: str, token: str | None, rotate_path: str) -> FeedRead:
    if token is None:
        return FeedRead(url=None, detail=f"{_SHOWN_ONCE} (POST {rotate_path})")
    return FeedRead(url=calendar_service.feed_url(settings, kind, token))


@router.get("/me/feed", response_model=FeedRead)
def my_feed(user: WriteUser, session: WriteSessionDep, settings: SettingsDep) -> FeedRead:
    """The secret URL of the caller's calendar feed when it is made (first call); afterwards
    ``url`` is null (only a hash is stored): rotate for a new one."""
    token = calendar_service.user_feed_token(session, user=user)
    return _feed(settings, "users", token, "/api/v1/me/feed/rotate")


@router.post("/me/feed/rotate", response_model=FeedRead)
def rotate_my_feed(user: WriteUser, session: WriteSessionDep, settings: SettingsDep) -> FeedRead:
    """A new secret URL for the caller's feed; the old one stops working."""
    token = calendar_service.user_feed_token(session, user=user, rotate=True)
    return _feed(settings, "users", token, "/api/v1/me/feed/rotate")


@router.get("/hosts/{name}/feed", response_model=FeedRead, responses={404: {}})
def host_feed_url(name: str, user: WriteUser, session: WriteSessionDep, settings: SettingsDep) -> FeedRead:
    """The secret URL of a host's calendar feed when it is made (first call by any member;
    who holds what is public in the lab); afterwards ``url`` is null: an admin rotates it."""
    host = host_service.get_host(session, name)
    token = calendar_service.host_feed_token(session, host=host, actor=user)
    return _feed(settings, "hosts", token, f"/api/v1/hosts/{name}/feed/rotate")


@router.post("/hosts/{name}/feed/rotate", response_model=FeedRead, responses={403: {}, 404: {}})
def rotate_host_feed(name: str, admin: AdminUser, session: WriteSessionDep, settings: SettingsDep) -> FeedRead:
    """A new secret URL for a host's feed (admins); the old one stops working."""
    host = host_service.get_host(session, name)
    token = calendar_service.host_feed_token(session, host=host, actor=admin, rotate=True)
    return _feed(settings, "hosts", token, f"/api/v1/hosts/{name}/feed/rotate")
