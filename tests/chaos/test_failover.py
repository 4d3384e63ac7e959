"""A Sentinel failover and a RabbitMQ restart under calls in flight.

What the README's chaos table claims for both, asserted at that strength: no
call lost or hung, every call in flight when the fault landed ``ok``, and the
only typed errors the trickle's calls refused before publishing while the
dependency was away (``Tally.typed_unexplained`` counts any other: a tool's
error, or a refusal before the fault or after the first new call got through).
The rig fails the test if the calls were not running when the fault landed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import BENCH
from rigs.chaos import (
    Fault,
    RabbitServer,
    fail_over,
    restart_rabbitmq,
    rig,
    run_fault,
    sentinel_rig,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(240)]

IN_FLIGHT = 10


def test_calls_continue_after_a_sentinel_failover(tmp_path: Path) -> None:
    with sentinel_rig(tmp_path, BENCH, workers=1) as built:
        fault = Fault("sentinel-failover", fail_over, in_flight=IN_FLIGHT, timeout=30)
        tally = run_fault(built, fault)
        alive = all(w.process is not None and w.process.poll() is None for w in built.workers)

    assert alive
    assert (tally.lost, tally.hung) == (0, 0), tally
    assert tally.in_flight_ok == (IN_FLIGHT, IN_FLIGHT), tally
    assert tally.typed_unexplained == 0, tally
    assert tally.recovery_s is not None, tally  # new calls succeed on the promoted replica


@pytest.mark.skipif(not RabbitServer.available(), reason="no rabbitmq-server binary on this host")
def test_calls_survive_a_rabbitmq_restart(tmp_path: Path) -> None:
    with rig(tmp_path, BENCH, workers=1, rabbitmq=True) as built:
        tally = run_fault(
            built, Fault("rabbitmq-restart", restart_rabbitmq, in_flight=IN_FLIGHT, timeout=60)
        )
        alive = all(w.process is not None and w.process.poll() is None for w in built.workers)

    assert alive
    assert (tally.lost, tally.hung) == (0, 0), tally
    assert tally.in_flight_ok == (IN_FLIGHT, IN_FLIGHT), tally
    assert tally.typed_unexplained == 0, tally
    assert tally.recovery_s is not None and tally.recovery_s <= 5.0, tally
