"""Gather (runtime/gather.py): ready work waits for the rest of the decoding requests, boundedly."""

from spd.runtime.gather import Gather


def test_work_runs_at_once_when_every_decoding_request_is_ready():
    g = Gather(2.0)
    g.observe(0.010)
    assert g.hold_until(ready=3, decoding=3, now=5.0) is None
    assert g.hold_until(ready=1, decoding=1, now=5.0) is None  # one request alone never waits


def test_partial_work_waits_at_most_factor_times_the_recent_compute_time():
    g = Gather(2.0)
    g.observe(0.010)
    assert g.hold_until(ready=1, decoding=4, now=5.0) == 5.020
    assert g.hold_until(ready=2, decoding=4, now=5.015) == 5.020  # the wait counts from the first ready
    assert g.hold_until(ready=2, decoding=4, now=5.020) is None  # the deadline passed: run what is ready
    assert g.hold_until(ready=1, decoding=4, now=6.0) == 6.020  # a new wait starts afresh


def test_more_work_arriving_ends_the_wait():
    g = Gather(2.0)
    g.observe(0.010)
    assert g.hold_until(ready=1, decoding=2, now=1.0) is not None
    assert g.hold_until(ready=2, decoding=2, now=1.001) is None


def test_no_wait_before_any_compute_was_timed_or_when_turned_off():
    assert Gather(2.0).hold_until(ready=1, decoding=4, now=0.0) is None
    off = Gather(0.0)
    off.observe(0.010)
    assert off.hold_until(ready=1, decoding=4, now=0.0) is None


def test_the_compute_time_is_a_running_average():
    g = Gather(1.0)
    g.observe(0.010)
    g.observe(0.020)
    assert abs(g.cost_s - 0.012) < 1e-12
