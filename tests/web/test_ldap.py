"""LDAP sign-in against a real OpenLDAP (slapd on loopback, fixture directory below)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.db import run_in_transaction
from tests.conftest import IN_CI
from tests.web.conftest import csrf_of
from testkit.live import free_port
from testkit.slapd import SUFFIX, running_slapd, slapd_binary

pytestmark = pytest.mark.commits  # apps built per directory setting share the test's users through the database

SERVICE_DN = f"uid=gpuroster-svc,ou=services,{SUFFIX}"
DIRECTORY = f"""dn: {SUFFIX}
objectClass: dcObject
objectClass: organization
dc: lab
o: Lab

dn: ou=people,{SUFFIX}
objectClass: organizationalUnit
ou: people

dn: ou=groups,{SUFFIX}
objectClass: organizationalUnit
ou: groups

dn: ou=services,{SUFFIX}
objectClass: organizationalUnit
ou: services

dn: {SERVICE_DN}
objectClass: account
objectClass: simpleSecurityObject
uid: gpuroster-svc
userPassword: svc-secret

dn: uid=lina,ou=people,{SUFFIX}
objectClass: inetOrgPerson
objectClass: posixAccount
uid: lina
cn: Lina Wang
sn: Wang
mail: lina@lab.test
uidNumber: 2001
gidNumber: 2001
homeDirectory: /home/lina
userPassword: lina-password

dn: uid=omar,ou=people,{SUFFIX}
objectClass: inetOrgPerson
objectClass: posixAccount
uid: omar
cn: Omar Diaz
sn: Diaz
mail: omar@lab.test
uidNumber: 2002
gidNumber: 2002
homeDirectory: /home/omar
userPassword: omar-password

dn: cn=vision,ou=groups,{SUFFIX}
objectClass: posixGroup
cn: vision
gidNumber: 3001
memberUid: lina
memberUid: omar

dn: cn=gpu-admins,ou=groups,{SUFFIX}
objectClass: groupOfNames
cn: gpu-admins
member: uid=omar,ou=people,{SUFFIX}

dn: cn=vision-pi,ou=groups,{SUFFIX}
objectClass: posixGroup
cn: vision-pi
gidNumber: 3003
memberUid: lina

