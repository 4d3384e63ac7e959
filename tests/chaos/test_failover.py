"""A Sentinel failover and a RabbitMQ restart under calls in flight."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import BENCH

from toolexec.chaos import (
    Fault,
    RabbitServer,
    fail_over,
    restart_rabbitmq,
    rig,
    run_fault,
    sentinel_rig,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(240)]


def test_calls_continue_after_a_sentinel_failover(tmp_path: Path) -> None:
    with sentinel_rig(tmp_path, BENCH, workers=1) as built:
        tally = run_fault(built, Fault("sentinel-failover", fail_over, in_flight=10, timeout=30))

    assert tally.hung == 0, tally
    assert tally.recovery_s is not None, tally  # new calls succeed on the promoted replica
    # only what was in flight on the dead master may be lost (asynchronous replication)
    assert tally.lost <= 10, tally


@pytest.mark.skipif(not RabbitServer.available(), reason="no rabbitmq-server binary on this host")
def test_calls_survive_a_rabbitmq_restart(tmp_path: Path) -> None:
    with rig(tmp_path, BENCH, workers=1, rabbitmq=True) as built:
        tally = run_fault(
            built, Fault("rabbitmq-restart", restart_rabbitmq, in_flight=10, timeout=60)
        )
        alive = all(w.process is not None and w.process.poll() is None for w in built.workers)

    assert alive
    assert (tally.lost, tally.hung) == (0, 0), tally
    assert tally.recovery_s is not None and tally.recovery_s <= 5.0, tally
