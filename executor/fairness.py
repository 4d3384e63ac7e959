"""Fairness keys and priorities: what a call carries, checked before it reaches a broker.

A call may name a *fairness key* (a tenant or user id) and a *priority*
(1 most urgent … 5; 3 when not given). Workers take higher priorities first
and, within one priority, fairness keys in proportion to their weights
(:mod:`toolexec.transport.lanes` on Redis; RabbitMQ's message priorities otherwise;
docs/guides/fairness.md). A call with neither is sent exactly as before: no
header, so it costs the dispatch nothing.

Everything here is pure: the checks that words a bad value for the model or
the caller, and the one header a message carries (``toolexec_lane``,
``"<priority>|<key>"``), which the worker's Lua reads with a pattern: hence
the small alphabet of a key.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from toolexec.errors import UsageError

__all__ = [
    "AMQP_LANE_MARK",
    "AMQP_MAX_SHARES",
    "DEFAULT_PRIORITY",
    "LANE_HEADER",
    "MAX_KEY_LENGTH",
    "MAX_WEIGHT",
    "NO_LANE",
    "Lane",
    "amqp_lane_queue",
    "amqp_priority",
    "amqp_shares",
    "checked_cap",
    "checked_fairness_key",
    "checked_priority",
    "checked_weight",
    "is_amqp",
    "lane_headers",
    "lane_in",
    "lane_of",
    "lane_options",
    "with_lane",
]

#: Most urgent first: 1 … 5, as Temporal's task-queue priority keys.
HIGHEST_PRIORITY = 1
LOWEST_PRIORITY = 5
DEFAULT_PRIORITY = 3

#: A key is an id (a tenant, a user), not data; short keeps a lane's Redis key short.
MAX_KEY_LENGTH = 64

#: Letters, digits and ``. _ : @ -``: no quote or ``|`` can reach the header's pattern.
_KEY = re.compile(r"[A-Za-z0-9._:@-]{1,64}")

#: The message header a call with a fairness key or a priority carries.
LANE_HEADER = "toolexec_lane"

#: A weight is a share: 1000 times another key's is already all of it.
MAX_WEIGHT = 1000.0
MIN_WEIGHT = 0.001

#: Calls of one key in flight across the fleet, at most (``max_in_flight``).
MAX_CAP = 100_000

#: On RabbitMQ a key's weight is a number of queues, each one share of the workers'
#: deliveries (docs/guides/fairness.md, "RabbitMQ"); more than this many queues per
#: key would cost the broker more than the share is worth.
AMQP_MAX_SHARES = 16

#: What a per-key queue's name has between its queue and its key, on RabbitMQ.
AMQP_LANE_MARK = ".fair."


def checked_fairness_key(key: Any, what: str = "fairness_key") -> str | None:
    """``key`` if it is a valid fairness key (or None); else a UsageError that says why."""
    if key is None:
        return None
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise UsageError(
            f"{what} must be 1 to {MAX_KEY_LENGTH} characters of letters, digits and "
            f"'. _ : @ -' (a tenant or user id), not {key!r:.80}"
        )
    return key


def checked_priority(priority: Any, what: str = "priority") -> int | None:
    """``priority`` if it is an int from 1 (most urgent) to 5 (or None); else a UsageError."""
    if priority is None:
        return None
    if type(priority) is not int or not HIGHEST_PRIORITY <= priority <= LOWEST_PRIORITY:
        raise UsageError(
            f"{what} must be a whole number from {HIGHEST_PRIORITY} (most urgent) to "
            f"{LOWEST_PRIORITY} (least); {DEFAULT_PRIORITY} is the default; got {priority!r:.40}"
        )
    return priority


def checked_weight(weight: Any) -> float:
    """A fairness key's weight: a finite number from 0.001 to 1000."""
    try:
        value = float(weight)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(weight, bool) or not (MIN_WEIGHT <= value <= MAX_WEIGHT):
        raise UsageError(
            f"a weight must be a number from {MIN_WEIGHT} to {MAX_WEIGHT:g}, not {weight!r:.40}"
        )
    return value


def checked_cap(cap: Any) -> int | None:
    """A ``max_in_flight``: None (no cap) or a whole number from 1 to 100 000."""
    if cap is None:
        return None
    if type(cap) is not int or not 1 <= cap <= MAX_CAP:
        raise UsageError(
            f"max_in_flight must be a whole number from 1 to {MAX_CAP}, not {cap!r:.40}"
        )
    return cap


