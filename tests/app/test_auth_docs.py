"""docs/auth.md's configuration examples are settings the service accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "auth.md"


def test_auth_examples_parse_into_settings(monkeypatch):
    from app.config import Settings

    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 2
    for block in blocks:
        for line in block.strip().splitlines():
            name, value = line.split("=", 1)
            assert name.startswith("GPUROSTER_")
            monkeypatch.setenv(name, shlex.split(value)[0])
    s = Settings()
    assert s.ldap_url == "ldap://ldap.lab.example.org:389" and s.ldap_starttls is True
    assert s.ldap_groups == {"vision": "vision", "nlp-students": "nlp"} and s.ldap_admin_group == "gpu-admins"
    assert s.ldap_user_filter.format(username="x") == "(&(objectClass=posixAccount)(uid=x))"
    assert s.oidc_discovery_url.endswith("/realms/lab/.well-known/openid-configuration")
    assert s.oidc_groups == {"vision": "vision", "nlp": "nlp"} and s.oidc_label == "Lab SSO"
