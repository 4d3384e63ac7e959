"""``toolexec demo``: a scripted agent against a service that misbehaves on purpose.

The demo starts what a deployment runs (Redis, a real worker process, a tool
backend) and sends the calls an agent would, one scenario per layer of the
defence: a service that fails twice, a rate limit with Retry-After, a backend
slower than the tool's limit, a missing record, an argument the model
invented, a tool it invented, a circuit breaker that opens and fails fast and
closes again after one probe, a retry budget that stops retries fleet-wide
during an outage, a fallback answer marked degraded, a write asked twice and run once, a result
too large for the model's context, a looping agent the run guard stops, and a
parallel fan-out. Each call declares how it must end, so the demo is also a
check: it exits 1 and names the broken expectation if one is not met. Each
call's line names its outcome in one word (ok, replayed, degraded, offloaded,
nudged, or the error type); below the table, one entry per scenario shows that
word and what the model received, wrapped rather than cut.

A demo may share a server with a real deployment, so it works under its own
key prefix and queue, and every process it started is stopped in a
``finally`` block, on Ctrl-C and SIGTERM too.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import redis
from rich import box
from rich.console import Console, RenderableType
from rich.json import JSON
from rich.live import Live
from rich.markup import escape
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from toolexec.adapters import run_round
from toolexec.client import ToolClient
from toolexec.connection import redact_url, redis_client, unavailable
from toolexec.embedded import EmbeddedServer, ensure_embedded, stop_embedded
from toolexec.errors import ErrorType
from toolexec.policies import RunBudget
from toolexec.results import Status, ToolResult
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply, WorkerProcess

__all__ = ["DemoCall", "Expect", "Step", "run_demo", "scenarios"]

#: The module the demo's worker imports; ``http_request`` comes with ``tasks``.
TOOLS_MODULE = "toolexec.tasks.demo_tools"
#: Must match ``toolexec.tasks.demo_tools.SERVICE_URL_ENV`` (not imported: the client
#: side of toolexec never imports tool code).
SERVICE_URL_ENV = "TOOLEXEC_DEMO_SERVICE_URL"
_CALL_TIMEOUT_S = 10.0
_EXIT_INTERRUPTED = 130


# -- the script --------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """How a call must end for the demo to pass."""

    status: Status = "ok"
    error: ErrorType | None = None
    attempts: int | None = None
    min_elapsed_s: float = 0.0
    max_elapsed_s: float | None = None
    #: The layer that must show in the result: replayed, from a fallback, offloaded.
    replayed: bool = False
    source: str | None = None
    offloaded: bool = False

    def describe(self) -> str:
        outcome = str(self.error) if self.error else self.status
        return f"{outcome} {_attempts(self.attempts)}".rstrip()

    def problems(self, result: ToolResult) -> list[str]:
        found = []
        got = result.error.type if result.error else None
        if (result.status, got) != (self.status, self.error) or (
            self.attempts is not None and result.attempts != self.attempts
        ):
            found.append(f"expected {self.describe()}, got {_outcome(result)}")
        return found + self._timing(result) + self._layers(result)

    def _timing(self, result: ToolResult) -> list[str]:
        took = result.elapsed_ms / 1000
        if took < self.min_elapsed_s:
            return [f"expected it to take at least {self.min_elapsed_s:g} s, it took {took:.2f} s"]
        if self.max_elapsed_s is not None and took > self.max_elapsed_s:
            return [f"expected it to take at most {self.max_elapsed_s:g} s, it took {took:.2f} s"]
        return []

    def _layers(self, result: ToolResult) -> list[str]:
        found = []
        if result.replayed != self.replayed:
            found.append(f"expected replayed={self.replayed}, got {result.replayed}")
        if (result.degraded, result.source) != (self.source is not None, self.source):
            found.append(
                f"expected the answer from {self.source or 'the tool'}, "
                f"got degraded={result.degraded} source={result.source}"
            )
        if (result.payload is not None) != self.offloaded:
            found.append(f"expected offloaded={self.offloaded}, got {result.payload is not None}")
        return found


@dataclass(frozen=True)
class DemoCall:
    """One tool call the scripted agent makes."""

    tool: str
    arguments: dict[str, Any]
    expect: Expect = Expect()
    label: str | None = None
    #: Seconds to let pass before this call (in a sequence): a breaker's open time.
    pause_s: float = 0.0

    def describe(self) -> str:
        if self.label:
            return self.label
        args = ", ".join(f"{name}={json.dumps(value)}" for name, value in self.arguments.items())
        return f"{self.tool}({args})"


@dataclass(frozen=True)
class Step:
    """A scenario: how the service will answer, and the calls that meet it.

    ``mode`` says how the calls go out: ``batch`` sends them together with
    ``call_many`` (``max_wall_s`` then checks that they really ran in
    parallel), ``sequence`` one after another, ``rounds`` one model turn each
    under a run guard (``toolexec.guard``), as an agent loop would. ``hits``
    is how many requests each path of the service must have seen afterwards.
    """

    scenario: str
    calls: tuple[DemoCall, ...]
    script: dict[str, tuple[Reply, ...]] = field(default_factory=dict)
    max_wall_s: float | None = None
    show_model_view: bool = False
    mode: Literal["batch", "sequence", "rounds"] = "batch"
    hits: dict[str, int] = field(default_factory=dict)

    def wall_problems(self, wall_s: float) -> list[str]:
        if self.max_wall_s is None or wall_s <= self.max_wall_s:
            return []
        return [f"the batch took {wall_s:.2f} s; in parallel it takes under {self.max_wall_s:g} s"]

    def hit_problems(self, service: FlakyServer | None) -> list[str]:
        if service is None:
            return []
        return [
            f"the service saw {len(service.hits(path))} request(s) to {path}, not {count}"
            for path, count in self.hits.items()
            if len(service.hits(path)) != count
        ]


def _fails(kind: ErrorType, attempts: int) -> Expect:
    return Expect("error", kind, attempts)


def _weather(temp_c: float, conditions: str, delay: float = 0.0) -> Reply:
    return Reply(200, {"temp_c": temp_c, "conditions": conditions}, delay=delay)


_FAN_OUT = {
    "Paris": (12.5, "overcast"),
    "Tokyo": (18.0, "clear"),
    "Nairobi": (24.0, "sunny"),
    "Quito": (14.0, "showers"),
}
_FAN_OUT_DELAY_S = 0.5

#: The log ``fetch_logs`` reads: about 190 KB, far past what a model should be
#: handed (600 tokens by default), with a few warnings and errors to find.
_LOG_LINES = 2_500


def _log_lines() -> list[str]:
    lines = []
    for n in range(_LOG_LINES):
        level = "ERROR" if n % 997 == 500 else "WARN" if n % 331 == 100 else "INFO"
        lines.append(
            f"2026-12-01T10:{n // 60 % 60:02d}:{n % 60:02d}Z {level} checkout "
            f"request {n:05d} handled in {(n * 37) % 900 + 12} ms"
        )
    return lines


def _repeated(
    tool: str, arguments: dict[str, Any], label: str, expects: list[Expect]
) -> tuple[DemoCall, ...]:
    """The same call several times, each row labelled with its turn."""
    return tuple(
        DemoCall(tool, arguments, expect, label=f"{label} #{n}")
        for n, expect in enumerate(expects, start=1)
    )


#: check_stock's breaker stays open this long (toolexec.tasks.demo_tools._STOCK_BREAKER).
_STOCK_OPEN_S = 1.5


def _defence_steps() -> list[Step]:
    """The layers that act across calls: breaker (open, then half-open and closed again),
    retry budget, fallback, idempotency, offload, run guard."""
    return [
        Step(
            "stock service down: 2 failed calls open the breaker, the 3rd fails fast; "
            f"{_STOCK_OPEN_S:g} s later one probe finds it back and closes the breaker",
            (
                *_repeated(
                    "check_stock",
                    {"sku": "SKU-7"},
                    'check_stock(sku="SKU-7")',
                    [
                        _fails(ErrorType.UNAVAILABLE, 1),
                        _fails(ErrorType.UNAVAILABLE, 1),
                        Expect("error", ErrorType.CIRCUIT_OPEN, 0, max_elapsed_s=0.5),
                    ],
                ),
                DemoCall(
                    "check_stock",
                    {"sku": "SKU-7"},
                    Expect(attempts=1),
                    label='check_stock(sku="SKU-7") #4 probe',
                    pause_s=_STOCK_OPEN_S + 0.3,
                ),
                DemoCall(
                    "check_stock",
                    {"sku": "SKU-7"},
                    Expect(attempts=1),
                    label='check_stock(sku="SKU-7") #5 closed',
                ),
            ),
            {"/stock/SKU-7": (Reply(503), Reply(503), Reply(200, {"SKU-7": {"oslo": 12}}))},
            mode="sequence",
            hits={"/stock/SKU-7": 4},
        ),
        Step(
            "reviews service down: the retry budget (2 retries for every caller) is spent "
            "by the 1st call, the next ones are not retried",
            _repeated(
                "list_reviews",
                {"sku": "SKU-7"},
                'list_reviews(sku="SKU-7")',
                [
                    _fails(ErrorType.UNAVAILABLE, 3),
                    _fails(ErrorType.RETRY_BUDGET_EXHAUSTED, 1),
                    _fails(ErrorType.RETRY_BUDGET_EXHAUSTED, 1),
                ],
            ),
            {"/reviews/SKU-7": (Reply(503),)},
            mode="sequence",
            hits={"/reviews/SKU-7": 5},
        ),
        Step(
            "search keeps failing; its fallback, a lighter index, answers",
            (
                DemoCall(
                    "search_products", {"query": "boots"}, Expect(source="search_products_lite")
                ),
            ),
            {
                "/search/boots": (Reply(503),),
                "/search-lite/boots": (
                    Reply(200, [{"sku": "SKU-7", "name": "Rain boots", "price": 49.0}]),
                ),
            },
            hits={"/search/boots": 2},
        ),
        Step(
            "the agent places the same order twice: it is made once",
            _repeated(
                "create_order",
                {"order_id": "C-3003", "sku": "SKU-7"},
                'create_order(order_id="C-3003", …)',
                [Expect(attempts=1), Expect(replayed=True)],
            ),
            {"/orders": (Reply(201, {"order_id": "C-3003", "status": "placed"}),)},
            mode="sequence",
            hits={"/orders": 1},
        ),
        Step(
            f"a log of {_LOG_LINES:,} lines: stored apart, the model gets a preview",
            (DemoCall("fetch_logs", {"service": "checkout"}, Expect(attempts=1, offloaded=True)),),
            {"/logs/checkout": (Reply(200, _log_lines()),)},
        ),
        Step(
            "a looping agent asks for the same order every turn; the run guard stops it",
            _repeated(
                "query_order",
                {"order_id": "B-2002"},
                'query_order(order_id="B-2002") turn',
                [
                    Expect(attempts=1),
                    Expect(attempts=1),
                    Expect(attempts=1),
                    _fails(ErrorType.TOOL_DISABLED, 0),
                    _fails(ErrorType.RUN_ABORTED, 0),
                ],
            ),
            {"/orders/B-2002": (Reply(200, {"order_id": "B-2002", "status": "processing"}),)},
            mode="rounds",
            hits={"/orders/B-2002": 3},
        ),
    ]


def scenarios(service_url: str) -> list[Step]:
    """The agent's script against the service at ``service_url``."""
    fan_out = tuple(
        DemoCall("get_weather", {"city": city, "unit": "f"}, Expect(attempts=1))
        for city in _FAN_OUT
    )
    return [
        Step(
            "weather service fails twice with 503, then answers",
            (DemoCall("get_weather", {"city": "Oslo"}, Expect(attempts=3)),),
            {"/weather/Oslo": (Reply(503), Reply(503), _weather(4.0, "light rain"))},
        ),
        Step(
            "order API says 429, Retry-After: 1, then answers",
            (DemoCall("query_order", {"order_id": "A-1001"}, Expect(attempts=2, min_elapsed_s=1)),),
            {
                "/orders/A-1001": (
                    Reply(429, {"error": "too many requests"}, {"Retry-After": "1"}),
                    Reply(200, {"order_id": "A-1001", "status": "shipped", "items": 2}),
                )
            },
        ),
        Step(
            "weather service takes 3 s; the tool's limit is 1.5 s",
            (DemoCall("get_weather", {"city": "Lima"}, _fails(ErrorType.TIMEOUT, 3)),),
            {"/weather/Lima": (Reply(200, {"temp_c": 19.0, "conditions": "fog"}, delay=3.0),)},
        ),
        Step(
            "the order does not exist (404)",
            (DemoCall("query_order", {"order_id": "Z-9999"}, _fails(ErrorType.NOT_FOUND, 1)),),
            {"/orders/Z-9999": (Reply(404, {"error": "no such order"}),)},
        ),
        Step(
            'the model invents unit="kelvin"',
            (
                DemoCall(
                    "get_weather",
                    {"city": "Oslo", "unit": "kelvin"},
                    _fails(ErrorType.INVALID_ARGUMENTS, 0),
                ),
            ),
            show_model_view=True,
        ),
        Step(
            "the model invents a tool",
            (DemoCall("get_stock_price", {"symbol": "ACME"}, _fails(ErrorType.UNKNOWN_TOOL, 0)),),
        ),
        *_defence_steps(),
        Step(
            "built-in http_request: 502 once, then 200",
            (
                DemoCall(
                    "http_request",
                    {"url": f"{service_url}/shipping/A-1001"},
                    Expect(attempts=2),
                    label="http_request(GET /shipping/A-1001)",
                ),
            ),
            {"/shipping/A-1001": (Reply(502), Reply(200, {"carrier": "DHL", "eta": "2 days"}))},
        ),
        Step(
            f"fan-out with call_many: {len(fan_out)} cities, {_FAN_OUT_DELAY_S:g} s each",
            fan_out,
            {
                f"/weather/{city}": (_weather(temp, sky, _FAN_OUT_DELAY_S),)
                for city, (temp, sky) in _FAN_OUT.items()
            },
            # One after another they would take len(fan_out) x the delay at least.
            max_wall_s=_FAN_OUT_DELAY_S * (len(fan_out) - 1),
        ),
    ]


