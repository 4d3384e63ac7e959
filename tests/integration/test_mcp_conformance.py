"""The official MCP conformance suite's server scenarios against ``toolexec mcp --http``.

A worker runs ``examples/mcp_conformance.py`` (the suite's fixtures as toolexec
tools), a front serves them on 127.0.0.1, and the suite (npm
``@modelcontextprotocol/conformance``, under Node 22 from npm) runs every server
scenario against it. The test prints the scenario / result table (``make
mcp-conformance`` shows it) and holds the pass set to what was measured.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mcp_conformance_support import SUITE_VERSION, Unavailable, install, read_results, table
from mcp_support import mcp_http_process

from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcp_conformance.py"
CLIENT = Path(__file__).resolve().parents[1] / "mcp_conformance_client.py"

#: Scenarios toolexec does not serve: prompts and completions (not tools' business).
NOT_SERVED = {
    "completion-complete",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
}

#: Every other server scenario of the suite passes.
EXPECTED_PASS = {
    "server-initialize",
    "logging-set-level",
    "ping",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-with-logging",
    "tools-call-error",
    "tools-call-with-progress",
    "tools-call-sampling",
    "tools-call-elicitation",
    "json-schema-2020-12",
    "elicitation-sep1034-defaults",
    "server-sse-polling",
    "server-sse-multiple-streams",
    "elicitation-sep1330-enums",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "resources-subscribe",
    "resources-unsubscribe",
    "dns-rebinding-protection",
}


#: No SHOULD warning is left: the suite's raw polling request declares 2025-03-26 in a
#: session that negotiated 2025-11-25, and the front primes by the session's protocol
#: (toolexec.mcp.priming), so the stream opens with an event id and ``retry:``.
KNOWN_WARNINGS: dict[str, set[str]] = {}


@pytest.fixture(scope="module")
def conformance_url(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("mcp-conformance")
    # a queue of its own: the session's worker of test tools serves the default one
    env = {**worker_env, "TOOLEXEC_DEFAULT_QUEUE": "mcp_conformance"}
    worker = WorkerProcess(
        str(EXAMPLE), env, queues="mcp_conformance", log_path=logs / "worker.log"
    )
    worker.start(settings.redis_url or "", settings.key_prefix)
    try:
        env = {**worker_env, "TOOLEXEC_MCP_PROGRESS_S": "0.2"}
        with mcp_http_process(env, logs / "front.log") as url:
            yield url
    finally:
        worker.stop()


@pytest.mark.timeout(900)  # 32 scenarios, some waiting on tools for seconds
def test_the_server_scenarios_pass(conformance_url: str, tmp_path: Path) -> None:
    try:
        suite = install()
    except Unavailable as exc:
        pytest.skip(f"the conformance suite cannot run here: {exc}")
    out = tmp_path / "results"
    # --suite all: the two scenarios the suite still calls pending (json-schema-2020-12,
    # server-sse-polling) are in the 32 too
    args = ["server", "--url", conformance_url, "--suite", "all", "-o", str(out)]
    done = subprocess.run(
        suite.command(*args),
        env=suite.env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    outcomes = read_results(out, "server")
    command = (
        f"npx @modelcontextprotocol/conformance@{SUITE_VERSION} server --suite all --url URL "
        "(tests/integration/test_mcp_conformance.py; make mcp-conformance)"
    )
    print("\n" + table(outcomes, command))
    assert outcomes, f"the suite wrote no results:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    passed = {name for name, o in outcomes.items() if o.passed}
    assert passed == EXPECTED_PASS, table(outcomes, command)
    warned = {name: set(o.warnings) for name, o in outcomes.items() if o.warnings}
    assert warned == KNOWN_WARNINGS, f"SHOULD warnings: {warned}"


def _isolated() -> list[str]:
    """A network namespace with only loopback, for the suite's servers (they bind every
    interface); the client script runs inside it too. Skips where none can be made."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("unshare and ip are needed to keep the suite's servers off the network")
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {probe.stderr.decode()[-200:]}")
    return ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']


CLIENT_SCENARIOS = [
    "initialize",
    "tools_call",
    "elicitation-sep1034-client-defaults",
    "sse-retry",
    *(
        f"auth/{name}"
        for name in (
            "metadata-default",
            "metadata-var1",
            "metadata-var2",
            "metadata-var3",
            "basic-cimd",
            "scope-from-www-authenticate",
            "scope-from-scopes-supported",
            "scope-omitted-when-undefined",
            "scope-step-up",
            "scope-retry-limit",
            "token-endpoint-auth-basic",
            "token-endpoint-auth-post",
            "token-endpoint-auth-none",
            "pre-registration",
            "2025-03-26-oauth-metadata-backcompat",
            "2025-03-26-oauth-endpoint-fallback",
            "resource-mismatch",
            "offline-access-scope",
            "offline-access-not-supported",
            "client-credentials-jwt",
            "client-credentials-basic",
            "cross-app-access-complete-flow",
        )
    ),
]


#: Client scenarios toolexec passes as the client of a remote server: 25 of 26 (measured
#: 2026-12-02). The one that fails serves metadata whose issuer differs from where it was
#: fetched, which the SDK refuses (RFC 8414, section 3.3): docs/guides/mcp.md.
KNOWN_CLIENT_FAILURES = {
    "auth/2025-03-26-oauth-metadata-backcompat",
}
EXPECTED_CLIENT_PASS = set(CLIENT_SCENARIOS) - KNOWN_CLIENT_FAILURES


#: Scenarios run at once, each in a network namespace of its own (so their servers'
#: ports cannot clash): the suite's own parallel run starts all 26 Python clients at
#: once, which a loaded 2-core machine does not start within the suite's 30 s.
CLIENT_PARALLEL = 6


@pytest.mark.timeout(1200)  # 26 scenarios, six at a time, a failing one up to 90 s
def test_the_client_scenarios_pass(tmp_path: Path) -> None:
    try:
        suite = install()
    except Unavailable as exc:
        pytest.skip(f"the conformance suite cannot run here: {exc}")
    isolated = _isolated()
    out = tmp_path / "results"
    client = f"{sys.executable} {CLIENT}"

    def run(scenario: str) -> None:
        args = ["client", "--scenario", scenario, "--command", client, "--timeout", "90000"]
        subprocess.run(
            [*isolated, *suite.command(*args, "-o", str(out))],
            env=suite.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )

    with ThreadPoolExecutor(CLIENT_PARALLEL) as pool:
        # the ones expected to fail first: they may wait out the suite's timeout
        slow_first = sorted(CLIENT_SCENARIOS, key=lambda name: name in EXPECTED_CLIENT_PASS)
        list(pool.map(run, slow_first))
    outcomes = read_results(out, "")
    command = (
        f"npx @modelcontextprotocol/conformance@{SUITE_VERSION} client --scenario NAME "
        "--command 'python tests/mcp_conformance_client.py' (in a network namespace)"
    )
    print("\n" + table(outcomes, command))
    assert set(outcomes) == set(CLIENT_SCENARIOS), sorted(outcomes)
    passed = {name for name, o in outcomes.items() if o.passed}
    assert passed >= EXPECTED_CLIENT_PASS, table(outcomes, command)
