"""Authorization matrix: every API route against anonymous, member (owner), other member,
admin, host token and another host's token. Zero mismatches against the expected table,
and every route of the OpenAPI document has a row."""

from __future__ import annotations

import itertools
from datetime import timedelta

from tests.conftest import future, gpu, snapshot_body

ACTORS = ("anon", "alice", "bob", "admin", "host", "other_host")
_slot = itertools.count()


def _row(anon, alice, bob, admin, host, other_host):
    return dict(zip(ACTORS, (anon, alice, bob, admin, host, other_host), strict=True))


# (method, path template, expected status per actor). "alice" owns {rid}; bob is another member.
MATRIX = [
    ("GET", "/api/v1/me", _row(401, 200, 200, 200, 403, 403)),
    # the lab's users have no password, so the "current password" is always wrong: 403
    ("POST", "/api/v1/me/password", _row(401, 403, 403, 403, 403, 403)),
    ("PUT", "/api/v1/me/language", _row(401, 200, 200, 200, 403, 403)),
    ("GET", "/api/v1/users", _row(401, 200, 200, 200, 403, 403)),
    ("POST", "/api/v1/users", _row(401, 403, 403, 201, 403, 403)),
    ("PATCH", "/api/v1/users/{username}", _row(401, 403, 403, 200, 403, 403)),
    ("GET", "/api/v1/tokens", _row(401, 200, 200, 200, 403, 403)),
    ("POST", "/api/v1/tokens", _row(401, 201, 201, 201, 403, 403)),
    ("DELETE", "/api/v1/tokens/{token_id}", _row(401, 200, 404, 200, 403, 403)),
    ("GET", "/api/v1/hosts", _row(401, 200, 200, 200, 403, 403)),
    ("POST", "/api/v1/hosts", _row(401, 403, 403, 201, 403, 403)),
    ("GET", "/api/v1/hosts/{name}", _row(401, 200, 200, 200, 403, 403)),
    ("PATCH", "/api/v1/hosts/{name}", _row(401, 403, 403, 200, 403, 403)),
    ("GET", "/api/v1/devices", _row(401, 200, 200, 200, 403, 403)),
    ("PATCH", "/api/v1/devices/{uuid}", _row(401, 403, 403, 200, 403, 403)),
    ("POST", "/api/v1/devices/{uuid}/move", _row(401, 403, 403, 200, 403, 403)),
    ("GET", "/api/v1/device-conflicts", _row(401, 403, 403, 200, 403, 403)),
    ("GET", "/api/v1/quarantines", _row(401, 200, 200, 200, 403, 403)),
    # the device is healthy: members may not clear (403), an admin finds nothing to clear (409)
    ("POST", "/api/v1/devices/{uuid}/clear-quarantine", _row(401, 403, 403, 409, 403, 403)),
    ("GET", "/api/v1/reservations", _row(401, 200, 200, 200, 403, 403)),
    ("POST", "/api/v1/reservations", _row(401, 201, 201, 201, 403, 403)),
    ("GET", "/api/v1/reservations/{reservation_id}", _row(401, 200, 200, 200, 403, 403)),
    ("PATCH", "/api/v1/reservations/{reservation_id}", _row(401, 200, 403, 200, 403, 403)),
    ("DELETE", "/api/v1/reservations/{reservation_id}", _row(401, 200, 403, 200, 403, 403)),
    ("POST", "/api/v1/reservations/{reservation_id}/release", _row(401, 200, 403, 200, 403, 403)),
    # nothing is asked about the reservation: its owner and an admin get 409, others 403
    ("POST", "/api/v1/reservations/{reservation_id}/keep", _row(401, 409, 403, 409, 403, 403)),
    ("POST", "/api/v1/agent/snapshots", _row(401, 403, 403, 403, 200, 403)),
    ("GET", "/api/v1/findings", _row(401, 200, 200, 200, 403, 403)),
    ("GET", "/api/v1/findings/{finding_id}", _row(401, 404, 404, 404, 403, 403)),
    ("GET", "/api/v1/reports/usage", _row(401, 200, 200, 200, 403, 403)),
    ("GET", "/api/v1/reports/usage.csv", _row(401, 200, 200, 200, 403, 403)),
    ("GET", "/api/v1/notify-targets", _row(401, 200, 200, 200, 403, 403)),
    ("POST", "/api/v1/notify-targets", _row(401, 201, 201, 201, 403, 403)),
    ("DELETE", "/api/v1/notify-targets/{target_id}", _row(401, 204, 404, 204, 403, 403)),
    ("GET", "/api/v1/me/notice-preferences", _row(401, 200, 200, 200, 403, 403)),
    ("PUT", "/api/v1/me/notice-preferences", _row(401, 200, 200, 200, 403, 403)),
    ("GET", "/api/v1/approvals", _row(401, 200, 200, 200, 403, 403)),
    # a confirmed reservation: members may not decide (403), an admin finds nothing pending (409)
    ("POST", "/api/v1/reservations/{reservation_id}/approve", _row(401, 403, 403, 409, 403, 403)),
    ("POST", "/api/v1/reservations/{reservation_id}/deny", _row(401, 403, 403, 409, 403, 403)),
    ("POST", "/api/v1/groups/{name}/managers", _row(401, 403, 403, 404, 403, 403)),
    ("POST", "/api/v1/maintenance", _row(401, 403, 403, 201, 403, 403)),
    ("GET", "/api/v1/boosts", _row(401, 200, 200, 200, 403, 403)),
    ("POST", "/api/v1/boosts", _row(401, 201, 201, 201, 403, 403)),
    # alice's pending boost: neither she nor bob may decide it; an admin may
    ("POST", "/api/v1/boosts/{boost_id}/approve", _row(401, 403, 403, 200, 403, 403)),
    ("POST", "/api/v1/boosts/{boost_id}/deny", _row(401, 403, 403, 200, 403, 403)),
    ("GET", "/api/v1/waitlist", _row(401, 200, 200, 200, 403, 403)),
    ("POST", "/api/v1/waitlist", _row(401, 201, 201, 201, 403, 403)),
    # alice owns {entry_id} (waiting): bob may neither read nor cancel it
    ("GET", "/api/v1/waitlist/{entry_id}", _row(401, 200, 403, 200, 403, 403)),
    ("DELETE", "/api/v1/waitlist/{entry_id}", _row(401, 200, 403, 200, 403, 403)),
]


