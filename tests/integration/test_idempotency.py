"""Side-effecting tools run at most once per key, on a real worker against a service that counts.

The "service" is a ledger on the FlakyServer (see ``idempotency_support``):
every POST of an order is one effect, recorded as it arrives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from idempotency_support import idem_env, order_arguments, run_id, start_worker, wait_until

from toolexec.client import ToolClient
from toolexec.errors import ErrorType
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Ledger, Reply, WorkerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def idem_worker(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    log = tmp_path_factory.mktemp("idem") / "worker.log"
    proc = start_worker(idem_env(worker_env), settings, log, queues="idem", concurrency=8)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def idem_client(settings: Settings, idem_worker: WorkerProcess) -> Iterator[ToolClient]:
    with ToolClient(settings) as tool_client:
        yield tool_client


@pytest.fixture
def ledger(flaky: FlakyServer) -> Ledger:
    return Ledger.open(flaky)


def test_two_concurrent_identical_calls_write_once_and_both_get_the_result(
    idem_client: ToolClient, ledger: Ledger
) -> None:
    """Given a slow write, when the same call is made twice at once, then the service sees one."""
    order = ledger.entry("o-1", Reply(delay=1.5))
    run = run_id()
    first = idem_client.submit(
        "place_order", order_arguments(ledger, order), run_id=run, timeout=20
    )
    # its request has reached the service (which answers after 1.5 s), so it holds the lease
    # it took before calling: the second must join it
    wait_until(lambda: len(ledger.writes(order)) == 1, 10, "the first call's write under way")
    second = idem_client.submit(
        "place_order", order_arguments(ledger, order), run_id=run, timeout=20
    )

    a, b = first.result(), second.result()

    assert len(ledger.writes(order)) == 1
    assert a.ok and b.ok and a.data == b.data
    assert [a.replayed, b.replayed] == [False, True]
    assert b.attempts == 0 and b.call_id == second.call_id
    assert b.elapsed_ms > 800  # it waited for the first call's outcome: it joined


def test_a_repeat_after_completion_is_replayed_at_once(
    idem_client: ToolClient, ledger: Ledger
) -> None:
    """Given a finished write, when the agent repeats it in the same run, then it is replayed."""
    order = ledger.entry("o-2")
    run = run_id()
    first = idem_client.call("place_order", order_arguments(ledger, order, 12.5), run_id=run)

    again = idem_client.call("place_order", order_arguments(ledger, order, 12.50), run_id=run)

    assert first.ok and not first.replayed
    assert again.ok and again.replayed and again.data == first.data
    assert len(ledger.writes(order)) == 1
    assert again.for_model()["replayed"] is True


def test_a_caller_key_reused_with_other_arguments_is_a_mismatch(
    idem_client: ToolClient, ledger: Ledger
) -> None:
    """Given a key used for one order, when it is sent with another amount, then it is refused."""
    order = ledger.entry("o-3")
    key = f"charge-{run_id()}"
    first = idem_client.call("place_order", order_arguments(ledger, order, 10), idempotency_key=key)

    other = idem_client.call("place_order", order_arguments(ledger, order, 99), idempotency_key=key)

    assert first.ok
    assert other.status == "error" and other.error is not None
    assert other.error.type is ErrorType.IDEMPOTENCY_MISMATCH and not other.error.retryable
    assert len(ledger.writes(order)) == 1


def test_a_caller_key_deduplicates_across_runs(idem_client: ToolClient, ledger: Ledger) -> None:
    """Given a caller key, when two runs send the same call with it, then it runs once."""
    order = ledger.entry("o-4")
    key = f"order-{run_id()}"
    first = idem_client.call(
        "place_order", order_arguments(ledger, order), run_id=run_id(), idempotency_key=key
    )

    second = idem_client.call(
        "place_order", order_arguments(ledger, order), run_id=run_id(), idempotency_key=key
    )

    assert first.ok and second.replayed and second.data == first.data
    assert len(ledger.writes(order)) == 1


def test_an_uncertain_write_is_checked_before_any_retry_and_not_repeated(
    idem_client: ToolClient, ledger: Ledger
) -> None:
    """Given a write that lands but answers after the tool's 1 s limit, then its retry checks.

    The first attempt times out: the order may or may not exist. The retry asks
    the tool's check, which finds it, so the write is not sent again.
    """
    order = ledger.entry("o-5", Reply(delay=2.0), Reply())

    result = idem_client.call(
        "place_order_hastily", order_arguments(ledger, order), run_id=run_id()
    )

    assert result.ok and result.source == "check"
    assert result.data == {"order_id": order, "found": True}
    assert len(ledger.writes(order)) == 1
    assert len(ledger.checks(order)) == 1


def test_an_uncertain_write_without_a_check_ends_unknown_and_is_not_repeated(
    idem_client: ToolClient, ledger: Ledger
) -> None:
    """Given a timed-out write and no check, then the call says unknown instead of retrying."""
    order = ledger.entry("o-6", Reply(delay=2.0), Reply())
    run = run_id()

    result = idem_client.call("place_order_blind", order_arguments(ledger, order), run_id=run)
    again = idem_client.call("place_order_blind", order_arguments(ledger, order), run_id=run)

    assert result.status == "unknown" and result.error is not None
    assert result.error.type is ErrorType.TIMEOUT and result.error.suggestion
    assert again.status == "unknown" and again.replayed
    assert len(ledger.writes(order)) == 1


def test_identical_reads_in_flight_share_one_request(
    idem_client: ToolClient, flaky: FlakyServer
) -> None:
    """Given a coalescing read-only tool, when two runs ask the same at once, then one request."""
    path = flaky.unique_path("stock")
    url = flaky.script(path, Reply(body={"left": 3}, delay=1.0))
    handles = [
        idem_client.submit("read_stock", {"url": url}, run_id=run_id(), timeout=20)
        for _ in range(2)
    ]

    results = [h.result() for h in handles]

    assert [r.data for r in results] == [{"left": 3}, {"left": 3}]
    assert len(flaky.hits(path)) == 1
    later = idem_client.call("read_stock", {"url": url}, run_id=run_id())
    assert later.ok and not later.replayed and len(flaky.hits(path)) == 2  # nothing cached


def test_a_worker_log_mentions_no_error(idem_worker: WorkerProcess, tmp_path: Path) -> None:
    """The worker that served this module never logged a traceback."""
    assert idem_worker.log_path is not None
    assert "Traceback" not in idem_worker.log_path.read_text()
