"""Render the Grafana dashboard's panels from real data, where Grafana cannot run.

Grafana is not installable here, so its screenshot cannot be taken. This
script shows the next most faithful thing: every panel of
docs/deploy/grafana/toolexec.json, with the panel's own PromQL evaluated by a
real Prometheus (Debian's ``prometheus``) that scrapes a real worker while a
scripted agent load runs (a search with occasional 503s, an inventory service
that goes down so its breaker opens and its fallback answers, large reports
that are offloaded). The picture is drawn with matplotlib, one chart per panel,
in the dashboard's order; it is not a Grafana screenshot and says so.

Usage: ``make dashboard-preview`` (installs prometheus and matplotlib), or
``python docs/deploy/preview/render.py [--seconds 90] [--out docs/dashboard-preview.png]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toolexec.client import ToolClient
from toolexec.embedded import ensure_embedded, stop_embedded
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply, WorkerProcess

HERE = Path(__file__).parent
DASHBOARD = HERE.parent / "grafana" / "toolexec.json"
RATE_INTERVAL = "10s"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def prometheus(target: str, folder: Path) -> Iterator[str]:
    """A real Prometheus scraping ``target`` every second; yields its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus is not installed: apt-get install prometheus")
    config = folder / "prometheus.yml"
    scrape = {"job_name": "toolexec-worker", "static_configs": [{"targets": [target]}]}
    config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": [scrape]}))
    port = _port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(folder / "prometheus.log").open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(f"{url}/-/ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _wait(url: str) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def _script(server: FlakyServer, rng: random.Random) -> dict[str, str]:
    search = [
        Reply(503) if rng.random() < 0.2 else Reply(200, delay=rng.uniform(0.005, 0.08))
        for _ in range(20000)
    ]
    inventory = (
        [Reply(200, delay=0.01)] * 100 + [Reply(500)] * 150 + [Reply(200, delay=0.01)] * 20000
    )
    return {
        "search": server.script("/search", *search),
        "inventory": server.script("/inventory", *inventory),
    }


def _agent(client: ToolClient, urls: dict[str, str], until: float, seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        pick = rng.random()
        if pick < 0.6:
            client.call("pv_search", {"url": urls["search"]}, timeout=10)
        elif pick < 0.95:
            client.call("pv_inventory", {"url": urls["inventory"]}, timeout=10)
        else:
            client.call("pv_report", {"size": rng.choice([2_000, 400_000])}, timeout=10)
        time.sleep(rng.uniform(0.02, 0.15))


def _query_range(prom: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "2s"})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{params}", timeout=30) as reply:
        body = json.load(reply)
    if body.get("status") != "success":
        raise SystemExit(f"Prometheus refused {expr!r}: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _expr(raw: str) -> str:
    return raw.replace("$__rate_interval", RATE_INTERVAL).replace('=~"$tool"', '=~".*"')


def _legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or "value"


def render(prom: str, start: float, end: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]
    rows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(15, 2.9 * rows), squeeze=False)
    fig.suptitle(
        "toolexec dashboard panels: each panel's own PromQL, evaluated by a real Prometheus\n"
        "scraping a real worker under scripted load (docs/deploy/preview/render.py); "
        "drawn with matplotlib, not a Grafana screenshot",
        fontsize=11,
    )
    for ax, panel in zip(axes.flat, panels, strict=False):
        _panel(ax, panel, prom, start, end)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=70)


def _panel(ax: Any, panel: dict[str, Any], prom: str, start: float, end: float) -> None:
    ax.set_title(panel["title"], fontsize=10, loc="left")
    shown = 0
    for target in panel["targets"]:
        for series in _query_range(prom, _expr(target["expr"]), start, end):
            xs = [float(t) - start for t, _ in series["values"]]
            ys = [float(v) for _, v in series["values"]]
            label = _legend(target.get("legendFormat", ""), series["metric"])
            ax.plot(xs, ys, label=label, linewidth=1.2)
            shown += 1
    if shown:
        ax.legend(fontsize=7, loc="upper left", ncol=2, framealpha=0.6)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlim(0, end - start)
    ax.tick_params(labelsize=7)
    ax.set_xlabel("seconds into the run", fontsize=7)
    ax.grid(alpha=0.3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard-preview.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="toolexec-preview-") as tmp_name:
        tmp = Path(tmp_name)
        server_info = ensure_embedded(tmp / "valkey")
        metrics_port = _port()
        settings = Settings(
            redis_url=server_info.url, data_dir=tmp, key_prefix="preview", default_queue="preview"
        )
        env = {
            "TOOLEXEC_REDIS_URL": server_info.url,
            "TOOLEXEC_KEY_PREFIX": "preview",
            "TOOLEXEC_DEFAULT_QUEUE": "preview",
            "TOOLEXEC_DATA_DIR": str(tmp),
            "TOOLEXEC_METRICS_PORT": str(metrics_port),
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        }
        worker = WorkerProcess("preview_tools", env, log_path=tmp / "worker.log", concurrency=8)
        try:
            worker.start(server_info.url, "preview")
            with FlakyServer() as service, prometheus(f"127.0.0.1:{metrics_port}", tmp) as prom:
                urls = _script(service, random.Random(7))
                start = time.time()
                until = time.monotonic() + args.seconds
                with ToolClient(settings) as client:
                    agents = [
                        threading.Thread(target=_agent, args=(client, urls, until, seed))
                        for seed in range(4)
                    ]
                    for agent in agents:
                        agent.start()
                    for agent in agents:
                        agent.join()
                time.sleep(3)  # the last scrapes
                render(prom, start, time.time(), args.out)
        finally:
            worker.stop()
            stop_embedded(tmp / "valkey")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