def test_authorization_matrix(client, lab, make_host, make_user):
    other = make_host("node-99")
    headers = {
        "anon": {}, "alice": lab.alice.headers, "bob": lab.bob.headers, "admin": lab.admin.headers,
        "host": lab.host.headers, "other_host": other.headers,
    }
    seq = itertools.count(100)
    # a limit to boost (large enough to refuse none of the matrix's bookings)
    r = client.post("/api/v1/rules", json={"scope": "default", "max_gpu_hours_month": 100000}, headers=lab.admin.headers)
    assert r.status_code == 201, r.text
    boost_end = (future(24 * 3)).isoformat()

    def fresh_reservation() -> int:
        s = future(24 * 10) + timedelta(hours=2 * next(_slot))
        r = client.post("/api/v1/reservations", json={"host": "node-01", "devices": [0], "start": s.isoformat(), "duration": "PT1H", "user": "alice"}, headers=lab.admin.headers)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def fresh_boost() -> int:
        r = client.post("/api/v1/boosts", json={"limit": "max_gpu_hours_month", "value": 200000 + next(seq), "reason": "matrix",
                                                "end": boost_end}, headers=lab.alice.headers)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def fresh_token() -> int:
        r = client.post("/api/v1/tokens", json={"name": "matrix"}, headers=lab.alice.headers)
        return r.json()["id"]

    def fresh_target() -> int:
        r = client.post("/api/v1/notify-targets", json={"url": "wecombot://matrix0123"}, headers=lab.alice.headers)
        return r.json()["id"]

    def fresh_entry() -> int:
        # every GPU of node-01 held for alice in a window, so her entry for it keeps waiting
        s = future(24 * 60) + timedelta(hours=3 * next(_slot))
        held = client.post("/api/v1/reservations", json={"host": "node-01", "devices": [0, 1, 2, 3], "user": "alice",
                                                         "start": s.isoformat(), "duration": "PT2H"}, headers=lab.admin.headers)
        assert held.status_code == 201, held.text
        r = client.post("/api/v1/waitlist", json={"count": 1, "duration": "PT1H", "start": s.isoformat(),
                                                  "end": (s + timedelta(hours=2)).isoformat()}, headers=lab.alice.headers)
        assert r.status_code == 201 and r.json()["state"] == "waiting", r.text
        return r.json()["id"]

    def body_for(method: str, path: str) -> dict | None:
        if path == "/api/v1/waitlist" and method == "POST":
            s = future(24 * 90) + timedelta(hours=2 * next(_slot))
            return {"count": 1, "duration": "PT1H", "start": s.isoformat(), "within": "PT2H"}
        if path == "/api/v1/me/password":
            return {"current_password": "not it", "new_password": "long enough"}
        if path == "/api/v1/notify-targets" and method == "POST":
            return {"url": "wecombot://abcdef0123"}
        if path == "/api/v1/me/notice-preferences" and method == "PUT":
            return {"waitlist": False}
        if path == "/api/v1/me/language":
            return {"language": "zh_CN"}
        if path == "/api/v1/users" and method == "POST":
            return {"username": f"new{next(seq)}"}
        if path.startswith("/api/v1/users/"):
            return {"display_name": "Renamed"}
        if path == "/api/v1/tokens" and method == "POST":
            return {"name": "t"}
        if path == "/api/v1/hosts" and method == "POST":
            return {"name": f"node-{next(seq)}"}
        if path.startswith("/api/v1/hosts/"):
            return {"grace_seconds": 30}
        if path.endswith("/move"):
            return {"host": "node-01"}
        if path.endswith("/clear-quarantine"):
            return {"note": "matrix"}
        if path.startswith("/api/v1/devices/"):
            return {"is_open": False}
        if path == "/api/v1/reservations" and method == "POST":
            s = future(24 * 20) + timedelta(hours=2 * next(_slot))
            return {"host": "node-01", "devices": [1], "start": s.isoformat(), "duration": "PT1H"}
        if path.startswith("/api/v1/reservations/") and method == "PATCH":
            return {"note": "changed"}
        if path.endswith("/managers"):
            return {"users": ["bob"]}
        if path == "/api/v1/maintenance":
            s = future(24 * 30) + timedelta(hours=2 * next(_slot))
            return {"host": "node-01", "devices": [2], "start": s.isoformat(), "end": (s + timedelta(hours=1)).isoformat(),
                    "reason": "matrix"}
        if path == "/api/v1/boosts" and method == "POST":
            return {"limit": "max_gpu_hours_month", "value": 200000 + next(seq), "reason": "matrix", "end": boost_end}
        if path == "/api/v1/agent/snapshots":
            return snapshot_body("node-01", next(seq), [gpu(u, i) for i, u in enumerate(lab.devices)])
        return None

    mismatches = []
    for method, template, expected in MATRIX:
        for actor in ACTORS:
            path = template.format(
                username="bob", token_id=fresh_token() if "{token_id}" in template else 0, name="node-01",
                uuid=lab.devices[3], reservation_id=fresh_reservation() if "{reservation_id}" in template else 0,
                finding_id=999, target_id=fresh_target() if "{target_id}" in template else 0,
                boost_id=fresh_boost() if "{boost_id}" in template else 0,
                entry_id=fresh_entry() if "{entry_id}" in template else 0,
            )
            r = client.request(method, path, json=body_for(method, template), headers=headers[actor])
            if r.status_code != expected[actor]:
                mismatches.append((method, template, actor, expected[actor], r.status_code, r.text[:160]))
    assert mismatches == []


def test_every_route_is_in_the_matrix(app):
    paths = app.openapi()["paths"]
    routes = {(m.upper(), p) for p, ops in paths.items() for m in ops if p.startswith("/api/v1/")}
    covered = {(m, p) for m, p, _ in MATRIX} | EXTRA_COVERED
    assert sorted(routes - covered) == []


# Routes whose authorization matrix lives in their own area's tests.
def _area_matrix() -> set[tuple[str, str]]:
    from tests.rules.test_authz import MATRIX as RULES_MATRIX  # rules, groups, series, feeds, sign-in

    return {(m, p) for m, p, _ in RULES_MATRIX}


EXTRA_COVERED: set[tuple[str, str]] = _area_matrix()
