"""The ``gpuroster`` command speaks the language of its environment: ``GPUROSTER_LANG``, else
``LC_ALL``/``LC_MESSAGES``/``LANG`` (``zh_CN.UTF-8`` gives Chinese), else English. Run as the
installed console script, as a member would."""

from __future__ import annotations

import os
import subprocess

import pytest

from testkit.live import BIN, free_port


def run(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUROSTER_", "LC_", "LANG"))}
    base.update({"XDG_CONFIG_HOME": str(tmp_path), **env})
    return subprocess.run([str(BIN / "gpuroster"), *args], env=base, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("env", "expected"), [
    ({}, "error: not signed in: run 'gpuroster login --server URL'"),
    ({"LANG": "zh_CN.UTF-8"}, "错误：尚未登录：请运行 'gpuroster login --server URL'"),
    ({"LANG": "zh_CN.UTF-8", "GPUROSTER_LANG": "en"}, "error: not signed in"),
    ({"LANG": "zh_CN.UTF-8", "LC_ALL": "C"}, "error: not signed in"),
])
def test_not_signed_in_in_the_environments_language(tmp_path, env, expected):
    r = run(tmp_path, "list", **env)
    assert r.returncode != 0 and expected in r.stderr


def test_unreachable_server_in_chinese(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    r = run(tmp_path, "list", LANG="zh_CN.UTF-8", GPUROSTER_SERVER=url, GPUROSTER_TOKEN="x")
    assert r.returncode != 0 and f"错误：无法连接 {url}：" in r.stderr
