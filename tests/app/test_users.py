"""Admin changes to users and hosts over the API (the same services the admin page uses)."""

from __future__ import annotations


def test_admin_changes_a_user_with_the_rules_named(client, lab, session_factory):
    r = client.patch("/api/v1/users/alice", json={"unix_name": "bob"}, headers=lab.admin.headers)
    assert r.status_code == 409 and r.json()["field"] == "unix_name"
    r = client.patch("/api/v1/users/boss", json={"role": "member"}, headers=lab.admin.headers)
    assert r.status_code == 403 and "demote" in r.json()["detail"]
    r = client.patch("/api/v1/users/alice", json={"email": "not-an-address"}, headers=lab.admin.headers)
    assert r.status_code == 422 and r.json()["field"] == "email"
    r = client.patch("/api/v1/users/alice", json={"unix_name": "alice2", "email": "a@lab.example", "role": "admin",
                                                  "password": "a long password"}, headers=lab.admin.headers)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["unix_name"], body["email"], body["role"]) == ("alice2", "a@lab.example", "admin")
    r = client.post("/api/v1/auth/token", json={"username": "alice", "password": "a long password"})
    assert r.status_code == 201
    r = client.patch("/api/v1/users/alice", json={"active": False}, headers=lab.admin.headers)
    assert r.status_code == 200 and r.json()["active"] is False
    assert client.get("/api/v1/me", headers=lab.alice.headers).status_code == 401  # deactivated: tokens stop working


def test_admin_sets_host_policy(client, lab):
    r = client.patch("/api/v1/hosts/node-01", json={"policy": "terminate", "grace_seconds": 30, "exempt_users": ["svc"]},
                     headers=lab.admin.headers)
    assert r.status_code == 200
    assert (r.json()["policy"], r.json()["grace_seconds"], r.json()["exempt_users"]) == ("terminate", 30, ["svc"])
    r = client.patch("/api/v1/hosts/node-01", json={"policy": "shoot"}, headers=lab.admin.headers)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "policy"
    ack = client.post("/api/v1/agent/snapshots", json={"host": "node-01", "seq": 99, "collected_at": "2030-01-01T00:00:00Z"},
                      headers=lab.host.headers).json()
    assert ack["policy"]["policy"] == "terminate" and ack["policy"]["grace_seconds"] == 30
