"""Passwords (argon2id via pwdlib) and tokens (random, stored as SHA-256 only)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from pwdlib import PasswordHash
from pwdlib.hashers.argon2 import Argon2Hasher

# OWASP minimum for argon2id: m=19 MiB, t=2, p=1. We use m=19 MiB, t=2, p=1.
ARGON2_PARAMETERS = {"memory_cost": 19 * 1024, "time_cost": 2, "parallelism": 1}
_hasher = PasswordHash((Argon2Hasher(**ARGON2_PARAMETERS),))
_DUMMY = None

API_TOKEN_PREFIX = "gpr_"
HOST_TOKEN_PREFIX = "gph_"


def hash_password(password: str) -> str:
    """argon2id hash string (PHC format) of ``password``."""
    return _hasher.hash(password)


def verify_password(password: str, password_hash: str | None) -> bool:
    """True if ``password`` matches; with no hash, still spends the hashing time and returns False."""
    global _DUMMY
    if not password_hash:
        if _DUMMY is None:
            _DUMMY = _hasher.hash("not-a-password")
        _hasher.verify(password, _DUMMY)
        return False
    try:
        return _hasher.verify(password, password_hash)
    except Exception:
        return False


def new_token(prefix: str) -> str:
    """A fresh bearer token: ``prefix`` + 40 URL-safe random characters (240 bits)."""
    return prefix + secrets.token_urlsafe(30)


def token_hash(token: str) -> str:
    """Hex SHA-256 of a token: what the database stores and looks tokens up by."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def constant_time_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
