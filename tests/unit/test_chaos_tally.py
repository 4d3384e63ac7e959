"""Which typed errors a chaos scenario's fault explains (``rigs.chaos.unexplained_typed``).

The chaos tests assert there are none unexplained, so the rule must be exact: a
refusal to publish whose wait ended after the fault landed and that was sent
before the first call sent after the dependency's return succeeded.
"""

from __future__ import annotations

from rigs.chaos import CallRecord, Tally, unexplained_typed

DOWN, BACK = 100.0, 103.0


def _ok(started: float, ended: float) -> CallRecord:
    return CallRecord(started, ended, "ok")


def _refused(started: float, ended: float) -> CallRecord:
    return CallRecord(started, ended, "typed", "BrokerUnavailableError", refused=True)


def test_a_refusal_while_the_dependency_is_away_is_explained() -> None:
    records = [_refused(101.0, 101.1), _refused(DOWN - 0.01, DOWN + 0.2), _ok(103.5, 104.0)]

    assert unexplained_typed(records, DOWN, BACK) == []


def test_a_refusal_before_the_fault_or_after_the_recovery_is_not() -> None:
    early, late = _refused(90.0, 90.1), _refused(104.5, 104.6)
    records = [early, _ok(103.5, 104.0), late]  # recovered at 104.0

    assert unexplained_typed(records, DOWN, BACK) == [early, late]


def test_a_refusal_sent_before_the_recovery_is_explained_even_if_back_was_earlier() -> None:
    records = [_refused(103.2, 103.3), _ok(103.4, 104.0)]

    assert unexplained_typed(records, DOWN, BACK) == []


def test_a_tools_own_error_is_never_explained_by_the_fault() -> None:
    failed = CallRecord(101.0, 102.0, "typed", "unavailable")

    assert unexplained_typed([failed, _ok(103.5, 104.0)], DOWN, BACK) == [failed]


def test_without_a_fault_every_typed_error_is_unexplained() -> None:
    records = [_refused(1.0, 1.1), _ok(2.0, 2.1)]

    assert unexplained_typed(records, None, None) == records[:1]


def test_the_tally_counts_them() -> None:
    records = [_refused(101.0, 101.1), _refused(90.0, 90.1), _ok(103.5, 104.0)]

    tally = Tally.of("scenario", records, BACK, down_at=DOWN)

    assert (tally.typed, tally.typed_unexplained) == (2, 1)
