"""``gpuroster serve``: one worker by default; several on SQLite get a note saying why not;
links in notices point where the server listens unless ``GPUROSTER_BASE_URL`` says otherwise."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner


@pytest.fixture
def started(monkeypatch):
    import uvicorn

    calls: list[dict] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: calls.append(kw))
    return calls


def _serve(monkeypatch, url: str, *args: str, base_url: str | None = None):
    from app.cli import cli

    monkeypatch.setenv("GPUROSTER_DATABASE_URL", url)
    # set or unset here, restored after the test (also when serve sets it)
    if base_url is None:
        monkeypatch.delenv("GPUROSTER_BASE_URL", raising=False)
    else:
        monkeypatch.setenv("GPUROSTER_BASE_URL", base_url)
    from app.config import get_settings

    get_settings.cache_clear()
    try:
        return CliRunner().invoke(cli, ["serve", "--no-migrate", *args])
    finally:
        get_settings.cache_clear()


def test_sqlite_serves_one_worker_by_default_without_a_note(monkeypatch, started, tmp_path):
    r = _serve(monkeypatch, f"sqlite:///{tmp_path / 'a.db'}")
    assert r.exit_code == 0, r.output
    assert started[0]["workers"] == 1
    assert "note:" not in r.output


def test_several_workers_on_sqlite_get_a_note(monkeypatch, started, tmp_path):
    r = _serve(monkeypatch, f"sqlite:///{tmp_path / 'a.db'}", "--workers", "2")
    assert r.exit_code == 0, r.output
    assert started[0]["workers"] == 2  # still honoured
    assert "single write lock" in r.output


def test_several_workers_on_postgresql_get_no_note(monkeypatch, started):
    r = _serve(monkeypatch, "postgresql://u@127.0.0.1:5432/x", "--workers", "3")
    assert r.exit_code == 0, r.output
    assert started[0]["workers"] == 3
    assert "note:" not in r.output


def test_links_point_where_the_server_listens(monkeypatch, started, tmp_path):
    import os

    from app.config import Settings

    r = _serve(monkeypatch, f"sqlite:///{tmp_path / 'a.db'}", "--port", "9123")
    assert r.exit_code == 0, r.output
    assert os.environ["GPUROSTER_BASE_URL"] == "http://127.0.0.1:9123"  # what uvicorn's workers read
    assert Settings().base_url == "http://127.0.0.1:9123"
    assert "links in notices point to http://127.0.0.1:9123" in r.output


def test_an_admins_base_url_is_kept(monkeypatch, started, tmp_path):
    import os

    r = _serve(monkeypatch, f"sqlite:///{tmp_path / 'a.db'}", "--port", "9123", base_url="https://gpus.lab.example")
    assert r.exit_code == 0, r.output
    assert os.environ["GPUROSTER_BASE_URL"] == "https://gpus.lab.example"
    assert "links in notices" not in r.output


@pytest.mark.parametrize("host, expected", [
    ("127.0.0.1", "http://127.0.0.1:8000"),
    ("::1", "http://[::1]:8000"),
    ("gpus.lab.example", "http://gpus.lab.example:8000"),
])
def test_listen_url(host, expected):
    from app.cli import listen_url

    assert listen_url(host, 8000) == expected


def test_listen_url_names_this_machine_for_a_wildcard_address(monkeypatch):
    import socket

    from app.cli import listen_url

    monkeypatch.setattr(socket, "getfqdn", lambda: "node-7.lab.example")
    assert listen_url("0.0.0.0", 8080) == listen_url("::", 8080) == "http://node-7.lab.example:8080"


def test_listen_url_never_names_localhost_for_a_wildcard_address(monkeypatch):
    """Where /etc/hosts puts the machine's name on 127.0.0.1, getfqdn() says "localhost"."""
    import socket

    from app.cli import listen_url

    monkeypatch.setattr(socket, "getfqdn", lambda: "localhost")
    monkeypatch.setattr(socket, "gethostname", lambda: "node-7")
    assert listen_url("0.0.0.0", 8080) == "http://node-7:8080"
