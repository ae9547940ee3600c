"""The one rule deciding a device's critical conditions (pure: no database)."""

from __future__ import annotations

import pytest

from agent.schema import DeviceReport, HealthCheck
from app.services.health_rule import CRITICAL_XIDS, critical_conditions, describe


def report(*checks: tuple, health: str = "ok") -> DeviceReport:
    return DeviceReport(uuid="GPU-x", health=health, health_checks=[
        HealthCheck(kind=k, state=s, value=v) for k, s, v in checks])


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 69])
def test_xids_a_program_causes_are_not_critical(xid):
    assert critical_conditions(report(("xid", "bad", xid))) == []


@pytest.mark.parametrize("xid", sorted(CRITICAL_XIDS))
def test_hardware_xids_are_critical_and_need_an_admin(xid):
    [c] = critical_conditions(report(("xid", "bad", xid)))
    assert (c.kind, c.key, c.self_clearing) == ("xid", f"xid:{xid}", False)


def test_unknown_and_ok_readings_are_never_critical():
    kinds = ["ecc_uncorrected", "retired_pages_pending", "remapped_rows_pending", "remapped_rows_failure",
             "gpu_lost", "thermal_slowdown", "power_slowdown", "xid"]
    assert critical_conditions(report(*[(k, "unknown", None) for k in kinds])) == []
    assert critical_conditions(report(*[(k, "ok", 0) for k in kinds])) == []


def test_ecc_is_keyed_by_count_and_slowdowns_clear_themselves():
    conds = critical_conditions(report(("ecc_uncorrected", "bad", 5), ("thermal_slowdown", "bad", None),
                                       ("power_slowdown", "bad", None), ("retired_pages_pending", "bad", None)))
    assert [(c.key, c.self_clearing) for c in conds] == [
        ("ecc_uncorrected:5", False), ("thermal_slowdown", True), ("power_slowdown", True), ("retired_pages_pending", False)]
    assert describe(conds) == ("5 uncorrectable ECC errors; thermal slowdown; power brake slowdown; "
                               "retired memory pages pending (GPU reset needed)")


def test_a_lost_device_is_critical_once_however_it_is_said():
    conds = critical_conditions(report(("gpu_lost", "bad", None), health="lost"))
    assert [c.key for c in conds] == ["gpu_lost"]
    assert [c.key for c in critical_conditions(report(health="lost"))] == ["gpu_lost"]
