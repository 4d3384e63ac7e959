"""A running tool talking to its caller, across the queue: log lines, questions, samples.

A tool runs on a worker; its caller (an MCP client, through ``toolexec mcp``)
holds a session on a front process somewhere else. So the tool writes to a
Redis list of its call (``Keys.asks``), the front that holds the session pops
it and forwards it (a log notification, an ``elicitation/create`` or a
``sampling/createMessage`` request), and pushes the answer onto a list the tool
waits on (``Keys.answer``), all within the call's deadline.

A caller that cannot answer (an SDK caller, an MCP client without the
capability) never makes a tool wait: the front notes what its client can
answer (``Keys.caller``) before the call is published, and without that note
:func:`elicit` and :func:`sample` return an :class:`Answer` with action
``refused`` at once: a typed result the tool can read and explain.

The functions work only inside a tool body run by a worker; anywhere else they
refuse (or, for :func:`log`, do nothing).
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import redis
from pydantic import BaseModel

from toolexec.clock import Clock
from toolexec.keys import REPLY_TTL_S, Keys
from toolexec.layers import Attempt, Layer, Outcome

__all__ = [
    "LOG_LEVELS",
    "Answer",
    "Asker",
    "CallerLayer",
    "asker",
    "current_line",
    "elicit",
    "log",
    "push_ask",
    "sample",
]

_log = logging.getLogger("toolexec.caller")

#: Seconds one blocking read for an answer lasts (the call-path client's socket allows 1 s).
_BLOCK_S = 0.5

#: MCP's log levels (RFC 5424's), least severe first.
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


class Answer(BaseModel):
    """The caller's answer to a question or a sampling request.

    ``action`` is the caller's: ``accept`` (``content`` holds the answer),
    ``decline`` or ``cancel``; or toolexec's: ``refused`` (no caller that can
    answer: an SDK call, a client without the capability) or ``timeout`` (no
    answer before the call's deadline). ``reason`` says which, for the model.
    """

    action: Literal["accept", "decline", "cancel", "refused", "timeout"]
    content: dict[str, Any] | None = None
    reason: str | None = None

    @property
    def accepted(self) -> bool:
        return self.action == "accept"


@dataclass
class _Line:
    """The current call's way to its caller: where to write, where to wait, until when."""

    client: redis.Redis
    keys: Keys
    call_id: str
    deadline: float
    clock: Clock
    asked: list[int] = field(default_factory=lambda: [0])

    def can(self) -> dict[str, Any] | None:
        raw = self.client.get(self.keys.caller(self.call_id))
        if raw is None:
            return None
        found = json.loads(raw)
        return found if isinstance(found, dict) else None

    def push(self, event: Mapping[str, Any]) -> None:
        _push(self.client, self.keys, self.clock, self.call_id, self.deadline, event)

    def ask(self, kind: str, params: Mapping[str, Any]) -> Answer:
        self.asked[0] += 1
        number = self.asked[0]
        self.push({"kind": kind, "ask": number, "params": dict(params)})
        key = self.keys.answer(self.call_id, number)
        # short blocking reads: the worker's call-path client gives up on a socket after 1 s
        while (wait := self.deadline - self.clock.now()) > 0:
            popped = self.client.blpop([key], timeout=min(_BLOCK_S, wait))
            if popped is not None:
                return Answer.model_validate_json(popped[1])
        return Answer(action="timeout", reason="no answer came before the call's deadline")


def _push(
    client: redis.Redis,
    keys: Keys,
    clock: Clock,
    call_id: str,
    deadline: float,
    event: Mapping[str, Any],
) -> None:
    key = keys.asks(call_id)
    ttl = max(1, int(deadline - clock.now()) + REPLY_TTL_S)
    pipe = client.pipeline(transaction=False)
    pipe.rpush(key, json.dumps(event))
    pipe.expire(key, ttl)
    pipe.execute()


def push_ask(
    client: redis.Redis,
    keys: Keys,
    clock: Clock,
    call_id: str,
    deadline: float,
    kind: str,
    params: Mapping[str, Any],
) -> bool:
    """Put a question no one waits on here to the call's caller (an approval); False: no one to ask.

    The answer does not come back on the call's answer list: the front acts on it
    (``toolexec.layers.approvals`` records a decision).
    """
    line = _Line(client, keys, call_id, deadline, clock)
    can = line.can()
    if not can or not can.get("elicitation"):
        return False
    line.push({"kind": kind, "params": dict(params)})
    return True


_LINE: contextvars.ContextVar[_Line | None] = contextvars.ContextVar(
    "toolexec_caller_line", default=None
)


@contextmanager
def _on_line(line: _Line) -> Iterator[None]:
    token = _LINE.set(line)
    try:
        yield
    finally:
        _LINE.reset(token)


def current_line() -> _Line | None:
    """The running call's line to its caller and Redis; None outside a tool body."""
    return _LINE.get()


class CallerLayer(Layer):
    """Gives the tool body its line to the caller (innermost: only the body needs it)."""

    def __init__(self, client: redis.Redis, keys: Keys, clock: Clock) -> None:
        self.client, self.keys, self.clock = client, keys, clock

    def around(self, attempt: Attempt, proceed: Callable[[], Outcome]) -> Outcome:
        line = _Line(self.client, self.keys, attempt.ctx.call_id, attempt.ctx.deadline, self.clock)
        with _on_line(line):
            return proceed()


def log(message: Any, level: str = "info", logger: str | None = None) -> None:
    """Send a log line to the caller (an MCP client sees ``notifications/message``).

    Outside a call, or with no one listening, it goes to this process's log only.
    The line must be JSON; the front drops it below the level its client set.
    """
    if level not in LOG_LEVELS:
        raise ValueError(f"level must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
    line = _LINE.get()
    if line is None:
        _log.info("%s", message)
        return
    try:
        line.push({"kind": "log", "params": {"level": level, "data": message, "logger": logger}})
    except redis.RedisError as exc:  # a log line is not worth failing the call over
        _log.warning("could not send a log line to the caller: %s", exc)


def _refused(what: str) -> Answer:
    return Answer(
        action="refused",
        reason=f"the caller of this call cannot answer {what} (not an MCP client that "
        "declared the capability); go on without it or say what you needed",
    )


def elicit(message: str, schema: Mapping[str, Any]) -> Answer:
    """Ask the caller's user a question: an answer shaped by ``schema`` (MCP elicitation).

    ``schema`` is a flat JSON Schema object of primitive properties, as MCP's
    ``requestedSchema``. Waits at most until the call's deadline.
    """
    line = _LINE.get()
    if line is None:
        return _refused("questions")
    can = line.can()
    if not can or not can.get("elicitation"):
        return _refused("questions")
    return line.ask("elicit", {"message": message, "requestedSchema": dict(schema)})


def sample(
    prompt: str | list[Mapping[str, Any]],
    max_tokens: int = 256,
    system_prompt: str | None = None,
) -> Answer:
    """Ask the caller's model for a completion (MCP sampling); ``content`` holds its message.

    ``prompt`` is a user message's text, or MCP ``SamplingMessage`` objects.
    """
    line = _LINE.get()
    if line is None:
        return _refused("sampling requests")
    can = line.can()
    if not can or not can.get("sampling"):
        return _refused("sampling requests")
    messages = (
        [{"role": "user", "content": {"type": "text", "text": prompt}}]
        if isinstance(prompt, str)
        else [dict(m) for m in prompt]
    )
    params = {"messages": messages, "maxTokens": max_tokens, "systemPrompt": system_prompt}
    return line.ask("sample", params)


#: A way to put a question (a message, a requested schema) to a call's caller.
Asker = Callable[[str, Mapping[str, Any]], Answer]


def asker() -> Asker:
    """The running call's way to ask its caller, usable from another thread.

    A remote MCP server's question arrives on the worker's session loop
    (``toolexec.mcp.sessions``), away from the tool body and its line; the body
    hands this over so the question goes to the same caller, within the same
    deadline, and is refused the same way when the caller cannot answer.
    Blocking: call it off an event loop.
    """
    line = _LINE.get()

    def ask(message: str, schema: Mapping[str, Any]) -> Answer:
        if line is None:
            return _refused("questions")
        with _on_line(line):
            return elicit(message, schema)

    return ask
