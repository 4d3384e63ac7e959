"""Messages nobody waits for any more are dropped before Celery reads them.

A call's caller waits until the call's deadline plus its reply grace, then
answers ``deadline_exceeded`` itself. A message still queued after that is
work for nobody: running it, or even answering it, costs the worker the full
path of a task (a request, the pool, task events, the attempt's round trips
for its counters and its answer) and delays every fresh call queued behind it.
After a ``call_many`` that outlived its deadline, 70 000 such messages kept a
fresh call waiting 32.9 s.

So the message guard (:mod:`toolexec.tasks.message_guard`, through
:mod:`toolexec.tasks.stale`) acknowledges such a message as soon as the
consumer takes it: no task runs, nothing is answered, no Redis command is sent
for it beyond the transport's own acknowledgement. That alone still costs each
message the transport's round trips (take, record, acknowledge): about 110 a
second on a loaded 2-core machine. So on a Redis broker the guard then reads
the next :data:`SWEEP` messages at the queue's tail (the next to be taken) and
removes the run of them that is abandoned too, in one script call
(:func:`stale_run` decides; ``lua/stale_sweep.lua`` removes only while the
tail is still what was read, so a message another consumer took is never
touched).

A message taken after its deadline but while its caller still waits goes on
as before, and the executor answers it ``deadline_exceeded`` without running
the tool, since that answer (with a retried call's last error) still reaches
someone. :class:`DropCounter` logs a line per :data:`LOG_EVERY` drops rather
than one per message.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LOG_EVERY", "SWEEP", "DropCounter", "abandoned", "stale_run"]

#: A worker draining tens of thousands of stale messages logs one line per this many.
LOG_EVERY = 1000

#: Messages read from a queue's tail per sweep: one round trip of a few hundred KB.
SWEEP = 500


def abandoned(context: Mapping[str, Any] | None, now: float, grace_s: float) -> bool:
    """Whether a call's caller has stopped waiting: ``now`` is past its deadline and grace.

    A message without a readable deadline is never abandoned here (the
    executor and the poison checks judge it).
    """
    if context is None:
        return False
    deadline = context.get("deadline")
    if not isinstance(deadline, int | float) or isinstance(deadline, bool):
        return False
    return math.isfinite(deadline) and now > deadline + max(0.0, grace_s)


def _envelope_context(raw: bytes | str) -> Mapping[str, Any] | None:
    """The call context of a kombu Redis envelope holding a plain protocol-2 call.

    None for anything else (a scheduled retry with ``eta``, an ``expires``, a
    body that is not base64 JSON of ``[args, kwargs, embed]``): those are not
    swept, the consumer and the message guard judge them one by one.
    """
    try:
        envelope = json.loads(raw)
        headers = envelope["headers"]
        if headers.get("eta") is not None or headers.get("expires") is not None:
            return None
        properties = envelope["properties"]
        if properties.get("body_encoding") != "base64":
            return None
        body = json.loads(base64.b64decode(envelope["body"], validate=True))
        context = body[1]["context"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        return None
    return context if isinstance(context, Mapping) else None


def stale_run(tail: Sequence[bytes | str], now: float, grace_s: float) -> list[bytes | str]:
    """The messages at the very end of ``tail`` (a queue's last items, oldest last) whose
    callers stopped waiting, oldest first, up to the first that is not one."""
    run = []
    for raw in reversed(tail):
        if not abandoned(_envelope_context(raw), now, grace_s):
            break
        run.append(raw)
    return run


@dataclass
class DropCounter:
    """How many abandoned messages this consumer dropped; says when to log."""

    dropped: int = 0

    def add(self, count: int = 1) -> bool:
        """Count ``count`` drops; True when they pass the first or a :data:`LOG_EVERY`-th."""
        before, self.dropped = self.dropped, self.dropped + count
        return count > 0 and (before == 0 or before // LOG_EVERY != self.dropped // LOG_EVERY)
