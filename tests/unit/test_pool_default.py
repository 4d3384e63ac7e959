"""The pool `toolexec worker` picks when nobody said, and the sentence that says why."""

from __future__ import annotations

from toolexec.ops.pool_default import choose_pool


def test_nothing_configured_gives_threads_and_advice_for_the_cores() -> None:
    """Given no pool or slots, when chosen on 4 cores, then threads, and 4 workers advised."""
    choice = choose_pool(4, None, None, 32)
    assert (choice.pool, choice.concurrency) == ("threads", 32)
    assert "runs a process per core" in choice.reason


def test_one_core_gets_no_advice_to_start_more_workers() -> None:
    """Given one core, when chosen, then the reason does not suggest more processes."""
    assert "workers to use them" not in choose_pool(1, None, None, 32).reason


def test_slots_given_alone_keep_the_default_pool() -> None:
    """Given only --concurrency 8, when chosen, then threads with 8 slots."""
    choice = choose_pool(2, None, 8, 32)
    assert (choice.pool, choice.concurrency) == ("threads", 8)


def test_a_configured_pool_is_taken_as_given() -> None:
    """Given --pool prefork -c 3, when chosen, then exactly that, said as configured."""
    choice = choose_pool(2, "prefork", 3, 32)
    assert (choice.pool, choice.concurrency) == ("prefork", 3)
    assert choice.reason.endswith("as configured")
