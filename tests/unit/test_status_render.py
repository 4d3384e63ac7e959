"""``toolexec status`` tables fit 80 columns and never break a name across lines."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from toolexec.ops.status import _render

_NAMES = ["get_weather", "search_products_lite", "http_request@api.example.com"]


def _view() -> dict[str, Any]:
    tool = {
        "in_flight": 2,
        "calls": 1234,
        "ok": 1200,
        "failed": {"retry_budget_exhausted": 30, "unavailable": 4},
        "failure_rate": 0.0275,
        "degraded": 600,
        "degraded_rate": 0.4862,
        "attempts": 2345,
        "retries": 1111,
        "retried": {},
        "retry_rate": 0.47,
    }
    return {
        "minutes": 5,
        "broker": "redis://127.0.0.1:6380/0",
        "unacked": 3,
        "queues": [{"name": "tools", "waiting": 12}, {"name": "slow-search", "waiting": 0}],
        "workers": [
            {
                "name": "toolexec-123456@worker-7.example",
                "heartbeat_age_s": 1.2,
                "answered_ping": None,
            }
        ],
        "breakers": [
            {"name": name, "state": "half_open", "failures": 12, "calls": 20, "failure_rate": 0.6}
            for name in _NAMES
        ],
        "tools": [{"tool": name, **tool} for name in _NAMES[:2]],
    }


def test_every_table_fits_80_columns_with_each_name_whole_on_one_line() -> None:
    console = Console(width=80, record=True, force_terminal=False)
    for part in _render(_view()):
        console.print(part)
    text = console.export_text()

    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text
    assert "…" not in text, text  # nothing cut short, numbers included
    for name in [*_NAMES, "toolexec-123456@worker-7.example", "retry_budget_exhausted"]:
        assert name in text, f"{name} is broken or cut:\n{text}"
    assert "FALLBK%" in text and "49%" in text  # the share of calls a fallback answered
    failures = [line for line in text.splitlines() if "retry_budget_exhausted" in line]
    assert len(failures) == 2 and all(line.split()[-1] == "30" for line in failures)
