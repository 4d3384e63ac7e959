"""Traces without a tracing backend: a loopback OTLP/HTTP receiver and ``toolexec trace``.

A production fleet sends its spans to a collector (Tempo, Jaeger, Honeycomb)
through ``OTEL_EXPORTER_OTLP_ENDPOINT``. On one host, or in a test, that is a
lot of machinery to answer "what happened to this call?", so this module
receives OTLP/HTTP itself (protobuf, decoded with ``opentelemetry-proto``, which
the ``otel`` extra's exporter already depends on), keeps the spans as JSON lines,
and prints the tree of the trace that holds a call id. It never listens beyond
loopback: spans name tools, runs and hosts.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["OtlpReceiver", "SpanRecord", "load_spans", "render_call", "trace_of_call"]

#: OTLP span kinds, by their protobuf number.
_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}

#: Attributes worth a place on a span's line in the tree.
_SHOWN = (
    "gen_ai.tool.call.id",
    "toolexec.attempt",
    "toolexec.outcome",
    "toolexec.status",
    "toolexec.attempts",
    "error.type",
    "toolexec.retryable",
    "http.response.status_code",
    "http.status_code",
)


@dataclass
class SpanRecord:
    """One span as received, in plain JSON-able values."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: str
    start_ns: int
    end_ns: int
    service: str
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    status: str = "unset"

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SpanRecord:
        return cls(**raw)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


def _attributes(pairs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def decode(body: bytes) -> list[SpanRecord]:
    """The spans of one OTLP/HTTP protobuf export request."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out = []
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            out += [_record(span, service) for span in scope_spans.spans]
    return out


def _record(span: Any, service: str) -> SpanRecord:
    events = [
        {"name": e.name, "time_ns": e.time_unix_nano, "attributes": _attributes(e.attributes)}
        for e in span.events
    ]
    return SpanRecord(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        name=span.name,
        kind=_KINDS.get(span.kind, str(span.kind)),
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        service=service,
        attributes=_attributes(span.attributes),
        events=events,
        status={0: "unset", 1: "ok", 2: "error"}.get(span.status.code, "unset"),
    )


class OtlpReceiver:
    """An OTLP/HTTP trace receiver on loopback; spans kept in memory and, if asked, a file."""

    def __init__(self, port: int = 0, path: Path | None = None) -> None:
        self.path = path
        self.spans: list[SpanRecord] = []
        self.requests = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """What ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` should be set to."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def snapshot(self) -> list[SpanRecord]:
        with self._lock:
            return list(self.spans)

    def _keep(self, spans: list[SpanRecord]) -> None:
        with self._lock:
            self.requests += 1
            self.spans += spans
            if self.path is not None:
                with self.path.open("a") as out:
                    out.writelines(json.dumps(s.to_json()) + "\n" for s in spans)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or "protobuf" not in (
                    self.headers.get("content-type") or ""
                ):
                    self.send_error(415 if self.path == "/v1/traces" else 404)
                    return
                receiver._keep(decode(body))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler


def load_spans(path: Path) -> list[SpanRecord]:
    """Spans a receiver kept in ``path`` (JSON lines)."""
    with path.open() as lines:
        return [SpanRecord.from_json(json.loads(line)) for line in lines if line.strip()]


def trace_of_call(spans: Iterable[SpanRecord], call_id: str) -> list[SpanRecord]:
    """Every span of the trace in which ``call_id`` was made (its client span's trace)."""
    spans = list(spans)
    ids = {s.trace_id for s in spans if s.attributes.get("gen_ai.tool.call.id") == call_id}
    return [s for s in spans if s.trace_id in ids]


def render_call(spans: Iterable[SpanRecord], call_id: str) -> str:
    """The trace of ``call_id`` as an indented tree, children in the order they started."""
    spans = sorted(trace_of_call(spans, call_id), key=lambda s: s.start_ns)
    if not spans:
        return f"no span of call {call_id} was received"
    known = {s.span_id for s in spans}
    children: dict[str, list[SpanRecord]] = {}
    for span in spans:
        children.setdefault(span.parent_id if span.parent_id in known else "", []).append(span)
    start = spans[0].start_ns
    return "\n".join(_lines(children, "", "", start))


def _lines(children: dict[str, list[SpanRecord]], parent: str, pad: str, t0: int) -> Iterator[str]:
    kids = children.get(parent, [])
    for i, span in enumerate(kids):
        last = i == len(kids) - 1
        branch = "" if not parent else ("└─ " if last else "├─ ")
        yield f"{pad}{branch}{_describe(span, t0)}"
        inner = pad + ("" if not parent else ("   " if last else "│  "))
        yield from _inside(children, span, inner, t0)


def _inside(
    children: dict[str, list[SpanRecord]], span: SpanRecord, pad: str, t0: int
) -> Iterator[str]:
    """A span's events and child spans, in the order they happened."""
    events = [(e["time_ns"], i, e) for i, e in enumerate(span.events)]
    nested = list(_lines(children, span.span_id, pad, t0))
    starts = [c.start_ns for c in children.get(span.span_id, [])]
    # each child's first line, with the lines under it, as one block placed by its start
    blocks: list[tuple[int, list[str]]] = []
    for text in nested:
        if text.startswith((pad + "├─ ", pad + "└─ ")):
            blocks.append((starts[len(blocks)], [text]))
        else:
            blocks[-1][1].append(text)
    last_start = max(starts, default=-1)

    def line(at: int, event: dict[str, Any]) -> str:
        marker = "│" if at < last_start else " "  # the line down to a later child span
        return f"{pad}{marker} · +{(at - t0) / 1e6:.1f} ms {_event(event)}"

    merged = [(at, [line(at, e)]) for at, _, e in events]
    for _, lines in sorted(merged + blocks, key=lambda item: item[0]):
        yield from lines


def _shown(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _describe(span: SpanRecord, t0: int) -> str:
    shown = " ".join(f"{k}={_shown(span.attributes[k])}" for k in _SHOWN if k in span.attributes)
    status = " ERROR" if span.status == "error" else ""
    return (
        f"{span.name} [{span.kind}, {span.service}] +{(span.start_ns - t0) / 1e6:.1f} ms "
        f"{span.duration_ms:.1f} ms{status} {shown}".rstrip()
    )


def _event(event: dict[str, Any]) -> str:
    attrs = " ".join(f"{k}={_shown(v)}" for k, v in event["attributes"].items())
    return f"{event['name']} {attrs}".rstrip()
