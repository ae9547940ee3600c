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


@pytest.mark.parametrize("round_", [1, 2])
@pytest.mark.parametrize("mode", ["rolled_back", pytest.param("committing", marks=pytest.mark.commits)])
def test_a_test_leaves_nothing_behind_and_ids_start_from_one(client, lab, mode, round_):
    assert client.get("/api/v1/reservations", headers=lab.admin.headers).json()["total"] == 0
    r = book(client, lab.alice, [lab.devices[0]], future(24))
    assert r.status_code == 201, r.text
    assert r.json()["id"] == 1
