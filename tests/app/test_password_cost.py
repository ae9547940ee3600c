"""The service hashes passwords at the production argon2id cost (the test process lowers it
for speed, so this is checked in a fresh interpreter, as a server would run)."""

from __future__ import annotations

import subprocess
import sys


def test_a_fresh_process_hashes_with_argon2id_at_19_mib_and_two_passes():
    code = "from app.security import hash_password, verify_password as v; h = hash_password('pw'); print(h); assert v('pw', h)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("$argon2id$v=19$m=19456,t=2,p=1$"), out


def test_the_test_process_verifies_production_hashes():
    from pwdlib import PasswordHash
    from pwdlib.hashers.argon2 import Argon2Hasher

    from app.security import ARGON2_PARAMETERS, hash_password, verify_password

    production = PasswordHash((Argon2Hasher(**ARGON2_PARAMETERS),)).hash("correct horse")
    assert verify_password("correct horse", production) and not verify_password("wrong horse", production)
    assert hash_password("x").startswith("$argon2id$")
