"""``toolexec status``, the workers' Prometheus metrics and JSON call logs, on a real worker.

One worker of its own (own key prefix and default queue, so that the shared
worker's calls never mix in) runs a known set of calls once per module: three
successes, one success after two 503s, one 404, and two failures that open a
breaker. Each test then checks one view of those same calls.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from integration_support import closed_port, stall_queue
from observability_tools import PARKED_QUEUE
from prometheus_client.parser import text_string_to_metric_families

from toolexec.client import ToolClient
from toolexec.ops.cli import cli
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply, WorkerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def obs_settings(settings: Settings) -> Settings:
    tag = uuid.uuid4().hex[:8]
    return settings.model_copy(update={"key_prefix": f"obs-{tag}", "default_queue": f"obs-{tag}"})


@pytest.fixture(scope="module")
def obs_env(obs_settings: Settings, worker_env: dict[str, str]) -> dict[str, str]:
    return {
        **worker_env,
        "TOOLEXEC_KEY_PREFIX": obs_settings.key_prefix,
        "TOOLEXEC_DEFAULT_QUEUE": obs_settings.default_queue,
    }


def _start(env: dict[str, str], settings: Settings, log: Path, **options: Any) -> WorkerProcess:
    proc = WorkerProcess("observability_tools", env, log_path=log, **options)
    proc.start(settings.redis_url or "", settings.key_prefix)
    return proc


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return closed_port()


@pytest.fixture(scope="module")
def obs_worker(
    obs_settings: Settings,
    obs_env: dict[str, str],
    metrics_port: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    env = {**obs_env, "TOOLEXEC_LOG_FORMAT": "json", "TOOLEXEC_METRICS_PORT": str(metrics_port)}
    log = tmp_path_factory.mktemp("obs") / "worker.log"
    proc = _start(env, obs_settings, log, queues=obs_settings.default_queue)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def obs_client(obs_settings: Settings, obs_worker: WorkerProcess) -> Iterator[ToolClient]:
    with ToolClient(obs_settings) as tool_client:
        yield tool_client


@pytest.fixture(scope="module")
def scenario(obs_client: ToolClient, flaky: FlakyServer) -> dict[str, ToolResult]:
    """The calls every test here looks at, made once."""
    ok = flaky.script(flaky.unique_path("ok"), Reply(200))
    flapping = flaky.script(
        flaky.unique_path("flapping"), Reply(503), Reply(503), Reply(200, {"fine": True})
    )
    missing = flaky.script(flaky.unique_path("missing"), Reply(404))
    results = {
        f"ok{i}": obs_client.call("obs_fetch", {"url": ok}, run_id="run-obs") for i in range(3)
    }
    results["flapping"] = obs_client.call("obs_fetch", {"url": flapping}, run_id="run-obs")
    results["missing"] = obs_client.call("obs_fetch", {"url": missing}, run_id="run-obs")
    results["breaking1"] = obs_client.call("obs_breaking")
    results["breaking2"] = obs_client.call("obs_breaking")
    assert [r.status for r in results.values()].count("ok") == 4, results
    assert results["flapping"].attempts == 3
    return results


def _status(env: dict[str, str], *args: str) -> Any:
    result = CliRunner().invoke(cli, ["status", *args], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output) if "--json" in args else result.output


def _tool(view: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in view["tools"] if t["tool"] == name)


def _eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        found = check()
        if found or time.monotonic() > end:
            return found
        time.sleep(0.1)


# -- toolexec status --------------------------------------------------------------


def test_status_counts_calls_retries_and_failures_per_tool(
    scenario: dict[str, ToolResult], obs_env: dict[str, str]
) -> None:
    """Given 5 calls of obs_fetch (4 ok, one after two 503s; one 404) and 2 failed obs_breaking,
    when an operator runs ``toolexec status --json``,
    then each tool's calls, outcomes, attempts, retries and rates are exact."""

    def settled() -> dict[str, Any] | None:
        # an attempt listed as running (it outlived a flush) leaves the list at the
        # worker's next flush (every 0.25 s): on a loaded machine, after the result
        view: dict[str, Any] = _status(obs_env, "--json")
        return view if _tool(view, "obs_fetch")["in_flight"] == 0 else None

    view = _eventually(settled)
    assert view is not None, "obs_fetch still listed as running 10 s after its calls ended"

    fetch = _tool(view, "obs_fetch")
    assert (fetch["calls"], fetch["ok"], fetch["failed"]) == (5, 4, {"not_found": 1})
    assert (fetch["attempts"], fetch["retries"], fetch["retried"]) == (7, 2, {"unavailable": 2})
    assert fetch["failure_rate"] == pytest.approx(0.2)
    assert fetch["retry_rate"] == pytest.approx(2 / 7)
    assert fetch["in_flight"] == 0
    breaking = _tool(view, "obs_breaking")
    assert (breaking["calls"], breaking["failed"], breaking["retries"]) == (
        2,
        {"unavailable": 2},
        0,
    )


