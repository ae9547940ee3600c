"""The CLI's exit codes are the ones ``docs/cli.md`` documents: the table's numbers are the
constants, every HTTP status it names maps to its row, and ``--help`` lists the same codes."""

from __future__ import annotations

import re

from app.client import context
from tests.conftest import REPO

STATUSES = range(400, 600)


def _documented() -> dict[int, str]:
    """Exit code -> meaning, from the table under "## Exit codes" in docs/cli.md."""
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| (.+) \|$", section, re.M)}


def test_documented_codes_are_the_clis_constants():
    doc = _documented()
    c = context
    assert sorted(doc) == sorted({c.OK, c.ERROR, c.USAGE, c.CONFLICT, c.REFUSED, c.UNREACHABLE, c.AUTH})
    assert "conflict" in doc[c.CONFLICT] and "refused" in doc[c.REFUSED] and "unreachable" in doc[c.UNREACHABLE]
    assert "not signed in" in doc[c.AUTH] and "invalid input" in doc[c.USAGE] and "not found" in doc[c.ERROR]


def test_every_http_status_the_table_names_maps_to_its_row_and_no_other_is_special():
    named: dict[int, int] = {}
    for code, meaning in _documented().items():
        for group in re.findall(r"HTTP ([\d/]+)", meaning):
            for status in group.split("/"):
                named[int(status)] = code
    assert named, "the table names no HTTP status"
    for status in STATUSES:
        assert context._code_for(status) == named.get(status, context.ERROR), status


def test_help_text_lists_the_documented_codes():
    listed = {int(n) for n in re.findall(r"(?:: |; )(\d) ", context.EXIT_CODES)}
    assert listed == set(_documented())
