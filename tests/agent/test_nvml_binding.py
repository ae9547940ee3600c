"""B49-B53 against the REAL nvidia-ml-py functions, at both ends of the project's pin.

Each end of the ``nvidia-ml-py`` range in ``pyproject.toml`` is installed (``pip install
--target``, cached under ``.venv/nvml-bindings/``) and :mod:`tests.agent.fake_libnvml` runs
in a subprocess with that copy first on ``sys.path``: the binding's own wrappers, struct
layouts and error classes run unchanged over a fake ``libnvidia-ml`` whose C symbols answer
like a 470 or 535 driver.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".venv" / "nvml-bindings"


def _pin() -> tuple[str, str]:
    """(lowest, upper bound) of the nvidia-ml-py requirement in pyproject.toml."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("nvidia-ml-py"))
    low = re.search(r">=\s*([\w.]+)", spec)
    high = re.search(r"<\s*([\w.]+)", spec)
    assert low and high, f"nvidia-ml-py must be pinned to a range, got {spec!r}"
    return low.group(1), high.group(1)


LOW, HIGH = _pin()
ENDS = {"lowest": f"nvidia-ml-py=={LOW}", "newest": f"nvidia-ml-py>={LOW},<{HIGH}"}


def _binding(end: str) -> Path:
    target = CACHE / end
    if not (target / "pynvml.py").exists():
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--target", str(target), ENDS[end]],
            capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, f"cannot install {ENDS[end]}: {proc.stderr[-2000:]}"
    return target


@pytest.fixture(scope="module", params=sorted(ENDS))
def results(request: pytest.FixtureRequest) -> dict:
    target = _binding(request.param)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-m", "tests.agent.fake_libnvml"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    if request.param == "lowest":
        assert data["binding"] == LOW
    else:
        assert int(data["binding"].split(".")[0]) < int(HIGH.split(".")[0]) and data["binding"] != LOW
    return data


def test_b49_graphics_list_unsupported_compute_list_still_observed(results):
    (poll,) = results["b49"]
    assert poll["pids"] == [41001] and poll["memory_mib"] == [2048.0]
    (dev,) = poll["devices"]
    assert dev["processes_status"] == "ok"  # observed for compute processes, so judged
    assert "graphics" in dev["processes_error"] and "compute" not in dev["processes_error"]
    assert poll["monitoring"] == "ok"


def test_b50_driver_without_v3_falls_back_to_v2_and_lists_the_process(results):
    (poll,) = results["b50"]
    assert poll["pids"] == [41001]
    assert poll["devices"][0]["processes_status"] == "ok"


def test_b50_no_process_list_symbol_at_all_is_function_not_found_with_driver(results):
    (poll,) = results["b50_none"]
    dev = poll["devices"][0]
    assert poll["pids"] == []
    assert dev["processes_status"] == "unavailable"
    assert dev["processes_error"].startswith("unavailable:")
    assert "function not found in driver 470.82.01" in dev["processes_error"]
    assert dev["health"] == "ok" and poll["monitoring"] == "degraded"


def test_b51_missing_symbol_is_function_not_found_whatever_the_binding_raises(results):
    b51 = results["b51"]
    if results["binding"].startswith("13."):
        assert b51["binding_raises"] == "NVMLLibraryMismatchError"
    else:
        assert b51["binding_raises"] == "NVMLError_FunctionNotFound"
    assert b51["classified_code"] == 13  # NVML_ERROR_FUNCTION_NOT_FOUND, never a device fault


def test_b52_used_memory_from_the_v2_structure_reserved_apart(results):
    (poll,) = results["b52"]
    dev = poll["devices"][0]
    assert dev["memory_used_mib"] == 8000.0 and dev["memory_reserved_mib"] == 99.0
    (old,) = results["b52_no_v2"]
    dev = old["devices"][0]
    assert dev["memory_used_mib"] == 8099.0 and dev["memory_reserved_mib"] is None
    assert dev["health"] == "ok"


def test_b53_transient_start_error_is_down_then_versions_filled_next_poll(results):
    first, second = results["b53"]
    assert first["monitoring"] == "down" and "retrying on the next poll" in first["message"]
    assert "agent error" not in first["message"]
    assert first["devices"] == []
    assert second["monitoring"] == "ok"
    assert second["versions"] == ["535.104.05", "12.535.104.05", "12.2"]
    assert second["pids"] == [41001]
