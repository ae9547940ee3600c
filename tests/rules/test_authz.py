"""Authorization matrix of the rules, groups, usage, availability, series, sign-in and feed
routes: every route against anonymous, member (owner), other member, admin, host token and
another host's token; and every route of ``app.api.rules`` / ``app.api.feeds`` has a row."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from tests.rules.helpers import group

ACTORS = ("anon", "alice", "bob", "admin", "host", "other_host")
USER = (401, 200, 200, 200, 403, 403)  # any signed-in user
ADMIN = (401, 403, 403, 200, 403, 403)
ADMIN_CREATE = (401, 403, 403, 201, 403, 403)
OPEN = (200, 200, 200, 200, 200, 200)  # the secret is in the URL or the body

MATRIX = [
    ("GET", "/api/v1/rules/open-devices", USER),
    ("POST", "/api/v1/rules/open-devices", ADMIN),
    ("DELETE", "/api/v1/rules/open-devices/{uuid}", ADMIN),
    ("GET", "/api/v1/rules", USER),
    ("POST", "/api/v1/rules", ADMIN_CREATE),
    ("GET", "/api/v1/rules/{rule_id}", USER),
    ("PATCH", "/api/v1/rules/{rule_id}", ADMIN),
    ("DELETE", "/api/v1/rules/{rule_id}", ADMIN),
    ("GET", "/api/v1/groups", USER),
    ("POST", "/api/v1/groups", ADMIN_CREATE),
    ("GET", "/api/v1/groups/{name}", USER),
    ("DELETE", "/api/v1/groups/{name}", ADMIN),
    ("POST", "/api/v1/groups/{name}/members", ADMIN),
    ("DELETE", "/api/v1/groups/{name}/members/{username}", ADMIN),
    ("GET", "/api/v1/me/usage", USER),
    ("GET", "/api/v1/availability", USER),
    ("POST", "/api/v1/series", (401, 201, 201, 201, 403, 403)),
    ("GET", "/api/v1/series", USER),
    ("GET", "/api/v1/series/{series_id}", USER),
    ("DELETE", "/api/v1/series/{series_id}", (401, 200, 403, 200, 403, 403)),
    ("POST", "/api/v1/auth/token", (201,) * 6),
    ("GET", "/api/v1/feeds/users/{token}.ics", OPEN),
    ("GET", "/api/v1/feeds/hosts/{token}.ics", OPEN),
    ("GET", "/api/v1/me/feed", USER),
    ("POST", "/api/v1/me/feed/rotate", USER),
    ("GET", "/api/v1/hosts/{name}/feed", USER),
    ("POST", "/api/v1/hosts/{name}/feed/rotate", ADMIN),
]


def test_authorization_matrix_of_the_rules_area(client, lab, make_host, make_user):
    other = make_host("node-99")
    make_user("dora", password="correct horse")
    headers = {"anon": {}, "alice": lab.alice.headers, "bob": lab.bob.headers, "admin": lab.admin.headers,
               "host": lab.host.headers, "other_host": other.headers}
    seq = itertools.count(1)
    week = itertools.count(1)

    def fresh_group(*members: str) -> str:
        return group(client, lab.admin, f"g{next(seq)}", *members)["name"]

    def fresh_rule() -> int:
        r = client.post("/api/v1/rules", json={"scope": "group", "group": fresh_group(), "max_devices": 2},
                        headers=lab.admin.headers)
        return r.json()["id"]

    def fresh_series() -> int:
        start = datetime.now(UTC).date() + timedelta(days=400 + 7 * next(week))
        r = client.post("/api/v1/series", headers=lab.alice.headers, json={
            "host": "node-01", "devices": [2], "freq": "daily", "start_date": start.isoformat(), "start_time": "10:00",
            "duration": "PT1H", "count": 2})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def url_path(url: str) -> str:
        return urlsplit(url).path

    def resolve(method: str, template: str) -> tuple[str, dict | None, dict | None]:
        body = params = None
        values: dict[str, object] = {"uuid": lab.devices[3], "name": "node-01" if "/hosts/" in template else "base",
                                     "username": "bob"}
        if template == "/api/v1/rules/open-devices" and method == "POST":
            body = {"devices": [lab.devices[3]]}
        if "{rule_id}" in template:
            values["rule_id"] = fresh_rule()
            body = {"max_devices": 3} if method == "PATCH" else None
        if template.startswith("/api/v1/groups/{name}"):
            values["name"] = fresh_group("bob") if method == "DELETE" else "base"
            if method == "POST":
                body = {"users": ["alice"]}
        if template == "/api/v1/groups" and method == "POST":
            body = {"name": f"new{next(seq)}"}
        if template == "/api/v1/rules" and method == "POST":
            body = {"scope": "group", "group": fresh_group(), "max_devices": 1}
        if template == "/api/v1/availability":
            params = {"count": 1, "duration": "1h"}
        if template == "/api/v1/series" and method == "POST":
            start = datetime.now(UTC).date() + timedelta(days=30 + 7 * next(week))
            body = {"host": "node-01", "devices": [1], "freq": "weekly", "start_date": start.isoformat(),
                    "start_time": "09:00", "duration": "PT1H", "count": 1}
        if "{series_id}" in template:
            values["series_id"] = fresh_series()
        if template == "/api/v1/auth/token":
            body = {"username": "dora", "password": "correct horse"}
        if template == "/api/v1/feeds/users/{token}.ics":
            return url_path(client.post("/api/v1/me/feed/rotate", headers=lab.alice.headers).json()["url"]), None, None
        if template == "/api/v1/feeds/hosts/{token}.ics":
            return url_path(client.post("/api/v1/hosts/node-01/feed/rotate", headers=lab.admin.headers).json()["url"]), None, None
        return template.format(**values), body, params

    group(client, lab.admin, "base", "bob")
    mismatches = []
    for method, template, expected in MATRIX:
        for actor, status in zip(ACTORS, expected, strict=True):
            path, body, params = resolve(method, template)
            r = client.request(method, path, json=body, params=params, headers=headers[actor])
            if r.status_code != status:
                mismatches.append((method, template, actor, status, r.status_code, r.text[:160]))
    assert mismatches == []


def test_every_route_of_the_area_has_a_row():
    from app.api import feeds, rules

    routes = {(m, r.path) for r in [*rules.router.routes, *feeds.router.routes] for m in r.methods}
    assert routes == {(m, p) for m, p, _ in MATRIX}
