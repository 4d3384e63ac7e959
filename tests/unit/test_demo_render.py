"""``toolexec demo``'s report without a terminal at 80 columns: names whole, nothing cut."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from toolexec.errors import ErrorType
from toolexec.ops.demo import DemoCall, Row, Step, _final_table, _print_model_lines, outcome_word
from toolexec.results import ErrorInfo, ToolResult

_CALLS = [
    ('query_order(order_id="B-2002") turn #5', ErrorType.RUN_ABORTED),
    ('get_weather(city="Oslo", unit="kelvin")', ErrorType.INVALID_ARGUMENTS),
    ('list_reviews(sku="SKU-7") #2', ErrorType.RETRY_BUDGET_EXHAUSTED),
    ('check_stock(sku="SKU-7") #4 probe', None),
]


def _rows() -> list[Row]:
    rows = []
    for label, kind in _CALLS:
        step = Step(f"a scenario whose description is long enough to wrap: {label}", ())
        error = (
            ErrorInfo(type=kind, message="m", suggestion="Stop calling tools now.")
            if kind
            else None
        )
        result = ToolResult(
            status="error" if kind else "ok",
            tool=label.split("(")[0],
            call_id="c1",
            error=error,
            attempts=0 if kind else 1,
            elapsed_ms=12.0,
            data=None if kind else {"note": "x" * 300},
        )
        row = Row(step, DemoCall(result.tool, {}, label=label))
        row.finish(result, [], result.for_model())
        rows.append(row)
    return rows


def _text(draw: Any) -> str:
    console = Console(width=80, record=True, force_terminal=False)
    draw(console)
    return console.export_text()


def test_the_narrow_table_keeps_every_call_and_error_type_whole() -> None:
    rows = _rows()
    text = _text(lambda console: console.print(_final_table(rows, 80)))

    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text
    assert "…" not in text, text
    for label, kind in _CALLS:
        head = label.split(" ")[0]  # the name and first argument never break
        assert head in text, f"{head} is cut:\n{text}"
        if kind:
            assert str(kind) in text, text


def test_what_the_model_received_wraps_instead_of_cutting() -> None:
    rows = _rows()
    text = _text(lambda console: _print_model_lines(console, rows))

    assert "…" not in text.replace("x" * 47 + "…", "")  # only _brief's own string cut
    assert "[ok] check_stock" in text and "[run_aborted] query_order" in text
    assert text.count("\n") > len(rows) + 2  # the long entry took more than one line
    assert '"status": "ok"' in text and text.rstrip().endswith("}")


def test_the_outcome_word_names_the_layer() -> None:
    (*_, probe) = _rows()
    assert probe.result is not None
    replayed = probe.result.model_copy(update={"replayed": True})
    assert outcome_word(probe.result, probe.model) == "ok"
    assert outcome_word(replayed, probe.model) == "replayed"
    assert outcome_word(probe.result, {**probe.model, "guard": {}}) == "nudged"
