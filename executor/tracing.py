"""OpenTelemetry traces of tool calls: client, Celery hop, worker attempts, downstream HTTP.

"Why did this agent step take 9 seconds?" has its answer spread over the
client's clock, the queue, several workers and the service a tool called; a
trace joins them on one id. The tree of one call:

* ``toolexec.call <tool>`` (client, child of whatever span the agent's framework
  has current) with the run id, call id, deadline and outcome;
* ``send <queue>`` (producer), whose W3C context travels in the Celery message
  headers (``traceparent``, ``tracestate``);
* ``execute_tool <tool>`` (consumer) for every attempt on a worker, each a child
  of the send span, so retries show side by side with their backoff waits as
  events; a fallback step is a ``toolexec.fallback <tool>`` span beside them;
* the HTTP client spans of the tool (opentelemetry-instrumentation-httpx), which
  carry ``traceparent`` to the service called.

Only ``opentelemetry-api`` is a core dependency. Without an SDK configured every
span is a non-recording no-op, so an agent or worker that does not trace pays
a few attribute-less calls per call; :func:`configure` installs the SDK
(``toolexec[otel]``) only when the standard ``OTEL_*`` variables ask for an
exporter, and leaves a provider the application installed itself alone.

Attributes follow OpenTelemetry's GenAI conventions for tool execution
(``gen_ai.operation.name = execute_tool``, ``gen_ai.tool.name``,
``gen_ai.tool.call.id``) and the messaging conventions for the hop. No argument
value is ever an attribute, and the HTTP spans keep query values out of URLs,
so a secret argument cannot leave the process through a trace.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from toolexec.layers import Attempt, Defer, Layer, NoReply, Outcome, Retry, Verdict
from toolexec.results import ToolResult

__all__ = [
    "CALL_SPAN",
    "AttemptSpans",
    "TracingLayer",
    "configure",
    "current_ids",
    "end_call",
    "event",
    "inject_headers",
    "install_worker_hooks",
    "redacted_url",
    "start_call",
    "trace_exemplar",
]

log = logging.getLogger("toolexec.tracing")

#: The client span's name, before the tool's: ``toolexec.call get_weather``.
CALL_SPAN = "toolexec.call"

#: The fallback chain's task (toolexec.fallback.state.FALLBACK_TASK, not imported: the
#: fallback package builds on the registry, which the client never needs).
FALLBACK_TASK = "toolexec.fallback"

#: Celery is not in the messaging conventions' list of systems; its own name is allowed.
MESSAGING_SYSTEM = "celery"

_tracer = trace.get_tracer("toolexec")  # a proxy: follows a provider installed later
_configured = False
_configure_lock = threading.Lock()


def _wanted(environ: Mapping[str, str]) -> bool:
    """Do the ``OTEL_*`` variables ask for traces to be exported?"""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure(service_name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Install the SDK when ``OTEL_*`` asks for it; True if spans are now exported.

    Sampling (``OTEL_TRACES_SAMPLER``, ``OTEL_TRACES_SAMPLER_ARG``), batching
    (``OTEL_BSP_*``) and the OTLP endpoint and headers are read by the SDK
    itself; ``OTEL_TRACES_EXPORTER`` may list ``otlp`` (OTLP/HTTP, protobuf)
    and ``console``. Safe to call more than once and from any process.
    """
    global _configured
    env = os.environ if environ is None else environ
    with _configure_lock:
        if _configured:
            return True
        if not _wanted(env):
            return False
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            _configured = True  # the application installed its own SDK: ours would fight it
            return True
        try:
            provider = _provider(service_name, env)
        except ImportError as exc:
            log.warning(
                "OTEL_* asks for traces but %s is missing: pip install 'toolexec[otel]'", exc
            )
            return False
        trace.set_tracer_provider(provider)
        _instrument_httpx()
        _configured = True
        return True


def _provider(service_name: str, env: Mapping[str, str]) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)
    for exporter in _exporters(env):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporters(env: Mapping[str, str]) -> list[Any]:
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    out: list[Any] = []
    for name in filter(None, names):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            out.append(OTLPSpanExporter())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            out.append(ConsoleSpanExporter())
        elif name != "none":
            log.warning("OTEL_TRACES_EXPORTER=%s is not supported here (otlp, console)", name)
    return out


def _instrument_httpx() -> None:
    """Every httpx client (``http_request``'s and the tools' own) sends ``traceparent``."""
    try:
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    except ImportError:
        return
    instrumentor = HTTPXClientInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(
            request_hook=_redact_request_span, async_request_hook=_redact_async_request_span
        )


