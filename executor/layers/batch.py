"""Commands that several parts of an attempt send to Redis in one round trip.

An attempt on the worker used to pay one round trip per protection: the
in-flight counter, the lease, the breaker permit, then the breaker's record,
the retry budget's, the counters and the reply, each on its own. None of
these waits on another's reply, so each only queues its commands on a
:class:`Batch` and receives its reply through a callback when the batch runs:
one round trip to admit an attempt and one to settle it, whatever the layers.

Each script stays a script of its own, on the keys of one unit (a record, a
breaker, a budget), so every script keeps to one Redis Cluster slot; the batch
is a pipeline, which a cluster client splits per node. Scripts go as
``EVALSHA`` and only a ``NOSCRIPT`` answer (a restarted or flushed server)
loads them and runs those again: redis-py's own pipelined scripts would ask
``SCRIPT EXISTS`` first, one more round trip every time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.exceptions
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from toolexec.stores.failopen import REDIS_ERRORS

__all__ = ["Batch", "OnError", "OnReply"]

log = logging.getLogger("toolexec.layers.batch")

OnReply = Callable[[Any], None]
OnError = Callable[[Exception], None]


@dataclass
class _Entry:
    client: redis.Redis
    queue: Callable[[Any], None]
    on_reply: OnReply | None
    on_error: OnError | None
    script: Script | None = None
    replies: int = 0
    what: str | None = None  # set: a held write (see the module doc), named for the log


class Batch:
    """Commands queued by several owners, sent in one pipeline per client, then answered.

    A callback gets its entry's reply (the last command's, for an entry of
    several); ``on_error`` gets a Redis error instead, so that each owner
    decides how to go on without Redis (``toolexec.stores.failopen``). An error
    nobody handles is raised by :meth:`execute` after every callback ran.
    Not thread-safe: a batch belongs to one attempt.
    """

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self.executed = False
        #: Held writes whose connection failed, and the last error: see :meth:`resend_held`.
        self._held: list[_Entry] = []
        self.held_error: Exception | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self,
        client: redis.Redis,
        queue: Callable[[Any], None],
        on_reply: OnReply | None = None,
        on_error: OnError | None = None,
        *,
        held: str | None = None,
    ) -> None:
        """``queue(pipeline)`` queues one or more commands; ``on_reply`` gets the last reply.

        ``held`` names a write safe to send twice, kept after a blip (module doc).
        """
        self._entries.append(_Entry(client, queue, on_reply, on_error, what=held))

    def script(
        self,
        client: redis.Redis,
        script: Script,
        keys: Sequence[Any],
        args: Sequence[Any],
        on_reply: OnReply | None = None,
        on_error: OnError | None = None,
        *,
        held: str | None = None,
    ) -> None:
        """One Lua script call, as ``EVALSHA``; loaded and run again only on ``NOSCRIPT``."""

        def queue(pipe: Any) -> None:
            # The command itself, not pipe.evalsha(): a cluster pipeline blocks that
            # method, yet routes an EVALSHA by its keys like any other command.
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)

        self._entries.append(_Entry(client, queue, on_reply, on_error, script, what=held))

    def prepend(self, other: Batch) -> None:
        """Send ``other``'s commands first, in this batch's round trip; ``other`` is done."""
        if not other.executed:
            self._entries[:0] = other._entries
            other._entries = []
            other.executed = True

    def execute(self, *, hold: bool = False) -> None:
        """Send every queued command (once), then call each owner back.

        With ``hold``, a held write whose connection failed is kept for
        :meth:`resend_held` instead of being reported to its owner.
        """
        if self.executed:
            return
        self.executed = True
        entries, self._entries = self._entries, []
        self._send_all(entries, hold)

    def _send_all(self, entries: list[_Entry], hold: bool) -> None:
        unhandled: list[Exception] = []
        for client, group in _by_client(entries):
            unhandled += _run(client, group, self._keep if hold else None)
        if unhandled:
            raise unhandled[0]

    def _keep(self, entry: _Entry, exc: Exception) -> bool:
        if entry.what is None:
            return False
        self._held.append(entry)
        self.held_error = exc
        return True

    @property
    def held(self) -> list[str]:
        """What the held writes not made yet are (``breaker record``, ...)."""
        return [entry.what or "" for entry in self._held]

    def resend_held(self) -> bool:
        """Send the held writes again, once, in one round trip; True when none is left.

        Those whose connection fails again stay held, :attr:`held_error` the reason.
        """
        entries, self._held = self._held, []
        if entries:
            self._send_all(entries, True)
        return not self._held

    def drop_held(self) -> list[str]:
        """Give up on the held writes: each owner hears of its error; returns what they were."""
        entries, self._held = self._held, []
        error = self.held_error or redis.exceptions.ConnectionError("Redis unreachable")
        for entry in entries:
            if entry.on_error is not None:
                entry.on_error(error)
        return [entry.what or "" for entry in entries]


def _by_client(entries: list[_Entry]) -> list[tuple[redis.Redis, list[_Entry]]]:
    """Entries grouped by client in first-seen order: one pipeline each (one, on a worker)."""
    groups: dict[int, tuple[redis.Redis, list[_Entry]]] = {}
    for entry in entries:
        groups.setdefault(id(entry.client), (entry.client, []))[1].append(entry)
    return list(groups.values())


def _send(client: redis.Redis, entries: Sequence[_Entry]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for entry in entries:
        # len(pipe), not its command_stack: a cluster pipeline queues elsewhere
        before = len(pipe)
        entry.queue(pipe)
        entry.replies = len(pipe) - before
    return list(pipe.execute(raise_on_error=False))


Keep = Callable[[_Entry, Exception], bool]


def _run(client: redis.Redis, entries: list[_Entry], keep: Keep | None) -> list[Exception]:
    """One round trip for ``entries`` (two after a ``NOSCRIPT``); the unhandled errors.

    ``keep`` may take an entry whose connection failed instead of its owner.
    """
    try:
        replies = _send(client, entries)
    except REDIS_ERRORS as exc:  # the connection failed: every owner hears of it
        answers: list[tuple[_Entry, Any]] = [(entry, exc) for entry in entries]
    else:
        answers = _split(entries, replies)
        missing = [
            i for i, (e, r) in enumerate(answers) if e.script and isinstance(r, NoScriptError)
        ]
        if missing:
            answers = _reload(client, answers, missing)
    unhandled = []
    for entry, reply in answers:
        if keep is not None and isinstance(reply, REDIS_ERRORS) and keep(entry, reply):
            continue
        problem = _answer(entry, reply)
        if problem is not None:
            unhandled.append(problem)
    return unhandled


def _split(entries: list[_Entry], replies: list[Any]) -> list[tuple[_Entry, Any]]:
    """Each entry with its last reply, or the first error among its replies."""
    out, at = [], 0
    for entry in entries:
        own = replies[at : at + entry.replies]
        at += entry.replies
        errors = [r for r in own if isinstance(r, Exception)]
        out.append((entry, errors[0] if errors else (own[-1] if own else None)))
    return out


def _reload(
    client: redis.Redis, answers: list[tuple[_Entry, Any]], missing: list[int]
) -> list[tuple[_Entry, Any]]:
    """The server lost its scripts: load them, and run the calls it refused again."""
    try:
        for script in {id(answers[i][0].script): answers[i][0].script for i in missing}.values():
            assert script is not None
            script.sha = client.script_load(script.script)
        again = _send(client, [answers[i][0] for i in missing])
    except REDIS_ERRORS as exc:
        return [(e, exc if i in missing else r) for i, (e, r) in enumerate(answers)]
    answers = list(answers)
    for index, reply in zip(missing, again, strict=True):
        answers[index] = (answers[index][0], reply)
    return answers


def _answer(entry: _Entry, reply: Any) -> Exception | None:
    if isinstance(reply, REDIS_ERRORS):
        return _answer_error(entry, reply)
    if isinstance(reply, Exception):  # a script's own error is a bug: raised, not failed open
        return reply
    if entry.on_reply is not None:
        try:
            entry.on_reply(reply)
        except Exception as exc:  # one owner's bug must not keep the others' replies
            log.exception("a batch reply handler failed")
            return exc
    return None


def _answer_error(entry: _Entry, exc: Exception) -> Exception | None:
    if entry.on_error is None:
        return exc
    entry.on_error(exc)
    return None
