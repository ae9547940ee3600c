"""How the CLI prints amounts: at most two decimals, none trailing (no database)."""

from __future__ import annotations

import pytest

from app.client.formatting import fmt_amount


@pytest.mark.parametrize(("value", "shown"), [
    (9.0063, "9.01"), (12.0, "12"), (0.5, "0.5"), (0.001, "0"), (-0.001, "0"), (1234567.5, "1234567.5"),
    (3, "3"), (0, "0"), (80.0, "80"),
])
def test_amounts_show_at_most_two_decimals_and_none_trailing(value, shown):
    assert fmt_amount(value) == shown
