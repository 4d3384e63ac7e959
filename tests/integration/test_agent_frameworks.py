"""Agent frameworks' own loops, with offline scripted models, against real workers.

Each framework runs its real agent loop (the OpenAI Agents SDK's ``Runner`` with a
custom ``Model``, pydantic-ai's ``Agent`` with a ``FunctionModel``, LangChain's
tool-calling loop with a scripted chat model, sync and async) over the tools
``toolexec.integrations`` builds from the live catalog. What the model reads is
recorded and checked: a retried call's answer, a typed error for bad arguments,
and the run guard's nudge and refusals when the model repeats itself. The same
repetition is checked through ``client.call`` and through ``toolexec mcp`` over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from agents import Agent as AgentsAgent
from agents import ModelResponse as AgentsResponse
from agents import RunConfig, Runner, Usage
from agents.models.interface import Model
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_support import mcp_http_process
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from toolexec.client import ToolClient
from toolexec.integrations import langchain as lc
from toolexec.integrations.openai_agents import function_tools
from toolexec.integrations.pydantic_ai import toolset
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply, WorkerProcess

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

Call = tuple[str, dict[str, Any]]
Plan = list[list[Call]]  # the tool calls of each model turn; then the model answers


# -- the scripted models, one per framework --------------------------------------------


class ScriptedAgentsModel(Model):
    """An Agents SDK model playing ``plan``; ``read`` is every tool output it was sent."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.read: list[str] = []
        self.turn = 0

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kw: Any
    ) -> AgentsResponse:
        outputs = [
            i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        self.read = [str(o["output"]) for o in outputs]
        if self.turn < len(self.plan):
            calls = [
                ResponseFunctionToolCall(
                    type="function_call",
                    call_id=f"c{self.turn}-{i}",
                    name=name,
                    arguments=json.dumps(arguments),
                )
                for i, (name, arguments) in enumerate(self.plan[self.turn])
            ]
            self.turn += 1
            return AgentsResponse(output=list(calls), usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text="done", annotations=[])
        message = ResponseOutputMessage(
            id="m", type="message", role="assistant", status="completed", content=[text]
        )
        return AgentsResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kw: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


class ScriptedChat(BaseChatModel):
    """A LangChain chat model playing ``plan`` (a turn per AI message)."""

    plan: Plan

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        turn = sum(isinstance(m, AIMessage) for m in messages)
        if turn < len(self.plan):
            calls = [
                {"name": name, "args": arguments, "id": f"c{turn}-{i}"}
                for i, (name, arguments) in enumerate(self.plan[turn])
            ]
            reply = AIMessage("", tool_calls=calls)
        else:
            reply = AIMessage("done")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def run_agents_sdk(client: ToolClient, plan: Plan) -> list[str]:
    model = ScriptedAgentsModel(plan)
    agent = AgentsAgent(name="t", model=model, tools=function_tools(client))
    result = Runner.run_sync(
        agent, "go", run_config=RunConfig(tracing_disabled=True), max_turns=len(plan) + 2
    )
    assert result.final_output == "done"
    return model.read


def run_pydantic_ai(client: ToolClient, plan: Plan) -> list[str]:
    read: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        read[:] = [
            part.content
            for message in messages
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if turn < len(plan):
            return ModelResponse(
                parts=[
                    ToolCallPart(name, arguments, tool_call_id=f"c{turn}-{i}")
                    for i, (name, arguments) in enumerate(plan[turn])
                ]
            )
        return ModelResponse(parts=[TextPart("done")])

    agent = PydanticAgent(FunctionModel(model), toolsets=[toolset(client)])
    assert agent.run_sync("go").output == "done"
    return read


def _langchain_loop(client: ToolClient, plan: Plan, use_async: bool) -> list[str]:
    by_name = {t.name: t for t in lc.tools(client)}
    model = ScriptedChat(plan=plan).bind_tools(list(by_name.values()))
    config: Any = {"configurable": {"thread_id": f"lc-{uuid.uuid4().hex[:8]}"}}
    messages: list[BaseMessage] = [HumanMessage("go")]
    read: list[str] = []
    for _ in range(len(plan) + 1):
        reply = model.invoke(messages, config)
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            tool = by_name[call["name"]]
            if use_async:
                answer = asyncio.run(tool.ainvoke(call, config))
            else:
                answer = tool.invoke(call, config)
            assert isinstance(answer, ToolMessage) and answer.artifact is not None
            messages.append(answer)
            read.append(str(answer.content))
    assert messages[-1].content == "done"
    return read


def run_langchain(client: ToolClient, plan: Plan) -> list[str]:
    return _langchain_loop(client, plan, use_async=False)


def run_langchain_async(client: ToolClient, plan: Plan) -> list[str]:
    return _langchain_loop(client, plan, use_async=True)


DRIVERS: dict[str, Callable[[ToolClient, Plan], list[str]]] = {
    "openai-agents": run_agents_sdk,
    "pydantic-ai": run_pydantic_ai,
    "langchain": run_langchain,
    "langchain-async": run_langchain_async,
}


@pytest.fixture(params=sorted(DRIVERS))
def drive(request: pytest.FixtureRequest) -> Callable[[ToolClient, Plan], list[str]]:
    return DRIVERS[request.param]


# -- the frameworks' loops -------------------------------------------------------------


def test_a_call_retried_once_reaches_the_model_as_its_answer(
    client: ToolClient, flaky: FlakyServer, drive: Callable[[ToolClient, Plan], list[str]]
) -> None:
    path = flaky.unique_path("fw-retry")
    url = flaky.script(path, Reply(503), Reply(200, {"temp": 21}))
    read = drive(client, [[("fetch", {"url": url})]])
    assert [json.loads(text) for text in read] == [{"status": "ok", "data": {"temp": 21}}]
    assert len(flaky.hits(path)) == 2  # the worker retried the 503 once


def test_invalid_arguments_come_back_as_a_typed_error_the_model_can_act_on(
    client: ToolClient, flaky: FlakyServer, drive: Callable[[ToolClient, Plan], list[str]]
) -> None:
    path = flaky.unique_path("fw-invalid")
    url = flaky.script(path, Reply(200))
    read = drive(client, [[("record", {"url": url, "count": "many"})]])
    body = json.loads(read[0])
    assert body["status"] == "error"
    assert body["error"]["type"] == "invalid_arguments"
    assert "count" in body["error"]["message"]
    assert body["error"]["suggestion"]
    assert flaky.hits(path) == []  # never reached the tool's body


def _rulings(read: list[str]) -> list[str]:
    """What the model was told for each call: ok, nudge, or the refusal's error type."""
    out = []
    for text in read:
        body = json.loads(text)
        if "guard" in body:
            out.append("nudge")
        else:
            out.append("ok" if body["status"] == "ok" else body["error"]["type"])
    return out


def _assert_nudged_then_refused(rulings: list[str], hits: int) -> None:
    assert len(rulings) == 8
    assert "nudge" in rulings, rulings
    first_refusal = next(i for i, r in enumerate(rulings) if r not in ("ok", "nudge"))
    assert rulings.index("nudge") < first_refusal
    assert set(rulings[first_refusal:]) <= {"tool_disabled", "run_aborted"}, rulings
    assert rulings[-1] == "run_aborted", rulings
    assert hits == first_refusal  # refused calls never reached the service


def test_eight_identical_calls_in_one_run_are_nudged_then_refused(
    client: ToolClient, flaky: FlakyServer, drive: Callable[[ToolClient, Plan], list[str]]
) -> None:
    path = flaky.unique_path("fw-loop")
    url = flaky.script(path, Reply(200, {"same": True}))
    read = drive(client, [[("fetch", {"url": url})]] * 8)
    _assert_nudged_then_refused(_rulings(read), len(flaky.hits(path)))


# -- the client's own calls --------------------------------------------------------------


def test_eight_identical_client_calls_under_one_run_id_are_nudged_then_refused(
    client: ToolClient, flaky: FlakyServer
) -> None:
    """Before: all eight came back plain ok; only run_tool_calls went through the guard."""
    path = flaky.unique_path("call-loop")
    url = flaky.script(path, Reply(200, {"same": True}))
    run_id = f"call-{uuid.uuid4().hex[:8]}"
    results = [client.call("fetch", {"url": url}, run_id=run_id) for _ in range(8)]
    _assert_nudged_then_refused(_rulings([r.content() for r in results]), len(flaky.hits(path)))
    nudged = next(r for r in results if r.guard)
    assert nudged.ok and "previous_result" in nudged.guard


def test_submit_acall_and_call_many_are_guarded_too_and_guard_false_opts_out(
    client: ToolClient, flaky: FlakyServer
) -> None:
    path = flaky.unique_path("paths-loop")
    url = flaky.script(path, Reply(200, {"same": True}))
    run_id = f"paths-{uuid.uuid4().hex[:8]}"
    first = client.submit("fetch", {"url": url}, run_id=run_id).result()
    second = asyncio.run(client.acall("fetch", {"url": url}, run_id=run_id))
    batch = client.call_many([("fetch", {"url": url})] * 2, run_id=run_id)
    later = [client.call("fetch", {"url": url}, run_id=run_id) for _ in range(2)]
    rulings = _rulings([r.content() for r in [first, second, *batch, *later]])
    assert rulings[:2] == ["ok", "ok"] and "nudge" in rulings[2:4], rulings
    assert rulings[-1] in ("tool_disabled", "run_aborted"), rulings
    free = [
        client.call("fetch", {"url": url}, run_id=f"free-{run_id}", guard=False) for _ in range(8)
    ]
    assert all(r.ok and r.guard is None for r in free)


# -- MCP over HTTP -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mcp_url(
    worker_env: dict[str, str], worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    log = tmp_path_factory.mktemp("mcp-frameworks") / "mcp.log"
    with mcp_http_process(worker_env, log) as url:
        yield url


def _mcp_calls(
    url: str, arguments: dict[str, Any], headers: dict[str, str], mode: Any = "auto"
) -> list[str]:
    async def main() -> list[str]:
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(url, http_client=http), mode=mode) as mcp,
        ):
            results = [await mcp.call_tool("fetch", arguments) for _ in range(8)]
        texts = []
        for result in results:
            block = result.content[0]
            assert isinstance(block, types.TextContent)
            assert result.structured_content == json.loads(block.text)
            texts.append(block.text)
        return texts

    return anyio.run(main)


