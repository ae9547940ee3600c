"""Findings on the service: recording agent reports (upsert by host and key, terminal
notices, enforcement actions in the audit log) and ``GET /api/v1/findings``; both databases."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from agent.schema import ActionReport, DeviceReport, FindingReport, NoticeReport, Snapshot
from app.db import build_engine, build_session_factory, run_in_transaction, transaction
from app.models import AuditLog, Device, Finding, Notice
from app.services import findings as svc
from app.services import hosts as host_service
from app.services import ingest

pytestmark = pytest.mark.commits  # records findings through a session factory of its own engine

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
G0 = "GPU-aaaa0000-0000-0000-0000-000000000000"
G1 = "GPU-aaaa1111-0000-0000-0000-000000000000"
OTHER = "GPU-bbbb0000-0000-0000-0000-000000000000"


@pytest.fixture
def factory(settings) -> Iterator[sessionmaker[Session]]:
    engine = build_engine(settings)
    yield build_session_factory(engine)
    engine.dispose()


@pytest.fixture
def hosts(factory, settings):
    """Hosts node-01 (GPUs G0, G1) and node-02 (OTHER), known to the service by one snapshot each."""
    def work(s: Session) -> None:
        for name, uuids in (("node-01", [G0, G1]), ("node-02", [OTHER])):
            host, _ = host_service.create_host(s, name=name)
            s.flush()
            snap = Snapshot(host=name, seq=1, collected_at=T0 - timedelta(minutes=5),
                            devices=[DeviceReport(uuid=u, index=i, pci_bus_id=f"00000000:{i + 1:02X}:00.0")
                                     for i, u in enumerate(uuids)])
            ingest.ingest_snapshot(s, host=host, snap=snap, settings=settings, now=T0 - timedelta(minutes=5))

    run_in_transaction(factory, work)


def report(**kw) -> FindingReport:
    base = dict(key=f"{G0}:4242:1772441000.00:unreserved", kind="unreserved", device_uuid=G0, pid=4242,
                create_time=1772441000.0, unix_user="alice", uid=1001, command="python train.py",
                first_seen=T0, last_seen=T0, state="open", message="your process 4242 ...")
    base.update(kw)
    return FindingReport(**base)


def record(factory, reports, host="node-01", now=T0, settings=None):
    def work(s: Session):
        h = host_service.get_host(s, host)
        return [f.id for f in svc.record_findings(s, host=h, reports=reports, now=now, settings=settings)]

    return run_in_transaction(factory, work)


def rows(factory, model, *where):
    with factory() as s:
        return list(s.scalars(select(model).where(*where).order_by(model.id)))


# ----------------------------------------------------------------------------------------
# recording


def test_upsert_by_host_and_key_one_row_per_finding(factory, hosts) -> None:
    [fid] = record(factory, [report()])
    [fid2] = record(factory, [report(state="notified", last_seen=T0 + timedelta(seconds=5))])
    assert fid == fid2
    [f] = rows(factory, Finding)
    with factory() as s:
        g0 = s.scalar(select(Device.id).where(Device.uuid == G0))
    assert (f.state, f.first_seen_at, f.last_seen_at, f.device_id, f.resolved_at) == (
        "notified", T0, T0 + timedelta(seconds=5), g0, None)
    # the same key on another host is another finding
    record(factory, [report(device_uuid=OTHER)], host="node-02")
    assert len(rows(factory, Finding)) == 2


def test_older_report_never_moves_a_finding_back_but_its_notices_count(factory, hosts) -> None:
    record(factory, [report(state="resolved", last_seen=T0 + timedelta(minutes=2))])
    late = report(state="notified", last_seen=T0 + timedelta(minutes=1),
                  notices=[NoticeReport(recipient="alice", at=T0 + timedelta(minutes=1), delivered=2, detail="written to /dev/pts/3, /dev/pts/7")])
    record(factory, [late])  # a spooled snapshot replayed after the newer one
    [f] = rows(factory, Finding)
    assert (f.state, f.last_seen_at, f.resolved_at) == ("resolved", T0 + timedelta(minutes=2), T0 + timedelta(minutes=2))
    [n] = rows(factory, Notice)
    assert (n.channel, n.recipient, n.status, n.sent_at) == ("terminal", "alice", "sent", T0 + timedelta(minutes=1))
    assert n.detail == "2 terminal(s): written to /dev/pts/3, /dev/pts/7"


def test_key_reported_again_after_it_ended_reopens(factory, hosts) -> None:
    record(factory, [report(state="resolved", last_seen=T0 + timedelta(minutes=1))])
    record(factory, [report(state="open", first_seen=T0 + timedelta(minutes=9), last_seen=T0 + timedelta(minutes=10))])
    [f] = rows(factory, Finding)
    assert (f.state, f.resolved_at, f.first_seen_at) == ("open", None, T0)


def test_terminal_notices_and_actions_are_recorded_once(factory, hosts) -> None:
    at = T0 + timedelta(minutes=1)
    rep = report(
        state="notified",
        notices=[NoticeReport(recipient="alice", at=T0, delivered=0, detail="no terminal of alice found"),
                 NoticeReport(recipient="bob", at=T0, delivered=0, detail="dry run: would write to /dev/pts/1")],
        actions=[ActionReport(action="sigterm", pid=4242, create_time=1772441000.0, at=at, reason="SIGTERM sent to pid 4242 via pidfd"),
                 ActionReport(action="skipped", pid=4242, create_time=1772441000.0, at=at + timedelta(seconds=10),
                              reason="SIGKILL not sent: gone")],
    )
    [fid] = record(factory, [rep])
    record(factory, [rep])  # delivered twice (another seq): nothing doubles
    assert [(n.recipient, n.status) for n in rows(factory, Notice)] == [("alice", "undelivered"), ("bob", "dry_run")]
    audit = rows(factory, AuditLog, AuditLog.target == f"finding:{fid}")
    assert [(a.actor, a.action, a.at) for a in audit] == [
        ("host:node-01", "finding.sigterm", at), ("host:node-01", "finding.skipped", at + timedelta(seconds=10))]
    assert audit[0].detail["pid"] == 4242 and "pidfd" in audit[0].detail["reason"]
    assert audit[0].detail["key"] == rep.key


def test_foreign_ids_from_an_agent_are_not_linked(factory, hosts) -> None:
    """A reservation id the service does not know (or of another host) and a device of
    another host are stored as NULL: never a foreign-key error, never a cross-host link."""
    record(factory, [report(reservation_id=999_999, device_uuid=OTHER, kind="foreign", holder="bob",
                            key=f"{OTHER}:4242:1772441000.00:foreign")])
    [f] = rows(factory, Finding)
    assert (f.reservation_id, f.device_id, f.holder) == (None, None, "bob")


def test_ingest_stores_findings_of_a_snapshot(factory, hosts, settings) -> None:
    def work(s: Session):
        h = host_service.get_host(s, "node-01")
        snap = Snapshot(host="node-01", seq=2, collected_at=T0, devices=[DeviceReport(uuid=G0, index=0)],
                        findings=[report(), report(key=f"{G1}:-:r1:idle", kind="idle", device_uuid=G1, pid=None,
                                                   create_time=None, holder="alice")])
        return ingest.ingest_snapshot(s, host=h, snap=snap, settings=settings, now=T0)

    run_in_transaction(factory, work)
    assert sorted(f.kind for f in rows(factory, Finding)) == ["idle", "unreserved"]


# ----------------------------------------------------------------------------------------
# reading: GET /api/v1/findings


@pytest.fixture
def api(client, make_user, factory, hosts):
    alice = make_user("alice", email="alice@lab.example")
    boss = make_user("boss", admin=True)
    carol = make_user("carol")
    reps = [
        report(state="notified", notices=[NoticeReport(recipient="alice", at=T0, delivered=1, detail="written to /dev/pts/2")],
               actions=[ActionReport(action="dry_run", pid=4242, at=T0, reason="would send SIGTERM")]),
        report(key=f"{G1}:77:1.00:foreign", kind="foreign", device_uuid=G1, pid=77, unix_user="carol",
               holder="alice", first_seen=T0 - timedelta(days=2), last_seen=T0 - timedelta(days=1), state="resolved"),
    ]
    record(factory, reps)
    record(factory, [report(key=f"{OTHER}:5:1.00:overrun", kind="overrun", device_uuid=OTHER, pid=5, unix_user="bob",
                            first_seen=T0 + timedelta(hours=1), last_seen=T0 + timedelta(hours=2))], host="node-02")
    with transaction(factory, write=True) as s:
        fid = s.scalar(select(Finding.id).where(Finding.pid == 4242))
        s.add(Notice(finding_id=fid, channel="email", recipient="alice@lab.example", sent_at=T0, status="sent"))
    return alice, boss, carol


def get(client, actor, **params):
    r = client.get("/api/v1/findings", params=params, headers=actor.headers)
    assert r.status_code == 200, r.text
    return r.json()


def test_list_findings_newest_first_with_device_notices_and_actions(client, api) -> None:
    alice, _, _ = api
    page = get(client, alice)
    assert page["total"] == 3 and [f["kind"] for f in page["items"]] == ["overrun", "unreserved", "foreign"]
    f = page["items"][1]
    assert (f["host"], f["device_uuid"], f["device_index"], f["device_pci_bus_id"]) == ("node-01", G0, 0, "00000000:01:00.0")
    assert [(n["channel"], n["recipient"], n["status"]) for n in f["notices"]] == [
        ("terminal", "alice", "sent"), ("email", "alice@lab.example", "sent")]
    assert [(a["action"], a["actor"], a["detail"]["reason"]) for a in f["actions"]] == [
        ("dry_run", "host:node-01", "would send SIGTERM")]


def test_members_see_all_findings_but_not_others_recipients(client, api) -> None:
    _, boss, carol = api
    page = get(client, carol)
    assert page["total"] == 3  # lab transparency
    alices = next(f for f in page["items"] if f["unix_user"] == "alice")
    assert [n["recipient"] for n in alices["notices"]] == [None, None]
    boss_view = next(f for f in get(client, boss)["items"] if f["unix_user"] == "alice")
    assert [n["recipient"] for n in boss_view["notices"]] == ["alice", "alice@lab.example"]


@pytest.mark.parametrize(
    "params,users",
    [
        ({"host": "node-02"}, ["bob"]),
        ({"user": "carol"}, ["carol"]),
        ({"kind": "foreign"}, ["carol"]),
        ({"state": "notified"}, ["alice"]),
        ({"since": (T0 - timedelta(hours=1)).isoformat()}, ["bob", "alice"]),
        ({"until": T0.isoformat()}, ["carol"]),
        ({"since": (T0 - timedelta(days=3)).isoformat(), "until": (T0 + timedelta(minutes=30)).isoformat()}, ["alice", "carol"]),
        ({"limit": 1, "offset": 1}, ["alice"]),
    ],
)
def test_list_findings_filters_and_pages(client, api, params, users) -> None:
    page = get(client, api[0], **params)
    assert [f["unix_user"] for f in page["items"]] == users


def test_bad_filters_are_422_naming_the_field_and_anonymous_is_401(client, api) -> None:
    alice = api[0]
    r = client.get("/api/v1/findings", params={"kind": "evil"}, headers=alice.headers)
    assert r.status_code == 422 and "kind" in r.text
    r = client.get("/api/v1/findings", params={"since": "yesterday"}, headers=alice.headers)
    assert r.status_code == 422 and r.json()["field"] == "since"
    assert client.get("/api/v1/findings").status_code == 401


def test_get_one_finding_and_404(client, api, factory) -> None:
    with factory() as s:
        fid = s.scalar(select(Finding.id).where(Finding.pid == 77))
    r = client.get(f"/api/v1/findings/{fid}", headers=api[0].headers)
    assert r.status_code == 200 and r.json()["holder"] == "alice" and r.json()["state"] == "resolved"
    r = client.get("/api/v1/findings/987654", headers=api[0].headers)
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/problem+json")


def test_finding_count_helper_matches_rows(factory, hosts) -> None:
    record(factory, [report(), report(key="k2", kind="foreign", holder="bob")])
    with factory() as s:
        rows_, total = svc.list_findings(s, flt=svc.FindingFilter(kind="foreign"), limit=10, offset=0)
        assert total == 1 and [f.key for f in rows_] == ["k2"]
        assert s.scalar(select(func.count()).select_from(Finding)) == 2
