"""LDAP sign-in with ldap3: bind as the service account, find the user, bind as the user.

Flow for :func:`authenticate`: open the connection (``ldaps://`` speaks TLS from the start;
``ldap://`` with ``settings.ldap_starttls`` upgrades before any bind, so no password crosses
the wire in clear), bind as ``settings.ldap_bind_dn`` (anonymous when unset), search
``settings.ldap_user_base`` with ``settings.ldap_user_filter`` (the username escaped per
RFC 4515), bind as the entry found with the given password, then list the user's groups
under ``settings.ldap_group_base``. A user the directory does not know or a wrong password
is ``None``; a directory that cannot be reached (or refuses the service account) raises
:class:`DirectoryUnavailable`, which the sign-in page shows as such, so local accounts
(checked first) keep working while it is down.
"""

from __future__ import annotations

import math
import ssl
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from app.config import Settings
from app.errors import AppError
from app.models import User
from app.services.directory import DirectoryAccount, provision

if TYPE_CHECKING:  # ldap3 itself is imported where a sign-in needs it: servers without LDAP never load it
    from ldap3 import Connection, Server


class DirectoryUnavailable(AppError):
    """503: the LDAP directory cannot be reached or refuses the service account."""

    status, title = 503, "Directory unavailable"


def enabled(settings: Settings) -> bool:
    """True when LDAP sign-in is configured (``GPUROSTER_LDAP_URL``)."""
    return bool(settings.ldap_url)


def _server(settings: Settings) -> Server:
    from ldap3 import NONE, Server, Tls

    url = settings.ldap_url or ""
    tls = Tls(
        validate=ssl.CERT_REQUIRED if settings.ldap_tls_verify else ssl.CERT_NONE,
        ca_certs_file=str(settings.ldap_ca_file) if settings.ldap_ca_file else None,
        version=ssl.PROTOCOL_TLS_CLIENT,
    )
    return Server(url, use_ssl=url.lower().startswith("ldaps://"), tls=tls, get_info=NONE,
                  connect_timeout=settings.ldap_timeout_seconds)


def _connect(server: Server, settings: Settings, *, user: str | None, password: str | None) -> Connection:
    from ldap3 import Connection

    conn = Connection(server, user=user, password=password, receive_timeout=max(1, math.ceil(settings.ldap_timeout_seconds)),
                      raise_exceptions=False, read_only=True)
    conn.open()
    if settings.ldap_starttls and not server.ssl:
        if not conn.start_tls():
            raise DirectoryUnavailable(f"LDAP directory {settings.ldap_url}: StartTLS refused ({conn.result})")
    return conn


def _first(entry_attrs: dict, name: str) -> str | None:
    value = entry_attrs.get(name)
    if isinstance(value, list):
        value = value[0] if value else None
    return None if value in (None, "") else str(value)


def authenticate(settings: Settings, *, username: str, password: str) -> DirectoryAccount | None:
    """The directory's account for ``username`` if ``password`` binds as it, else ``None``.

    Raises :class:`DirectoryUnavailable` (503) when the directory is down, times out (after
    ``settings.ldap_timeout_seconds``), refuses StartTLS or the service account's bind.
    """
    if not username or not password:  # an empty password would be an unauthenticated bind: never a sign-in
        return None
    from ldap3 import SUBTREE
    from ldap3.core.exceptions import LDAPException
    from ldap3.utils.conv import escape_filter_chars

    server = _server(settings)
    try:
        svc = _connect(server, settings, user=settings.ldap_bind_dn, password=settings.ldap_bind_password)
        try:
            if not svc.bind():
                raise DirectoryUnavailable(
                    f"LDAP directory {settings.ldap_url}: the service account bind was refused "
                    f"({svc.result.get('description')})")
            attrs = [settings.ldap_email_attr, settings.ldap_uid_attr, settings.ldap_unix_name_attr,
                     settings.ldap_display_name_attr]
            flt = settings.ldap_user_filter.format(username=escape_filter_chars(username))
            svc.search(settings.ldap_user_base, flt, search_scope=SUBTREE, attributes=attrs, size_limit=2)
            entries = [e for e in svc.response or () if e.get("type") == "searchResEntry"]
            if len(entries) != 1:
                return None  # unknown, or ambiguous: never guess which entry the password belongs to
            dn, found = entries[0]["dn"], entries[0]["attributes"]
            user_conn = _connect(server, settings, user=dn, password=password)
            try:
                if not user_conn.bind():
                    return None
            finally:
                user_conn.unbind()
            groups: list[str] = []
            if settings.ldap_group_base:
                gflt = settings.ldap_group_filter.format(username=escape_filter_chars(username),
                                                         dn=escape_filter_chars(dn))
                svc.search(settings.ldap_group_base, gflt, search_scope=SUBTREE,
                           attributes=[settings.ldap_group_name_attr])
                for e in svc.response or ():
                    if e.get("type") == "searchResEntry":
                        name = _first(e["attributes"], settings.ldap_group_name_attr)
                        if name:
                            groups.append(name)
        finally:
            svc.unbind()
    except LDAPException as e:
        raise DirectoryUnavailable(f"LDAP directory {settings.ldap_url} unreachable: {type(e).__name__}: {e}") from e
    uid = _first(found, settings.ldap_uid_attr)
    return DirectoryAccount(
        source="ldap", username=username, email=_first(found, settings.ldap_email_attr),
        display_name=_first(found, settings.ldap_display_name_attr),
        unix_name=_first(found, settings.ldap_unix_name_attr),
        unix_uid=int(uid) if uid and uid.isdigit() else None, groups=tuple(groups),
    )




def sign_in_user(session: Session, *, settings: Settings, username: str, password: str) -> User | None:
    """Authenticate against the directory and provision or refresh the account; ``None`` for a
    wrong password, an unknown or a deactivated user. Raises :class:`DirectoryUnavailable`,
    and what :func:`app.services.directory.provision` raises."""
    account = authenticate(settings, username=username, password=password)
    if account is None:
        return None
    user = provision(session, account=account, group_map=settings.ldap_groups, admin_group=settings.ldap_admin_group,
                     manager_map=settings.ldap_manager_groups)
    return user if user.active else None


__all__ = ["DirectoryUnavailable", "authenticate", "enabled", "sign_in_user"]
