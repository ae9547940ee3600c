"""Quota boosts on the pages: a member asks on the Usage page (a double submit asks once, a
bad value re-renders the form naming the field), an admin approves on the Approvals page, the
member's Usage page shows the raised limit; a late second decision is a 409 page (both
databases)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from app.models import QuotaBoost


def _api(b, method, path, **kw):
    return b.client.request(method, "/api/v1" + path, headers={"X-CSRF-Token": b.csrf}, **kw)


def test_ask_on_usage_page_approve_on_approvals_page(weblab, session_factory):
    assert _api(weblab.admin, "POST", "/rules", json={"scope": "default", "max_devices": 1}).status_code == 201
    usage = weblab.alice.get("/reports/usage")
    assert usage.status_code == 200 and 'action="/boosts"' in usage.text and "No pending or active boosts" in usage.text
    key = re.search(r'name="idempotency_key" value="([^"]+)"', usage.text).group(1)
    day = (datetime.now(UTC) + timedelta(days=3)).date().isoformat()
    bad = weblab.alice.post("/boosts", {"limit": "max_devices", "value": "lots", "end": day, "reason": "sweep",
                                        "idempotency_key": key + "x"})
    assert bad.status_code == 422 and "value: &#39;lots&#39; is not a number" in bad.text
    assert 'id="b-value" name="value" value="lots"' in bad.text and 'aria-invalid="true"' in bad.text
    form = {"limit": "max_devices", "value": "3", "end": day, "reason": "ablation sweep", "idempotency_key": key}
    first = weblab.alice.post("/boosts", form)
    again = weblab.alice.post("/boosts", form)
    assert first.status_code == again.status_code == 303 and first.headers["location"] == "/reports/usage?done=boost"
    with session_factory() as s:
        assert s.scalar(select(func.count()).select_from(QuotaBoost)) == 1
        bid = s.scalar(select(QuotaBoost.id))
    mine = weblab.alice.get("/reports/usage?done=boost").text
    assert "Boost asked" in mine and f'id="boost-{bid}"' in mine and "st-pending" in mine
    assert "No quota boost awaits your decision" in weblab.bob.get("/approvals").text
    page = weblab.admin.get("/approvals")
    assert f'action="/approvals/boosts/{bid}"' in page.text and "ablation sweep" in page.text
    done = weblab.admin.post(f"/approvals/boosts/{bid}", {"decision": "approve", "reason": "ok"})
    assert done.status_code == 303 and done.headers["location"] == "/approvals?done=boost-approve"
    assert "Boost approved" in weblab.admin.get("/approvals?done=boost-approve").text
    mine = weblab.alice.get("/reports/usage").text
    assert f"boost:{bid}" in mine and "st-active" in mine
    late = weblab.admin.post(f"/approvals/boosts/{bid}", {"decision": "deny"})
    assert late.status_code == 409 and "already approved by boss" in late.text
    assert weblab.bob.post(f"/approvals/boosts/{bid}", {"decision": "deny"}).status_code == 403