def test_eight_identical_calls_in_one_mcp_session_are_nudged_then_refused(
    mcp_url: str, flaky: FlakyServer
) -> None:
    """A 2025-era session (initialize handshake, Mcp-Session-Id) is one run."""
    path = flaky.unique_path("mcp-loop")
    url = flaky.script(path, Reply(200, {"same": True}))
    read = _mcp_calls(mcp_url, {"url": url}, {}, mode="legacy")
    _assert_nudged_then_refused(_rulings(read), len(flaky.hits(path)))


def test_a_run_id_header_makes_a_2026_client_one_run(mcp_url: str, flaky: FlakyServer) -> None:
    """The 2026 transport has no session: before, each of its calls was a run of its own
    (eight plain oks); a Toolexec-Run-Id header set once on the connection joins them."""
    path = flaky.unique_path("mcp-header")
    url = flaky.script(path, Reply(200, {"same": True}))
    headers = {"Toolexec-Run-Id": f"hdr-{uuid.uuid4().hex[:8]}"}
    read = _mcp_calls(mcp_url, {"url": url}, headers)
    _assert_nudged_then_refused(_rulings(read), len(flaky.hits(path)))
    again = _rulings(_mcp_calls(mcp_url, {"url": url}, headers))  # another connection, same run
    assert again == ["run_aborted"] * 8