# -- running it --------------------------------------------------------------


@dataclass
class Row:
    """One call of the script and, once it has ended, its result."""

    step: Step
    call: DemoCall
    result: ToolResult | None = None
    problems: list[str] = field(default_factory=list)
    #: What the model read: the result, with the run guard's note when it added one.
    model: dict[str, Any] = field(default_factory=dict)

    def finish(self, result: ToolResult, extra: list[str], model: dict[str, Any]) -> None:
        self.problems = self.call.expect.problems(result) + extra
        self.model = model
        self.result = result

    @property
    def passed(self) -> bool:
        return self.result is not None and not self.problems


def _outcome(result: ToolResult) -> str:
    return f"{result.error.type if result.error else result.status} {_attempts(result.attempts)}"


def outcome_word(result: ToolResult, model: dict[str, Any]) -> str:
    """One word for how a call ended, naming the layer that shaped an ok answer (pure):
    the error type, else replayed, degraded, offloaded, nudged or ok."""
    if result.error is not None:
        return str(result.error.type)
    tags = _layer_tags(result, model)
    return tags[0].split()[0] if tags else str(result.status)


def _how(result: ToolResult, model: dict[str, Any]) -> str:
    """The word and what it means for this call, for the streaming line."""
    word = outcome_word(result, model)
    if result.replayed:
        return f"{word}: the first call's result, the tool did not run again"
    if result.degraded:
        return f"{word}: {result.source} answered, {_attempts(result.attempts)} in all"
    return f"{word} {_attempts(result.attempts)}"


