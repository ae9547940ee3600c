"""Finding notices reach each recipient in the language they chose (``User.language``):
e-mail to a user who chose Chinese is in Chinese, everyone else's (and the lab-wide
webhook's) stays English; on both databases."""

from __future__ import annotations

from email.header import decode_header, make_header

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import run_in_transaction
from app.models import User
from tests.app.test_notices import conf, factory, finding, hook, lab, mailbox, post  # noqa: F401 - fixtures


def _choose(factory, username: str, language: str) -> None:
    def work(s: Session) -> None:
        s.scalar(select(User).where(User.username == username)).language = language

    run_in_transaction(factory, work)


def _subject(msg) -> str:
    """The decoded subject (an encoded word per non-ASCII run, folded lines joined)."""
    return str(make_header(decode_header(msg["Subject"].replace("\r\n", ""))))


def test_the_holder_who_chose_chinese_gets_a_chinese_notice(factory, lab, conf, mailbox, hook) -> None:
    box, _ = mailbox
    _choose(factory, "bob", "zh_CN")
    post(factory, conf, 1, [finding()])
    [to_bob] = box.to("bob@lab.example")
    assert _subject(to_bob) == "[gpuroster] 你在 node-01 上预约的 GPU 0 NVIDIA A40 被占用"
    body = to_bob.get_payload(decode=True).decode()
    assert "被 alice 的进程 5101（python train.py）占用" in body and "主机策略：通知" in body
    assert "http://testserver/findings" in body
    [to_alice] = box.to("alice@lab.example")
    assert to_alice["Subject"] == "[gpuroster] foreign on node-01: GPU 0 NVIDIA A40"
    assert "Host policy: notify." in to_alice.get_payload()
    [hooked] = hook.bodies
    assert "reserved by `bob`" in hooked["text"]


def test_the_offender_who_chose_chinese_reads_the_kind_and_policy_in_chinese(factory, lab, conf, mailbox, hook) -> None:
    box, _ = mailbox
    _choose(factory, "alice", "zh_CN")
    post(factory, conf, 1, [finding(kind="unreserved", holder=None)])
    [to_alice] = box.to("alice@lab.example")
    assert _subject(to_alice) == "[gpuroster] node-01 上的未预约：GPU 0 NVIDIA A40"
    assert "主机策略：通知。" in to_alice.get_payload(decode=True).decode()
