"""Deployment files without a Docker engine: the Compose file against the Compose
Specification's JSON schema (vendored, see data/SOURCES.md) and the properties the
deployment needs; the systemd unit and the ``start`` script's guards."""

from __future__ import annotations

import configparser
import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft7Validator

from tests.conftest import REPO

DATA = Path(__file__).parent / "data"
COMPOSE = REPO / "docker-compose.yml"

_VAR = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")


class MissingVariable(Exception):
    pass


def interpolate(value, env: dict[str, str]):
    """Compose's variable interpolation (``${X}``, ``${X:-d}``, ``${X-d}``, ``${X:?e}``, ``${X?e}``, ``$$``)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("name") or m.group("bare")
        op, arg = m.group("op"), m.group("arg") or ""
        val = env.get(name)
        unset_or_empty = val is None or (op is not None and op.startswith(":") and val == "")
        if op in (":?", "?") and unset_or_empty:
            raise MissingVariable(f"{name}: {arg}")
        if op in (":-", "-") and unset_or_empty:
            return arg
        return val or ""

    return _VAR.sub(sub, value)


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def validator() -> Draft7Validator:
    schema = json.loads((DATA / "compose-spec.json").read_text())
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


REQUIRED = {"GPUROSTER_DB_PASSWORD", "GPUROSTER_SECRET_KEY", "GPUROSTER_BASE_URL"}
ENV = {"GPUROSTER_DB_PASSWORD": "0123abcd", "GPUROSTER_SECRET_KEY": "k" * 32, "GPUROSTER_BASE_URL": "https://gpu.lab.example"}


def test_compose_file_validates_against_the_compose_spec(raw, validator):
    errors = sorted(validator.iter_errors(raw), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    resolved = interpolate(raw, ENV)
    errors = list(validator.iter_errors(resolved))
    assert not errors, [e.message for e in errors]


def test_the_schema_check_is_not_vacuous(raw, validator):
    broken = copy.deepcopy(raw)
    broken["services"]["agent"]["volumes"] = "/etc/passwd:/etc/passwd:ro"  # must be a list
    broken["services"]["db"]["healthcheck"]["intervall"] = "5s"
    assert len(list(validator.iter_errors(broken))) >= 2


def test_required_variables_fail_fast(raw):
    missing = set()
    for name in REQUIRED:
        env = {k: v for k, v in ENV.items() if k != name}
        with pytest.raises(MissingVariable) as e:
            interpolate(raw, env)
        missing.add(str(e.value).split(":")[0])
    assert missing == REQUIRED
    resolved = interpolate(raw, ENV)
    url = resolved["services"]["app"]["environment"]["GPUROSTER_DATABASE_URL"]
    assert url == "postgresql://gpuroster:0123abcd@db:5432/gpuroster"


def test_services_have_what_the_deployment_needs(raw):
    s = interpolate(raw, ENV)["services"]
    db = s["db"]
    assert db["image"].startswith("postgres:")
    assert any(v.split(":")[0] in raw["volumes"] for v in db["volumes"]), "a named volume for the data"
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])

    migrate, app = s["migrate"], s["app"]
    assert migrate["command"] == ["gpuroster", "migrate"]
    assert app["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert app["depends_on"]["db"]["condition"] == "service_healthy"
    assert app["deploy"]["replicas"] == 2
    assert "/readyz" in " ".join(app["healthcheck"]["test"])
    assert app["environment"]["GPUROSTER_ENVIRONMENT"] == "production"

    agent = s["agent"]
    assert agent["runtime"] == "nvidia" and agent["environment"]["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert agent["pid"] == "host"
    assert "/etc/passwd:/etc/passwd:ro" in agent["volumes"] and "/etc/group:/etc/group:ro" in agent["volumes"]
    assert agent["secrets"] == ["gpuroster_host_token"]
    cmd = agent["command"]
    assert cmd[cmd.index("--token-file") + 1] == "/run/secrets/gpuroster_host_token"
    assert "gpuroster_host_token" in raw["secrets"]


def test_dockerfile_copies_what_exists_and_runs_the_console_scripts():
    text = (REPO / "Dockerfile").read_text()
    assert "pip wheel --no-deps" in text and 'pip install "$(ls /dist/gpuroster-*.whl)[server]"' in text
    assert " -e " not in text, "the image installs the wheel, not the source tree"
    scripts = set(re.findall(r'^(\S+)\s*=\s*"', (REPO / "pyproject.toml").read_text().split("[project.scripts]")[1], re.M))
    assert {"gpuroster", "gpuroster-agent"} <= scripts
    ignored = (REPO / ".dockerignore").read_text().split()
    for needed in ("app", "agent", "app/migrations", "app/templates", "app/alembic.ini", "pyproject.toml"):
        assert (REPO / needed).exists() and needed not in ignored
    assert ".env" in ignored and "/secrets" in ignored, "secrets never enter the build context"


def test_systemd_unit_migrates_then_serves():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(REPO / "deploy" / "gpuroster.service")
    svc = unit["Service"]
    assert svc["ExecStartPre"].endswith("gpuroster migrate")
    assert " serve " in svc["ExecStart"] and "--no-migrate" in svc["ExecStart"]
    assert svc["User"] == "gpuroster" and svc["Restart"] == "on-failure"
    assert svc["EnvironmentFile"] == "/etc/gpuroster/gpuroster.env"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


# ---------------------------------------------------------------------------- ./start


@pytest.fixture
def start_copy(tmp_path) -> Path:
    shutil.copy(REPO / "start", tmp_path / "start")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_start_script_parses():
    subprocess.run(["bash", "-n", str(REPO / "start")], check=True)
    assert os.access(REPO / "start", os.X_OK)


def test_start_refuses_a_python_older_than_3_11(start_copy):
    fake = start_copy / "old-python"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    r = subprocess.run([str(start_copy / "start")], env={**os.environ, "PYTHON": str(fake)}, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 1 and "not Python 3.11 or newer" in r.stderr
    assert not (start_copy / ".venv").exists()


def test_start_reuses_an_installed_venv_and_passes_arguments_to_demo(start_copy):
    bin_dir = start_copy / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    fake = bin_dir / "gpuroster"
    fake.write_text('#!/bin/sh\necho "gpuroster $*"\n')
    fake.chmod(0o755)
    (start_copy / ".venv" / ".gpuroster-installed").touch()
    r = subprocess.run([str(start_copy / "start"), "--port", "9001", "--data-dir", "/tmp/x"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "gpuroster demo --port 9001 --data-dir /tmp/x", "no reinstall, arguments passed on"