def _attempts(count: int | None) -> str:
    if count is None:
        return ""
    if count == 0:
        return "before any attempt"
    return f"after {count} attempt" + ("" if count == 1 else "s")


def _run_step(
    client: ToolClient, step: Step, rows: list[Row], run_id: str, service: FlakyServer | None
) -> None:
    start = time.monotonic()
    if step.mode == "rounds":
        views = _run_rounds(client, step)
    # each step shows one layer; the guard has a step of its own ("rounds"), so the
    # steps' plain calls only carry the run id as a label
    elif step.mode == "sequence" or len(step.calls) == 1:
        views = [_one(client, call, run_id) for call in step.calls]
    else:
        pairs = [(call.tool, call.arguments) for call in step.calls]
        results = client.call_many(pairs, run_id=run_id, timeout=_CALL_TIMEOUT_S, guard=False)
        views = [_plain(result) for result in results]
    extra = step.wall_problems(time.monotonic() - start) + step.hit_problems(service)
    for row, (result, model) in zip(rows, views, strict=True):
        row.finish(result, extra, model)


def _one(client: ToolClient, call: DemoCall, run_id: str) -> tuple[ToolResult, dict[str, Any]]:
    if call.pause_s:
        time.sleep(call.pause_s)  # the scenario's own clock: a breaker's open time passing
    return _plain(
        client.call(call.tool, call.arguments, run_id=run_id, timeout=_CALL_TIMEOUT_S, guard=False)
    )


