"""Dependencies: sessions (committed before the response), authentication, authorization.

``SessionDep`` is a read session; ``WriteSessionDep`` begins its transaction as a writer
(SQLite ``BEGIN IMMEDIATE``). Both commit before the response is sent (``scope="function"``),
so a failed commit is never hidden behind a 200.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Annotated, TypeVar

from fastapi import Depends, Path, Query, Request, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from app.config import Settings
from app.db import request_write_wait, transaction, write_turn
from app.errors import Forbidden, Unauthorized
from app.models import Host, User
from app.security import HOST_TOKEN_PREFIX
from app.services import hosts as host_service
from app.services import users as user_service


def _session(request: Request, write: bool) -> Iterator[Session]:
    with transaction(request.app.state.session_factory, write=write) as session:
        yield session


def get_session(request: Request) -> Iterator[Session]:
    yield from _session(request, write=False)


async def _write_turn(request: Request) -> AsyncIterator[None]:
    """On SQLite, one write transaction at a time per process, queued on an asyncio lock
    (:func:`app.db.write_turn`, waiting at most :func:`app.db.request_write_wait`).

    SQLite has one writer. Left to themselves, the threads of one process would contend for
    the file lock through SQLite's busy handler, which sleeps in steps of up to 100 ms, and
    latency would collapse under load. Queuing here costs no thread while waiting (a thread
    blocked on a lock would hold one of the worker pool's slots, and enough of them starve
    the request that holds the lock). No-op on PostgreSQL.
    """
    app = request.app
    async with write_turn(app, wait=request_write_wait(app.state.settings)):
        yield


def get_write_session(
    request: Request, _turn: Annotated[None, Depends(_write_turn, scope="function")]
) -> Iterator[Session]:
    yield from _session(request, write=True)


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
WriteSessionDep = Annotated[Session, Depends(get_write_session, scope="function")]


async def get_settings_dep(request: Request) -> Settings:
    """The application's settings. ``async`` because it only reads memory: FastAPI runs a
    plain ``def`` dependency in the worker thread pool, a hand-off per request for nothing."""
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def bearer_token(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if not auth:
        return None
    scheme, _, value = auth.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthorized("Authorization header must be 'Bearer <token>'")
    return value.strip()


def _user_from_request(request: Request, session: Session) -> User | None:
    token = bearer_token(request)
    if token is not None:
        if token.startswith(HOST_TOKEN_PREFIX):
            raise Forbidden("host tokens reach only the agent endpoints")
        return user_service.user_for_token(session, token, usage=getattr(request.app.state, "token_usage", None))
    resolver = getattr(request.app.state, "cookie_user_resolver", None)
    if resolver is not None:
        return resolver(request, session)
    return None


def current_user(request: Request, session: SessionDep) -> User:
    """The signed-in user (API token, or a web session cookie); raises Unauthorized (401)."""
    user = _user_from_request(request, session)
    if user is None:
        raise Unauthorized("sign in or send 'Authorization: Bearer <API token>'")
    return user


def current_user_write(request: Request, session: WriteSessionDep) -> User:
    """The signed-in user, read in the request's write transaction; raises Unauthorized (401)."""
    return _signed_in(request, session)


def _signed_in(request: Request, session: Session) -> User:
    user = _user_from_request(request, session)
    if user is None:
        raise Unauthorized("sign in or send 'Authorization: Bearer <API token>'")
    return user


T = TypeVar("T")


async def in_write_unit(request: Request, work: Callable[[Session, User], T]) -> T:
    """Run ``work(session, user)`` in one write transaction, in one hand-off to the worker
    thread pool, holding this process's SQLite write turn: begin as a writer, authenticate
    the request, run ``work``, commit; roll back if anything raises.

    What :data:`WriteSessionDep` and :data:`WriteUser` do, in their order (the write turn,
    the transaction, the user; Unauthorized 401 and Forbidden 403 as there; WriteTurnBusy and
    an unavailable database 503), with one hand-off instead of four (the session's start and
    end, the user, the route): each costs the event loop and a worker thread a wake-up, about
    a tenth of a millisecond of CPU, and the booking route is the hot write path of people
    and scripts. A route using it reads its own body (:mod:`app.api.json_body`) and raises
    the body's validation errors from ``work``, after authentication, as FastAPI would.
    """
    def unit() -> T:
        with transaction(request.app.state.session_factory, write=True) as session:
            return work(session, _signed_in(request, session))

    async with write_turn(request.app, wait=request_write_wait(request.app.state.settings)):
        return await run_in_threadpool(unit)


async def admin_user(user: Annotated[User, Depends(current_user_write)]) -> User:
    """The signed-in user if an admin (raises Forbidden, 403); reads no database, so it runs
    on the event loop (see :func:`get_settings_dep`)."""
    if not user.is_admin:
        raise Forbidden("admins only")
    return user


def current_host(request: Request, session: WriteSessionDep, known: dict[str, Host] | None = None) -> Host:
    """The host authenticated by its host token (``known``: hosts already read for a batch's
    tokens, :func:`app.services.hosts.hosts_for_tokens`); raises Unauthorized/Forbidden."""
    token = bearer_token(request)
    if token is None:
        raise Unauthorized("send 'Authorization: Bearer <host token>'")
    if not token.startswith(HOST_TOKEN_PREFIX):
        raise Forbidden("this endpoint takes a host token")
    return host_service.host_for_token(session, token, known)


CurrentUser = Annotated[User, Depends(current_user)]
WriteUser = Annotated[User, Depends(current_user_write)]
AdminUser = Annotated[User, Depends(admin_user)]


# Row ids in paths: 1 .. 2^31-1 (both databases' integer range); anything else is a 422.
RowId = Annotated[int, Path(ge=1, le=2_147_483_647, description="row id")]


class PageParams:
    """``limit`` (1..5000, default 1000) and ``offset`` of a plain-list listing; the total
    goes in the ``X-Total-Count`` response header."""

    def __init__(
        self,
        limit: Annotated[int, Query(ge=1, le=5000, description="page size (max 5000)")] = 1000,
        offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
    ) -> None:
        self.limit, self.offset = limit, offset

    def apply(self, items: list, response: Response) -> list:
        response.headers["X-Total-Count"] = str(len(items))
        return items[self.offset : self.offset + self.limit]


PageDep = Annotated[PageParams, Depends()]