def test_status_lists_the_live_worker_and_the_open_breaker(
    scenario: dict[str, ToolResult], obs_env: dict[str, str], obs_worker: WorkerProcess
) -> None:
    """Given a running worker whose obs_breaking breaker opened,
    when ``toolexec status --json --ping`` runs,
    then the worker is listed with a fresh heartbeat and a pong, and the breaker as open."""
    view = _status(obs_env, "--json", "--ping")

    worker = next(w for w in view["workers"] if w["name"] == obs_worker.hostname)
    assert worker["heartbeat_age_s"] < 45
    assert worker["answered_ping"] is True
    breaker = next(b for b in view["breakers"] if b["name"] == "obs_breaking")
    assert breaker["state"] == "open"


def test_status_shows_waiting_calls_and_calls_in_flight(
    obs_client: ToolClient, obs_env: dict[str, str], obs_settings: Settings
) -> None:
    """Given 3 calls routed to a queue no worker consumes and one call running for 2 s,
    when ``toolexec status`` runs meanwhile,
    then the queue shows 3 waiting, the running tool 1 in flight, and 0 once it ended."""
    stall_queue(obs_client.redis, obs_client.keys, PARKED_QUEUE)
    # RabbitMQ keeps a queue across runs: what an earlier run left parked there counts too
    before = {q["name"]: q["waiting"] for q in _status(obs_env, "--json")["queues"]}
    for _ in range(3):
        obs_client.submit("obs_parked", {}, timeout=60)
    handle = obs_client.submit("obs_hold", {"seconds": 2.0})

    running = _eventually(lambda: _tool(_status(obs_env, "--json"), "obs_hold")["in_flight"])
    view = _status(obs_env, "--json")

    assert running == 1
    queues = {q["name"]: q["waiting"] for q in view["queues"]}
    assert queues[PARKED_QUEUE] - (before.get(PARKED_QUEUE) or 0) == 3
    assert queues[obs_settings.default_queue] == 0
    assert handle.result().ok
    assert _tool(_status(obs_env, "--json"), "obs_hold")["in_flight"] == 0


def test_status_prints_tables_for_people(
    scenario: dict[str, ToolResult], obs_env: dict[str, str]
) -> None:
    """Without --json the same view is a set of tables with the tools' rates."""
    text = _status({**obs_env, "COLUMNS": "120"}, "--minutes", "10")

    for heading in ("Queues on", "Workers", "Circuit breakers", "Tools, last 10 min"):
        assert heading in text
    rows = [line.split() for line in text.splitlines() if "obs_fetch" in line]
    assert "20%" in rows[0]  # the tools table: its failure rate
    assert ["obs_fetch", "not_found", "1"] in rows  # failures by type, a row each


# -- Prometheus metrics -----------------------------------------------------------


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_metrics_count_outcomes_attempts_retries_and_latency_per_tool(
    scenario: dict[str, ToolResult], metrics_port: int
) -> None:
    """Given the scenario's calls, when Prometheus scrapes the worker's --metrics-port,
    then calls by outcome, attempts, retries by error type and latency counts match them."""
    samples = _scrape(metrics_port)

    assert _value(samples, "toolexec_calls_total", tool="obs_fetch", outcome="ok") == 4
    assert _value(samples, "toolexec_calls_total", tool="obs_fetch", outcome="not_found") == 1
    assert _value(samples, "toolexec_attempts_total", tool="obs_fetch") == 7
    retries = _value(samples, "toolexec_retries_total", tool="obs_fetch", error_type="unavailable")
    assert retries == 2
    assert _value(samples, "toolexec_call_duration_seconds_count", tool="obs_fetch") == 5
    assert _value(samples, "toolexec_attempt_duration_seconds_count", tool="obs_fetch") == 7
    total = _value(samples, "toolexec_call_duration_seconds_sum", tool="obs_fetch") or 0.0
    ended = [r.elapsed_ms / 1000 for k, r in scenario.items() if not k.startswith("breaking")]
    assert total == pytest.approx(sum(ended), rel=1e-6)
    assert _value(samples, "toolexec_calls_in_flight", tool="obs_fetch") == 0
    unavailable = _value(
        samples, "toolexec_calls_total", tool="obs_breaking", outcome="unavailable"
    )
    assert unavailable == 2


