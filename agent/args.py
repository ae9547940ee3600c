"""``gpuroster-agent``'s command line: its flags, and the exit status and hint for a
monitoring state in which ``--once`` / ``--print`` cannot report GPUs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent import __version__
from agent.schema import Snapshot

# monitoring states in which --once / --print exit non-zero, with the hint to print
_HINTS = {
    "no_driver": "no NVIDIA driver on this host (no /proc/driver/nvidia): nothing to monitor; "
    "use --replay FILE to run on captures",
    "misconfigured": "NVML (libnvidia-ml.so.1) could not be loaded: install the NVIDIA driver's user-space "
    "libraries (or the nvidia-ml-py binding), or unset expect_gpus",
    "down": "NVML is not usable; if the message says driver/library mismatch, reboot the host "
    "(the loaded kernel module is older than the installed libraries)",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The agent's flags; ``--token`` is refused (only ``--token-file``)."""
    # allow_abbrev=False: "--token SECRET" must fail, not be read as "--token-file SECRET"
    p = argparse.ArgumentParser(prog="gpuroster-agent", description="gpuroster host agent: report GPU use to the service",
                                allow_abbrev=False)
    p.add_argument("--config", type=Path, help="TOML file (default /etc/gpuroster/agent.toml)")
    p.add_argument("--server", help="service base URL")
    p.add_argument("--token-file", type=Path, help="file holding the host token (never pass the token itself)")
    p.add_argument("--allow-readable-token-file", action="store_true", default=None,
                   help="start even if group or others may read the token file (default: refuse)")
    p.add_argument("--host", help="host name to report (default: this machine's)")
    p.add_argument("--interval", type=float, help="seconds between polls (default 5)")
    p.add_argument("--state-dir", type=Path, help="spool, seq counter and ack cache (default /var/lib/gpuroster-agent)")
    p.add_argument("--hide-args", action="store_true", default=None, help="report executables without arguments")
    p.add_argument("--expect-gpus", action="store_true", default=None, help="treat a missing NVML as a misconfiguration")
    p.add_argument("--replay", type=Path, nargs="+", metavar="FILE", help="replay nvidia-smi -q -x captures instead of NVML")
    p.add_argument("--replay-owners", type=Path, metavar="MAP.json", help="pid -> owner map for replayed processes")
    p.add_argument("--dry-run", action="store_true", default=None, help="enforcement only logs what it would do")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="poll once, post, exit (non-zero if the post failed)")
    mode.add_argument("--print", dest="print_", action="store_true", help="print one snapshot as JSON, post nothing")
    p.add_argument("--version", action="version", version=f"gpuroster-agent {__version__}")
    return p.parse_args(argv)


def exit_for_monitoring(snap: Snapshot) -> int:
    hint = _HINTS.get(snap.monitoring.status)
    if hint is None:
        return 0
    print(f"gpuroster-agent: {snap.monitoring.message}\nhint: {hint}", file=sys.stderr)
    return 3
