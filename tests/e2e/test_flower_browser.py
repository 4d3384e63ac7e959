"""Flower in a real browser: every toolexec call is a ``tools.<name>`` task with its state.

Given a worker and Flower (behind basic auth) on loopback, and calls that
succeed, retry and fail, headless Chromium logs in and finds each call on
the tasks page, and Flower's API shows the retries and error types. The
recipe (system Chromium through Playwright, no browser download) is
docs/background.md, Flower. ``TOOLEXEC_UPDATE_DOCS=1`` (``make screenshot``) also writes the
screenshot docs/ops/monitoring.md shows, docs/flower-tasks.png.
"""

from __future__ import annotations

import os
import shutil
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ops_support import REPO, FlowerProcess
from ops_tools import OPS_QUEUE

from toolexec.client import ToolClient
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply, WorkerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

CHROMIUM = Path("/usr/lib/chromium/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
USER, PASSWORD = "ops", "flower-pw-93"
SECRET = "tok-SECRET-e2e"

sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="Playwright is not installed: pip install -e '.[e2e]' (make test does)",
)
if not CHROMIUM.exists():
    pytest.skip(
        f"no Chromium at {CHROMIUM}: apt-get install -y chromium chromium-driver "
        "(.ci/run does where apt-get is available)",
        allow_module_level=True,
    )


@dataclass(frozen=True)
class Calls:
    """The task ids of the calls Flower should show, one per outcome."""

    ok: str
    retried: str
    failed: str
    exhausted: str


@pytest.fixture(scope="module")
def e2e_worker(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    log = tmp_path_factory.mktemp("e2e") / "worker.log"
    proc = WorkerProcess("ops_tools", worker_env, queues=OPS_QUEUE, concurrency=8, log_path=log)
    proc.start(settings.redis_url or "", settings.key_prefix)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def flower(
    e2e_worker: WorkerProcess, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FlowerProcess]:
    """Flower starts before any call: it only knows what it saw as events."""
    log = tmp_path_factory.mktemp("e2e") / "flower.log"
    proc = FlowerProcess(worker_env, USER, PASSWORD, log).start(e2e_worker.hostname)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def calls(settings: Settings, flower: FlowerProcess, flaky: FlakyServer) -> Calls:
    """One call that succeeds, one that succeeds on its third attempt, two that fail."""
    twice = flaky.script(flaky.unique_path("e2e"), Reply(503), Reply(503), Reply(200))
    always = flaky.script(flaky.unique_path("e2e-down"), Reply(503))
    with ToolClient(settings) as client:
        handles = [
            client.submit("greet", {"name": "flower"}),
            client.submit("fetch_with_token", {"url": twice, "token": SECRET}),
            client.submit("lookup_order", {"order_id": "A-42"}),
            client.submit("fetch_with_token", {"url": always, "token": SECRET}),
        ]
        statuses = [h.result().status for h in handles]
    assert statuses == ["ok", "ok", "error", "error"]
    made = Calls(*(h.call_id for h in handles))
    for task_id in (made.ok, made.retried, made.failed, made.exhausted):
        flower.wait_final(task_id)
    return made


def test_flower_api_shows_states_retries_and_error_types_but_no_secret(
    flower: FlowerProcess, calls: Calls
) -> None:
    ok, retried = flower.task(calls.ok), flower.task(calls.retried)
    failed, exhausted = flower.task(calls.failed), flower.task(calls.exhausted)
    assert (ok["name"], ok["state"], ok["retries"]) == ("tools.greet", "SUCCESS", 0)
    assert (retried["name"], retried["state"]) == ("tools.fetch_with_token", "SUCCESS")
    assert retried["retries"] == 2
    assert failed["state"] == "FAILURE" and "not_found" in failed["exception"]
    assert exhausted["state"] == "FAILURE" and exhausted["retries"] == 3
    assert "unavailable" in exhausted["exception"]
    for info in (retried, exhausted):
        assert SECRET not in info["kwargs"] and "'token': '***'" in info["kwargs"]


def test_flower_refuses_requests_without_credentials(flower: FlowerProcess) -> None:
    assert flower.status_without_auth("/api/workers") == 401
    assert flower.status_without_auth("/tasks") == 401
    assert PASSWORD not in flower.log()


def test_flower_metrics_count_the_retries_per_tool(flower: FlowerProcess, calls: Calls) -> None:
    """/metrics needs no auth, so a Prometheus scraper can read it (docs/background.md, Celery)."""
    with urllib.request.urlopen(flower.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    retried = [
        line
        for line in text.splitlines()
        if line.startswith("flower_events_total")
        and 'task="tools.fetch_with_token"' in line
        and 'type="task-retried"' in line
    ]
    assert retried and float(retried[0].rsplit(" ", 1)[1]) >= 5  # 2 + 3 retries


@pytest.fixture
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _logged_in_page(browser: object, flower: FlowerProcess) -> object:
    """A page in a fresh context (Flower keeps the table's filter in localStorage)."""
    context = browser.new_context(  # type: ignore[attr-defined]
        http_credentials={"username": USER, "password": PASSWORD},
        viewport={"width": 1600, "height": 720},
    )
    context.set_default_timeout(15_000)
    return context.new_page()


def test_browser_logs_in_and_the_tasks_page_lists_each_tool_call_with_its_state(
    browser: object, flower: FlowerProcess, calls: Calls, tmp_path: Path
) -> None:
    # Given Flower behind basic auth, when a browser logs in and opens the tasks page
    page = _logged_in_page(browser, flower)
    page.goto(flower.url + "/tasks")  # type: ignore[attr-defined]
    expect = sync_api.expect
    table = page.locator("#tasks-table")  # type: ignore[attr-defined]
    # Then every call is a row named after its tool, with its final state
    for task_id, name, state in [
        (calls.ok, "tools.greet", "SUCCESS"),
        (calls.retried, "tools.fetch_with_token", "SUCCESS"),
        (calls.failed, "tools.lookup_order", "FAILURE"),
        (calls.exhausted, "tools.fetch_with_token", "FAILURE"),
    ]:
        row = table.locator(f"tr[id='{task_id}']")
        expect(row).to_contain_text(name)
        expect(row).to_contain_text(state)
    expect(table).not_to_contain_text(SECRET)
    shot = tmp_path / "flower-tasks.png"
    page.screenshot(path=str(shot))  # type: ignore[attr-defined]
    assert shot.stat().st_size > 10_000
    if os.environ.get("TOOLEXEC_UPDATE_DOCS") == "1":
        shutil.copyfile(shot, REPO / "docs" / "flower-tasks.png")


def test_browser_task_page_shows_the_retries_and_the_error_type(
    browser: object, flower: FlowerProcess, calls: Calls
) -> None:
    page = _logged_in_page(browser, flower)
    expect = sync_api.expect
    page.goto(f"{flower.url}/task/{calls.exhausted}")  # type: ignore[attr-defined]
    body = page.locator("body")  # type: ignore[attr-defined]
    expect(body).to_contain_text("tools.fetch_with_token")
    expect(body).to_contain_text("FAILURE")
    expect(body).to_contain_text("unavailable")
    expect(body).to_contain_text("ToolFailed")


def test_browser_without_credentials_is_turned_away(browser: object, flower: FlowerProcess) -> None:
    context = browser.new_context()  # type: ignore[attr-defined]
    page = context.new_page()
    with pytest.raises(sync_api.Error, match="ERR_INVALID_AUTH_CREDENTIALS"):
        page.goto(flower.url + "/tasks")
