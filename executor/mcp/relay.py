"""The front's half of a tool talking to its caller (``toolexec.caller``'s other end).

While a call waits, the front pops what the running tool pushed onto the
call's list (``Keys.asks``) and forwards it on the client's session: a log
line as ``notifications/message`` (at or above the level the session set with
``logging/setLevel``), a question as ``elicitation/create``, a sampling request
as ``sampling/createMessage``. Each answer goes back on its own list
(``Keys.answer``) for the tool to pop. What the client can answer is noted
before the call is published (``Keys.caller``), so a tool never waits on a
client that cannot answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import mcp_types as types
import redis
import redis.asyncio

from toolexec.caller import LOG_LEVELS, Answer
from toolexec.keys import REPLY_TTL_S, Keys

__all__ = ["APPROVAL_SCHEMA", "Relay", "approval_decision", "can_answer", "level_allows"]

log = logging.getLogger("toolexec.mcp")

#: Seconds one blocking read of a call's asks lasts; the relay ends with the call anyway.
_BLOCK_S = 1.0


#: What an approval question asks for: yes or no, and why (optional).
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean", "title": "Approve", "description": "Run the call?"},
        "reason": {"type": "string", "title": "Reason", "description": "Why (optional)"},
    },
    "required": ["approve"],
}

#: Records a call's approval decision: (call id, "approved" or "denied", reason).
Decide = Callable[[str, str, str | None], Awaitable[None]]


def approval_decision(action: str, content: Mapping[str, Any] | None) -> str | None:
    """The decision an answer to an approval question means; None: no decision (cancelled).

    Only an accepted form with ``approve`` true approves; a declined question denies.
    """
    if action == "decline":
        return "denied"
    if action != "accept":
        return None
    return "approved" if (content or {}).get("approve") is True else "denied"


def can_answer(capabilities: types.ClientCapabilities | None) -> dict[str, bool] | None:
    """What a client declared it can answer; None when nothing (no note is written then)."""
    if capabilities is None:
        return None
    found = {
        "elicitation": capabilities.elicitation is not None,
        "sampling": capabilities.sampling is not None,
    }
    return found if any(found.values()) else None


def level_allows(session_level: str | None, level: str) -> bool:
    """Whether a log line at ``level`` reaches a session that set ``session_level``.

    A session that set no level gets every line (MCP leaves the default to the
    server; a tool's log line is sent for its caller to see).
    """
    if session_level is None or level not in LOG_LEVELS:
        return True
    return LOG_LEVELS.index(level) >= LOG_LEVELS.index(session_level)


class Relay:
    """Forwards one call's asks to its client and the answers back, until cancelled."""

    def __init__(
        self,
        replies: redis.asyncio.Redis,
        keys: Keys,
        call_id: str,
        deadline_in: float,
        session: Any,
        request_id: types.RequestId | None,
        level: str | None,
        decide: Decide | None = None,
    ) -> None:
        self.decide = decide
        self.replies, self.keys, self.call_id = replies, keys, call_id
        self.ttl = max(1, int(deadline_in) + REPLY_TTL_S)
        self.session, self.request_id, self.level = session, request_id, level

    async def run(self) -> None:
        key = self.keys.asks(self.call_id)
        async with anyio.create_task_group() as tasks:
            while True:
                try:
                    popped = await self.replies.blpop([key], timeout=_BLOCK_S)
                except redis.RedisError as exc:
                    log.debug("could not read call %s's asks: %s", self.call_id, exc)
                    await anyio.sleep(_BLOCK_S)
                    continue
                if popped is None:
                    continue
                try:
                    event = json.loads(popped[1])
                except ValueError:
                    continue
                if isinstance(event, dict):
                    tasks.start_soon(self._handle, event)

    async def _handle(self, event: Mapping[str, Any]) -> None:
        kind, params = event.get("kind"), event.get("params") or {}
        if kind == "log":
            await self._log(params)
            return
        if kind == "approve":
            await self._approve(params)
            return
        number = event.get("ask")
        if not isinstance(number, int) or kind not in ("elicit", "sample"):
            return
        try:
            answer = await (self._elicit(params) if kind == "elicit" else self._sample(params))
        except Exception as exc:  # the client refused or failed: the tool reads why
            answer = Answer(action="cancel", reason=f"the caller could not answer: {exc}")
        await self._answer(number, answer)

    async def _approve(self, params: Mapping[str, Any]) -> None:
        """Ask the client's user to approve the call; record the answer (toolexec.layers.approvals).

        A cancelled or failed question records nothing: an operator may still decide.
        """
        if self.decide is None:
            return
        try:
            result: types.ElicitResult = await self.session.elicit_form(
                str(params.get("prompt") or "Approve this tool call?"),
                APPROVAL_SCHEMA,
                related_request_id=self.request_id,
            )
        except Exception as exc:
            log.info("could not ask for approval of call %s: %s", self.call_id, exc)
            return
        decision = approval_decision(result.action, result.content)
        if decision is not None:
            reason = (result.content or {}).get("reason")
            await self.decide(self.call_id, decision, reason if isinstance(reason, str) else None)

    async def _log(self, params: Mapping[str, Any]) -> None:
        level = params.get("level")
        if level not in LOG_LEVELS or not level_allows(self.level, level):
            return
        try:
            await self.session.send_log_message(
                level, params.get("data"), params.get("logger"), related_request_id=self.request_id
            )
        except Exception as exc:  # a closed stream: the call goes on without its log
            log.debug("could not forward a log line of call %s: %s", self.call_id, exc)

    async def _elicit(self, params: Mapping[str, Any]) -> Answer:
        result: types.ElicitResult = await self.session.elicit_form(
            str(params.get("message", "")),
            dict(params.get("requestedSchema") or {}),
            related_request_id=self.request_id,
        )
        return Answer(action=result.action, content=result.content)

    async def _sample(self, params: Mapping[str, Any]) -> Answer:
        messages = [types.SamplingMessage.model_validate(m) for m in params.get("messages") or []]
        result = await self.session.create_message(
            messages,
            max_tokens=int(params.get("maxTokens") or 256),
            system_prompt=params.get("systemPrompt"),
            related_request_id=self.request_id,
        )
        return Answer(action="accept", content=result.model_dump(mode="json", by_alias=True))

    async def _answer(self, number: int, answer: Answer) -> None:
        key = self.keys.answer(self.call_id, number)
        try:
            async with self.replies.pipeline(transaction=False) as pipe:
                pipe.rpush(key, answer.model_dump_json())
                pipe.expire(key, self.ttl)
                await pipe.execute()
        except redis.RedisError as exc:  # the tool waits until its deadline and says so
            log.warning("could not hand call %s its answer: %s", self.call_id, exc)