def test_metrics_report_breaker_states_and_transitions(
    scenario: dict[str, ToolResult], metrics_port: int
) -> None:
    """Given obs_breaking's breaker opened by this worker, a scrape shows it open (read from
    Redis) and counts the one transition to open (from the breaker's listener)."""
    samples = _scrape(metrics_port)

    assert _value(samples, "toolexec_breaker_state", breaker="obs_breaking", state="open") == 1
    assert _value(samples, "toolexec_breaker_state", breaker="obs_breaking", state="closed") == 0
    opened = _value(
        samples, "toolexec_breaker_transitions_total", breaker="obs_breaking", state="open"
    )
    assert opened == 1


def test_metrics_page_declares_fallback_and_offload_series(
    scenario: dict[str, ToolResult], metrics_port: int
) -> None:
    """Series without samples yet still carry HELP and TYPE, so dashboards can be built first."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()

    for name in (
        "toolexec_fallbacks_total",
        "toolexec_offloaded_payloads_total",
        "toolexec_offloaded_bytes_total",
    ):
        assert f"# TYPE {name} counter" in text


def test_metrics_count_offloaded_results_and_their_bytes(
    obs_client: ToolClient, metrics_port: int
) -> None:
    """Given a call whose 60 kB result is stored instead of travelling inline, a scrape counts
    one offloaded result of at least that many bytes for its tool."""
    result = obs_client.call("obs_big", {"size": 60_000})

    assert result.ok and result.payload is not None, result
    samples = _scrape(metrics_port)
    offloaded = _value(samples, "toolexec_offloaded_payloads_total", tool="obs_big", kind="result")
    stored = _value(samples, "toolexec_offloaded_bytes_total", tool="obs_big", kind="result")
    assert offloaded == 1
    assert (stored or 0) >= 60_000


def test_a_prefork_worker_serves_the_sum_of_its_children(
    obs_settings: Settings,
    obs_env: dict[str, str],
    flaky: FlakyServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Given a prefork worker with two children and --metrics-port,
    when six calls ran (spread over both children),
    then one scrape of the parent reports all six: multiprocess mode adds the children up."""
    tag = uuid.uuid4().hex[:8]
    settings = obs_settings.model_copy(
        update={"key_prefix": f"pre-{tag}", "default_queue": f"pre-{tag}"}
    )
    port = closed_port()
    env = {
        **obs_env,
        "TOOLEXEC_KEY_PREFIX": settings.key_prefix,
        "TOOLEXEC_DEFAULT_QUEUE": settings.default_queue,
        "TOOLEXEC_METRICS_PORT": str(port),
    }
    log = tmp_path_factory.mktemp("prefork") / "worker.log"
    proc = _start(env, settings, log, queues=settings.default_queue, pool="prefork", concurrency=2)
    try:
        url = flaky.script(flaky.unique_path("prefork"), Reply(200))
        with ToolClient(settings) as client:
            results = client.call_many([("obs_fetch", {"url": url})] * 6)
        assert all(r.ok for r in results), results
        samples = _scrape(port)
    finally:
        proc.stop()

    assert _value(samples, "toolexec_calls_total", tool="obs_fetch", outcome="ok") == 6
    assert _value(samples, "toolexec_attempt_duration_seconds_count", tool="obs_fetch") == 6


# -- structured logs --------------------------------------------------------------


def test_each_call_outcome_is_one_json_log_line_with_its_ids(
    scenario: dict[str, ToolResult], obs_worker: WorkerProcess
) -> None:
    """Given TOOLEXEC_LOG_FORMAT=json, every line the worker wrote is a JSON object, and the
    404 call's outcome line carries its call id, run id, tool, attempts, error type, elapsed."""
    assert obs_worker.log_path is not None
    lines = [line for line in obs_worker.log_path.read_text().splitlines() if line.strip()]
    assert [line for line in lines if not line.startswith("{")] == []
    records = [json.loads(line) for line in lines]

    missing = scenario["missing"]
    outcome = next(
        r
        for r in records
        if r.get("event") == "call_finished" and r.get("call_id") == missing.call_id
    )
    assert outcome["run_id"] == "run-obs"
    assert outcome["tool"] == "obs_fetch"
    assert outcome["status"] == "error"
    assert outcome["error_type"] == "not_found"
    assert outcome["attempts"] == 1
    assert outcome["elapsed_ms"] == pytest.approx(missing.elapsed_ms, abs=0.01)
    assert {"ts", "level", "logger", "message"} <= set(outcome)
