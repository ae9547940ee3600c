"""Fixtures for the agent tests: the capture corpus, a fake-NVML snapshot helper."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.collect import SnapshotBuilder
from agent.nvml import NvmlSource
from agent.owners import OwnerResolver
from agent.schema import Snapshot
from agent.telemetry import reset_warnings
from testkit.fake_nvml import FakeNVML, FakeOwner, FakeProcessTable

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "corpus"
CORPUS_XML = sorted(CORPUS.glob("*.xml"))
T0 = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)


def nvml_builder(
    fake: FakeNVML,
    owners: dict[int, FakeOwner] | None = None,
    *,
    host_pid_ns: bool | None = True,
    hidepid: bool = False,
    hide_args: bool = False,
    expect_gpus: bool = False,
    driver_present: bool = True,
    lost_table: list[tuple[str, str]] | None = None,
    clock=None,  # noqa: ANN001
) -> SnapshotBuilder:
    """A snapshot builder over ``fake`` with owners from a :class:`FakeProcessTable`."""
    kwargs = {"clock": clock} if clock is not None else {}
    source = NvmlSource(lib=fake, expect_gpus=expect_gpus, pid_max=4_194_304, timeout=5.0,
                        driver_present=lambda: driver_present, lost_lookup=lambda: list(lost_table or []), **kwargs)
    table = FakeProcessTable(owners or {})
    resolver = OwnerResolver(hide_args=hide_args, host_pid_ns=host_pid_ns, hidepid=hidepid, **table.resolver_kwargs())
    return SnapshotBuilder(source, host="node-01", resolver=resolver, pid_namespace_ok=host_pid_ns, hide_args=hide_args)


def snapshot_of(fake: FakeNVML, owners: dict[int, FakeOwner] | None = None, **kw) -> Snapshot:  # noqa: ANN003
    """One snapshot of ``fake`` (see :func:`nvml_builder`)."""
    return nvml_builder(fake, owners, **kw).build(1, T0)


@pytest.fixture(autouse=True)
def _fresh_log_once() -> None:
    """Each test sees "log once" warnings afresh."""
    reset_warnings()


@pytest.fixture(scope="session")
def corpus_files() -> list[Path]:
    if not CORPUS_XML:
        pytest.fail(f"no nvidia-smi captures under {CORPUS}: see tests/data/corpus/SOURCES.md")
    return CORPUS_XML
