"""Whom a GPU process is judged as, and which processes are exempt: pure, no I/O.

Part of the coverage rules of :mod:`agent.policy` (which re-exports these names): a process in
a container is judged as the container's owner the agent found, never by its uid; a host
process by its uid through the service's uid table first, then its passwd name; a system
process is exempt only by the verified executable the agent reported (``ProcessReport.exe``),
never by the name the process chose. See ``docs/attribution.md``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from agent.schema import HostPolicy, ProcessReport

#: Owner statuses whose ``unix_user`` may be trusted.
KNOWN_OWNER_STATUSES = frozenset({"ok", "replay"})
#: Owner statuses that are judged: known owners, and the two kinds of owner to be found.
JUDGED_OWNER_STATUSES = frozenset({"ok", "replay", "uid_only", "unattributed"})


def process_names(process: ProcessReport) -> set[str]:
    """Names an exemption list is matched against: the process name and the base name of
    the command's first word (``/usr/lib/xorg/Xorg -core`` gives ``Xorg``)."""
    names: set[str] = set()
    if process.name:
        names.add(process.name)
        names.add(os.path.basename(process.name))
    if process.command:
        first = process.command.strip().split(" ", 1)[0]
        if first:
            names.add(os.path.basename(first))
    names.discard("")
    return names


def owner_known(process: ProcessReport) -> bool:
    """True when the process owner is attributed (not: unseen in another PID namespace, exited before the lookup, lookup denied)."""
    return process.owner_status in KNOWN_OWNER_STATUSES and bool(process.unix_user)


def owner_of(process: ProcessReport, unix_uids: Mapping[int, str] | None = None) -> str | None:
    """The unix name ``process`` is judged as, or ``None`` when nobody can be named.

    A container process: the container's owner (``unix_user`` as the agent reported it).
    A host process: its uid through ``unix_uids`` (the service's uid table) first, else its
    passwd name.
    """
    if process.owner_status not in JUDGED_OWNER_STATUSES:
        return None
    if process.container_id:
        return process.unix_user if process.owner_status != "unattributed" else None
    if unix_uids and process.uid is not None and process.uid in unix_uids:
        return unix_uids[process.uid]
    return process.unix_user or None


def _system_exe(process: ProcessReport) -> str | None:
    """The verified executable, or for a replayed process (no executable to check) the
    command's first word; never the name the process chose."""
    if process.container_id:
        return None
    if process.exe:
        return process.exe
    if process.owner_status == "replay" and process.command:
        return process.command.strip().split(" ", 1)[0] or None
    return None


def exemption(process: ProcessReport, policy: HostPolicy) -> str | None:
    """Why ``process`` is exempt from judgement, or ``None`` when it is judged.

    Exempt: owners that cannot be read; a verified system executable of the host run by root
    or a system account (uid below ``policy.min_uid``), or whose base name is in
    ``policy.exempt_process_names``; users in ``policy.exempt_users``. Root in a container,
    and root running an executable that is not a verified system binary, are judged.
    """
    if process.owner_status not in JUDGED_OWNER_STATUSES or (
        process.owner_status == "replay" and not process.unix_user
    ):
        return f"owner unknown ({process.owner_status})"
    exe = _system_exe(process)
    if exe is not None:
        system_account = process.unix_user == "root" or (process.uid is not None and process.uid < policy.min_uid)
        if system_account:
            return f"system process ({exe}, uid {process.uid})"
        base = os.path.basename(exe)
        if base in policy.exempt_process_names:
            return f"exempt system executable {exe}"
    if process.unix_user and process.unix_user in policy.exempt_users and not process.container_id:
        return f"exempt user {process.unix_user}"
    return None


__all__ = [
    "JUDGED_OWNER_STATUSES",
    "KNOWN_OWNER_STATUSES",
    "exemption",
    "owner_known",
    "owner_of",
    "process_names",
]
