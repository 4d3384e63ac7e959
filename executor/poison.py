"""Which task messages a worker refuses before Celery reads them, and where unknown tasks go.

Celery 5.7's message handler unpacks a protocol-2 body as ``args, kwargs,
embed`` and parses the ``eta``/``expires`` headers without catching what a
malformed message raises. The exception leaves the consumer, the worker
exits, and the unacknowledged message goes back to the head of the queue:
one message of ``null`` or ``[]`` stops every worker that picks it up, one
after the other, for as long as it stays there. Anyone who can publish to the
broker (or a buggy producer) can do it, so the worker checks the shape first
and refuses what it could not run. These decisions are pure; the Celery side
(a consumer bootstep) is ``toolexec.tasks.message_guard``.

A task this worker does not have is another matter: during a rolling deploy
the call is good, only this worker is old. It is handed back to the queue for
a worker that has the tool, a bounded number of times after a short pause,
and never past the call's deadline, so a tool nobody serves cannot circulate
for ever.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HANDBACK_HEADER",
    "MAX_HANDBACKS",
    "GiveUp",
    "HandBack",
    "call_context",
    "fingerprint",
    "handback_count",
    "message_problem",
    "unknown_task_fate",
]

#: Message header counting how often workers without the task handed the message back.
HANDBACK_HEADER = "x-toolexec-handbacks"

#: Hand-backs before the call is given up (sooner if its deadline comes first):
#: with the pauses below, about thirty seconds of a deploy, time enough for a
#: worker that has the tool to (re)start and take it.
MAX_HANDBACKS = 100

#: The pause before each hand-back, drawn between these bounds. Without one, a
#: worker alone on the queue would bounce the message to itself thousands of
#: times a second. It stays short: the worker holds the message meanwhile, and
#: on Redis the consumer blocked longest gets the next message, so after a long
#: hold that is this worker again (measured: a 3 s pause brought the message back
#: to it every time while a worker with the tool idled).
_MIN_PAUSE_S = 0.1
_MAX_PAUSE_S = 0.5

#: Give up this long before the call's deadline, so that the caller's answer
#: (``unavailable``) reaches it while it still waits.
_ANSWER_MARGIN_S = 1.0

#: Task names whose unknown messages are worth handing back: only toolexec's
#: tools are ever deployed to some workers before others.
_TOOL_TASK_PREFIX = "tools."

#: A task id is a call id (a UUID) and ends up in log lines, events and Redis
#: keys: anything longer, or with control characters, is not one of ours.
_MAX_ID_LENGTH = 200


_RNG = random.Random()


@dataclass(frozen=True)
class HandBack:
    """Publish the message again after ``delay`` seconds, as hand-back number ``count``."""

    delay: float
    count: int


@dataclass(frozen=True)
class GiveUp:
    """Dead-letter the message; ``reason`` says why, without any of its content."""

    reason: str


def _clean_text(value: Any, limit: int = _MAX_ID_LENGTH) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= limit
        and value.isprintable()
        and value.strip() == value
    )


def _headers_problem(headers: Any) -> str | None:
    if not isinstance(headers, Mapping):
        return "its headers are not a mapping"
    if not _clean_text(headers.get("id")):
        return "its task id is missing, too long or holds control characters"
    if not _clean_text(headers.get("task")):
        return "its task name is missing or not printable"
    retries = headers.get("retries", 0)
    if retries is not None and (type(retries) is not int or retries < 0):
        return "its retries header is not a count"
    for name in ("eta", "expires"):
        value = headers.get(name)
        if value is not None and not _clean_text(value, 64):
            return f"its {name} header is not a timestamp"
    limits = headers.get("timelimit")
    if limits is not None and not _pair_of_limits(limits):
        return "its timelimit header is not a pair of numbers"
    return None


def _pair_of_limits(value: Any) -> bool:
    return (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(v is None or (_is_number(v) and math.isfinite(v) and v >= 0) for v in value)
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _body_problem(body: Any) -> str | None:
    if not isinstance(body, list | tuple) or len(body) != 3:
        return "its body is not [args, kwargs, embed]"
    args, kwargs, embed = body
    if not isinstance(args, list | tuple):
        return "its args are not a list"
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        return "its kwargs are not a mapping of names"
    if embed is not None and not isinstance(embed, Mapping):
        return "its embed part is not a mapping"
    return None


def message_problem(headers: Any, body: Any) -> str | None:
    """Why a protocol-2 task message cannot be handed to Celery's handler, or None.

    ``body`` is the decoded JSON. Only what Celery's handler would choke on,
    or what would carry control characters into logs, is checked here; a
    tool's own arguments are validated later by its model, with an answer for
    the caller.
    """
    return _headers_problem(headers) or _body_problem(body)


def handback_count(headers: Any) -> int:
    """How often this message was handed back already (a bad header counts as the limit)."""
    if not isinstance(headers, Mapping):
        return MAX_HANDBACKS
    count = headers.get(HANDBACK_HEADER, 0)
    if type(count) is not int or count < 0:
        return MAX_HANDBACKS
    return count


def call_context(body: Any) -> Mapping[str, Any] | None:
    """The ``context`` keyword argument of a tool task's body, when it has that shape."""
    if _body_problem(body) is not None:
        return None
    context = body[1].get("context")
    return context if isinstance(context, Mapping) else None


def _deadline(context: Mapping[str, Any] | None) -> float | None:
    deadline = None if context is None else context.get("deadline")
    if isinstance(deadline, int | float) and _is_number(deadline) and math.isfinite(deadline):
        return float(deadline)
    return None


def unknown_task_fate(
    name: str,
    handbacks: int,
    context: Mapping[str, Any] | None,
    now: float,
    rng: random.Random | None = None,
) -> HandBack | GiveUp:
    """What a worker that lacks task ``name`` does with its message.

    Only tools are handed back; other unknown names (a typo, an attack, a task
    of another application sharing the broker) will not appear on any worker.
    The pause is random, so that workers that lack the tool do not hand
    messages back in step.
    """
    if not name.startswith(_TOOL_TASK_PREFIX):
        return GiveUp(f"no toolexec worker runs tasks named {name!r}")
    if handbacks >= MAX_HANDBACKS:
        return GiveUp(f"no worker that serves {name!r} took it after {handbacks} hand-backs")
    deadline = _deadline(context)
    delay = _MIN_PAUSE_S + (_MAX_PAUSE_S - _MIN_PAUSE_S) * (rng or _RNG).random()
    if deadline is not None and now + delay + _ANSWER_MARGIN_S >= deadline:
        return GiveUp(f"no worker that serves {name!r} took it before its deadline")
    return HandBack(delay=delay, count=handbacks + 1)


def fingerprint(raw: Any) -> dict[str, Any]:
    """Size and sha256 of a message body: enough to match it with its producer's logs.

    The body itself is never kept or logged: it may carry a call's secrets.
    """
    data = raw.encode() if isinstance(raw, str) else bytes(raw or b"")
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
