"""The orchestrator's driver, in process: messages are fed to it directly and what it broadcasts is
recorded, so sequencing, verification and recovery are checked deterministically, without processes.

Greedy, n = 2, one request: the prefill's EXIT gives the first token; each later EXIT is judged
against the draft for the next position (accept: no broadcast; reject: RESEED with the target's
token); a worker's protocol ERROR re-prefills the committed tokens under a new epoch.
"""

from __future__ import annotations

import pytest

from runtime_util import draft, exit_, ipc_topology
from spd import wire
from spd.core.sampling import SamplingParams
from spd.core.stopping import StopRule
from spd.runtime.driver import Driver, DriverConfig
from spd.runtime.jobs import Job

PROMPT = [5, 6, 7]


@pytest.fixture
def driver(tmp_path):
    d = Driver(ipc_topology(tmp_path), DriverConfig(vocab_size=64, context=128, draft_wait_s=600.0))
    for role, index in (("stage", 1), ("stage", 2), ("drafter", 0)):  # every worker has said HELLO
        d._register(wire.Hello(role=role, index=index, incarnation=f"{role}{index}", pid=1, endpoint=""))
    d.sent, d.inbox_feed = [], []
    real_broadcast = d.broadcast

    def broadcast(message):
        d.sent.append(message)  # as built: its epoch is stamped by the real broadcast
        return real_broadcast(message)

    d.broadcast = broadcast
    d._poll = lambda timeout_ms: d.inbox_feed.pop(0) if d.inbox_feed else None
    yield d
    d.ctx.destroy(linger=0)


def _start(driver, max_tokens=4) -> Job:
    job = Job("r1", list(PROMPT), SamplingParams(), StopRule(max_tokens, frozenset()))
    driver.jobs.put(job)
    driver._admit(0.0)
    return job


def _feed(driver, build, pos, value):
    """A DRAFT or EXIT (`build`: runtime_util.draft / exit_) of the request's current epoch at `pos`."""
    driver.inbox_feed.append(build(0, driver.runs[0].epoch, pos, value, rid="r1"))
    driver._step()


def _tokens(job):
    events = []
    while not job.events.empty():
        events.append(job.events.get())
    return [e[1] for e in events if e[0] == "token"], [e for e in events if e[0] != "token"]


def test_exits_are_judged_against_drafts_accepts_pass_and_a_reject_reseeds(driver):
    job = _start(driver)
    first = driver.sent[0]
    assert isinstance(first, wire.Prefill) and first.prompt_len == 3 and first.ids.tolist() == PROMPT
    assert (first.rid, first.slot, first.routes) == ("r1", 0, driver.routes)
    _feed(driver, exit_, 2, 10)  # the prefill's last position: the first token, then stage 1 restarts
    assert driver.sent[-1] == wire.Reseed(rid="r1", slot=0, pos=3, base=3, token=10)
    _feed(driver, draft, 4, 11)
    _feed(driver, exit_, 3, 11)  # the draft for 4 was right: committed, nothing broadcast
    assert isinstance(driver.sent[-1], wire.Reseed) and len(driver.sent) == 2
    _feed(driver, draft, 5, 99)
    _feed(driver, exit_, 4, 12)  # wrong draft: the target's token is committed, the pipeline reseeded
    assert driver.sent[-1] == wire.Reseed(rid="r1", slot=0, pos=5, base=5, token=12)
    _feed(driver, exit_, 5, 13)  # no draft for 6 yet: the judgement waits for it (up to draft_wait_s)
    assert len(driver.runs[0].verifier.generated) == 3
    _feed(driver, draft, 6, 13)  # it arrives: right, and the 4th token reaches max_tokens
    tokens, rest = _tokens(job)
    assert tokens == [10, 11, 12, 13]
    (done,) = rest
    assert done[:2] == ("done", "length") and (done[2].accepts, done[2].rejects) == (2, 1)
    assert driver.sent[-1] == wire.Cancel(rid="r1", slot=0) and not driver.runs  # the slot is free


def test_a_protocol_error_re_prefills_the_committed_tokens_under_a_new_epoch(driver):
    job = _start(driver)
    _feed(driver, exit_, 2, 10)
    before = driver.runs[0].epoch
    driver.inbox_feed.append(wire.Error(rid="r1", epoch=before, slot=0, role="stage", index=2,
                                        reason="KV length 7 != position 4"))
    driver._step()
    again = driver.sent[-1]
    assert isinstance(again, wire.Prefill) and again.prompt_len == 3 and driver.runs[0].epoch > before
    assert again.ids.tolist() == PROMPT + [10]  # the committed token, after the prompt
    assert driver.runs[0].stats.recoveries == 1
    assert _tokens(job)[0] == [10]  # what was streamed stays streamed


def test_an_error_about_an_old_epoch_is_ignored_and_a_compute_error_recovers(driver):
    _start(driver)
    _feed(driver, exit_, 2, 10)
    old = driver.runs[0].epoch - 1  # a message the last RESEED already voided
    driver.inbox_feed.append(wire.Error(rid="r1", epoch=old, slot=0, role="stage", index=2, reason="late"))
    driver._step()
    assert driver.runs[0].stats.recoveries == 0 and isinstance(driver.sent[-1], wire.Reseed)
    driver.inbox_feed.append(wire.Error(role="stage", index=1, reason="compute: boom", compute=True))
    driver._step()
    assert driver.runs[0].stats.recoveries == 1 and isinstance(driver.sent[-1], wire.Prefill)
