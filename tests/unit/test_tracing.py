"""toolexec.tracing without a worker: when it turns on, what a span says, ids for logs and metrics.

The SDK is used through providers of the tests' own (never the process-wide
one), so these tests neither depend on nor change what other tests see.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest

from toolexec import tracing
from toolexec.context import CallContext
from toolexec.errors import TransientError
from toolexec.layers import Attempt, Defer, Final, NoReply, Outcome, Retry
from toolexec.ops.metrics import Metrics
from toolexec.ops.traces import OtlpReceiver, SpanRecord, render_call
from toolexec.results import ErrorInfo, ToolResult
from toolexec.testing import FlakyServer, Reply
from toolexec.worker.logs import JsonFormatter


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    provider = TracerProvider(resource=Resource.create({"service.name": "unit"}))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),  # a name alone exports nothing
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://h"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_only_otel_variables_that_ask_for_an_exporter_turn_tracing_on(
    env: dict[str, str], wanted: bool
) -> None:
    assert tracing._wanted(env) is wanted


_NO_OP_CHECK = """
from toolexec import tracing
assert tracing.configure("unit", environ={}) is False
span = tracing.start_call("t", "c1", None, 0.0, None)
assert not span.is_recording()  # nothing is collected or exported
assert tracing.inject_headers(span, "q", "c1", "tools.t") == {}
tracing.end_call(span, "ok", None, 1)
print("no-op")
"""


def test_unset_variables_leave_the_no_op_tracer_in_place() -> None:
    """In a fresh process: OpenTelemetry's provider is process-global, and other tests
    of this session install a real one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", _NO_OP_CHECK], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "no-op", done.stderr


def test_a_client_span_carries_the_call_and_its_outcome(
    spans: tuple[TracerProvider, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = spans
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("toolexec"))
    span = tracing.start_call("get_weather", "c1", "r1", 1234.5, "tools")
    headers = tracing.inject_headers(span, "tools", "c1", "tools.get_weather")
    tracing.end_call(span, "error", "timeout", 3)

    send, call = exporter.get_finished_spans()
    assert call.name == "toolexec.call get_weather"
    assert dict(call.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "get_weather",
        "gen_ai.tool.call.id": "c1",
        "toolexec.deadline": 1234.5,
        "toolexec.run_id": "r1",
        "messaging.destination.name": "tools",
        "toolexec.status": "error",
        "toolexec.attempts": 3,
        "error.type": "timeout",
    }
    assert call.status.status_code.name == "ERROR"
    assert send.name == "send tools" and send.parent is not None
    assert send.parent.span_id == call.context.span_id
    _, trace_id, parent_id, _ = headers["traceparent"].split("-")
    assert (trace_id, parent_id) == (
        format(call.context.trace_id, "032x"),
        format(send.context.span_id, "016x"),
    )


def test_a_call_the_client_refuses_says_so_on_its_span(
    spans: tuple[TracerProvider, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = spans
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("toolexec"))
    tracing.end_call(tracing.start_call("f", "c1", None, 1.0, None), "error", "circuit_open", 0)
    (span,) = exporter.get_finished_spans()
    assert [e.name for e in span.events] == ["breaker.refused"]


def test_an_unsampled_call_still_passes_its_context_on() -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    provider = TracerProvider(sampler=ALWAYS_OFF)
    span = provider.get_tracer("t").start_span("call")
    headers = tracing.inject_headers(span, "q", "c1", "tools.t")
    flags = int(headers["traceparent"].rsplit("-", 1)[1], 16)
    assert flags & 1 == 0  # not sampled: the worker will not sample it either


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://api.example/v1?api_key=s3cr3t&q=x",
            "https://api.example/v1?api_key=REDACTED&q=REDACTED",
        ),
        ("https://user:pw@api.example:8443/p", "https://api.example:8443/p"),
        ("http://h/p", "http://h/p"),
    ],
)
def test_urls_on_spans_lose_credentials_and_query_values(url: str, shown: str) -> None:
    assert tracing.redacted_url(url) == shown


