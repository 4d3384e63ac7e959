"""The Grafana dashboard (docs/deploy/grafana/toolexec.json) against a real worker's /metrics.

Grafana cannot run here, so the dashboard is checked the way it could go
wrong: JSON Grafana would refuse (ids, grid, datasource, targets), and
queries that name a metric no worker exports, which Grafana shows as an
empty panel without complaint.
"""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from integration_support import closed_port
from prometheus_client.parser import text_string_to_metric_families

from toolexec.client import ToolClient
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply, WorkerProcess

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).parents[2] / "docs" / "deploy" / "grafana" / "toolexec.json"

#: The sample names each metric type exposes, after its family name.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count", "_created"),
}


def _panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def _exprs() -> list[str]:
    return [t["expr"] for p in _panels() for t in p["targets"]]


def test_the_dashboard_is_json_grafana_accepts() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "toolexec" and board["title"] and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "tool"} <= variables
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        taken = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not taken & cells, f"{panel['title']} overlaps another panel"
        cells |= taken
    for panel in _panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
    for expr in _exprs():
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
        assert set(re.findall(r"\$(\w+)", expr)) <= {*variables, "__rate_interval"}, expr


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    exprs = " ".join(_exprs())
    for metric in (
        "toolexec_calls_total",  # call rate and outcomes
        "toolexec_attempts_total",  # attempts per call
        "toolexec_call_duration_seconds_bucket",  # latency percentiles
        "toolexec_breaker_state",
        "toolexec_retry_budget_spent_total",
        "toolexec_queue_depth",
        "toolexec_calls_in_flight",
    ):
        assert metric in exprs, metric
    assert any(t.get("exemplar") for p in _panels() for t in p["targets"])


@pytest.fixture(scope="module")
def metrics_page(
    settings: Settings,
    worker_env: dict[str, str],
    flaky: FlakyServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """A real worker's /metrics after a retried call."""
    tag = uuid.uuid4().hex[:8]
    own = settings.model_copy(update={"key_prefix": f"db-{tag}", "default_queue": f"db-{tag}"})
    port = closed_port()
    env = {
        **worker_env,
        "TOOLEXEC_KEY_PREFIX": own.key_prefix,
        "TOOLEXEC_DEFAULT_QUEUE": own.default_queue,
        "TOOLEXEC_METRICS_PORT": str(port),
    }
    log = tmp_path_factory.mktemp("dashboard") / "worker.log"
    proc = WorkerProcess("tracing_tools", env, log_path=log, queues=own.default_queue)
    proc.start(own.redis_url or "", own.key_prefix)
    try:
        url = flaky.script(flaky.unique_path("db"), Reply(503), Reply(200))
        with ToolClient(own) as client:
            assert client.call("tr_fetch", {"url": url, "token": "t"}, timeout=20).ok
        yield urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        proc.stop()


def test_every_metric_the_dashboard_names_is_in_a_workers_metrics(metrics_page: str) -> None:
    exported = {
        family.name + suffix
        for family in text_string_to_metric_families(metrics_page)
        for suffix in _SUFFIXES.get(family.type, ("",))
    }
    named = {m for expr in _exprs() for m in re.findall(r"\btoolexec_[a-z_]+\b", expr)}
    assert len(named) >= 10
    assert named <= exported, sorted(named - exported)
    # the scrape-time gauges report real values, not just their HELP lines
    assert re.search(r'^toolexec_queue_depth\{queue="db-\w+"\} ', metrics_page, re.M)
