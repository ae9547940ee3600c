"""Each test starts from the empty schema, with ids from 1, whatever ran before it.

The two rounds of each test below run one after the other in one worker (pytest-xdist hands
out whole files): the second round sees nothing the first one wrote, although the first
committed through the application (its transaction is rolled back after the test, or, for
the ``commits`` one, its tables emptied), and its ids start again from 1 on both databases
(PostgreSQL's sequences are not transactional: the suite restarts them after each test).
"""

from __future__ import annotations

import pytest

from tests.conftest import book, future


def _book_once(client, lab) -> int:
    r = book(client, lab.alice, [lab.devices[0]], future(24))
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.mark.parametrize("round_", [1, 2])
def test_a_rolled_back_test_leaves_nothing_and_ids_start_from_one(client, lab, round_):
    assert client.get("/api/v1/reservations", headers=lab.admin.headers).json()["total"] == 0
    assert _book_once(client, lab) == 1


@pytest.mark.commits
@pytest.mark.parametrize("round_", [1, 2])
def test_a_committing_test_leaves_nothing_and_ids_start_from_one(client, lab, round_):
    assert client.get("/api/v1/reservations", headers=lab.admin.headers).json()["total"] == 0
    assert _book_once(client, lab) == 1
