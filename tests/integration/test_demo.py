"""``toolexec demo`` end to end: its own embedded Valkey, a real worker, a flaky service.

The demo runs as a user runs it, in a subprocess with no ``TOOLEXEC_REDIS_URL``,
so it starts (and must stop) its own embedded server under the data directory.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

_DEMO_TIMEOUT_S = 90


def _demo_env(data_dir: Path) -> dict[str, str]:
    """The caller's environment without any toolexec setting, so the demo uses its own server."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("TOOLEXEC_")}
    env["TOOLEXEC_DATA_DIR"] = str(data_dir)
    env["COLUMNS"] = "220"  # wide enough that no table cell wraps
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _demo_command() -> list[str]:
    return [sys.executable, "-m", "toolexec", "demo"]


def _pids(output: str) -> tuple[int, int]:
    """The embedded server's and the worker's pids, as the demo announced them."""
    valkey = re.search(r"embedded Valkey started at \S+ \(pid (\d+)\)", output)
    worker = re.search(r"worker \S+ ready in [\d.]+ s \(pid (\d+)", output)
    assert valkey and worker, output
    return int(valkey.group(1)), int(worker.group(1))


def _live_pids() -> dict[int, tuple[str, int]]:
    """Every process that is not a zombie: pid -> (state, process group)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if state != "Z":
            found[int(entry.name)] = (state, int(pgrp))
    return found


def _assert_all_stopped(valkey_pid: int, worker_pid: int, data_dir: Path) -> None:
    live = _live_pids()
    assert valkey_pid not in live, "the embedded Valkey the demo started is still running"
    left = [pid for pid, (_, group) in live.items() if group == worker_pid]
    assert not left, f"processes of the worker's group are still running: {left}"
    assert not (data_dir / "valkey" / "valkey.pid").exists()
    assert not (data_dir / "valkey" / "url").exists()


def _table_match(output: str, call: str) -> re.Match[str]:
    table = output.split("What the agent got back", 1)[1].split("What the model received")[0]
    row = re.search(re.escape(call) + r"\s+(\d+)\s+(ok|error)(?: \(([^)]*)\))?\s+(\S+)", table)
    assert row, f"no row for {call} in:\n{table}"
    return row


def _table_row(output: str, call: str) -> tuple[int, str, str]:
    """(attempts, outcome, error type) of ``call`` in the final table."""
    row = _table_match(output, call)
    return int(row.group(1)), row.group(2), row.group(4)


def _tags(output: str, call: str) -> str | None:
    """What the outcome column says about the layers that shaped an ok answer."""
    return _table_match(output, call).group(3)


def _model_entries(output: str) -> list[tuple[str, str]]:
    """(outcome word, text) of each scenario's entry under "What the model received"; an
    entry wraps over several lines, which are joined again."""
    section = output.split("What the model received", 1)[1].split("\n\n", 1)[0]
    entries: list[tuple[str, str]] = []
    for line in section.splitlines()[1:]:
        start = re.match(r"^  \[(\w+)\] (.*)$", line)
        if start:
            entries.append((start.group(1), start.group(2).rstrip()))
        elif entries:
            word, text = entries[-1]
            entries[-1] = (word, text + " " + line.strip())
    return entries


def _model_entry(output: str, call: str) -> tuple[str, str]:
    found = [(w, t) for w, t in _model_entries(output) if t.startswith(call + " → ")]
    assert found, f"no model entry for {call} in:\n{_model_entries(output)}"
    return found[0]


def _model_line(output: str, call: str) -> str:
    """What the model received in the scenario that ends with ``call``, on one line."""
    return _model_entry(output, call)[1]


def _streamed(output: str, call: str) -> str:
    """The line printed when ``call`` ended (no terminal: one line per call)."""
    found = [line for line in output.splitlines() if line.startswith(f"✓ {call} · ")]
    assert found, f"no streamed line for {call}"
    return found[0].split(" · ", 1)[1]


def test_demo_meets_every_expectation_and_stops_what_it_started(tmp_path: Path) -> None:
    """Given no TOOLEXEC_REDIS_URL, the demo starts its own server, passes, and stops it all."""
    # When the demo runs from an unrelated directory
    done = subprocess.run(
        _demo_command(),
        env=_demo_env(tmp_path / "data"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=_DEMO_TIMEOUT_S,
    )
    output = done.stdout

    # Then every scripted call ended as declared
    assert done.returncode == 0, output + done.stderr
    ended = re.search(r"✓ all 28 calls ended as expected in ([\d.]+) s", output)
    assert ended, output
    assert float(ended.group(1)) < 60, "the demo must stay well under a minute"
    # ... 503 twice and 429-with-Retry-After end ok after their retries, not as errors
    assert _table_row(output, 'get_weather(city="Oslo")') == (3, "ok", "—")
    assert _table_row(output, 'query_order(order_id="A-1001")') == (2, "ok", "—")
    assert _table_row(output, "http_request(GET /shipping/A-1001)") == (2, "ok", "—")
    # ... and the failures reach the agent classified
    assert _table_row(output, 'get_weather(city="Lima")') == (3, "error", "timeout")
    assert _table_row(output, 'query_order(order_id="Z-9999")') == (1, "error", "not_found")
    assert _table_row(output, 'get_weather(city="Oslo", unit="kelvin")') == (
        0,
        "error",
        "invalid_arguments",
    )
    assert _table_row(output, 'get_stock_price(symbol="ACME")') == (0, "error", "unknown_tool")
    for city in ("Paris", "Tokyo", "Nairobi", "Quito"):
        assert _table_row(output, f'get_weather(city="{city}", unit="f")') == (1, "ok", "—")

    # ... the breaker opens after two failed calls, and the third fails fast without an attempt
    stock = 'check_stock(sku="SKU-7")'
    assert _table_row(output, f"{stock} #1") == (1, "error", "unavailable")
    assert _table_row(output, f"{stock} #2") == (1, "error", "unavailable")
    assert _table_row(output, f"{stock} #3") == (0, "error", "circuit_open")
    # ... and after its open time one probe finds the service back and closes it
    assert _table_row(output, f"{stock} #4 probe") == (1, "ok", "—")
    assert _table_row(output, f"{stock} #5 closed") == (1, "ok", "—")
    assert _model_entry(output, f"{stock} #5 closed")[0] == "ok"
    # ... the retry budget lets the first failing call retry, and no more
    reviews = 'list_reviews(sku="SKU-7")'
    assert _table_row(output, f"{reviews} #1") == (3, "error", "unavailable")
    for n in (2, 3):
        assert _table_row(output, f"{reviews} #{n}") == (1, "error", "retry_budget_exhausted")
    assert _model_entry(output, f"{reviews} #3")[0] == "retry_budget_exhausted"
    # ... a fallback answers, and the model is told the answer is degraded and where it came from
    search = 'search_products(query="boots")'
    assert _table_row(output, search)[1:] == ("ok", "—") and _tags(output, search) == "degraded"
    assert '"degraded": true, "source": "search_products_lite"' in _model_line(output, search)
    assert _model_entry(output, search)[0] == "degraded"
    assert _streamed(output, search).startswith("degraded: search_products_lite answered")
    # ... the same order placed twice is made once: the second call is a replay
    order = 'create_order(order_id="C-3003", …)'
    assert _table_row(output, f"{order} #1") == (1, "ok", "—")
    assert _tags(output, f"{order} #1") is None
    assert _tags(output, f"{order} #2") == "replayed"
    assert '"replayed": true' in _model_line(output, f"{order} #2")
    assert _model_entry(output, f"{order} #2")[0] == "replayed"
    assert _streamed(output, f"{order} #2").startswith("replayed: the first call's result")
    assert "before any attempt" not in _streamed(output, f"{order} #2")
    # ... a large result is stored apart and the model gets a preview that says so
    logs = 'fetch_logs(service="checkout")'
    assert _table_row(output, logs) == (1, "ok", "—")
    assert re.fullmatch(r"offloaded [\d,]+ kB", _tags(output, logs) or ""), _tags(output, logs)
    assert '"partial": true' in _model_line(output, logs)
    assert _model_entry(output, logs)[0] == "offloaded"
    # ... and no entry is cut short: each ends with its closing brace
    assert all(text.endswith("}") for _, text in _model_entries(output)), output
    # ... the run guard nudges a looping agent, then disables the tool, then ends the run
    turn = 'query_order(order_id="B-2002") turn'
    assert [_table_row(output, f"{turn} #{n}") for n in (1, 2, 3, 4, 5)] == [
        (1, "ok", "—"),
        (1, "ok", "—"),
        (1, "ok", "—"),
        (0, "error", "tool_disabled"),
        (0, "error", "run_aborted"),
    ]
    assert _tags(output, f"{turn} #3") == "nudged"
    assert '"type": "run_aborted"' in _model_line(output, f"{turn} #5")
    # ... and every scenario has its line saying what the model received
    assert _model_line(output, 'get_weather(city="Oslo")').endswith('"light rain"}}')

    # And nothing it started outlives it
    valkey_pid, worker_pid = _pids(output)
    assert "stopped: worker, service, embedded Valkey" in output
    _assert_all_stopped(valkey_pid, worker_pid, tmp_path / "data")
    assert list((tmp_path / "data" / "demo").iterdir()) == [], "the worker log of a passing run"


def _wait_for_line(process: subprocess.Popen[str], pattern: str, seen: list[str]) -> None:
    assert process.stdout is not None
    end = time.monotonic() + _DEMO_TIMEOUT_S
    while time.monotonic() < end:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return
    raise AssertionError(f"the demo never printed {pattern!r}:\n{''.join(seen)}")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_demo_still_stops_everything_it_started(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """Given a demo in the middle of its calls, a Ctrl-C or SIGTERM still stops all it started."""
    process = subprocess.Popen(
        _demo_command(),
        env=_demo_env(tmp_path / "data"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A runner started in the background (``cmd &``, nohup) ignores SIGINT, and a
        # child inherits that: Python then installs no KeyboardInterrupt handler at all.
        # A user's terminal never does this, so the demo is given the default back.
        preexec_fn=_default_sigint,
    )
    seen: list[str] = []
    try:
        # When it is interrupted after its first call has ended
        _wait_for_line(process, r"✓ get_weather\(city=\"Oslo\"\)", seen)
        process.send_signal(signum)
        rest, _ = process.communicate(timeout=_DEMO_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = "".join(seen) + rest

    # Then it says so, exits 130 and leaves nothing running
    assert process.returncode == 130, output
    assert "interrupted" in output
    valkey_pid, worker_pid = _pids(output)
    _assert_all_stopped(valkey_pid, worker_pid, tmp_path / "data")
