"""The orchestrator's driver, in process: messages are fed to it directly and what it broadcasts is
recorded, so sequencing, verification and recovery are checked deterministically, without processes.

Greedy, n = 2, one request: the prefill's EXIT gives the first token; each later EXIT is judged
against the draft for the next position (accept: no broadcast; reject: RESEED with the target's
token); a worker's protocol ERROR re-prefills the committed tokens under a new epoch.
"""

from __future__ import annotations

import pytest

from runtime_util import ipc_topology
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
        d._register({"role": role, "index": index, "incarnation": f"{role}{index}", "pid": 1, "endpoint": ""})
    d.sent, d.inbox_feed = [], []
    real_broadcast = d.broadcast

    def broadcast(kind, header, tensors=None, epoch_bump=True):
        d.sent.append((kind, dict(header)))
        return real_broadcast(kind, header, tensors, epoch_bump)

    d.broadcast = broadcast
    d._poll = lambda timeout_ms: d.inbox_feed.pop(0) if d.inbox_feed else None
    yield d
    d.ctx.destroy(linger=0)


def _start(driver, max_tokens=4) -> Job:
    job = Job("r1", list(PROMPT), SamplingParams(), StopRule(max_tokens, frozenset()))
    driver.jobs.put(job)
    driver._admit(0.0)
    return job


def _feed(driver, kind, pos, **header):
    run = driver.runs[0]
    driver.inbox_feed.append(wire.Message(kind, {"rid": "r1", "epoch": run.epoch, "pos": pos, "slot": 0, **header}))
    driver._step()


def _tokens(job):
    events = []
    while not job.events.empty():
        events.append(job.events.get())
    return [e[1] for e in events if e[0] == "token"], [e for e in events if e[0] != "token"]


def test_exits_are_judged_against_drafts_accepts_pass_and_a_reject_reseeds(driver):
    job = _start(driver)
    assert driver.sent[0][0] == "PREFILL" and driver.sent[0][1]["prompt_len"] == 3
    _feed(driver, "EXIT", 2, argmax=10)  # the prefill's last position: the first token, then stage 1 restarts
    assert driver.sent[-1] == ("RESEED", {"rid": "r1", "slot": 0, "pos": 3, "base": 3, "token": 10})
    _feed(driver, "DRAFT", 4, token=11)
    _feed(driver, "EXIT", 3, argmax=11)  # the draft for 4 was right: committed, nothing broadcast
    assert driver.sent[-1][0] == "RESEED" and len(driver.sent) == 2
    _feed(driver, "DRAFT", 5, token=99)
    _feed(driver, "EXIT", 4, argmax=12)  # wrong draft: the target's token is committed, the pipeline reseeded
    assert driver.sent[-1] == ("RESEED", {"rid": "r1", "slot": 0, "pos": 5, "base": 5, "token": 12})
    _feed(driver, "EXIT", 5, argmax=13)  # no draft for 6 yet: the judgement waits for it (up to draft_wait_s)
    assert len(driver.runs[0].verifier.generated) == 3
    _feed(driver, "DRAFT", 6, token=13)  # it arrives: right, and the 4th token reaches max_tokens
    tokens, rest = _tokens(job)
    assert tokens == [10, 11, 12, 13]
    (done,) = rest
    assert done[:2] == ("done", "length") and (done[2].accepts, done[2].rejects) == (2, 1)
    assert driver.sent[-1] == ("CANCEL", {"rid": "r1", "slot": 0}) and not driver.runs  # the slot is free


def test_a_protocol_error_re_prefills_the_committed_tokens_under_a_new_epoch(driver):
    job = _start(driver)
    _feed(driver, "EXIT", 2, argmax=10)
    before = driver.runs[0].epoch
    _feed(driver, "ERROR", 0, role="stage", index=2, reason="KV length 7 != position 4")
    kind, header = driver.sent[-1]
    assert kind == "PREFILL" and header["prompt_len"] == 3 and driver.runs[0].epoch > before
    assert driver.runs[0].stats.recoveries == 1
    assert _tokens(job)[0] == [10]  # what was streamed stays streamed
