"""gpuroster host agent: reads NVML (or replays ``nvidia-smi -q -x`` captures), attributes
every GPU process to its Unix user and container, judges it against the host's
reservations and reports to the gpuroster service.

This package imports nothing from ``app``; the service imports its wire schema
(:mod:`agent.schema`) and its coverage function (:mod:`agent.policy`).
"""

__version__ = "0.1.0"
