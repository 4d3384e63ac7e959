"""Ids cannot forge log lines, and worker restarts do not grow the workers set for ever.

Before: a run or call id with a newline wrote a line of the caller's choosing into
the worker's log (``run=r1`` then ``INFO ... status=ok`` on a line of its own), and
every worker start added a member to ``<prefix>:workers`` that nothing removed.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from security.hostile_support import Deployment, deployment, eventually
from toolexec.connection import redis_client
from toolexec.context import CallContext
from toolexec.keys import Keys
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

FORGED = f"FORGED-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def fleet(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    log = tmp_path_factory.mktemp("injection") / "worker.log"
    with deployment(settings, worker_env, log) as found:
        yield found


def test_newlines_in_run_and_call_ids_are_escaped_not_written_as_lines(fleet: Deployment) -> None:
    """Given a call whose context carries a run id and a call id with newlines and a forged
    log line after them, then the worker's log shows each on its own line, escaped, and no
    line starts with the forged text."""
    task_id = uuid.uuid4().hex
    ctx = CallContext(
        call_id=f"c1\n[2026-01-01 00:00:00,000: INFO/MainProcess] {FORGED} call",
        tool="sec_echo",
        deadline=time.time() + 30,
        submitted_at=time.time(),
        reply_to=uuid.uuid4().hex,
        run_id=f"r1\r\n{FORGED} run status=ok",
    )
    body = [[], {"arguments": {"text": "hi"}, "context": ctx.to_json()}, {}]
    fleet.publish_raw("tools.sec_echo", json.dumps(body).encode(), id=task_id)

    assert eventually(lambda: FORGED in fleet.log()), fleet.log()[-3000:]
    lines = fleet.log().splitlines()
    assert [
        line for line in lines if line.startswith(FORGED) or line.startswith("[2026-01-01")
    ] == []
    assert any("r1\\r\\n" + FORGED in line for line in lines)


def test_a_stopped_worker_leaves_the_workers_set(fleet: Deployment, tmp_path: Path) -> None:
    """Given a second worker that starts and stops, then its hostname is no longer a member
    of the workers set (before, each start left a member behind for ever)."""
    redis = redis_client(fleet.settings.redis_url or "")
    key = Keys(fleet.settings.key_prefix).workers()
    other = fleet.another_worker("security_tools", tmp_path / "other.log")
    joined = redis.zscore(key, other.hostname) is not None
    other.stop()

    assert joined
    assert eventually(lambda: redis.zscore(key, other.hostname) is None, timeout=10)
    assert redis.zscore(key, fleet.worker.hostname) is not None