def _plain(result: ToolResult) -> tuple[ToolResult, dict[str, Any]]:
    return result, result.for_model()


#: The guard of the looping-agent scenario: a call repeated 3 times in 10 is a loop.
_GUARD_BUDGET = RunBudget(max_steps=10, repeat_threshold=3, repeat_window=10)


def _run_rounds(client: ToolClient, step: Step) -> list[tuple[ToolResult, dict[str, Any]]]:
    """Each call is one model turn through ``run_round`` under a run guard of its own."""
    guard = client.run_guard(f"demo-loop-{uuid.uuid4().hex[:8]}", _GUARD_BUDGET)
    views = []
    for n, call in enumerate(step.calls):
        tool_call = {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": call.tool, "arguments": json.dumps(call.arguments)},
        }
        outcome = run_round(client, [tool_call], guard=guard, timeout=_CALL_TIMEOUT_S).outcomes[0]
        views.append((outcome.result, outcome.for_model()))
    return views


class _Progress:
    """The live view: every call of the script, with a spinner on the running step."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows
        self.running: Step | None = None
        self.spinner = Spinner("dots", style="cyan")

    def __rich__(self) -> Table:
        table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
        table.add_column(width=2, no_wrap=True)
        table.add_column(no_wrap=True)
        table.add_column(style="dim")
        for row in self.rows:
            table.add_row(*self._cells(row))
        return table

    def _cells(self, row: Row) -> tuple[RenderableType, RenderableType, str]:
        if row.result is not None:
            return _mark(row), Text(row.call.describe()), _short(row)
        if row.step is self.running:
            return self.spinner, Text(row.call.describe()), "running…"
        return Text("·", style="dim"), Text(row.call.describe(), style="dim"), row.step.scenario


def _mark(row: Row) -> Text:
    return Text("✓", style="green") if row.passed else Text("✗", style="bold red")


def _short(row: Row) -> str:
    assert row.result is not None
    return f"{_how(row.result, row.model)} in {row.result.elapsed_ms / 1000:.2f} s"


def _run_script(
    console: Console,
    client: ToolClient,
    steps: list[Step],
    before_step: Callable[[], None],
    service: FlakyServer | None = None,
) -> list[Row]:
    rows = [Row(step, call) for step in steps for call in step.calls]
    progress = _Progress(rows)
    run_id = f"demo-run-{uuid.uuid4().hex[:8]}"
    with Live(progress, console=console, refresh_per_second=12, transient=True):
        for step in steps:
            before_step()
            progress.running = step
            mine = [row for row in rows if row.step is step]
            _run_step(client, step, mine, run_id, service)
            if not console.is_terminal:  # no live view in a log: one line per call
                for row in mine:
                    console.print(_mark(row), escape(row.call.describe()), "·", _short(row))
        progress.running = None
    return rows


# -- the report --------------------------------------------------------------


#: From this width on the error type and the suggestion get columns of their own.
_WIDE_TABLE = 120
#: The call column's least width: ``query_order(order_id="B-2002")`` and its kin whole.
_CALL_MIN_WIDTH = 31


def _final_table(rows: list[Row], width: int) -> Table:
    """One row per call; a narrow terminal gets the same facts in fewer columns."""
    wide = width >= _WIDE_TABLE
    table = Table(
        box=box.SIMPLE_HEAD,
        title="What the agent got back",
        title_justify="left",
        title_style="bold",
    )
    table.add_column("", no_wrap=True)
    # wide enough for the longest call's name and first argument, which must not be cut
    table.add_column("call", min_width=_CALL_MIN_WIDTH, overflow="fold")
    table.add_column("tries" if not wide else "attempts", justify="right", no_wrap=True)
    table.add_column("outcome", overflow="fold")
    if wide:
        table.add_column("error type", no_wrap=True)
        table.add_column("suggestion to the model")
    table.add_column("elapsed", justify="right", no_wrap=True)
    previous: Step | None = None
    for row in rows:
        if row.result is not None:
            cells = _wide_cells if wide else _narrow_cells
            table.add_row(*cells(row, row.result, row.step is not previous))
            previous = row.step
    return table


def _call_cell(row: Row, first_of_step: bool) -> Text:
    cell = Text(row.call.describe())
    if first_of_step:
        cell.append(f"\n{row.step.scenario}", style="dim")
    return cell


def _status_cell(result: ToolResult, model: dict[str, Any]) -> Text:
    cell = Text(result.status, style="green" if result.ok else "red")
    tags = _layer_tags(result, model)
    if tags:
        cell.append(f" ({', '.join(tags)})", style="yellow")
    return cell


def _layer_tags(result: ToolResult, model: dict[str, Any]) -> list[str]:
    """The layers that shaped an answer the model still reads as ok."""
    tags = []
    if result.replayed:
        tags.append("replayed")
    if result.degraded:
        tags.append("degraded")
    if result.payload is not None:
        tags.append(f"offloaded {result.payload.size_bytes / 1000:,.0f} kB")
    if "guard" in model:
        tags.append("nudged")
    return tags


def _wide_cells(row: Row, result: ToolResult, first_of_step: bool) -> list[RenderableType]:
    error = result.error
    return [
        _mark(row),
        _call_cell(row, first_of_step),
        str(result.attempts),
        _status_cell(result, row.model),
        str(error.type) if error else "—",
        (error.suggestion or "—") if error else "—",
        _seconds(result),
    ]


def _narrow_cells(row: Row, result: ToolResult, first_of_step: bool) -> list[RenderableType]:
    """Outcome and error type share a column, the suggestion goes under the call."""
    error = result.error
    call = _call_cell(row, first_of_step)
    if error is not None and error.suggestion:
        call.append(f"\n→ {error.suggestion}", style="italic")
    outcome = Text(str(error.type), style="red") if error else _status_cell(result, row.model)
    return [_mark(row), call, str(result.attempts), outcome, _seconds(result)]


def _seconds(result: ToolResult) -> str:
    return f"{result.elapsed_ms / 1000:.2f} s"


def _print_model_view(console: Console, rows: list[Row]) -> None:
    """What the model reads back for one failure: proof that it can act on it."""
    for row in rows:
        if row.step.show_model_view and row.result is not None:
            console.print(
                f"[bold]The tool message the model gets for {escape(row.call.describe())}:"
            )
            # soft_wrap: a long message wraps in the terminal instead of being cut off.
            console.print(
                JSON.from_data(row.result.for_model(), ensure_ascii=False), soft_wrap=True
            )
            console.print()
            return


#: Strings longer than this are cut in the one-line views: the line is a glimpse.
_BRIEF_CHARS = 48


def _brief(value: Any) -> str:
    """JSON of ``value`` with long strings cut and long lists shortened, for one line."""
    if isinstance(value, dict):
        inner = ", ".join(f"{json.dumps(k)}: {_brief(v)}" for k, v in value.items())
        return "{" + inner + "}"
    if isinstance(value, list):
        items = [_brief(item) for item in value[:2]]
        if len(value) > 2:
            items.append(f"…{len(value) - 2} more")
        return "[" + ", ".join(items) + "]"
    if isinstance(value, str) and len(value) > _BRIEF_CHARS:
        value = value[: _BRIEF_CHARS - 1] + "…"
    return json.dumps(value, ensure_ascii=False, default=str)


def _print_model_lines(console: Console, rows: list[Row]) -> None:
    """One entry per scenario: its outcome word and what the model received from its last
    call, wrapped over as many lines as it needs."""
    console.print("[bold]What the model received[/] (the last call of each scenario):")
    last: dict[int, Row] = {}
    for row in rows:
        if row.result is not None:
            last[id(row.step)] = row
    for row in last.values():
        assert row.result is not None
        line = Text("  ")
        line.append(f"[{outcome_word(row.result, row.model)}] ", style="bold")
        line.append(row.call.describe(), style="dim")
        line.append(" → " + _brief(row.model))
        # wrapped, never cut: a field cut in half tells the reader nothing
        console.print(line, overflow="fold")
    console.print()


def _print_report(console: Console, rows: list[Row]) -> None:
    console.print()
    console.print(_final_table(rows, console.width))
    _print_model_lines(console, rows)
    _print_model_view(console, rows)


def _verdict(console: Console, rows: list[Row], elapsed_s: float) -> int:
    failed = [row for row in rows if not row.passed]
    if not failed:
        console.print(
            f"[bold green]✓ all {len(rows)} calls ended as expected[/] in {elapsed_s:.1f} s"
        )
        return 0
    console.print(f"[bold red]✗ {len(failed)} of {len(rows)} calls did not end as expected:[/]")
    for row in failed:
        why = "; ".join(row.problems) or "it never finished"
        console.print(f"  ✗ {escape(row.call.describe())} ({row.step.scenario}): {escape(why)}")
    return 1


# -- what the demo starts, and stops -----------------------------------------


class DemoSetupError(Exception):
    """Something the demo needs did not start; the message says what and why."""


class _Services:
    """Everything the demo starts, each stopped in ``close`` whatever happened."""

    def __init__(self, base: Settings, keep_server: bool, console: Console) -> None:
        self.base = base
        self.keep_server = keep_server
        self.console = console
        run = uuid.uuid4().hex[:8]
        self.prefix = f"demo-{run}"
        self.embedded: EmbeddedServer | None = None
        self.url = ""
        self.service: FlakyServer | None = None
        self.worker: WorkerProcess | None = None
        self.log_path = base.data_dir.resolve() / "demo" / f"worker-{run}.log"

    def settings(self) -> Settings:
        """The demo's own key prefix and queue, so it never meets a real deployment's calls."""
        return Settings.from_env(
            redis_url=self.url,
            key_prefix=self.prefix,
            default_queue=self.prefix,
            task_events=False,
            data_dir=self.base.data_dir.resolve(),
        )

    def start_redis(self) -> None:
        if self.base.redis_url:
            self.url = self.base.redis_url
            _ping(self.url)
            self._done(f"Redis at {redact_url(self.url)} (TOOLEXEC_REDIS_URL)")
            return
        self.embedded = ensure_embedded(self.base.data_dir, notify=None)  # says it below
        self.url = self.embedded.url
        how = "started" if self.embedded.started_here else "already running"
        self._done(f"embedded Valkey {how} at {self.url} (pid {self.embedded.pid})")

    def start_service(self) -> list[Step]:
        """Start the service and script it; the script needs its URL."""
        self.service = FlakyServer().start()
        steps = scenarios(self.service.url)
        for step in steps:
            for path, replies in step.script.items():
                self.service.script(path, *replies)
        self._done(f"misbehaving service at {self.service.url}")
        return steps

    def start_worker(self, service_url: str) -> None:
        settings = self.settings()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {
            "TOOLEXEC_REDIS_URL": self.url,
            "TOOLEXEC_KEY_PREFIX": settings.key_prefix,
            "TOOLEXEC_DEFAULT_QUEUE": settings.default_queue,
            "TOOLEXEC_TASK_EVENTS": "false",
            "TOOLEXEC_DATA_DIR": str(settings.data_dir),
            # The demo's service listens on loopback, which http_request refuses by default.
            "TOOLEXEC_HTTP_ALLOW": "127.0.0.1",
            SERVICE_URL_ENV: service_url,
        }
        # Run from the data directory: a ``tasks`` or ``executor`` package in the
        # caller's directory must not shadow toolexec's in the worker.
        self.worker = WorkerProcess(
            TOOLS_MODULE, env, concurrency=8, log_path=self.log_path, cwd=self.log_path.parent
        )
        start = time.monotonic()
        try:
            self.worker.start(self.url, settings.key_prefix)
        except RuntimeError as exc:  # its message carries the log's tail
            raise DemoSetupError(str(exc)) from exc
        pid = self.worker.process.pid if self.worker.process else "?"
        self._done(
            f"worker {self.worker.name} ready in {time.monotonic() - start:.1f} s "
            f"(pid {pid}, tools from {TOOLS_MODULE} + http_request)"
        )

    def check_worker(self) -> None:
        """Stop early if the worker died: its calls would only wait out their deadlines."""
        process = self.worker.process if self.worker else None
        if process is not None and process.poll() is not None:
            raise DemoSetupError(
                f"the worker exited with code {process.returncode} in the middle of the demo"
            )

    def _done(self, what: str) -> None:
        self.console.print(f"[green]✓[/] {escape(what)}")

    def close(self, succeeded: bool) -> None:
        stopped = []
        if self.worker is not None:
            self.worker.stop()
            stopped.append("worker")
        if self.service is not None:
            self.service.stop()
            stopped.append("service")
        if self.embedded is not None and self.embedded.started_here and not self.keep_server:
            stop_embedded(self.base.data_dir)
            stopped.append("embedded Valkey")
        elif self.url:
            self._forget()
            self._say_server_left()
        if succeeded:
            self.log_path.unlink(missing_ok=True)
        elif self.log_path.exists():
            self.console.print(f"[dim]worker log kept at {self.log_path}[/]")
        if stopped:
            self.console.print(f"[dim]stopped: {', '.join(stopped)}[/]")

    def _say_server_left(self) -> None:
        if self.embedded is not None and self.embedded.started_here:
            self.console.print(
                f"[dim]embedded Valkey left running at {self.url}; "
                "stop it with `toolexec embedded stop`[/]"
            )

    def _forget(self) -> None:
        """Delete the demo's keys from a server that stays up."""
        with (
            contextlib.suppress(redis.RedisError),
            contextlib.closing(
                redis_client(self.url, socket_connect_timeout=1.0, socket_timeout=2.0)
            ) as client,
        ):
            keys = list(client.scan_iter(match=f"{self.prefix}:*", count=500))
            if self.base.broker_url is None:  # kombu keeps the queue on this server too
                keys += [
                    self.prefix,
                    f"_kombu.binding.{self.prefix}",
                    f"_kombu.binding_permanent.{self.prefix}",
                ]
                client.zrem("_kombu.binding_deadlines", self.prefix)
            client.delete(*keys)