def lane_headers(
    fairness_key: str | None, priority: int | None, tool_cap: tuple[str, int] | None = None
) -> dict[str, str] | None:
    """The header that puts a call in its lane; None for the default lane (no key, priority 3).

    ``tool_cap`` is (tool, max_in_flight) for a tool that caps its calls in flight:
    its calls get a lane of their own (``"<p>|<key>|<tool>#<cap>"``), so that the
    excess waits there and not in front of other tools' calls.
    """
    level = DEFAULT_PRIORITY if priority is None else priority
    if fairness_key is None and level == DEFAULT_PRIORITY and tool_cap is None:
        return None
    lane = f"{level}|{fairness_key or ''}"
    if tool_cap is not None:
        lane += f"|{tool_cap[0]}#{tool_cap[1]}"
    return {LANE_HEADER: lane}


def lane_of(headers: Any) -> tuple[int, str]:
    """(priority, key) a message's headers put it in; the default lane for anything else.

    The same reading as the worker's Lua pattern: a malformed header is the
    default lane, never an error (a hostile producer gains nothing by it).
    """
    raw = headers.get(LANE_HEADER) if isinstance(headers, dict) else None
    if not isinstance(raw, str):
        return DEFAULT_PRIORITY, ""
    level, _, key = raw.partition("|")
    if level not in ("1", "2", "3", "4", "5") or (key and not _KEY.fullmatch(key)):
        return DEFAULT_PRIORITY, ""
    return int(level), key


def amqp_priority(priority: int | None) -> int:
    """The AMQP message priority for a toolexec priority: 5 (urgent) … 1; queues declare max 5.

    RabbitMQ takes a message without a priority as 0, below every other, so
    every call carries one on RabbitMQ, the default ones 3.
    """
    level = DEFAULT_PRIORITY if priority is None else priority
    return LOWEST_PRIORITY + HIGHEST_PRIORITY - level


@dataclass(frozen=True)
class Lane:
    """The fairness key and priority the calls of one request wait under (both checked)."""

    fairness_key: str | None = None
    priority: int | None = None

    @classmethod
    def of(cls, fairness_key: Any, priority: Any) -> Lane:
        """Both checked: a UsageError that says why, before anything is sent."""
        return cls(checked_fairness_key(fairness_key), checked_priority(priority))


#: No fairness key, the tool's (or the default) priority.
NO_LANE = Lane()


def lane_in(kwargs: Any) -> Lane:
    """The lane a task message's ``context`` names; the default lane for anything invalid.

    A worker sending a call on (a fallback step) keeps it in the caller's lane;
    the context came from a message, so it is checked again, never trusted.
    """
    ctx = kwargs.get("context") if isinstance(kwargs, dict) else None
    if not isinstance(ctx, dict):
        return NO_LANE
    try:
        return Lane.of(ctx.get("fairness_key"), ctx.get("priority"))
    except UsageError:
        return NO_LANE


def amqp_shares(weight: float) -> int:
    """How many queues a key of ``weight`` gets on RabbitMQ: its weight, whole, 1 to 16.

    RabbitMQ hands a freed delivery slot of a channel to its consumed queues in turn
    (a random one first each time), whatever their depth, so a key's share of a
    worker's deliveries is its number of queues among the backlogged ones.
    """
    return max(1, min(AMQP_MAX_SHARES, round(checked_weight(weight))))


def amqp_lane_queue(queue: str, key: str, share: int) -> str:
    """The RabbitMQ queue of ``key``'s calls to ``queue``, its ``share``-th (from 0)."""
    return f"{queue}{AMQP_LANE_MARK}{key}.{share}"


def is_amqp(broker_url: str) -> bool:
    """Whether the broker is RabbitMQ, whose queues order by message priority."""
    return broker_url.startswith(("amqp", "pyamqp"))


def with_lane(
    headers: dict[str, Any] | None,
    fairness_key: str | None,
    priority: int | None,
    tool_cap: tuple[str, int] | None = None,
) -> dict[str, Any] | None:
    """``headers`` plus the lane header of a call with a fairness key or priority (else as is)."""
    lane = lane_headers(fairness_key, priority, tool_cap)
    if lane is None:
        return headers
    return {**(headers or {}), **lane}


def lane_options(amqp: bool, priority: int | None) -> dict[str, Any]:
    """Send options: on RabbitMQ every call carries its AMQP priority (none ranks below all)."""
    return {"priority": amqp_priority(priority)} if amqp else {}
