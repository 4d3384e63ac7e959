"""OpenTelemetry traces of real calls: the agent's process, the Celery hop, a real worker, HTTP.

The test process plays the agent: its spans go to the SDK's in-memory
exporter. The worker is a real process configured only by ``OTEL_*``
variables: it exports over OTLP/HTTP to a receiver this module starts on
loopback (:class:`toolexec.ops.traces.OtlpReceiver`, which decodes with
``opentelemetry-proto``). A local service records the ``traceparent`` it is
sent. Each test then joins the three on the trace id.
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
from integration_support import closed_port
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from toolexec.client import ToolClient
from toolexec.ops.traces import OtlpReceiver, SpanRecord, render_call
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply, WorkerProcess

pytestmark = pytest.mark.integration

SECRET = "tok-" + uuid.uuid4().hex  # must never appear in a span


@pytest.fixture(scope="module")
def memory() -> InMemorySpanExporter:
    """The agent's spans (this process), kept in memory by the SDK."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def tr_settings(settings: Settings) -> Settings:
    tag = uuid.uuid4().hex[:8]
    return settings.model_copy(update={"key_prefix": f"tr-{tag}", "default_queue": f"tr-{tag}"})


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return closed_port()


@pytest.fixture(scope="module")
def tr_worker(
    tr_settings: Settings,
    worker_env: dict[str, str],
    receiver: OtlpReceiver,
    metrics_port: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    env = {
        **worker_env,
        "TOOLEXEC_KEY_PREFIX": tr_settings.key_prefix,
        "TOOLEXEC_DEFAULT_QUEUE": tr_settings.default_queue,
        "TOOLEXEC_LOG_FORMAT": "json",
        "TOOLEXEC_METRICS_PORT": str(metrics_port),
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": "toolexec-worker-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    log = tmp_path_factory.mktemp("tracing") / "worker.log"
    proc = WorkerProcess("tracing_tools", env, log_path=log, queues=tr_settings.default_queue)
    proc.start(tr_settings.redis_url or "", tr_settings.key_prefix)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def tr_client(
    tr_settings: Settings, tr_worker: WorkerProcess, memory: InMemorySpanExporter
) -> Iterator[ToolClient]:
    with ToolClient(tr_settings) as tool_client:
        yield tool_client


def _hex(number: int, width: int) -> str:
    return format(number, f"0{width}x")


def _client_span(memory: InMemorySpanExporter, call_id: str) -> ReadableSpan:
    found = [
        s
        for s in memory.get_finished_spans()
        if (s.attributes or {}).get("gen_ai.tool.call.id") == call_id
    ]
    assert len(found) == 1, found
    return found[0]


def _wait_for(
    receiver: OtlpReceiver, trace_id: str, ready: Callable[[list[SpanRecord]], bool]
) -> list[SpanRecord]:
    end = time.monotonic() + 15
    while time.monotonic() < end:
        spans = [s for s in receiver.snapshot() if s.trace_id == trace_id]
        if ready(spans):
            return spans
        time.sleep(0.05)
    raise AssertionError(f"the worker's spans of trace {trace_id} did not arrive: {spans}")


def _named(spans: list[SpanRecord], prefix: str) -> list[SpanRecord]:
    return sorted((s for s in spans if s.name.startswith(prefix)), key=lambda s: s.start_ns)


@pytest.fixture(scope="module")
def retried(
    tr_client: ToolClient, flaky: FlakyServer, memory: InMemorySpanExporter
) -> dict[str, Any]:
    """One call of tr_fetch that succeeds at the third attempt, inside an agent's span."""
    path = flaky.unique_path("tr")
    url = flaky.script(path, Reply(503), Reply(503), Reply(200, {"n": 1}))
    tracer = trace.get_tracer("agent-framework")
    with tracer.start_as_current_span("agent step") as step:
        result = tr_client.call(
            "tr_fetch", {"url": url, "token": SECRET}, run_id="run-tr", timeout=20
        )
    assert result.ok, result
    span = _client_span(memory, result.call_id)
    return {"result": result, "client": span, "agent": step, "path": path}


def test_one_call_makes_a_client_span_and_worker_spans_in_one_trace(
    retried: dict[str, Any], memory: InMemorySpanExporter, receiver: OtlpReceiver
) -> None:
    client: ReadableSpan = retried["client"]
    trace_id = _hex(client.context.trace_id, 32)
    # the client span is a child of the agent framework's span, with the call's facts
    assert client.parent is not None
    assert client.parent.span_id == retried["agent"].get_span_context().span_id
    assert client.name == "toolexec.call tr_fetch"
    attrs = dict(client.attributes or {})
    assert attrs["gen_ai.operation.name"] == "execute_tool"
    assert attrs["gen_ai.tool.name"] == "tr_fetch"
    assert attrs["toolexec.run_id"] == "run-tr"
    assert attrs["toolexec.status"] == "ok" and attrs["toolexec.attempts"] == 3
    assert attrs["toolexec.deadline"] > time.time() - 60
    send = [
        s
        for s in memory.get_finished_spans()
        if s.parent is not None and s.parent.span_id == client.context.span_id
    ]
    assert [s.name for s in send] == [f"send {tr_settings_queue(attrs)}"]
    assert send[0].kind is trace.SpanKind.PRODUCER
    assert (send[0].attributes or {})["messaging.message.id"] == retried["result"].call_id

    spans = _wait_for(receiver, trace_id, lambda s: len(_named(s, "execute_tool")) == 3)
    attempts = _named(spans, "execute_tool")
    assert {s.service for s in attempts} == {"toolexec-worker-test"}
    assert {s.parent_id for s in attempts} == {_hex(send[0].context.span_id, 16)}
    assert [s.attributes["toolexec.attempt"] for s in attempts] == [1, 2, 3]
    assert all(s.kind == "consumer" for s in attempts)
    assert {s.attributes["gen_ai.tool.call.id"] for s in attempts} == {retried["result"].call_id}
    assert {s.attributes["toolexec.run_id"] for s in attempts} == {"run-tr"}
    assert (
        attempts[0].attributes["messaging.destination.name"] == attrs["messaging.destination.name"]
    )


def tr_settings_queue(attrs: dict[str, Any]) -> str:
    return str(attrs["messaging.destination.name"])


def test_a_retried_call_shows_each_attempt_and_its_backoff(
    retried: dict[str, Any], receiver: OtlpReceiver
) -> None:
    trace_id = _hex(retried["client"].context.trace_id, 32)
    spans = _wait_for(receiver, trace_id, lambda s: len(_named(s, "execute_tool")) == 3)
    first, second, third = _named(spans, "execute_tool")
    for failed in (first, second):
        assert failed.attributes["error.type"] == "unavailable"  # a 503
        assert failed.attributes["toolexec.retryable"] is True
        assert failed.attributes["toolexec.outcome"] == "retry"
        backoff = [e for e in failed.events if e["name"] == "backoff"]
        assert len(backoff) == 1, (failed.attributes, failed.events)
        assert 0 < backoff[0]["attributes"]["delay_s"] <= 0.1
    assert third.attributes["toolexec.outcome"] == "ok"
    assert "error.type" not in third.attributes
    tree = render_call([*spans, *_records(retried)], retried["result"].call_id)
    assert tree.count("execute_tool tr_fetch") == 3 and tree.count("backoff") == 2


def _records(retried: dict[str, Any]) -> list[SpanRecord]:
    """The client span as a record, to print it in one tree with the worker's."""
    span: ReadableSpan = retried["client"]
    return [
        SpanRecord(
            trace_id=_hex(span.context.trace_id, 32),
            span_id=_hex(span.context.span_id, 16),
            parent_id="",
            name=span.name,
            kind="client",
            start_ns=span.start_time or 0,
            end_ns=span.end_time or 0,
            service="agent",
            attributes=dict(span.attributes or {}),
        )
    ]


def test_the_trace_id_reaches_the_service_the_tool_calls(
    retried: dict[str, Any], flaky: FlakyServer, receiver: OtlpReceiver
) -> None:
    trace_id = _hex(retried["client"].context.trace_id, 32)
    hits = flaky.hits(retried["path"])
    assert len(hits) == 3
    parents = [h.headers["traceparent"].split("-") for h in hits]
    assert {p[1] for p in parents} == {trace_id}
    # each request's parent is an HTTP client span inside one of the attempts
    # the worker exports in batches: an attempt's span may come after its children's
    spans = _wait_for(
        receiver,
        trace_id,
        lambda s: (
            len([x for x in s if x.kind == "client"]) == 3 and len(_named(s, "execute_tool")) == 3
        ),
    )
    http = {s.span_id: s for s in spans if s.kind == "client"}
    attempts = {s.span_id for s in _named(spans, "execute_tool")}
    assert {p[2] for p in parents} == set(http)
    assert {s.parent_id for s in http.values()} == attempts


def test_http_request_propagates_traceparent_and_keeps_query_secrets_out(
    tr_client: ToolClient,
    flaky: FlakyServer,
    memory: InMemorySpanExporter,
    receiver: OtlpReceiver,
) -> None:
    path = flaky.unique_path("tr-http")
    url = flaky.script(path, Reply(200, {"ok": True}))
    result = tr_client.call("http_request", {"url": url, "params": {"api_key": SECRET}})
    assert result.ok, result
    trace_id = _hex(_client_span(memory, result.call_id).context.trace_id, 32)
    (hit,) = flaky.hits(path)
    assert hit.headers["traceparent"].split("-")[1] == trace_id
    assert SECRET in hit.query  # the service got it; the spans must not
    spans = _wait_for(receiver, trace_id, lambda s: any(x.kind == "client" for x in s))
    (http,) = [s for s in spans if s.kind == "client"]
    assert http.attributes["url.full"].endswith(f"{path}?api_key=REDACTED")


def test_a_fallback_shows_its_steps(
    tr_client: ToolClient,
    flaky: FlakyServer,
    memory: InMemorySpanExporter,
    receiver: OtlpReceiver,
) -> None:
    url = flaky.script(flaky.unique_path("tr-down"), Reply(500))
    result = tr_client.call("tr_down", {"url": url}, timeout=20)
    assert result.degraded and result.source == "explanation", result
    client = _client_span(memory, result.call_id)
    trace_id = _hex(client.context.trace_id, 32)
    # the worker exports in batches: the attempt's span and the step's may come apart
    spans = _wait_for(
        receiver,
        trace_id,
        lambda s: len(_named(s, "toolexec.fallback")) == 1 and len(_named(s, "execute_tool")) == 1,
    )
    (attempt,) = _named(spans, "execute_tool")
    (step,) = _named(spans, "toolexec.fallback")
    assert attempt.attributes["error.type"] == "unavailable" and attempt.status == "error"
    assert step.parent_id == attempt.parent_id  # both children of the client's send span
    assert [e["name"] for e in step.events] == ["fallback.step"]
    assert "explanation" in step.events[0]["attributes"]["step"]


def test_no_secret_reaches_a_span(
    retried: dict[str, Any], memory: InMemorySpanExporter, receiver: OtlpReceiver
) -> None:
    worker_spans = [s.to_json() for s in receiver.snapshot()]
    client_spans = [s.to_json() for s in memory.get_finished_spans()]
    assert worker_spans and client_spans
    assert SECRET not in json.dumps(worker_spans) + json.dumps(client_spans, default=str)


def test_json_log_lines_carry_the_trace(retried: dict[str, Any], tr_worker: WorkerProcess) -> None:
    trace_id = _hex(retried["client"].context.trace_id, 32)
    assert tr_worker.log_path is not None
    lines = [json.loads(x) for x in Path(tr_worker.log_path).read_text().splitlines() if x]
    ended = [x for x in lines if x.get("call_id") == retried["result"].call_id]
    assert len(ended) == 1
    assert ended[0]["trace_id"] == trace_id and len(ended[0]["span_id"]) == 16


def test_the_latency_histogram_carries_trace_exemplars(
    retried: dict[str, Any], metrics_port: int
) -> None:
    trace_id = _hex(retried["client"].context.trace_id, 32)
    request = urllib.request.Request(
        f"http://127.0.0.1:{metrics_port}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
    )
    page = urllib.request.urlopen(request, timeout=5).read().decode()
    lines = [x for x in page.splitlines() if x.startswith("toolexec_call_duration_seconds_bucket")]
    assert any(f'# {{trace_id="{trace_id}"}}' in x and 'tool="tr_fetch"' in x for x in lines)


def _attempt_events(receiver: OtlpReceiver, trace_id: str) -> list[str]:
    spans = _wait_for(receiver, trace_id, lambda s: len(_named(s, "execute_tool")) >= 1)
    return [e["name"] for s in _named(spans, "execute_tool") for e in s.events]


def test_a_replay_and_an_offload_are_events_of_their_attempts(
    tr_client: ToolClient, memory: InMemorySpanExporter, receiver: OtlpReceiver
) -> None:
    key = f"order-{uuid.uuid4().hex[:8]}"
    first = tr_client.call("tr_write", {"order": key}, idempotency_key=key)
    again = tr_client.call("tr_write", {"order": key}, idempotency_key=key)
    assert first.ok and again.replayed, again
    replay_trace = _hex(_client_span(memory, again.call_id).context.trace_id, 32)
    assert _attempt_events(receiver, replay_trace) == ["idempotency.replayed"]
    first_trace = _hex(_client_span(memory, first.call_id).context.trace_id, 32)
    assert _attempt_events(receiver, first_trace) == []

    big = tr_client.call("tr_big", {"size": 50_000})
    assert big.payload is not None, big
    big_trace = _hex(_client_span(memory, big.call_id).context.trace_id, 32)
    spans = _wait_for(receiver, big_trace, lambda s: len(_named(s, "execute_tool")) == 1)
    (offload,) = _named(spans, "execute_tool")[0].events
    assert offload["name"] == "payload.offloaded"
    assert offload["attributes"]["size_bytes"] == big.payload.size_bytes
