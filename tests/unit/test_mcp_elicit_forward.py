"""A remote MCP server's question during a call: whose caller answers, and in what terms."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import mcp_types as types

from toolexec.caller import Answer, asker
from toolexec.mcp.servers import RemoteServer
from toolexec.mcp.sessions import _ASKER, _Session, elicit_result

FORM = types.ElicitRequestFormParams(message="name?", requested_schema={"type": "object"})


def _answering(name: str) -> Any:
    def ask(message: str, schema: Mapping[str, Any]) -> Answer:
        return Answer(action="accept", content={"name": name})

    return ask


def test_toolexecs_own_outcomes_become_a_cancel_never_an_error() -> None:
    assert elicit_result(Answer(action="refused", reason="x")).action == "cancel"
    assert elicit_result(Answer(action="timeout")).action == "cancel"
    assert elicit_result(Answer(action="decline")).action == "decline"
    accepted = elicit_result(Answer(action="accept", content={"a": 1}))
    assert accepted.action == "accept" and accepted.content == {"a": 1}


def test_outside_a_tool_body_the_asker_refuses() -> None:
    assert asker()("name?", {}).action == "refused"


def test_the_question_goes_to_the_asking_calls_caller() -> None:
    session = _Session(RemoteServer(name="r", url="http://127.0.0.1:1/mcp"), lambda: None)

    async def main() -> list[Any]:
        async def in_call(name: str) -> Any:
            _ASKER.set(_answering(name))
            with session.asking(_answering(name)):
                return await session._elicit(None, FORM)

        return await asyncio.gather(in_call("ada"), in_call("bob"))

    answers = asyncio.run(main())
    assert [a.content for a in answers] == [{"name": "ada"}, {"name": "bob"}]


def test_without_context_only_a_lone_call_is_asked_and_several_are_not_guessed() -> None:
    session = _Session(RemoteServer(name="r", url="http://127.0.0.1:1/mcp"), lambda: None)

    async def main() -> tuple[Any, Any]:
        with session.asking(_answering("ada")):
            lone = await session._elicit(None, FORM)
            with session.asking(_answering("bob")):
                several = await session._elicit(None, FORM)
        return lone, several

    lone, several = asyncio.run(main())
    assert lone.action == "accept" and lone.content == {"name": "ada"}
    assert several.action == "cancel"
