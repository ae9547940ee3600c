"""The admin page: users, groups, hosts and devices; members get a 403 page; on both databases."""

from __future__ import annotations

import html
import re

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.models import Device, Group, GroupMember, Host, User
from tests.conftest import gpu, snapshot_body
from tests.web.conftest import PASSWORD, count, sign_in


def test_members_get_a_403_page_for_admin_pages_and_posts(weblab, session_factory):
    r = weblab.alice.get("/admin")
    assert r.status_code == 403 and "<html" in r.text and "admins only" in r.text
    r = weblab.alice.post("/admin/users", {"username": "sneaky", "password": PASSWORD})
    assert r.status_code == 403
    assert count(session_factory, User, User.username == "sneaky") == 0
    assert 'href="/admin"' not in weblab.alice.get("/").text
    assert 'href="/admin"' in weblab.admin.get("/").text


def test_admin_creates_a_user_who_can_sign_in(weblab, app, session_factory):
    r = weblab.admin.post("/admin/users", {"username": "carol", "unix_name": "cdoe", "email": "carol@lab.example",
                                           "password": PASSWORD, "display_name": "Carol Doe"})
    assert r.status_code == 303 and r.headers["location"] == "/admin?done=user-created#users"
    assert "User created." in weblab.admin.get(r.headers["location"]).text
    with session_factory() as s:
        u = s.scalar(select(User).where(User.username == "carol"))
        assert u.unix_name == "cdoe" and u.role == "member" and u.active
    with TestClient(app) as c:
        sign_in(c, "carol")
        assert "carol" in c.get("/profile").text


@pytest.mark.parametrize(
    "data, status, message",
    [
        ({"username": "alice", "password": PASSWORD}, 409, "username: 'alice' is already taken"),
        ({"username": "Bad Name", "password": PASSWORD}, 422, "username: 'Bad Name' must start with"),
        ({"username": "dave", "password": "short"}, 422, "password: at least 8 characters"),
        ({"username": "dave", "email": "nope"}, 422, "email: not an e-mail address"),
    ],
)
def test_bad_user_input_is_named_and_nothing_is_written(weblab, session_factory, data, status, message):
    before = count(session_factory, User)
    r = weblab.admin.post("/admin/users", data)
    assert r.status_code == status and message in html.unescape(r.text)
    assert count(session_factory, User) == before


def test_role_unix_name_and_deactivation(weblab, session_factory):
    r = weblab.admin.post("/admin/users/alice", {"role": "admin", "unix_name": "alice2"})
    assert r.status_code == 303
    r = weblab.admin.post("/admin/users/bob", {"unix_name": "alice2", "role": "member"})
    assert r.status_code == 409 and "unix_name: &#39;alice2&#39; is already taken" in r.text
    r = weblab.admin.post("/admin/users/bob", {"active": "0"})
    assert r.status_code == 303
    with session_factory() as s:
        alice = s.scalar(select(User).where(User.username == "alice"))
        bob = s.scalar(select(User).where(User.username == "bob"))
        assert alice.role == "admin" and alice.unix_name == "alice2" and not bob.active
    assert weblab.bob.get("/", follow_redirects=False).status_code == 303  # deactivated: signed out
    r = weblab.admin.post("/admin/users/boss", {"active": "0"})
    assert r.status_code == 403 and "cannot deactivate or demote themselves" in r.text


def test_groups_create_add_and_remove_members(weblab, session_factory):
    r = weblab.admin.post("/admin/groups", {"name": "vision", "description": "CV team", "members": "alice"})
    assert r.status_code == 303
    assert weblab.admin.post("/admin/groups/vision/members", {"users": "bob, alice"}).status_code == 303
    page = weblab.admin.get("/admin").text
    assert "<strong>vision</strong>" in page and "CV team" in page
    with session_factory() as s:
        gid = s.scalar(select(Group.id).where(Group.name == "vision"))
        assert count(session_factory, GroupMember, GroupMember.group_id == gid) == 2
    assert weblab.admin.post("/admin/groups/vision/members/remove", {"user": "bob"}).status_code == 303
    assert count(session_factory, GroupMember, GroupMember.group_id == gid) == 1
    r = weblab.admin.post("/admin/groups/vision/members", {"users": "nobody"})
    assert r.status_code == 422 and "users: no user &#39;nobody&#39;" in r.text
    r = weblab.admin.post("/admin/groups", {"name": "vision"})
    assert r.status_code == 409 and "already exists" in r.text
    assert "vision" in weblab.alice.get("/profile").text


def test_add_host_shows_its_token_once_and_the_agent_can_use_it(weblab, client):
    r = weblab.admin.post("/admin/hosts", {"name": "node-02"})
    assert r.status_code == 201 and r.headers["cache-control"] == "no-store"
    token = re.search(r'<pre class="copy" id="host-token">(gph_[^<]+)</pre>', r.text).group(1)
    body = snapshot_body("node-02", 1, [gpu("GPU-node02-0", 0)])
    assert client.post("/api/v1/agent/snapshots", json=body, headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert token not in weblab.admin.get("/admin").text
    r = weblab.admin.post("/admin/hosts", {"name": "node-02"})
    assert r.status_code == 409 and "already exists" in r.text


def test_host_policy_grace_and_exempt_lists(weblab, session_factory):
    r = weblab.admin.post("/admin/hosts/node-01", {"policy": "terminate", "grace_seconds": "120",
                                                  "exempt_users": "root, backup", "exempt_process_names": "Xorg dcgm-exporter"})
    assert r.status_code == 303
    with session_factory() as s:
        h = s.scalar(select(Host).where(Host.name == "node-01"))
        assert (h.policy, h.grace_seconds, h.exempt_users, h.exempt_process_names) == (
            "terminate", 120, ["root", "backup"], ["Xorg", "dcgm-exporter"])
    for data, message in (({"policy": "nuke"}, "policy:"), ({"grace_seconds": "soon"}, "grace_seconds: &#39;soon&#39; is not"),
                          ({"grace_seconds": "-1"}, "grace_seconds:")):
        r = weblab.admin.post("/admin/hosts/node-01", {"policy": "notify", **data})
        assert r.status_code == 422 and message in r.text
    with session_factory() as s:
        assert s.scalar(select(Host.policy).where(Host.name == "node-01")) == "terminate"


def test_retired_device_leaves_now_and_booking(weblab, session_factory):
    uuid = weblab.devices[3]
    r = weblab.admin.post("/admin/devices", {"uuid": uuid, "retired": "1"})
    assert r.status_code == 303
    assert uuid not in weblab.alice.get("/").text and uuid not in weblab.alice.get("/book").text
    assert "Bring back" in weblab.admin.get("/admin").text
    with session_factory() as s:
        assert s.scalar(select(Device.retired_at).where(Device.uuid == uuid)) is not None
    r = weblab.admin.post("/admin/devices", {"uuid": "GPU-none", "retired": "1"})
    assert r.status_code == 404 and "device &#39;GPU-none&#39; not found" in r.text