def redacted_url(url: str) -> str:
    """``url`` without credentials or query values: a model may put an API key in either."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port is not None:
        netloc = f"{netloc}:{parts.port}"
    query = "&".join(f"{pair.split('=', 1)[0]}=REDACTED" for pair in parts.query.split("&") if pair)
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _redact_request_span(span: Span, request: Any) -> None:
    if span.is_recording():
        shown = redacted_url(str(request[1] if isinstance(request, tuple) else request.url))
        span.set_attribute("url.full", shown)
        span.set_attribute("http.url", shown)


async def _redact_async_request_span(span: Span, request: Any) -> None:
    """The same for ``httpx.AsyncClient`` (``http_request`` is async), whose hooks are awaited."""
    _redact_request_span(span, request)


# -- the client: one span per call, its context in the message headers ----------


def start_call(
    tool: str,
    call_id: str,
    run_id: str | None,
    deadline: float,
    queue: str | None,
    start_ns: int | None = None,
) -> Span:
    """The span of one call in the agent's process: a child of the span current there."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call_id,
        "toolexec.deadline": deadline,
    }
    if run_id is not None:
        attributes["toolexec.run_id"] = run_id
    if queue is not None:
        attributes["messaging.destination.name"] = queue
    return _tracer.start_span(
        f"{CALL_SPAN} {tool}", kind=SpanKind.CLIENT, attributes=attributes, start_time=start_ns
    )


def end_call(span: Span, status: str, error_type: str | None, attempts: int) -> None:
    """Record a call's outcome on its client span and end it."""
    if span.is_recording():
        span.set_attribute("toolexec.status", status)
        span.set_attribute("toolexec.attempts", attempts)
        if error_type is not None:
            span.set_attribute("error.type", error_type)
            span.set_status(Status(StatusCode.ERROR, error_type))
            if attempts == 0 and error_type in _REFUSALS:  # refused before any attempt ran
                span.add_event(_REFUSALS[error_type])
    span.end()


def inject_headers(call: Span, queue: str | None, task_id: str, task_name: str) -> dict[str, str]:
    """The headers of one message: a producer span's W3C context (empty when not tracing).

    An unsampled call still passes its context on, so that the worker does not
    start a trace of its own for it.
    """
    carrier: dict[str, str] = {}
    parent = trace.set_span_in_context(call)
    if not call.is_recording():
        if call.get_span_context().is_valid:
            propagate.inject(carrier, context=parent)
        return carrier
    with _tracer.start_as_current_span(
        context=parent,
        name=f"send {queue or 'default'}",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": queue or "",
            "messaging.message.id": task_id,
            "celery.task.name": task_name,
        },
    ):
        propagate.inject(carrier)
    return carrier


# -- the worker: one span per attempt, from Celery's signals ---------------------


class _RequestGetter(Getter[Any]):
    """Reads trace headers from a Celery request: custom headers become its attributes."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = getattr(carrier, key, None)
        if value is None and isinstance(getattr(carrier, "headers", None), dict):
            value = carrier.headers.get(key)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Any) -> list[str]:
        return []


_GETTER = _RequestGetter()


@dataclass
class _Open:
    span: Span
    token: object
    parent: otel_context.Context
    task_id: str
    task_name: str
    call_id: str


@dataclass
class _Stack(threading.local):
    open: list[_Open] = field(default_factory=list)


_stack = _Stack()


def _is_ours(name: str) -> bool:
    return name.startswith("tools.") or name == FALLBACK_TASK


def _span_name(task_name: str, tool: str) -> str:
    return f"execute_tool {tool}" if task_name.startswith("tools.") else f"{task_name} {tool}"


def _task_started(task_id: str = "", task: Any = None, kwargs: Any = None, **_: Any) -> None:
    if task is None or not _is_ours(str(task.name)):
        return
    request = task.request
    parent = propagate.extract(request, getter=_GETTER)
    ctx = (kwargs or {}).get("context") or {}
    tool = str(ctx.get("tool") or task.name.removeprefix("tools."))
    number = int(request.retries or 0) + 1 - int(ctx.get("deferrals") or 0)
    delivery = request.delivery_info or {}
    span = _tracer.start_span(
        _span_name(str(task.name), tool),
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": str(ctx.get("call_id") or task_id),
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "process",
            "messaging.destination.name": str(delivery.get("routing_key") or ""),
            "messaging.message.id": task_id,
            "toolexec.attempt": number,
            "celery.task.name": str(task.name),
        },
    )
    if ctx.get("run_id"):
        span.set_attribute("toolexec.run_id", str(ctx["run_id"]))
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    call_id = str(ctx.get("call_id") or task_id)
    _stack.open.append(_Open(span, token, parent, task_id, str(task.name), call_id))


def _task_ended(task_id: str = "", task: Any = None, retval: Any = None, **kw: Any) -> None:
    if not _stack.open or _stack.open[-1].task_id != task_id:
        return
    top = _stack.open.pop()
    try:
        _describe_end(top, kw.get("state"), retval)
    finally:
        top.span.end()
        otel_context.detach(top.token)  # type: ignore[arg-type]


def _describe_end(top: _Open, state: Any, retval: Any) -> None:
    """What only Celery knows: the task's state, and which step a fallback task took."""
    if not top.span.is_recording():
        return
    top.span.set_attribute("celery.state", str(state))
    if top.task_name == FALLBACK_TASK and isinstance(retval, dict) and "step" in retval:
        event("fallback.step", step=str(retval["step"]))


