"""Property: for random request sequences, accepted reservations never overlap on a device
(MIG slices and their parent included), and every 409 really overlapped an accepted one."""

from __future__ import annotations

import itertools
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import future, gpu, snapshot_body

_host_ids = itertools.count()

PARENT = 0  # device 0 is a GPU in MIG mode with slices 4 and 5
SLICES = (4, 5)

request_st = st.tuples(
    st.sets(st.integers(min_value=0, max_value=5), min_size=1, max_size=3),  # device numbers
    st.integers(min_value=0, max_value=23),  # start, in 30-min steps
    st.integers(min_value=1, max_value=6),  # length, in 30-min steps
)


def _excludes(a: int, b: int) -> bool:
    """Do devices a and b exclude each other (same device, or a MIG slice and its parent)?"""
    return a == b or {a, b} in ({PARENT, SLICES[0]}, {PARENT, SLICES[1]})


def _overlaps(x, y) -> bool:
    (da, sa, ea), (db, sb, eb) = x, y
    return sa < eb and sb < ea and any(_excludes(a, b) for a in da for b in db)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(request_st, min_size=1, max_size=12))
def test_accepted_never_overlap_and_every_409_overlapped(client, make_user, make_host, requests):
    n = next(_host_ids)
    user = make_user(f"prop{n}")
    host = make_host(f"prop-{n}")
    uuids = [f"GPU-{n:04d}{i:04d}-prop-0000-0000-000000000000" for i in range(4)] + [
        f"MIG-{n:04d}{i:04d}-prop-0000-0000-000000000000" for i in SLICES
    ]
    devs = [gpu(uuids[i], i) for i in range(4)] + [
        {"uuid": uuids[i], "parent_uuid": uuids[PARENT], "gpu_instance_id": i, "compute_instance_id": 0} for i in SLICES
    ]
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body(f"prop-{n}", 1, devs), headers=host.headers)
    assert r.status_code == 200, r.text
    base = future(24 * 30)
    accepted: list[tuple[set[int], int, int]] = []
    for devices, s, length in requests:
        start, end = base + timedelta(minutes=30 * s), base + timedelta(minutes=30 * (s + length))
        resp = client.post(
            "/api/v1/reservations",
            json={"host": f"prop-{n}", "devices": [uuids[d] for d in sorted(devices)], "start": start.isoformat(), "end": end.isoformat()},
            headers=user.headers,
        )
        me = (devices, s, s + length)
        if PARENT in devices and devices & set(SLICES):
            assert resp.status_code == 422 and resp.json()["field"] == "devices", resp.text
            continue
        clash = [a for a in accepted if _overlaps(me, a)]
        if resp.status_code == 201:
            assert not clash, f"accepted {me} although it overlaps {clash}"
            accepted.append(me)
        else:
            assert resp.status_code == 409, resp.text
            assert clash, f"refused {me} without any overlapping accepted reservation"
    for a, b in itertools.combinations(accepted, 2):
        assert not _overlaps(a, b)