# -- the examples ---------------------------------------------------------------------------


@pytest.mark.parametrize("example", ["openai_agents.py", "pydantic_ai.py", "langchain.py"])
def test_the_examples_run_offline_and_the_model_reads_the_retried_answer(
    example: str, settings: Settings
) -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "TOOLEXEC_KEY_PREFIX")
    }
    env["TOOLEXEC_REDIS_URL"] = settings.redis_url or ""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / example)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout.strip().splitlines()[-1]
    assert said.startswith("The tool said: "), done.stdout
    body = json.loads(said.removeprefix("The tool said: "))
    assert body["status"] == "ok"
    assert body["data"]["city"] == "Oslo" and body["data"]["conditions"] == "light rain"


def test_run_tool_calls_turns_strict_mode_arguments_back(
    client: ToolClient, flaky: FlakyServer
) -> None:
    """A model given tool_definitions(strict=True) sends null for "not given"."""
    url = flaky.script(flaky.unique_path("strict-args"), Reply(200))
    definitions = client.tool_definitions("openai", strict=True)
    record = next(d["function"] for d in definitions if d["function"]["name"] == "record")
    assert record["strict"] is True
    assert sorted(record["parameters"]["required"]) == ["count", "unit", "url"]
    arguments = json.dumps({"url": url, "count": 2, "unit": None})
    call = {"id": "c1", "type": "function", "function": {"name": "record", "arguments": arguments}}
    as_sent = json.loads(client.run_tool_calls([call])[0]["content"])
    assert as_sent["error"]["type"] == "invalid_arguments"  # null is no unit
    turned_back = json.loads(client.run_tool_calls([call], strict=True)[0]["content"])
    assert turned_back == {"status": "ok", "data": {"count": 2, "unit": "c"}}
