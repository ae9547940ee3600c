"""Where the CLI keeps its server URL and API token.

``$XDG_CONFIG_HOME/gpuroster/config.json`` (default ``~/.config/gpuroster/config.json``),
written with mode 0600 in a 0700 directory. ``GPUROSTER_SERVER`` and ``GPUROSTER_TOKEN``
override the file (for CI jobs and containers).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class ClientConfig:
    server: str | None = None
    token: str | None = None
    username: str | None = None  # who the stored token belongs to
    timezone: str | None = None  # the lab's zone, as the server said at login


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpuroster"


def config_path() -> Path:
    return config_dir() / "config.json"


def load() -> ClientConfig:
    """The stored configuration with the environment's overrides applied.

    A token from ``GPUROSTER_TOKEN`` that differs from the stored one drops the stored
    username (it may belong to someone else). An unreadable file counts as empty.
    """
    cfg = ClientConfig()
    try:
        data = json.loads(config_path().read_text(encoding="utf-8"))
        cfg = ClientConfig(**{k: data.get(k) for k in asdict(cfg)})
    except (OSError, ValueError, TypeError):
        pass
    server = os.environ.get("GPUROSTER_SERVER")
    token = os.environ.get("GPUROSTER_TOKEN")
    if server:
        if server.rstrip("/") != (cfg.server or "").rstrip("/"):
            cfg.timezone = None
        cfg.server = server
    if token:
        if token != cfg.token:
            cfg.username = None
        cfg.token = token
    if cfg.server:
        cfg.server = cfg.server.rstrip("/")
    return cfg


def save(cfg: ClientConfig) -> Path:
    """Write ``cfg`` atomically with mode 0600 (directory 0700); returns the path."""
    d = config_dir()
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    import tempfile  # only `login` writes the configuration: the other commands start without it

    fd, tmp = tempfile.mkstemp(prefix=".config.", dir=d)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(asdict(cfg), f, indent=2)
            f.write("\n")
        os.replace(tmp, config_path())
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return config_path()
