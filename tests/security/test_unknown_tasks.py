"""A worker that lacks a task neither drops it nor leaks it.

Before: a worker without the tool (a rolling deploy) logged the whole message
body at ERROR, dropped the call (the caller waited until ``deadline_exceeded``)
and wrote a ``celery-task-meta-<id>`` key for whatever id the message named.
Now it hands the call back for a worker that has the tool, a bounded number of
times; a call nobody serves is answered ``unavailable`` and dead-lettered; no
result key is ever written.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from security.hostile_support import FLEETS, Deployment, dead_letters, eventually, fleet_of
from toolexec.connection import redis_client
from toolexec.context import CallContext
from toolexec.errors import ErrorType
from toolexec.keys import Keys
from toolexec.results import ToolResult
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

MARK = f"unknown-{uuid.uuid4().hex}"


@pytest.fixture(scope="module", params=FLEETS)
def old_fleet(
    request: pytest.FixtureRequest,
    settings: Settings,
    worker_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    """A worker deployed before ``sec_new`` existed."""
    log = tmp_path_factory.mktemp("unknown") / f"old-worker-{request.param}.log"
    with fleet_of(request.param, settings, worker_env, log) as found:
        yield found


def _publish_call(fleet: Deployment, task: str, deadline_s: float = 30.0) -> CallContext:
    ctx = CallContext(
        call_id=uuid.uuid4().hex,
        tool=task.removeprefix("tools."),
        deadline=time.time() + deadline_s,
        submitted_at=time.time(),
        reply_to=uuid.uuid4().hex,
    )
    body = [[], {"arguments": {"text": MARK}, "context": ctx.to_json()}, {}]
    fleet.publish_raw(task, json.dumps(body).encode(), id=ctx.call_id)
    return ctx


def _meta_keys(fleet: Deployment) -> set[str]:
    """Result keys in the suite's shared database: other modules' plain Celery tests leave
    theirs, so each test compares what it finds after with what was there before."""
    return set(redis_client(fleet.settings.redis_url or "").scan_iter("celery-task-meta-*"))


def test_a_call_for_a_tool_this_worker_lacks_is_handed_to_a_worker_that_has_it(
    old_fleet: Deployment, tmp_path: Path
) -> None:
    """Given an old worker alone on the queue and a catalog that lists ``sec_new`` (a newer
    worker published it and is restarting), when a call for it arrives, then the old worker
    hands it back instead of dropping it, and once the newer worker is up it answers; the
    old worker's log never holds the call's arguments, and no result key is written."""
    results_before = _meta_keys(old_fleet)
    newer = old_fleet.another_worker("security_tools,rolling_tools", tmp_path / "new-1.log")
    newer.stop()  # its catalog entry stays: clients still send calls for sec_new
    answer: list[object] = []
    caller = threading.Thread(
        target=lambda: answer.append(old_fleet.client.call("sec_new", {"text": MARK}, timeout=25))
    )
    caller.start()
    handed = eventually(lambda: "handing it back" in old_fleet.log(), timeout=15)
    back = old_fleet.another_worker("security_tools,rolling_tools", tmp_path / "new-2.log")
    try:
        caller.join(30)
    finally:
        back.stop()

    assert handed, old_fleet.log()[-3000:]
    assert answer and isinstance(answer[0], ToolResult)
    assert answer[0].ok, answer[0]
    assert answer[0].data == f"new:{MARK}"
    assert MARK not in old_fleet.log()
    assert _meta_keys(old_fleet) == results_before


def test_a_tool_nobody_serves_is_handed_back_a_bounded_number_of_times_then_answered(
    old_fleet: Deployment,
) -> None:
    """Given a call of a tool no worker has, then after a bounded number of hand-backs the
    caller gets ``unavailable`` (not a wait until its deadline), the message is dead-lettered,
    and neither its arguments nor a result key are left behind."""
    results_before = _meta_keys(old_fleet)
    ctx = _publish_call(old_fleet, "tools.nobody_serves_this", deadline_s=8.0)
    redis = redis_client(old_fleet.settings.redis_url or "")
    keys = Keys(old_fleet.settings.key_prefix)

    popped = redis.blpop([keys.reply(ctx.reply_to)], timeout=20)

    assert popped is not None, old_fleet.log()[-3000:]
    result = ToolResult.model_validate_json(popped[1])
    assert result.error is not None and result.error.type == ErrorType.UNAVAILABLE
    assert result.call_id == ctx.call_id
    assert time.time() < ctx.deadline  # answered before the caller would give up
    handbacks = old_fleet.log().count(f"id={ctx.call_id}; handing it back")
    assert 1 <= handbacks <= 80
    assert any(e["id"] == ctx.call_id for e in dead_letters(redis, keys.deadletter()))
    assert MARK not in old_fleet.log()
    assert _meta_keys(old_fleet) == results_before
    assert old_fleet.alive()


def test_a_task_that_is_no_tool_is_dead_lettered_at_once_without_a_result_key(
    old_fleet: Deployment,
) -> None:
    """Given a message for ``os.system`` (no toolexec worker will ever run it), then it is
    refused on first sight: no hand-back, no body in the log, no ``celery-task-meta`` key."""
    results_before = _meta_keys(old_fleet)
    task_id = old_fleet.publish_raw(
        "os.system", json.dumps([["rm -rf /"], {"m": MARK}, {}]).encode()
    )

    assert eventually(lambda: f"refused task message id={task_id} " in old_fleet.log())
    assert f"id={task_id}; handing it back" not in old_fleet.log()
    assert MARK not in old_fleet.log()
    assert _meta_keys(old_fleet) == results_before
    assert old_fleet.client.call("sec_echo", {"text": "ok"}, timeout=20).ok
