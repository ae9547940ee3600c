"""Agent settings: command-line flags over ``GPUROSTER_AGENT_*`` environment variables over
a TOML file (default ``/etc/gpuroster/agent.toml``) over defaults.

The host token is read from ``token_file``; there is deliberately no way to pass the
token itself on the command line (it would show in ``ps`` and shell history).
"""

from __future__ import annotations

import os
import socket
import stat
import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from agent.settings_lean import pydantic_settings  # pydantic_settings without loading asyncio

BaseSettings = pydantic_settings.BaseSettings
InitSettingsSource = pydantic_settings.InitSettingsSource
PydanticBaseSettingsSource = pydantic_settings.PydanticBaseSettingsSource
SettingsConfigDict = pydantic_settings.SettingsConfigDict

DEFAULT_CONFIG = Path("/etc/gpuroster/agent.toml")
DEFAULT_STATE_DIR = Path("/var/lib/gpuroster-agent")


class AgentSettings(BaseSettings):
    """Everything the agent can be told. Times in seconds, sizes in MiB."""

    model_config = SettingsConfigDict(env_prefix="GPUROSTER_AGENT_", extra="forbid")

    server: str | None = Field(default=None, description="service base URL, e.g. https://gpuroster.lab.example")
    token_file: Path | None = Field(default=None, description="file holding this host's token")
    allow_readable_token_file: bool = Field(
        default=False, description="start even if group or others may read or write the token file (not recommended)")
    host: str = Field(default_factory=socket.gethostname, min_length=1, max_length=128)
    interval: float = Field(default=5.0, gt=0, le=3600, description="seconds between polls")
    state_dir: Path = Field(default=DEFAULT_STATE_DIR, description="spool, seq counter, ack cache")
    hide_args: bool = Field(default=False, description="report executables without their arguments")
    max_command_length: int = Field(default=1024, ge=16, le=4096, description="command lines are cut to this many characters")
    max_body_kb: int = Field(default=256, ge=16, description="the service's body limit in KiB: snapshots are trimmed to fit")
    expect_gpus: bool = Field(default=False, description="a missing NVML library is a misconfiguration")
    replay: list[Path] = Field(default_factory=list, description="nvidia-smi -q -x captures to replay instead of NVML")
    replay_owners: Path | None = Field(default=None, description="JSON map pid -> owner for replayed processes")
    dry_run: bool = Field(default=False, description="enforcement only says what it would do")
    nvml_timeout: float = Field(default=2.0, gt=0, le=60, description="seconds before a poll is marked stale")
    spool_max_mb: int = Field(default=1024, ge=1)
    spool_max_age_hours: float = Field(default=48.0, gt=0)
    log_level: str = "INFO"
    container_sockets: list[Path] = Field(
        default_factory=lambda: [Path("/var/run/docker.sock"), Path("/run/podman/podman.sock")],
        description="Unix sockets speaking the Docker Engine API (Docker, Podman), asked for container owners",
    )
    container_state_dirs: list[Path] = Field(
        default_factory=lambda: [Path("/run/containerd/io.containerd.runtime.v2.task"),
                                 Path("/run/containers/storage/overlay-containers")],
        description="containerd / CRI-O state directories read for Kubernetes containers (OCI annotations)",
    )
    container_owner_label: str = Field(default="org.gpuroster.user", min_length=1, max_length=256,
                                       description="container label naming the owner")
    container_name_pattern: str | None = Field(
        default=None, description="regex with (?P<user>...) read from container names, e.g. ^(?P<user>[a-z]+)-"
    )
    container_compose_pattern: str | None = Field(
        default=None, description="regex with (?P<user>...) read from the compose project (or pod namespace)"
    )
    container_cache_seconds: float = Field(default=600.0, gt=0, description="how long a container's owner is cached")

    @field_validator("container_name_pattern", "container_compose_pattern")
    @classmethod
    def _user_group(cls, v: str | None) -> str | None:
        if v is None:
            return v
        import re

        try:
            pat = re.compile(v)
        except re.error as e:
            raise ValueError(f"not a regular expression: {e}") from None
        if "user" not in pat.groupindex:
            raise ValueError("needs a named group (?P<user>...)")
        return v

    @field_validator("server")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("server must start with http:// or https://")
        return v.rstrip("/") if v else v


def read_toml(path: Path) -> dict[str, Any]:
    """Settings from a TOML file: top-level keys, or an ``[agent]`` table."""
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    return data.get("agent", data) if isinstance(data.get("agent"), dict) else data


def load_settings(cli: dict[str, Any], config: Path | None = None, *, env: bool = True) -> AgentSettings:
    """Build settings with flags (``cli``, ``None`` values ignored) > environment > TOML > defaults.

    ``config`` is the TOML file; without it ``GPUROSTER_AGENT_CONFIG`` or
    ``/etc/gpuroster/agent.toml`` is used if present. A ``config`` given explicitly must exist.
    """
    explicit = config is not None
    if config is None:
        config = Path(os.environ.get("GPUROSTER_AGENT_CONFIG", DEFAULT_CONFIG))
        explicit = "GPUROSTER_AGENT_CONFIG" in os.environ
    toml_data: dict[str, Any] = {}
    if config.exists():
        toml_data = read_toml(config)
    elif explicit:
        raise FileNotFoundError(f"config file {config} does not exist")
    flags = {k: v for k, v in cli.items() if v is not None}

    class _Layered(AgentSettings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            layers = [init_settings]
            if env:
                layers.append(env_settings)
            layers.append(InitSettingsSource(settings_cls, init_kwargs=toml_data))
            return tuple(layers)

    return AgentSettings.model_validate(_Layered(**flags).model_dump())


def read_token(path: Path, *, allow_readable: bool = False) -> str:
    """The host token from ``path`` (surrounding whitespace removed).

    Raises ``ValueError`` when the file is empty, or when group or others may read or write
    it (anyone who reads it can report as this host) unless ``allow_readable``, which only
    logs a warning; ``OSError`` when it cannot be read.
    """
    from agent.telemetry import log

    mode = path.stat().st_mode
    if mode & (stat.S_IRGRP | stat.S_IROTH | stat.S_IWGRP | stat.S_IWOTH):
        what = f"token file {path} is accessible to other users (mode {stat.S_IMODE(mode):04o})"
        if not allow_readable:
            raise ValueError(f"{what}; run 'chmod 600 {path}' (or start with --allow-readable-token-file)")
        log.warning("%s; chmod 600 it", what)
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token
