"""Property: for random sequences of create (some above an approval threshold, so pending),
approve, deny, cancel, extend and maintenance with override, no two holding reservations
(pending or confirmed, not cancelled/denied/expired) overlap on a device, and every state a
reservation passes through follows the transition table (both databases)."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import future, gpu, snapshot_body

_ids = itertools.count()
# (state before, state after) that the API may show for one reservation between two steps
LEGAL = {("pending", "upcoming"), ("pending", "denied"), ("pending", "cancelled"), ("upcoming", "cancelled")}
HELD = ("pending", "upcoming", "active")

step_st = st.one_of(
    st.tuples(st.just("create"), st.sets(st.integers(0, 2), min_size=1, max_size=2), st.integers(0, 11),
              st.integers(1, 4)),
    st.tuples(st.sampled_from(["approve", "deny", "cancel", "extend"]), st.integers(0, 20)),
    st.tuples(st.just("maintenance"), st.integers(0, 2), st.integers(0, 11)),
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step_st, min_size=2, max_size=10))
def test_holding_reservations_never_overlap_and_states_move_legally(client, make_user, make_host, steps):
    n = next(_ids)
    admin, member = make_user(f"padm{n}", admin=True), make_user(f"pmem{n}")
    host = make_host(f"plc-{n}")
    uuids = [f"GPU-{n:04d}{i:04d}-plc0-0000-0000-000000000000" for i in range(3)]
    assert client.post("/api/v1/agent/snapshots", json=snapshot_body(f"plc-{n}", 1, [gpu(u, i) for i, u in enumerate(uuids)]),
                       headers=host.headers).status_code == 200
    if not client.get("/api/v1/rules", headers=admin.headers).json():  # once per database
        assert client.post("/api/v1/rules", json={"scope": "default", "approval_above_devices": 1},
                           headers=admin.headers).status_code == 201
    base = future(24 * 40 + 24 * n)
    ids: list[int] = []
    seen: dict[int, str] = {}
    for step in steps:
        if step[0] == "create":
            _, devs, at, length = step
            s = base + timedelta(minutes=30 * at)
            r = client.post("/api/v1/reservations", json={"host": f"plc-{n}", "devices": sorted(devs), "start": s.isoformat(),
                                                          "end": (s + timedelta(minutes=30 * length)).isoformat()},
                            headers=member.headers)
            assert r.status_code in (201, 409), r.text
            if r.status_code == 201:
                ids.append(r.json()["id"])
        elif step[0] == "maintenance":
            _, dev, at = step
            s = base + timedelta(minutes=30 * at)
            r = client.post("/api/v1/maintenance", json={"host": f"plc-{n}", "devices": [dev], "start": s.isoformat(),
                                                         "end": (s + timedelta(hours=1)).isoformat(), "reason": "prop",
                                                         "override": True}, headers=admin.headers)
            assert r.status_code in (201, 409), r.text
            if r.status_code == 201:
                ids.append(r.json()["maintenance"]["id"])
        elif ids:
            action, k = step
            rid = ids[k % len(ids)]
            url = f"/api/v1/reservations/{rid}"
            if action == "cancel":
                r = client.delete(url, headers=admin.headers)
            elif action == "extend":
                cur = client.get(url, headers=admin.headers).json()
                r = client.patch(url, json={"end": (datetime.fromisoformat(cur["end"]) + timedelta(minutes=30)).isoformat()},
                                 headers=admin.headers)
            else:
                r = client.post(f"{url}/{action}", headers=admin.headers)
            assert r.status_code in (200, 409), r.text
        rows = [client.get(f"/api/v1/reservations/{i}", headers=admin.headers).json() for i in ids]
        for row in rows:
            before = seen.get(row["id"], row["state"])
            assert before == row["state"] or (before, row["state"]) in LEGAL, (before, row["state"])
            seen[row["id"]] = row["state"]
        held = [r for r in rows if r["state"] in HELD]
        for a, b in itertools.combinations(held, 2):
            shared = {d["uuid"] for d in a["devices"]} & {d["uuid"] for d in b["devices"]}
            if shared:
                sa, ea, sb, eb = (datetime.fromisoformat(v) for v in (a["start"], a["end"], b["start"], b["end"]))
                assert ea <= sb or eb <= sa, (a, b)
