"""The holder rule on rows (``conflicts.match_holdings``), as the indexed matcher applies it,
agrees with the rule read literally: a row holds the device it names, and a device of the
same physical GPU with the other slice kind (a whole GPU and its MIG slices hold each
other, sibling slices never), in the rows' order."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from app.services.conflicts import match_holdings


@dataclass(frozen=True)
class Dev:
    id: int
    parent_id: int | None


def literal(devices, rows):
    out = {}
    for d in devices:
        kind = 1 if d.parent_id else 0
        found = [(d.id, r[3], None if r[0] == d.id else r[4]) for r in rows
                 if r[0] == d.id or (r[1] == (d.parent_id or d.id) and r[2] != kind)]
        if found:
            out[d.id] = found
    return out


@st.composite
def labs(draw):
    """Whole GPUs 1..n, some with MIG slices (ids from 100), and reservation rows naming them."""
    gpus = draw(st.integers(1, 4))
    devices = [Dev(g, None) for g in range(1, gpus + 1)]
    next_id = 100
    for g in range(1, gpus + 1):
        for _ in range(draw(st.integers(0, 3))):
            devices.append(Dev(next_id, g))
            next_id += 1
    named = st.sampled_from(devices)
    rows = [(d.id, d.parent_id or d.id, 1 if d.parent_id else 0, f"r{i}", d.id)
            for i, d in enumerate(draw(st.lists(named, max_size=12)))]
    shown = draw(st.lists(named, unique=True, min_size=1))
    return shown, rows


@settings(max_examples=300, deadline=None)
@given(labs())
def test_indexed_matcher_agrees_with_the_rule_read_literally(lab):
    devices, rows = lab
    got = {k: [(h.device_id, h.reservation, h.via) for h in v] for k, v in match_holdings(devices, rows).items()}
    assert got == literal(devices, rows)


def test_whole_gpu_and_its_slice_hold_each_other_but_siblings_do_not():
    whole, a, b = Dev(1, None), Dev(10, 1), Dev(11, 1)
    rows = [(10, 1, 1, "slice-booking", 10)]
    held = match_holdings([whole, a, b], rows)
    assert [h.reservation for h in held[1]] == ["slice-booking"] and held[1][0].via == 10
    assert held[10][0].via is None
    assert 11 not in held