def test_httpx_spans_never_show_a_secret_query_or_header(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    secret = "sk-live-0123456789"
    with FlakyServer() as server, httpx.Client() as client:
        url = server.script("/x", Reply(200))
        HTTPXClientInstrumentor.instrument_client(
            client, tracer_provider=provider, request_hook=tracing._redact_request_span
        )
        client.get(url, params={"api_key": secret}, headers={"Authorization": f"Bearer {secret}"})
        (hit,) = server.hits("/x")
    (span,) = exporter.get_finished_spans()
    assert secret in hit.query  # the service got it; the span must not
    assert secret not in span.to_json()
    assert str((span.attributes or {})["url.full"]).endswith("/x?api_key=REDACTED")


def test_log_lines_and_exemplars_carry_the_current_trace(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = spans
    record = logging.LogRecord("toolexec.worker", logging.INFO, __file__, 1, "hi", (), None)
    assert "trace_id" not in json.loads(JsonFormatter().format(record))
    metrics = Metrics(CollectorRegistry())
    with provider.get_tracer("t").start_as_current_span("attempt") as span:
        line = json.loads(JsonFormatter().format(record))
        metrics.finished("fetch", "c1", 1, None, 0.2)
    trace_id = format(span.get_span_context().trace_id, "032x")
    assert line["trace_id"] == trace_id
    assert line["span_id"] == format(span.get_span_context().span_id, "016x")
    page = generate_latest(metrics.registry).decode()
    (bucket,) = [x for x in page.splitlines() if 'le="0.25"' in x and "call_duration" in x]
    assert f'# {{trace_id="{trace_id}"}} 0.2' in bucket


def test_the_otlp_exporter_reaches_the_receiver_and_the_tree_prints(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = spans
    with OtlpReceiver() as receiver:
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.endpoint))
        )
        tracer = provider.get_tracer("t")
        with (
            tracer.start_as_current_span(
                "toolexec.call f", attributes={"gen_ai.tool.call.id": "c9"}
            ),
            tracer.start_as_current_span("execute_tool f") as attempt,
        ):
            attempt.set_attribute("toolexec.attempt", 1)
            attempt.add_event("backoff", {"delay_s": 0.5})
        received = receiver.snapshot()
    assert [s.name for s in received] == ["execute_tool f", "toolexec.call f"]
    assert {s.service for s in received} == {"unit"}
    assert received[0].events[0]["attributes"] == {"delay_s": 0.5}
    tree = render_call(received, "c9").splitlines()
    assert tree[0].startswith("toolexec.call f [internal, unit]")
    assert tree[1].startswith("└─ execute_tool f") and "toolexec.attempt=1" in tree[1]
    assert "backoff delay_s=0.5" in tree[2]
    assert render_call(received, "other") == "no span of call other was received"
    assert SpanRecord.from_json(received[0].to_json()) == received[0]


def test_the_tracing_layer_writes_the_verdict_on_the_attempt_span(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    refused = ToolResult(
        status="error",
        tool="f",
        call_id="c1",
        error=ErrorInfo(type="circuit_open", message="open", retryable=True),
        attempts=1,
    )
    layer = tracing.TracingLayer()
    tracer = provider.get_tracer("t")
    retry = Retry(0.25, TransientError("HTTP 503"), _ctx())
    for verdict in (Final(refused), retry, Defer(1.5, _ctx().deferred(1)), NoReply("joined c0")):
        with tracer.start_as_current_span("execute_tool f"):
            assert layer.settle(_attempt(), Outcome(), verdict) is verdict
    final, retried, deferred, joined = exporter.get_finished_spans()
    assert (final.attributes or {})["error.type"] == "circuit_open"
    assert final.status.status_code.name == "ERROR"
    assert [e.name for e in final.events] == ["breaker.refused"]
    assert (retried.attributes or {})["toolexec.outcome"] == "retry"
    assert [(e.name, dict(e.attributes or {})) for e in retried.events] == [
        ("backoff", {"delay_s": 0.25, "error_type": "unavailable"})
    ]
    assert [e.name for e in deferred.events] == ["rate_limit.deferred"]
    assert [e.name for e in joined.events] == ["idempotency.joined"]


def _ctx() -> CallContext:
    return CallContext(call_id="c1", tool="f", deadline=10.0, submitted_at=0.0, reply_to="r")


def _attempt() -> Attempt:
    from toolexec.registry import Registry, tool

    registry = Registry()

    @tool(registry=registry)
    def f() -> None:
        """A tool."""

    spec = registry.get("f")
    assert spec is not None
    return Attempt(spec, _ctx(), 1, {}, 5.0)


def test_toolexec_trace_prints_the_tree_from_the_receivers_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from toolexec.ops.cli import cli

    spans = tmp_path / "spans.jsonl"
    call = SpanRecord(
        "t1",
        "a",
        "",
        "toolexec.call f",
        "client",
        0,
        9_000_000,
        "agent",
        {"gen_ai.tool.call.id": "c1", "toolexec.status": "ok"},
    )
    attempt = SpanRecord(
        "t1",
        "b",
        "a",
        "execute_tool f",
        "consumer",
        1_000_000,
        8_000_000,
        "worker",
        {"toolexec.attempt": 1},
        [{"name": "backoff", "time_ns": 8_000_000, "attributes": {"delay_s": 0.25}}],
    )
    other = SpanRecord(
        "t2", "c", "", "toolexec.call g", "client", 0, 1, "agent", {"gen_ai.tool.call.id": "c2"}
    )
    spans.write_text("".join(json.dumps(s.to_json()) + "\n" for s in (call, attempt, other)))

    shown = CliRunner().invoke(cli, ["trace", "c1", "--spans", str(spans)])
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines() == [
        "toolexec.call f [client, agent] +0.0 ms 9.0 ms gen_ai.tool.call.id=c1 toolexec.status=ok",
        "└─ execute_tool f [consumer, worker] +1.0 ms 7.0 ms toolexec.attempt=1",
        "     · +8.0 ms backoff delay_s=0.25",
    ]
    missing = CliRunner().invoke(cli, ["trace", "nope", "--spans", str(spans)])
    assert missing.exit_code == 1 and "no span of call nope" in missing.output
