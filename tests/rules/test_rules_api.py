"""Sharing rules over the API on both databases: administration, resolution, every limit,
the override path, B32, open devices, shares and usage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from tests.conftest import future, gpu, snapshot_body
from tests.rules.helpers import audit, book, group, rule, usage_of

BERLIN = ZoneInfo("Europe/Berlin")


def test_rules_crud_one_rule_per_target_and_admins_only(client, lab):
    r = client.post("/api/v1/rules", json={"scope": "default", "max_devices": 4}, headers=lab.admin.headers)
    assert r.status_code == 201, r.text
    rid = r.json()["id"]
    assert r.headers["location"] == f"/api/v1/rules/{rid}"
    dup = client.post("/api/v1/rules", json={"scope": "default", "max_devices": 2}, headers=lab.admin.headers)
    assert dup.status_code == 409 and dup.json()["rule_id"] == rid
    assert client.post("/api/v1/rules", json={"scope": "default"}, headers=lab.alice.headers).status_code == 403
    # members read the policy
    listed = client.get("/api/v1/rules", headers=lab.alice.headers).json()
    assert [x["max_devices"] for x in listed] == [4]
    r = client.patch(f"/api/v1/rules/{rid}", json={"max_devices": None, "max_duration_seconds": 3600}, headers=lab.admin.headers)
    assert r.status_code == 200 and r.json()["max_devices"] is None and r.json()["max_duration_seconds"] == 3600
    assert client.patch(f"/api/v1/rules/{rid}", json={"note": "x"}, headers=lab.bob.headers).status_code == 403
    assert client.delete(f"/api/v1/rules/{rid}", headers=lab.admin.headers).status_code == 200
    assert client.get(f"/api/v1/rules/{rid}", headers=lab.admin.headers).status_code == 404
    assert [a.detail.get("scope") for a in audit(client.app.state.session_factory, "rule.create")] == ["default"]


def test_bad_rule_input_gets_422_naming_the_field(client, lab):
    cases = [
        ({"scope": "user"}, "user"),
        ({"scope": "user", "user": "nobody"}, "user"),
        ({"scope": "group", "group": "nogroup"}, "group"),
        ({"scope": "default", "user": "alice"}, "scope"),
        ({"scope": "default", "allowed_hosts": []}, "allowed_hosts"),
        ({"scope": "default", "allowed_models": ["  "]}, "allowed_models"),
    ]
    for body, field in cases:
        r = client.post("/api/v1/rules", json=body, headers=lab.admin.headers)
        assert r.status_code == 422 and r.json()["field"] == field, (body, r.text)
    for body, field in [({"scope": "default", "max_devices": 0}, "max_devices"),
                        ({"scope": "everyone"}, "scope"),
                        ({"scope": "default", "max_gpu_hours_7d": -1}, "max_gpu_hours_7d"),
                        ({"scope": "default", "bogus": 1}, "bogus")]:
        r = client.post("/api/v1/rules", json=body, headers=lab.admin.headers)
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == field, (body, r.text)
    assert client.get("/api/v1/rules", headers=lab.admin.headers).json() == []


def test_most_specific_scope_wins_and_most_generous_group(client, lab, make_user):
    rule(client, lab.admin, scope="default", max_devices=1, max_duration_seconds=3600, allowed_models=["A100"])
    group(client, lab.admin, "vision", "alice")
    group(client, lab.admin, "nlp", "alice", "bob")
    rule(client, lab.admin, scope="group", group="vision", max_devices=2, allowed_models=["H100"])
    rule(client, lab.admin, scope="group", group="nlp", max_devices=3, max_duration_seconds=7200)
    carol = make_user("carol")

    a = usage_of(client, lab.alice)
    assert (a["max_devices"]["limit"], a["max_devices"]["scope"]) == (3, "group:nlp")  # most generous group
    assert set(a["allowed_models"]["limit"]) == {"H100"}  # the only group that sets it
    assert a["max_duration_seconds"]["limit"] == 7200
    b = usage_of(client, lab.bob)
    assert (b["max_devices"]["limit"], b["allowed_models"]["limit"], b["allowed_models"]["scope"]) == (3, ["A100"], "default")
    c = usage_of(client, carol)
    assert (c["max_devices"]["limit"], c["max_devices"]["scope"]) == (1, "default")

    # a user rule wins even when it is stricter; limits it does not set are inherited
    rule(client, lab.admin, scope="user", user="alice", max_devices=1)
    a = usage_of(client, lab.alice)
    assert (a["max_devices"]["limit"], a["max_devices"]["scope"]) == (1, "user")
    assert a["max_duration_seconds"]["scope"] == "group:nlp"
    # both groups set a list: the union is the most generous
    nlp_rule = [x for x in client.get("/api/v1/rules", headers=lab.admin.headers).json() if x["group"] == "nlp"][0]
    client.patch(f"/api/v1/rules/{nlp_rule['id']}", json={"allowed_models": ["A100"]}, headers=lab.admin.headers)
    assert set(usage_of(client, lab.alice)["allowed_models"]["limit"]) == {"A100", "H100"}


def test_max_devices_refusal_names_rule_limit_and_what_is_left(client, lab):
    rule(client, lab.admin, scope="default", max_devices=3)
    start = future(30)
    first = book(client, lab.alice, [0, 1], start, start + timedelta(hours=4))
    assert first.status_code == 201
    r = book(client, lab.alice, [2, 3], start + timedelta(hours=1), duration="PT1H")
    assert r.status_code == 403, r.text
    doc = r.json()
    assert doc["type"] == "/problems/rule-violation"
    assert (doc["rule"], doc["limit"], doc["used"], doc["left"]) == ("max_devices", 3, 2, 1)
    until = (start + timedelta(hours=4)).astimezone(BERLIN).strftime("%H:%M")
    assert "you hold 2 of 3 devices until" in doc["detail"] and until in doc["detail"], doc["detail"]
    assert "1 left" in doc["detail"]
    assert book(client, lab.alice, [2], start + timedelta(hours=1), duration="PT1H").status_code == 201
    # after the first reservation ends, 3 at once are fine; bob has his own count
    assert book(client, lab.alice, [0, 1, 2], start + timedelta(hours=4), duration="PT1H").status_code == 201
    assert book(client, lab.bob, [3], start + timedelta(hours=1), duration="PT1H").status_code == 201


def test_length_ahead_concurrency_hosts_and_models(client, lab, make_host):
    rule(client, lab.admin, scope="default", max_duration_seconds=4 * 3600, max_ahead_seconds=7 * 86400,
         max_concurrent_reservations=1, allowed_hosts=["node-01"], allowed_models=["A100"])
    r = book(client, lab.alice, [0], future(2), duration="PT5H")
    assert r.status_code == 403 and r.json()["rule"] == "max_duration_seconds" and "limit of 4 h" in r.json()["detail"]
    r = book(client, lab.alice, [0], future(8 * 24), duration="PT1H")
    assert r.status_code == 403 and r.json()["rule"] == "max_ahead_seconds"
    s = future(3)
    assert book(client, lab.alice, [0], s, duration="PT2H").status_code == 201
    r = book(client, lab.alice, [1], s + timedelta(hours=1), duration="PT2H")
    assert r.status_code == 403 and r.json()["rule"] == "max_concurrent_reservations"
    assert r.json()["used"] == 1 and r.json()["left"] == 0
    # another host, another model
    h = make_host("node-02")
    client.post("/api/v1/agent/snapshots", headers=h.headers, json=snapshot_body(
        "node-02", 1, [gpu("GPU-h100-0000-0000-0000-000000000000", 0, "NVIDIA H100 80GB HBM3")]))
    r = book(client, lab.bob, [0], future(5), host="node-02")
    assert r.status_code == 403 and r.json()["rule"] == "allowed_hosts"
    rules = client.get("/api/v1/rules", headers=lab.admin.headers).json()
    client.patch(f"/api/v1/rules/{rules[0]['id']}", json={"allowed_hosts": None}, headers=lab.admin.headers)
    r = book(client, lab.bob, [0], future(5), host="node-02")
    assert r.status_code == 403 and r.json()["rule"] == "allowed_models" and "H100" in r.json()["detail"]


def test_gpu_hours_per_7_days_refusal_shows_used_and_left(client, lab):
    rule(client, lab.admin, scope="default", max_gpu_hours_7d=10)
    s = future(48)
    assert book(client, lab.alice, [0, 1], s, duration="PT4H").status_code == 201  # 8 GPU-hours
    r = book(client, lab.alice, [2], s + timedelta(hours=5), duration="PT3H")
    assert r.status_code == 403
    doc = r.json()
    assert (doc["rule"], doc["limit"], doc["used"], doc["left"]) == ("max_gpu_hours_7d", 10, 8, 2)
    assert "8 of 10 GPU-hours" in doc["detail"] and "2 left" in doc["detail"] and "Europe/Berlin" in doc["detail"]
    assert book(client, lab.alice, [2], s + timedelta(hours=5), duration="PT2H").status_code == 201
    # fourteen days later the rolling window is empty again
    assert book(client, lab.alice, [2], s + timedelta(days=14), duration="PT3H").status_code == 201


def test_admin_override_is_recorded_with_its_reason(client, lab, session_factory):
    rule(client, lab.admin, scope="default", max_duration_seconds=8 * 3600)
    s = future(10)
    r = book(client, lab.alice, [0], s, duration="P2D", override_reason="mine")
    assert r.status_code == 403 and r.json()["field"] == "override_reason"
    r = book(client, lab.admin, [0], s, duration="P2D", user="alice", override_reason="paper deadline")
    assert r.status_code == 201, r.text
    assert r.json()["override_reason"] == "paper deadline"
    [entry] = audit(session_factory, "rule.override")
    assert entry.actor == "user:boss" and entry.detail["reason"] == "paper deadline"
    assert entry.detail["rules"][0]["rule"] == "max_duration_seconds" and entry.detail["owner"] == "alice"


def test_b32_note_only_edit_200_admin_extension_200_user_extension_403(client, lab, session_factory):
    rule(client, lab.admin, scope="default", max_duration_seconds=8 * 3600)
    s = future(20)
    r = book(client, lab.admin, [1], s, duration="P2D", user="alice", override_reason="2-day run agreed")
    assert r.status_code == 201
    rid, end = r.json()["id"], datetime.fromisoformat(r.json()["end"])
    r = client.patch(f"/api/v1/reservations/{rid}", json={"note": "new title"}, headers=lab.alice.headers)
    assert r.status_code == 200 and r.json()["note"] == "new title"
    r = client.patch(f"/api/v1/reservations/{rid}", headers=lab.admin.headers,
                     json={"end": (end + timedelta(hours=1)).isoformat()})  # admins unlimited, no reason needed
    assert r.status_code == 200, r.text
    r = client.patch(f"/api/v1/reservations/{rid}", json={"end": (end + timedelta(hours=2)).isoformat()}, headers=lab.alice.headers)
    assert r.status_code == 403 and r.json()["rule"] == "max_duration_seconds" and r.json()["limit"] == 8 * 3600
    # shortening never breaks a rule that the reservation already exceeds
    r = client.patch(f"/api/v1/reservations/{rid}", json={"end": (end - timedelta(hours=1)).isoformat()}, headers=lab.alice.headers)
    assert r.status_code == 200
    overrides = audit(session_factory, "rule.override")
    assert [e.target for e in overrides] == ["user:alice", f"reservation:{rid}"]
    assert overrides[1].detail["reason"] == "(admin, no reason given)"


def test_note_and_share_edits_are_never_refused_by_rules_tightened_later(client, lab):
    s = future(6)
    rid = book(client, lab.alice, [0, 1, 2], s, duration="PT6H").json()["id"]
    rule(client, lab.admin, scope="default", max_devices=1, max_duration_seconds=3600, max_gpu_hours_7d=1)
    group(client, lab.admin, "team", "bob")
    r = client.patch(f"/api/v1/reservations/{rid}", json={"note": "still mine", "share_with": ["bob", "group:team"]},
                     headers=lab.alice.headers)
    assert r.status_code == 200, r.text
    assert r.json()["shared_with"] == ["bob", "group:team"]
    assert client.patch(f"/api/v1/reservations/{rid}", json={"share_with": ["bob"]}, headers=lab.bob.headers).status_code == 403
    r = client.patch(f"/api/v1/reservations/{rid}", json={"share_with": ["nobody"]}, headers=lab.alice.headers)
    assert r.status_code == 422 and r.json()["field"] == "share_with"
    assert client.get(f"/api/v1/reservations/{rid}", headers=lab.bob.headers).json()["shared_with"] == ["bob", "group:team"]
    same = client.patch(f"/api/v1/reservations/{rid}", json={"share_with": ["group:team", "bob"]}, headers=lab.alice.headers)
    assert same.status_code == 200 and len(audit(client.app.state.session_factory, "reservation.share")) == 1
    # the agent's table carries the share
    ack = client.post("/api/v1/agent/snapshots", headers=lab.host.headers, json=snapshot_body(
        "node-01", 2, [gpu(u, i) for i, u in enumerate(lab.devices)])).json()
    entry = [e for e in ack["reservations"] if e["id"] == rid][0]
    assert "bob" in entry["shared_with"]
    r = client.patch(f"/api/v1/reservations/{rid}", json={"share_with": []}, headers=lab.alice.headers)
    assert r.status_code == 200 and r.json()["shared_with"] == []


def test_open_devices_are_set_listed_sent_to_the_agent_and_not_bookable(client, lab):
    r = client.post("/api/v1/rules/open-devices", json={"devices": [lab.devices[3]]}, headers=lab.admin.headers)
    assert r.status_code == 200 and r.json()[0]["is_open"] is True and r.json()[0]["host"] == "node-01"
    assert client.post("/api/v1/rules/open-devices", json={"devices": [lab.devices[2]]}, headers=lab.alice.headers).status_code == 403
    r = client.post("/api/v1/rules/open-devices", json={"devices": ["GPU-nope"]}, headers=lab.admin.headers)
    assert r.status_code == 404 and r.json()["field"] == "devices"
    assert [d["uuid"] for d in client.get("/api/v1/rules/open-devices", headers=lab.bob.headers).json()] == [lab.devices[3]]
    ack = client.post("/api/v1/agent/snapshots", headers=lab.host.headers, json=snapshot_body(
        "node-01", 2, [gpu(u, i) for i, u in enumerate(lab.devices)])).json()
    assert ack["open_devices"] == [lab.devices[3]]
    r = book(client, lab.alice, [3], future(4))
    assert r.status_code == 403 and r.json()["rule"] == "open_devices"
    # placement never picks it
    r = client.post("/api/v1/reservations", headers=lab.alice.headers,
                    json={"count": 3, "host": "node-01", "start": "asap", "duration": "PT1H"})
    assert r.status_code == 201 and lab.devices[3] not in [d["uuid"] for d in r.json()["devices"]]
    r = client.delete(f"/api/v1/rules/open-devices/{lab.devices[3]}", headers=lab.admin.headers)
    assert r.status_code == 200 and r.json()["is_open"] is False
    assert book(client, lab.alice, [3], future(4)).status_code == 201


def test_usage_shows_each_limit_used_and_left(client, lab):
    rule(client, lab.admin, scope="default", max_devices=4, max_gpu_hours_7d=20, max_concurrent_reservations=3,
         max_duration_seconds=8 * 3600)
    r = book(client, lab.alice, [0, 1], "now", duration="PT2H")
    assert r.status_code == 201
    doc = client.get("/api/v1/me/usage", headers=lab.alice.headers).json()
    assert doc["timezone"] == "Europe/Berlin"
    u = {i["rule"]: i for i in doc["limits"]}
    assert (u["max_devices"]["used"], u["max_devices"]["left"]) == (2, 2)
    assert (u["max_concurrent_reservations"]["used"], u["max_concurrent_reservations"]["left"]) == (1, 2)
    # the window is the 7 calendar days ending tonight (lab zone): a booking past midnight counts up to it
    in_window = min(2.0, (datetime.fromisoformat(doc["window"]["end"]) - datetime.fromisoformat(r.json()["start"]))
                    .total_seconds() / 3600)
    used = 2 * in_window
    assert abs(u["max_gpu_hours_7d"]["used"] - used) < 0.05 and abs(u["max_gpu_hours_7d"]["left"] - (20 - used)) < 0.05
    assert u["max_duration_seconds"]["limit"] == 8 * 3600 and u["max_duration_seconds"]["used"] is None
    assert u["allowed_hosts"]["limit"] is None and u["allowed_hosts"]["detail"] == "any"
    window = doc["window"]
    start = datetime.fromisoformat(window["start"]).astimezone(BERLIN)
    assert (start.hour, start.minute) == (0, 0)
    assert datetime.fromisoformat(window["end"]) > datetime.now(UTC)
    # admins may look at someone else's usage, members may not
    assert client.get("/api/v1/me/usage", params={"user": "alice"}, headers=lab.admin.headers).json()["user"] == "alice"
    assert client.get("/api/v1/me/usage", params={"user": "alice"}, headers=lab.bob.headers).status_code == 403


def test_groups_api(client, lab):
    g = group(client, lab.admin, "vision", "alice")
    assert g["members"] == ["alice"]
    assert client.post("/api/v1/groups", json={"name": "vision"}, headers=lab.admin.headers).status_code == 409
    r = client.post("/api/v1/groups", json={"name": "Bad Name"}, headers=lab.admin.headers)
    assert r.status_code == 422 and r.json()["field"] == "name"
    r = client.post("/api/v1/groups", json={"name": "x", "members": ["ghost"]}, headers=lab.admin.headers)
    assert r.status_code == 422 and r.json()["field"] == "members"
    assert client.post("/api/v1/groups", json={"name": "mine"}, headers=lab.alice.headers).status_code == 403
    r = client.post("/api/v1/groups/vision/members", json={"users": ["bob", "alice"]}, headers=lab.admin.headers)
    assert r.status_code == 200 and r.json()["members"] == ["alice", "bob"]
    assert client.get("/api/v1/me", headers=lab.bob.headers).json()["groups"] == ["vision"]
    r = client.delete("/api/v1/groups/vision/members/alice", headers=lab.admin.headers)
    assert r.json()["members"] == ["bob"]
    assert client.delete("/api/v1/groups/vision/members/alice", headers=lab.admin.headers).status_code == 404
    rule(client, lab.admin, scope="group", group="vision", max_devices=2)
    assert client.delete("/api/v1/groups/vision", headers=lab.admin.headers).status_code == 200
    assert client.get("/api/v1/rules", headers=lab.admin.headers).json() == []  # its rule went with it
    assert client.get("/api/v1/groups", headers=lab.alice.headers).json() == []


def test_password_sign_in_for_the_cli_is_throttled(client, lab, make_user, settings):
    make_user("dora", password="correct horse")
    r = client.post("/api/v1/auth/token", json={"username": "dora", "password": "correct horse", "name": "laptop"})
    assert r.status_code == 201, r.text
    token = r.json()["token"]
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).json()["username"] == "dora"
    for _ in range(settings.login_max_attempts):
        r = client.post("/api/v1/auth/token", json={"username": "dora", "password": "wrong"})
        assert r.status_code == 401 and r.json()["detail"] == "wrong username or password"
    r = client.post("/api/v1/auth/token", json={"username": "dora", "password": "correct horse"})
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
    # unknown users answer like wrong passwords
    assert client.post("/api/v1/auth/token", json={"username": "ghost", "password": "x"}).status_code == 401
    r = client.post("/api/v1/auth/token", json={"username": "dora"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "password"


def test_an_extension_is_judged_where_the_added_time_falls(client, lab):
    s = future(40)
    assert book(client, lab.alice, [0, 1], s, s + timedelta(hours=2)).status_code == 201
    rid = book(client, lab.alice, [2], s, s + timedelta(hours=3)).json()["id"]
    rule(client, lab.admin, scope="default", max_devices=2)  # tightened after booking: 3 at once until s+2h
    r = client.patch(f"/api/v1/reservations/{rid}", json={"end": (s + timedelta(hours=4)).isoformat()}, headers=lab.alice.headers)
    assert r.status_code == 200, r.text  # the added hour holds 1 device
    other = book(client, lab.alice, [3], s + timedelta(hours=4), s + timedelta(hours=6)).json()["id"]
    r = client.patch(f"/api/v1/reservations/{rid}", json={"end": (s + timedelta(hours=5)).isoformat()}, headers=lab.alice.headers)
    assert r.status_code == 200  # 2 at once in the added hour: within the limit
    assert client.delete(f"/api/v1/reservations/{other}", headers=lab.alice.headers).status_code == 200
    assert book(client, lab.alice, [0, 3], s + timedelta(hours=5), s + timedelta(hours=6)).status_code == 201
    r = client.patch(f"/api/v1/reservations/{rid}", json={"end": (s + timedelta(hours=6)).isoformat()}, headers=lab.alice.headers)
    assert r.status_code == 403 and r.json()["rule"] == "max_devices" and r.json()["used"] == 2
