"""A server process loads the notice, directory and HTTP-client libraries only when a
deployment uses them: apprise, ldap3 and httpx cost about a fifth of a second of every
start (``python -X importtime -c 'import app.main'``), paid by each serve process."""

from __future__ import annotations

import subprocess
import sys

LAZY = ("apprise", "ldap3", "httpx", "authlib")


def test_importing_the_app_loads_no_optional_client_library():
    code = f"import sys, app.main; print(' '.join(m for m in {LAZY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "", f"imported at start: {out.stdout.strip()}"