def _resend_headers(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """A message a worker sends for a call (a retry, a fallback step) keeps the call's parent.

    Each attempt's span is then a child of the client's send span, not of the
    attempt before it, so a retried call reads as a row of attempts.
    """
    if headers is None or not _stack.open:
        return
    top = _stack.open[-1]
    parent = top.parent
    if not trace.get_current_span(parent).get_span_context().is_valid:
        parent = trace.set_span_in_context(top.span)  # untraced caller: chain to this attempt
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=parent)
    headers.update(carrier)


_hooks_installed = False


def install_worker_hooks(signals: Any) -> None:
    """Connect the attempt spans to Celery's task ``signals`` (once per process).

    The worker's tasks (``toolexec.tasks``) pass ``celery.signals`` in at
    ``worker_init``: this module is part of the Celery-free core the client
    imports too (docs/architecture.md, Boundaries).
    """
    global _hooks_installed
    if _hooks_installed:
        return
    signals.task_prerun.connect(_task_started, weak=False)
    signals.task_postrun.connect(_task_ended, weak=False)
    signals.before_task_publish.connect(_resend_headers, weak=False)
    _hooks_installed = True


def event(name: str, **attributes: Any) -> None:
    """An event on the current span (a breaker refusal, an offload...); free when not tracing."""
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, {k: v for k, v in attributes.items() if v is not None})


class TracingLayer(Layer):
    """The outermost layer: writes each attempt's verdict on the attempt's span.

    Its ``settle`` runs last (innermost first), so it sees the verdict every
    other layer agreed on: a retry and its backoff, a deferral, an answer left
    to another worker, or the final result with the refusal, replay or offload
    that shaped it, also when a fallback chain then takes the call over. It
    never changes the verdict, and does nothing while spans are not recorded.
    """

    name = "tracing"

    def settle(self, attempt: Attempt, outcome: Outcome, verdict: Verdict) -> Verdict:
        span = trace.get_current_span()
        if span.is_recording():
            _describe_verdict(span, verdict)
        return verdict


def _describe_verdict(span: Span, verdict: Verdict) -> None:
    if isinstance(verdict, Retry):
        span.set_attribute("toolexec.outcome", "retry")
        span.set_attribute("error.type", str(verdict.error.error_type))
        span.set_attribute("toolexec.retryable", True)
        event("backoff", delay_s=verdict.delay, error_type=str(verdict.error.error_type))
    elif isinstance(verdict, Defer):
        span.set_attribute("toolexec.outcome", "deferred")
        # a rate limit keeps a slot for the attempt; a budget or breaker wait keeps none
        what = "rate_limit.deferred" if verdict.context.slot_for else "defence.wait"
        event(what, delay_s=verdict.delay)
    elif isinstance(verdict, NoReply):
        span.set_attribute("toolexec.outcome", "answered_elsewhere")
        event("idempotency.joined", reason=verdict.reason)
    else:
        _describe_result(span, verdict.result)
        _result_events(verdict.result, len(verdict.joined))


def _describe_result(span: Span, result: ToolResult) -> None:
    span.set_attribute("toolexec.outcome", str(result.status))
    span.set_attribute("toolexec.attempts", int(result.attempts))
    if result.error is not None:
        kind = str(result.error.type)
        span.set_attribute("error.type", kind)
        span.set_attribute("toolexec.retryable", bool(result.error.retryable))
        span.set_status(Status(StatusCode.ERROR, kind))


_REFUSALS = {
    "circuit_open": "breaker.refused",
    "retry_budget_exhausted": "retry_budget.refused",
    "rate_limited": "rate_limit.refused",
}


def _result_events(result: ToolResult, joined: int) -> None:
    refusal = None if result.error is None else _REFUSALS.get(str(result.error.type))
    if refusal is not None:
        event(refusal, error_type=str(result.error.type) if result.error else None)
    if result.replayed:
        event("idempotency.replayed")
    if result.source is not None:
        event("fallback.answered", source=result.source)
    if result.payload is not None:
        event("payload.offloaded", size_bytes=result.payload.size_bytes)
    if joined:
        event("idempotency.answers_joined", calls=joined)


class AttemptSpans:
    """The observer hook (toolexec.pipeline.observe) for results that never met the layers.

    A call refused before the layers (invalid arguments, a deadline already
    past) and a fallback step's answer are final without a verdict from the
    pipeline; this writes their outcome on the span of the attempt that
    delivers them. Calls that joined it are answered in the same delivery and
    are left out: their answer is on their own client spans.
    """

    def finished(self, call_id: str, result: ToolResult) -> None:
        if not _stack.open or _stack.open[-1].call_id != call_id:
            return
        span = _stack.open[-1].span
        if span.is_recording():
            _describe_result(span, result)


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span in hex, when it is being recorded."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def trace_exemplar() -> dict[str, str] | None:
    """An OpenMetrics exemplar pointing at the current sampled trace, else None."""
    ctx = trace.get_current_span().get_span_context()
    if not (ctx.is_valid and ctx.trace_flags.sampled):
        return None
    return {"trace_id": format(ctx.trace_id, "032x")}