def _ping(url: str) -> None:
    try:
        with contextlib.closing(redis_client(url, socket_timeout=5.0)) as client:
            client.ping()
    except redis.RedisError as exc:
        raise unavailable(url, exc) from exc


# -- signals -----------------------------------------------------------------


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind like Ctrl-C, so the ``finally`` blocks stop everything."""
    if not _in_main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _uninterruptible() -> Iterator[None]:
    """A second Ctrl-C must not cut the clean-up short and leave processes behind."""
    if not _in_main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -- the command -------------------------------------------------------------


def _demo(services: _Services, console: Console) -> list[Row]:
    console.print(
        "[bold]toolexec demo[/]: a scripted agent calls tools through a real worker\n"
        "against a local service that misbehaves on purpose.\n"
    )
    with console.status("starting Redis, the service and a worker…"):
        services.start_redis()
        steps = services.start_service()
        assert services.service is not None
        services.start_worker(services.service.url)
    console.print()
    with ToolClient(services.settings()) as client:
        rows = _run_script(console, client, steps, services.check_worker, services.service)
    _print_report(console, rows)
    return rows


def run_demo(keep_server: bool = False, console: Console | None = None) -> int:
    """Run the scripted agent; 0 if every call ended as declared, 1 if not, 130 if stopped."""
    console = console or Console(highlight=False)
    services = _Services(Settings.from_env(), keep_server, console)
    started = time.monotonic()
    rows: list[Row] = []
    try:
        with _sigterm_as_interrupt():
            try:
                rows = _demo(services, console)
            finally:
                with _uninterruptible():
                    services.close(succeeded=bool(rows) and all(row.passed for row in rows))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: everything the demo started has been stopped")
        return _EXIT_INTERRUPTED
    except DemoSetupError as exc:
        console.print(f"[bold red]✗ {escape(str(exc))}[/]")
        return 1
    return _verdict(console, rows, time.monotonic() - started)
