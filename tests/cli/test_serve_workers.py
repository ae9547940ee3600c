"""``gpuroster serve``: one worker by default; several on SQLite get a note saying why not."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner


@pytest.fixture
def started(monkeypatch):
    import uvicorn

    calls: list[dict] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: calls.append(kw))
    return calls


def _serve(monkeypatch, url: str, *args: str):
    from app.cli import cli

    monkeypatch.setenv("GPUROSTER_DATABASE_URL", url)
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
