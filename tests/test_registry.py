"""The orchestrator's worker registry: liveness, restarts, and which roles a warm spare takes over."""

from __future__ import annotations

from spd.runtime.registry import Registry


def _cluster(r: Registry) -> None:
    for j in range(1, r.n + 1):
        assert r.beat("stage", j, f"s{j}", 100 + j, f"tcp://h:{j}") == "new"
    assert r.beat("drafter", 0, "d", 200, "tcp://h:9") == "new"


def test_a_role_never_held_is_not_vacant_so_spares_do_not_race_starting_workers():
    r = Registry(2)
    r.beat("spare", 1, "sp1", 300, "tcp://h:20")
    assert r.missing() == ["stage 1", "stage 2", "drafter"]
    assert r.vacancies() == []


def test_a_dropped_connection_makes_its_role_vacant_at_once_and_one_spare_fills_it():
    r = Registry(2)
    _cluster(r)
    r.beat("spare", 1, "sp1", 300, "tcp://h:20")
    assert r.endpoint_down("tcp://h:2") == [("stage", 2)]
    assert r.missing(need_drafter=False) == ["stage 2"] and r.vacancies() == [("stage", 2)]
    spare = r.take_spare(("stage", 2))
    assert spare.endpoint == "tcp://h:20"
    assert r.vacancies() == []  # a spare is on its way
    assert r.take_spare(("drafter", 0)) is None  # and it was the only one
    assert r.beat("spare", 1, "sp1", 300, "tcp://h:20") == "ignored"  # its last beats as a spare
    assert r.beat("stage", 2, "sp1-as-stage", 300, "tcp://h:20") == "restart"
    assert r.missing() == []


def test_stages_come_before_the_drafter_when_both_lost_their_worker():
    r = Registry(2)
    _cluster(r)
    r.endpoint_down("tcp://h:9")
    r.endpoint_down("tcp://h:1")
    assert r.vacancies() == [("stage", 1), ("drafter", 0)]


def test_a_spare_that_dies_on_its_way_leaves_the_role_vacant_again():
    r = Registry(1)
    _cluster(r)
    r.beat("spare", 1, "sp1", 300, "tcp://h:20")
    r.endpoint_down("tcp://h:1")
    r.take_spare(("stage", 1))
    r.endpoint_down("tcp://h:20")
    assert r.vacancies() == [("stage", 1)]


def test_a_second_claimant_waits_while_the_holder_lives_and_the_old_incarnation_stays_retired():
    r = Registry(1)
    _cluster(r)
    assert r.beat("stage", 1, "other", 400, "tcp://h:30") == "ignored"  # e.g. a restarted pod
    r.endpoint_down("tcp://h:1")
    assert r.beat("stage", 1, "other", 400, "tcp://h:30") == "restart"
    assert r.beat("stage", 1, "s1", 101, "tcp://h:1") == "ignored"  # the replaced one, if it ever beats again
    assert r.workers[("stage", 1)].endpoint == "tcp://h:30"


def test_a_heartbeat_in_flight_before_the_drop_does_not_revive_a_dead_worker():
    r = Registry(1, timeout_s=2.0)
    _cluster(r)
    r.endpoint_down("tcp://h:1")
    assert r.beat("stage", 1, "s1", 101, "tcp://h:1") == "same"
    assert not r.alive("stage", 1)