dn: cn=unmapped,ou=groups,{SUFFIX}
objectClass: posixGroup
cn: unmapped
gidNumber: 3002
memberUid: lina
"""


@pytest.fixture(scope="module")
def slapd(tmp_path_factory):
    if slapd_binary() is None:
        if IN_CI:
            pytest.fail("slapd is not installed: CI must run the LDAP tests (apt-get install slapd ldap-utils)")
        pytest.skip("slapd not installed (apt-get install slapd ldap-utils)")
    with running_slapd(tmp_path_factory.mktemp("slapd"), DIRECTORY, tls=True) as server:
        yield server


def ldap_settings(settings, url: str):
    return settings.model_copy(update={
        "ldap_url": url, "ldap_bind_dn": SERVICE_DN, "ldap_bind_password": "svc-secret",
        "ldap_user_base": f"ou=people,{SUFFIX}", "ldap_group_base": f"ou=groups,{SUFFIX}",
        "ldap_groups": {"vision": "vision-lab"}, "ldap_admin_group": "gpu-admins",
        "ldap_manager_groups": {"vision-pi": "vision-lab"},
    })


@pytest.fixture
def ldap_client(settings, slapd):
    from app.main import create_app

    app = create_app(ldap_settings(settings, slapd.url))
    with TestClient(app) as c:
        yield c


def post_login(c: TestClient, username: str, password: str):
    page = c.get("/login")
    return c.post("/login", data={"username": username, "password": password, "csrf_token": csrf_of(page.text),
                                  "next": "/profile"}, follow_redirects=False)


def users_by_name(client: TestClient):
    from app.models import Group, GroupMember, User

    with client.app.state.session_factory() as s:
        users = {u.username: u for u in s.scalars(select(User))}
        groups = {}
        for g, u in s.execute(select(Group.name, User.username).join(GroupMember, GroupMember.group_id == Group.id)
                              .join(User, User.id == GroupMember.user_id)):
            groups.setdefault(u, set()).add(g)
        return users, groups


def test_first_ldap_sign_in_provisions_the_account_with_uid_mail_and_mapped_groups(ldap_client):
    r = post_login(ldap_client, "lina", "lina-password")
    assert r.status_code == 303, r.text
    profile = ldap_client.get("/profile")
    assert profile.status_code == 200 and "lina@lab.test" in profile.text and "vision-lab" in profile.text
    users, groups = users_by_name(ldap_client)
    lina = users["lina"]
    assert (lina.email, lina.unix_uid, lina.unix_name, lina.display_name, lina.auth_source, lina.role) == (
        "lina@lab.test", 2001, "lina", "Lina Wang", "ldap", "member")
    assert lina.password_hash is None  # the directory keeps the password, not us
    assert groups["lina"] == {"vision-lab"}  # "unmapped" is not a gpuroster group


def test_directory_admin_group_makes_an_admin(ldap_client):
    assert post_login(ldap_client, "omar", "omar-password").status_code == 303
    users, _ = users_by_name(ldap_client)
    assert users["omar"].role == "admin" and users["omar"].unix_uid == 2002


@pytest.mark.parametrize("username,password", [("lina", "wrong"), ("nobody", "lina-password"), ("*", "lina-password"),
                                               ("lina", ""), ("lina)(uid=*", "x")])
def test_wrong_password_unknown_user_or_filter_injection_is_401(ldap_client, username, password):
    r = post_login(ldap_client, username, password)
    assert r.status_code == 401 and "wrong username or password" in r.text
    users, _ = users_by_name(ldap_client)
    assert users == {}


def test_group_membership_follows_the_directory_on_next_sign_in(ldap_client, slapd):
    assert post_login(ldap_client, "lina", "lina-password").status_code == 303
    # out of vision, and of vision-pi whose members manage (so also belong to) vision-lab
    for g in ("vision", "vision-pi"):
        slapd.modify(f"dn: cn={g},ou=groups,{SUFFIX}\nchangetype: modify\ndelete: memberUid\nmemberUid: lina\n")
    try:
        fresh = TestClient(ldap_client.app)
        assert post_login(fresh, "lina", "lina-password").status_code == 303
        _, groups = users_by_name(ldap_client)
        assert "vision-lab" not in groups.get("lina", set())
    finally:
        for g in ("vision", "vision-pi"):
            slapd.modify(f"dn: cn={g},ou=groups,{SUFFIX}\nchangetype: modify\nadd: memberUid\nmemberUid: lina\n")


def _managers(client: TestClient) -> dict[str, set[str]]:
    from app.models import Group, GroupMember, User

    with client.app.state.session_factory() as s:
        out: dict[str, set[str]] = {}
        for g, u in s.execute(select(Group.name, User.username).join(GroupMember, GroupMember.group_id == Group.id)
                              .join(User, User.id == GroupMember.user_id).where(GroupMember.is_manager.is_(True))):
            out.setdefault(u, set()).add(g)
        return out


def test_directory_manager_group_makes_a_group_manager_and_leaving_it_ends_the_role(ldap_client, slapd):
    assert post_login(ldap_client, "lina", "lina-password").status_code == 303
    assert post_login(TestClient(ldap_client.app), "omar", "omar-password").status_code == 303
    assert _managers(ldap_client) == {"lina": {"vision-lab"}}  # omar is a member of vision, not of vision-pi
    slapd.modify(f"dn: cn=vision-pi,ou=groups,{SUFFIX}\nchangetype: modify\ndelete: memberUid\nmemberUid: lina\n")
    try:
        assert post_login(TestClient(ldap_client.app), "lina", "lina-password").status_code == 303
        _, groups = users_by_name(ldap_client)
        assert _managers(ldap_client) == {} and groups["lina"] == {"vision-lab"}  # still a member through vision
    finally:
        slapd.modify(f"dn: cn=vision-pi,ou=groups,{SUFFIX}\nchangetype: modify\nadd: memberUid\nmemberUid: lina\n")


def test_directory_down_is_a_clear_503_and_local_admin_still_signs_in(settings, make_user):
    from app.main import create_app

    down = ldap_settings(settings, f"ldap://127.0.0.1:{free_port()}").model_copy(update={"ldap_timeout_seconds": 2})
    with TestClient(create_app(down)) as c:
        from app.services import users as user_service

        # a writer's transaction (BEGIN IMMEDIATE, retried): the apps' periodic sweeps write too
        run_in_transaction(c.app.state.session_factory,
                           lambda s: user_service.create_user(s, username="root-admin", password="local-password", admin=True))
        r = post_login(c, "lina", "lina-password")
        assert r.status_code == 503
        assert "Directory unavailable" in r.text and "unreachable" in r.text and "local accounts" in r.text
        assert post_login(c, "root-admin", "local-password").status_code == 303


def test_local_account_with_the_same_name_is_not_taken_over(ldap_client):
    from app.services import users as user_service

    run_in_transaction(ldap_client.app.state.session_factory,
                       lambda s: user_service.create_user(s, username="lina", password="local-password-1"))
    assert post_login(ldap_client, "lina", "lina-password").status_code == 401
    assert post_login(ldap_client, "lina", "local-password-1").status_code == 303


def test_api_tokens_keep_working_for_directory_accounts(ldap_client):
    from app.services import users as user_service

    assert post_login(ldap_client, "lina", "lina-password").status_code == 303
    plain = run_in_transaction(ldap_client.app.state.session_factory,
                               lambda s: user_service.create_api_token(s, user=user_service.get_user(s, "lina"))[1])
    r = TestClient(ldap_client.app).get("/api/v1/me", headers={"Authorization": f"Bearer {plain}"})
    assert r.status_code == 200 and r.json()["username"] == "lina"


@pytest.mark.parametrize("mode", ["starttls", "ldaps"])
def test_sign_in_over_starttls_and_ldaps_with_the_labs_ca(settings, slapd, mode):
    from app.main import create_app

    url = slapd.url if mode == "starttls" else slapd.ldaps_url
    conf = ldap_settings(settings, url).model_copy(update={"ldap_starttls": mode == "starttls", "ldap_ca_file": slapd.ca_file})
    with TestClient(create_app(conf)) as c:
        assert post_login(c, "lina", "lina-password").status_code == 303


def test_untrusted_directory_certificate_is_a_503_not_a_sign_in(settings, slapd):
    from app.main import create_app

    conf = ldap_settings(settings, slapd.url).model_copy(update={"ldap_starttls": True, "ldap_ca_file": None})
    with TestClient(create_app(conf)) as c:
        r = post_login(c, "lina", "lina-password")
        assert r.status_code == 503 and "Directory unavailable" in r.text
