"""Issue 22, item 5: a big ``call_many`` discarded results that arrived in time.

Before: ``call_many`` of 20 000 no-ops with ``timeout=6`` returned 0 ok after
16 s although about 2 000 had run ok within their deadlines (the client was
still sending when the deadline passed, and then read nothing); 100 000 calls
took 161 s to send and 451 MB of client memory, and left 70 000 stale messages
behind which a fresh call waited 32.9 s. Now a batch over ``max_batch_calls`` is
refused before anything is sent, answers are read between the windows a batch
is sent in and once more when the wait ends, windows whose deadline has passed
are not sent, and a worker acknowledges a message whose caller stopped
waiting without running or answering it.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
from hostile_input_support import eventually, isolated_worker

from toolexec.client import ToolClient
from toolexec.client.publish import WINDOW, publish
from toolexec.clock import Clock
from toolexec.errors import ErrorType, UsageError
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration

STALE = 4000


@pytest.fixture(scope="module")
def served(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, ToolClient]]:
    with isolated_worker(
        settings, worker_env, tmp_path_factory.mktemp("batches"), "limits_tools"
    ) as pair:
        yield pair


def _queued(client: ToolClient) -> int:
    return int(client.redis.llen(client.settings.default_queue))  # type: ignore[arg-type]


def test_a_batch_over_the_limit_is_refused_before_anything_is_sent(
    served: tuple[WorkerProcess, ToolClient],
) -> None:
    _, client = served
    small = client.settings.model_copy(update={"max_batch_calls": 5})
    with ToolClient(small) as limited:
        with pytest.raises(UsageError, match="TOOLEXEC_MAX_BATCH_CALLS"):
            limited.call_many([("lim_nap", {})] * 6, timeout=10)
        with pytest.raises(UsageError, match="at most 5"):  # an endless iterable is not read whole
            limited.call_many(itertools.repeat(("lim_nap", {})), timeout=10)
        assert _queued(limited) == 0
        assert all(r.ok for r in limited.call_many([("lim_nap", {})] * 5, timeout=20))


def test_an_answer_that_came_in_time_counts_though_the_caller_read_late(
    served: tuple[WorkerProcess, ToolClient],
) -> None:
    """The caller is busy (sending the rest of a batch) until after the deadline; the
    worker's answer was on the reply list before it: it is ok, not deadline_exceeded."""
    _, client = served
    handle = client.submit("lim_nap", {"seconds": 0}, timeout=1.0)
    box = client.keys.reply(handle.call_id)
    deadline = handle._prepared.ctx.deadline + client.settings.reply_grace

    eventually(lambda: client.redis.llen(box) == 1 and client.clock.now() > deadline)
    result = handle.result()

    assert result.ok, result.error


def test_windows_whose_deadline_passed_are_not_sent_and_the_rest_is_read_while_sending(
    served: tuple[WorkerProcess, ToolClient],
) -> None:
    _, client = served
    batch = client.preparer.prepare_many([("lim_nap", {})] * (2 * WINDOW), None, 20)
    past = client.clock.now() - 1
    batch[WINDOW:] = [replace(p, ctx=replace(p.ctx, deadline=past)) for p in batch[WINDOW:]]
    boxes = client.waiter.open(batch)
    reads: list[int] = []

    def between() -> None:
        client.waiter.drain(boxes)
        reads.append(_queued(client))

    unsent = publish(client.app, batch, clock=client.clock, between=between)
    results = client.waiter.collect(batch, None, boxes, unsent)

    assert unsent == {p.ctx.call_id for p in batch[WINDOW:]}
    assert len(reads) == 1  # one look at the answers between the two windows
    assert all(r.ok for r in results[:WINDOW])
    late = [r.error for r in results[WINDOW:]]
    assert all(e is not None and e.type == ErrorType.DEADLINE_EXCEEDED for e in late)
    assert all(e is not None and "was not sent" in e.message for e in late)
    assert _queued(client) == 0


def _stale_copies(client: ToolClient, count: int) -> list[bytes]:
    """``count`` messages for ``lim_mark`` whose caller gave up a minute ago, each its own.

    One is published to a queue no worker reads and taken from there as a pattern.
    """
    stash = f"stash-{uuid.uuid4().hex[:8]}"
    prepared = client.preparer.prepare("lim_mark", {}, None, 5, None, None)
    gone = client.clock.now() - 60
    publish(client.app, [replace(prepared, queue=stash, ctx=replace(prepared.ctx, deadline=gone))])
    raw = client.redis.rpop(stash)
    client.redis.delete(stash, f"_kombu.binding.{stash}")
    assert isinstance(raw, bytes | str)
    envelope = json.loads(raw)
    queue = client.settings.default_queue
    envelope["properties"]["delivery_info"].update(exchange=queue, routing_key=queue)
    copies = []
    for _ in range(count):
        envelope["headers"]["id"] = uuid.uuid4().hex
        envelope["properties"]["delivery_tag"] = uuid.uuid4().hex
        copies.append(json.dumps(envelope).encode())
    return copies


def test_a_fresh_call_is_not_stuck_behind_messages_nobody_waits_for(
    served: tuple[WorkerProcess, ToolClient],
) -> None:
    worker, client = served
    queue = client.settings.default_queue
    copies = _stale_copies(client, STALE)
    pipe = client.redis.pipeline(transaction=False)
    for start in range(0, len(copies), 500):
        pipe.lpush(queue, *copies[start : start + 500])
    pipe.execute()

    start = time.monotonic()
    fresh = client.call("lim_nap", {"seconds": 0}, timeout=8)
    waited = time.monotonic() - start

    assert worker.log_path is not None
    assert fresh.ok, (_queued(client), f"{waited:.1f} s", worker.log_path.read_text()[-3000:])
    assert eventually(lambda: _queued(client) == 0)
    assert client.call("lim_marks", {}, timeout=10).data == 0  # none of them ran
    assert "dropped messages whose caller stopped waiting" in worker.log_path.read_text()


class _Jumping:
    """The client's clock, moved on by ``offset`` seconds when the test says."""

    def __init__(self, real: Clock) -> None:
        self.real = real
        self.offset = 0.0

    def now(self) -> float:
        return self.real.now() + self.offset


def test_the_windows_after_the_batch_deadline_are_answered_unsent_at_once(
    served: tuple[WorkerProcess, ToolClient],
) -> None:
    """A batch takes about its timeout however large: what its deadline leaves unsent ends
    deadline_exceeded without being prepared, queued or run."""
    _, client = served
    real = client.preparer.clock
    jumping = _Jumping(real)
    client.preparer.clock = jumping
    try:
        windows = client.preparer.windows([("lim_nap", {})] * (2 * WINDOW + 1), None, 5, WINDOW)
        first = next(windows)
        jumping.offset = 10.0
        rest = [p for window in windows for p in window]
    finally:
        client.preparer.clock = real

    assert len(first) == WINDOW and all(p.early is None for p in first)
    assert len(rest) == WINDOW + 1
    errors = [p.early.error for p in rest if p.early is not None]
    assert len(errors) == WINDOW + 1
    assert all(e is not None and e.type == ErrorType.DEADLINE_EXCEEDED for e in errors)
    assert all(e is not None and "was not sent" in e.message for e in errors)
