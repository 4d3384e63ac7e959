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

import base64
import binascii
import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "HANDBACK_HEADER",
    "MAX_HANDBACKS",
    "MAX_RETRIES_HEADER",
    "MAX_TIMELIMIT_S",
    "GiveUp",
    "HandBack",
    "call_context",
    "envelope_problem",
    "eta_problem",
    "fingerprint",
    "handback_count",
    "message_problem",
    "short_hash",
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


#: Largest ``retries`` header a worker accepts. toolexec's own resends (retries
#: plus rate-limit deferrals) stay far below it within the longest deadline; a
#: bigger count only comes from a forged message, and would be reported as the
#: call's attempts (``retries=10**30`` ran and answered ``attempts=10^30+1``).
MAX_RETRIES_HEADER = 10_000

#: Largest soft or hard time limit a message may ask for, in seconds (a day):
#: toolexec's own are a tool's timeout plus a few seconds.
MAX_TIMELIMIT_S = 86_400

#: An ``eta`` this far past the call's deadline still runs: clocks of client and
#: worker hosts may differ by a little.
_ETA_SKEW_S = 1.0

#: The transport's message encodings kombu's Redis channel can decode.
_BODY_ENCODINGS = (None, "base64")

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
    if retries is not None and (type(retries) is not int or not 0 <= retries <= MAX_RETRIES_HEADER):
        return f"its retries header is not a count of at most {MAX_RETRIES_HEADER}"
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
        and all(
            v is None or (_is_number(v) and math.isfinite(v) and 0 <= v <= MAX_TIMELIMIT_S)
            for v in value
        )
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
    return _headers_problem(headers) or _body_problem(body) or _context_problem(body)


def _context_problem(body: Any) -> str | None:
    """The call context's counts, which become attempt numbers (its times are checked on load)."""
    context = call_context(body)
    if context is None:
        return None
    for name in ("deferrals", "slot_for"):
        value = context.get(name)
        if value is not None and (type(value) is not int or not 0 <= value <= MAX_RETRIES_HEADER):
            return f"its call context's {name} is not a count of at most {MAX_RETRIES_HEADER}"
    return None


def _parse_eta(value: Any) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def eta_problem(
    headers: Any, body: Any, now: float, horizon_s: float, scheduled: int, max_scheduled: int
) -> str | None:
    """Why a message's ``eta`` cannot be held until it is due, or None.

    A worker keeps a message with an ``eta`` in memory until then, and on Redis
    the visibility timeout hands it out again meanwhile: 5 000 messages with
    ``eta=2999-01-01`` grew a worker from 89 to 386 MB. Nothing is worth holding
    past the call's deadline (its caller has stopped waiting), or past
    ``horizon_s`` for a message that carries none; and a worker holds at most
    ``max_scheduled`` of them (``scheduled`` now).
    """
    raw = headers.get("eta") if isinstance(headers, Mapping) else None
    if raw is None:
        return None
    eta = _parse_eta(raw)
    if eta is None:
        return "its eta header is not an ISO 8601 time"
    due = eta.timestamp() - now
    if due <= 0:
        return None
    deadline = _deadline(call_context(body))
    if deadline is not None and eta.timestamp() > deadline + _ETA_SKEW_S:
        return "its eta lies beyond its call's deadline"
    if deadline is None and due > horizon_s:
        return f"its eta lies more than {horizon_s:g} s ahead (the scheduling horizon)"
    if scheduled >= max_scheduled:
        return f"this worker already holds {scheduled} scheduled messages, its bound"
    return None


def envelope_problem(payload: Any) -> str | None:
    """Why a decoded Redis transport envelope cannot be handed to kombu, or None.

    kombu's Redis channel builds its message from these fields without
    checking them: a ``{}`` raises ``KeyError`` inside the consumer loop, a
    list ``delivery_tag`` raises in the unacked record, an unknown
    ``body_encoding`` an ``AttributeError``; each stopped the worker, and the
    message came back to stop the next one.
    """
    if not isinstance(payload, Mapping):
        return "it is not a transport envelope (a JSON object)"
    properties = payload.get("properties")
    if not isinstance(properties, Mapping):
        return "its properties are not a mapping"
    problem = _properties_problem(properties)
    if problem is not None:
        return problem
    headers = payload.get("headers")
    if headers is not None and not isinstance(headers, Mapping):
        return "its headers are not a mapping"
    if isinstance(headers, Mapping) and "task" in headers and not _clean_text(headers["task"]):
        return "its task header is not a printable name"
    for name in ("content-type", "content-encoding"):
        if payload.get(name) is not None and not _clean_text(payload[name], 255):
            return f"its {name} is not a name"
    return _encoded_body_problem(payload.get("body"), properties.get("body_encoding"))


def _properties_problem(properties: Mapping[str, Any]) -> str | None:
    if not _clean_text(properties.get("delivery_tag")):
        return "its delivery tag is missing or not a short printable text"
    info = properties.get("delivery_info")
    if not isinstance(info, Mapping):
        return "its delivery_info is not a mapping"
    if not all(isinstance(info.get(k), str) for k in ("exchange", "routing_key")):
        return "its delivery_info has no exchange and routing key names"
    priority = properties.get("priority")
    if priority is not None and (type(priority) is not int or not 0 <= priority <= 255):
        return "its priority is not a number from 0 to 255"
    if properties.get("body_encoding") not in _BODY_ENCODINGS:
        return "its body_encoding is not one kombu decodes (base64)"
    return None


def _encoded_body_problem(body: Any, encoding: Any) -> str | None:
    if body is None or body == "":
        return None
    if not isinstance(body, str):
        return "its body is not text"
    if encoding == "base64":
        try:  # as leniently as kombu decodes it: only what kombu would fail on
            base64.b64decode(body.encode())
        except (binascii.Error, ValueError):
            return "its body is not base64"
    return None


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


def short_hash(raw: Any) -> str:
    """The first 12 hex digits of a body's sha256: for a log line (the dead letter has all 64)."""
    return str(fingerprint(raw)["sha256"])[:12]


def fingerprint(raw: Any) -> dict[str, Any]:
    """Size and sha256 of a message body: enough to match it with its producer's logs.

    The body itself is never kept or logged: it may carry a call's secrets.
    """
    data = raw.encode() if isinstance(raw, str) else bytes(raw or b"")
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
