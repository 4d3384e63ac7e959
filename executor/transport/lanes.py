"""Lanes: a worker takes higher priorities first and fairness keys by their weights (Redis).

A client sends every call to its queue as before; a call with a fairness key or
a priority other than 3 only carries one more header (``toolexec_lane``,
:mod:`toolexec.fairness`). Sorting happens where the calls are taken: one Lua
script (``lua/fair_take.lua``) moves up to :data:`INGEST` messages from the
queue into per (priority, key) lists, the *lanes*, and moves the next call into
the consumer's inbox, all atomically. So a call is always in exactly one of the
queue, a lane, an inbox or kombu's unacknowledged record, and a killed worker's
calls come back as before (:mod:`toolexec.transport.orphans`): a call in an inbox goes back
to its queue with its header, and is sorted again.

The choice inside one priority is start-time fair queueing: each ready key has a
virtual time in a sorted set; the lowest goes next and its time grows by
1/weight, so over time keys are taken in proportion to their weights (round
robin at equal weights), and a key alone gets every slot. A key whose lane
empties starts again at the priority's clock, so idling banks nothing. A take is
O(log keys): a sorted-set head, a pop, a push.

A consumer pays nothing for this while no call carries a lane: it waits with
its ``BLMOVE`` (:mod:`toolexec.transport.inbox`). It switches to the script when a message
it took carries a lane (that message is put back at the queue's head and sorted
with the rest, in the same script) and stays on it while lanes hold calls. Once
a second it takes through the script anyway (same round trip, one message), so
that lanes a killed worker left are found even by consumers kept busy by plain
calls.

A fairness key may have a ``max_in_flight`` (``toolexec fairness set --max-in-flight``):
its lane is *parked* while that many of its calls run anywhere, and only that
lane waits. The calls in flight are the delivery tags in a sorted set, removed by
the acknowledgement (:class:`toolexec.transport.QoS`) or lapsing after the
visibility timeout if an acknowledgement was lost.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from toolexec.keys import BrokerKeys
from toolexec.lua import script_source

__all__ = [
    "INGEST",
    "PROBE_S",
    "LaneState",
    "has_lane",
    "parse_take",
    "release",
    "send_take",
    "state_of",
    "swap",
    "take_args",
    "use_script",
    "wait_s",
]

#: Queued messages sorted into lanes per take, at most: a priority-1 call behind a
#: backlog reaches its lane within backlog/INGEST takes, and one take stays short
#: (a few hundred small commands).
INGEST = 128

#: A consumer on its plain ``BLMOVE`` takes through the script once this often.
PROBE_S = 1.0

#: How long a consumer waits for new calls when every lane with calls is parked.
PARKED_WAIT_S = 0.1

_STATE = "_toolexec_lanes"
_SOURCE = script_source("fair_take")
_SHA = hashlib.sha1(_SOURCE.encode()).hexdigest()
_MARK = b'"toolexec_lane"'

#: Delivery tags of capped calls this process took -> their in-flight sets (for the ack).
_capped: dict[str, list[str]] = {}


@dataclass
class LaneState:
    """How one channel takes: through the script while lanes hold calls."""

    fair: bool = False
    #: Only parked lanes hold calls: wait on the queue until then, then look again.
    parked_until: float = 0.0
    probed_at: float = 0.0


def state_of(channel: Any) -> LaneState:
    state = channel.__dict__.get(_STATE)
    if state is None:
        state = channel.__dict__[_STATE] = LaneState()
    return state  # type: ignore[no-any-return]


def use_script(state: LaneState, now: float) -> bool:
    """Whether this take goes through the script: lanes hold calls, or a probe is due.

    Not while every waiting lane is parked: the script would find nothing again at
    once, so the consumer waits on the queue for :data:`PARKED_WAIT_S` first.
    """
    return (state.fair and now >= state.parked_until) or now - state.probed_at >= PROBE_S


def wait_s(state: LaneState, default: float) -> float:
    """How long a plain ``BLMOVE`` may block: briefly while parked lanes wait for a slot."""
    return PARKED_WAIT_S if state.fair else default


def has_lane(item: bytes) -> bool:
    """Whether a message carries a lane header (the script's own test, ``string.find``)."""
    return _MARK in item


def take_args(
    keys: BrokerKeys, queue: str, inbox: str, requeue: bytes, now: str, lease_s: float
) -> list[Any]:
    """EVALSHA's arguments after the sha: key count, keys, argv (see ``fair_take.lua``)."""
    names = [
        queue,
        inbox,
        keys.fair_weights(),
        keys.fair_caps(),
        keys.vclock(queue),
        keys.parked(queue),
        *(keys.ready(queue, p) for p in range(1, 6)),
    ]
    argv = [now, INGEST, requeue, keys.lane_prefix(queue), keys.fair_inflight_prefix(), lease_s]
    return [len(names), *names, *argv]


def send_take(channel: Any, keys: BrokerKeys, queue: str, inbox: str, now: float) -> None:
    """Send a take on the channel's polling connection; :func:`parse_take` reads it."""
    state_of(channel).probed_at = now
    args = take_args(keys, queue, inbox, b"", "", _lease(channel))
    channel.client.connection.send_command("EVALSHA", _SHA, *args)


def parse_take(channel: Any, reply: Any, now: float) -> bytes | None:
    """The message a take moved into the inbox (None: nothing to take); notes the lanes' state."""
    item, _priority, sets, tag, more = reply
    state = state_of(channel)
    state.fair = more == b"1"
    state.parked_until = now + PARKED_WAIT_S if state.fair and item is None else 0.0
    if item is None:
        return None
    if tag and sets:
        _capped[tag.decode()] = sets.decode().split()
    return bytes(item)


def swap(
    channel: Any, keys: BrokerKeys, queue: str, inbox: str, item: bytes, now: float
) -> bytes | None:
    """A message with a lane that a ``BLMOVE`` took: sorted with the rest, the next one taken."""
    state_of(channel).probed_at = now
    args = take_args(keys, queue, inbox, item, "", _lease(channel))
    try:
        reply = channel.client.execute_command("EVALSHA", _SHA, *args)
    except NoScriptError:
        reply = channel.client.execute_command("EVAL", _SOURCE, *args)
    return parse_take(channel, reply, now)


def load(channel: Any) -> None:
    """After ``NOSCRIPT`` (a restarted Redis): load the script for the next take."""
    channel.client.execute_command("SCRIPT", "LOAD", _SOURCE)


def release(tag: str) -> list[str]:
    """The in-flight sets call ``tag`` counts in, once, when it is acknowledged ([]: none)."""
    return _capped.pop(tag, [])


def _lease(channel: Any) -> float:
    return float(getattr(channel, "visibility_timeout", 3600) or 3600)
