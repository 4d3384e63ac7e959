"""The agent integrations and the run guard put a call in its tenant's lane, seen on the broker.

Each framework runs its real loop (the OpenAI Agents SDK's ``Runner`` with a
scripted ``Model``, pydantic-ai's ``Agent`` with a ``FunctionModel``, LangChain's
``BaseTool.invoke``/``ainvoke``) with one scripted tool call, against a real worker
of the fairness queue. To see the lane a call waits in, the tenant's key is capped
at one call in flight and a long call of that key holds the slot: the framework's
call then waits, parked, in the lane of its (priority, key), which the test reads on
the broker before letting it run. A call that lost its key or priority on the way
would run at once in the lane of priority 3, no key, and never be seen there.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import mcp_types as types
import pytest
from agents import Agent as AgentsAgent
from agents import ModelResponse as AgentsResponse
from agents import RunConfig, Runner, Usage
from agents.models.interface import Model
from cluster_support import cluster_run
from fairness_support import fairness_worker
from fairness_tools import QUEUE
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
from rigs.chaos import wait_until

from toolexec.client import ToolClient
from toolexec.connection import redis_client
from toolexec.integrations import langchain as lc
from toolexec.integrations.openai_agents import function_tools
from toolexec.integrations.pydantic_ai import toolset
from toolexec.keys import BrokerKeys
from toolexec.settings import Settings
from toolexec.stores.fairness_store import FairnessStore
from toolexec.testing import WorkerProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(cluster_run(), reason="lanes live on a Redis broker, not a cluster"),
]

#: The call that holds the key's one slot while the framework's call waits behind it.
HOLD_MS = 3000
CALL = ("nap", {"ms": 1, "tag": "framework"})


@pytest.fixture(scope="module")
def fair_worker(
    worker_env: dict[str, str], settings: Settings, tmp_path_factory: Any
) -> Iterator[WorkerProcess]:
    proc = fairness_worker(worker_env, settings, tmp_path_factory.mktemp("fair-integrations"), 4)
    yield proc
    proc.stop()


@pytest.fixture
def fair_client(settings: Settings, fair_worker: WorkerProcess) -> Iterator[ToolClient]:
    with ToolClient(settings) as tool_client:
        yield tool_client


class Broker:
    """The broker's view of one tenant: its cap, its calls in flight, its lanes."""

    def __init__(self, settings: Settings) -> None:
        self.redis = redis_client(settings.broker_url or settings.redis_url or "")
        self.keys = BrokerKeys(settings.key_prefix)
        self.store = FairnessStore(self.redis, self.keys)
        self.tenant = f"tenant-{uuid.uuid4().hex[:8]}"

    def in_flight(self) -> int:
        return int(self.redis.zcard(f"{self.keys.fair_inflight_prefix()}{self.tenant}"))

    def waiting_in(self, priority: int) -> int:
        return int(self.redis.llen(self.keys.lane(QUEUE, priority, self.tenant)))


@pytest.fixture
def broker(settings: Settings) -> Iterator[Broker]:
    view = Broker(settings)
    view.store.set(view.tenant, max_in_flight=1)
    yield view
    view.store.clear(view.tenant)
    view.redis.close()


def _assert_waits_in_lane(
    client: ToolClient, broker: Broker, priority: int, drive: Callable[[], list[str]]
) -> None:
    """``drive`` runs a framework's one call while the tenant's slot is held; it must be
    seen waiting in the lane (``priority``, tenant), then finish ok."""
    holder = client.submit("nap", {"ms": HOLD_MS, "tag": "hold"}, fairness_key=broker.tenant)
    assert wait_until(lambda: broker.in_flight() == 1, 10), "the holding call never started"
    read: list[str] = []
    runner = threading.Thread(target=lambda: read.extend(drive()), daemon=True)
    runner.start()
    seen = wait_until(lambda: broker.waiting_in(priority) == 1, HOLD_MS / 1000)
    runner.join(timeout=30)
    assert holder.result().status == "ok"
    assert seen, f"the call never waited in lane ({priority}, {broker.tenant})"
    assert [json.loads(text) for text in read] == [{"status": "ok", "data": "framework"}]


# -- the frameworks' loops, each with one scripted call -----------------------------------


class OneCallModel(Model):
    """An Agents SDK model that asks for ``CALL`` once, then answers."""

    def __init__(self) -> None:
        self.read: list[str] = []
        self.turn = 0

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kw: Any
    ) -> AgentsResponse:
        self.read = [
            str(i["output"])
            for i in input
            if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        if self.turn == 0:
            self.turn += 1
            call = ResponseFunctionToolCall(
                type="function_call", call_id="c0", name=CALL[0], arguments=json.dumps(CALL[1])
            )
            return AgentsResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text="done", annotations=[])
        message = ResponseOutputMessage(
            id="m", type="message", role="assistant", status="completed", content=[text]
        )
        return AgentsResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kw: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def agents_sdk(client: ToolClient, built: dict[str, Any], context: Any) -> list[str]:
    model = OneCallModel()
    agent = AgentsAgent(name="t", model=model, tools=function_tools(client, **built))
    result = Runner.run_sync(
        agent, "go", context=context, run_config=RunConfig(tracing_disabled=True), max_turns=3
    )
    assert result.final_output == "done"
    return model.read


def pydantic_ai(client: ToolClient, built: dict[str, Any], context: Any) -> list[str]:
    read: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        read[:] = [
            str(part.content)
            for message in messages
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart(CALL[0], CALL[1], tool_call_id="c0")])
        return ModelResponse(parts=[TextPart("done")])

    agent = PydanticAgent(FunctionModel(model), toolsets=[toolset(client, **built)], deps_type=Any)
    assert agent.run_sync("go", deps=context).output == "done"
    return read


def _langchain(client: ToolClient, built: dict[str, Any], context: Any, aio: bool) -> list[str]:
    tool = {t.name: t for t in lc.tools(client, **built)}[CALL[0]]
    call = {"name": CALL[0], "args": CALL[1], "id": "c0", "type": "tool_call"}
    config: Any = {"metadata": context or {}}
    answer = asyncio.run(tool.ainvoke(call, config)) if aio else tool.invoke(call, config)
    return [str(answer.content)]


def langchain(client: ToolClient, built: dict[str, Any], context: Any) -> list[str]:
    return _langchain(client, built, context, aio=False)


def langchain_async(client: ToolClient, built: dict[str, Any], context: Any) -> list[str]:
    return _langchain(client, built, context, aio=True)


Driver = Callable[[ToolClient, dict[str, Any], Any], list[str]]
DRIVERS: dict[str, Driver] = {
    "openai-agents": agents_sdk,
    "pydantic-ai": pydantic_ai,
    "langchain": langchain,
    "langchain-async": langchain_async,
}


@pytest.fixture(params=sorted(DRIVERS))
def driver(request: pytest.FixtureRequest) -> Driver:
    return DRIVERS[request.param]


def test_the_integrations_fairness_key_and_priority_reach_the_workers_lanes(
    fair_client: ToolClient, broker: Broker, driver: Driver
) -> None:
    built = {"fairness_key": broker.tenant, "priority": 2}
    _assert_waits_in_lane(fair_client, broker, 2, lambda: driver(fair_client, built, None))


def test_a_runs_context_names_its_tenant_for_tools_built_for_every_tenant(
    fair_client: ToolClient, broker: Broker, driver: Driver
) -> None:
    context = {"fairness_key": broker.tenant}
    _assert_waits_in_lane(fair_client, broker, 3, lambda: driver(fair_client, {}, context))


def test_a_framework_call_inherits_the_fairness_key_its_run_carries(
    fair_client: ToolClient, broker: Broker, driver: Driver
) -> None:
    """The run got its key from its first call; the framework's tools know only the run id."""
    run_id = f"fair-run-{uuid.uuid4().hex[:8]}"
    first = fair_client.call(
        "nap", {"ms": 1, "tag": "first"}, run_id=run_id, fairness_key=broker.tenant
    )
    assert first.ok
    assert fair_client.run_guard(run_id).view().fairness_key == broker.tenant
    built = {"run_id": run_id, "priority": 4}
    _assert_waits_in_lane(fair_client, broker, 4, lambda: driver(fair_client, built, None))


def test_run_tool_calls_inherit_the_key_of_a_run_whose_guard_was_given_one(
    fair_client: ToolClient, broker: Broker
) -> None:
    run_id = f"fair-guard-{uuid.uuid4().hex[:8]}"
    arguments = json.dumps(CALL[1])
    call = {"id": "c1", "type": "function", "function": {"name": CALL[0], "arguments": arguments}}
    guard = fair_client.run_guard(run_id, fairness_key=broker.tenant)
    first = fair_client.run_tool_calls([call], guard=guard)
    assert json.loads(first[0]["content"])["status"] == "ok"
    assert guard.view().fairness_key == broker.tenant

    def later_round() -> list[str]:  # another process's loop: it knows only the run id
        replies = fair_client.run_tool_calls([{**call, "id": "c2"}], run_id=run_id)
        return [reply["content"] for reply in replies]

    _assert_waits_in_lane(fair_client, broker, 3, later_round)


# -- MCP: a session is a run ---------------------------------------------------------------


@pytest.fixture(scope="module")
def mcp_url(
    worker_env: dict[str, str], fair_worker: WorkerProcess, tmp_path_factory: Any
) -> Iterator[str]:
    log = tmp_path_factory.mktemp("mcp-fair") / "mcp.log"
    with mcp_http_process(worker_env, log) as url:
        yield url


def test_an_mcp_sessions_calls_inherit_the_key_its_first_call_named(
    fair_client: ToolClient, broker: Broker, mcp_url: str
) -> None:
    first_done, go = threading.Event(), threading.Event()
    texts: list[str] = []

    async def session() -> None:
        async with Client(streamable_http_client(mcp_url), mode="legacy") as mcp:
            meta: Any = {"toolexec/fairness_key": broker.tenant}
            first = await mcp.call_tool("nap", {"ms": 1, "tag": "first"}, meta=meta)
            texts.append(_text(first))
            first_done.set()
            await anyio.to_thread.run_sync(go.wait, 30)
            texts.append(_text(await mcp.call_tool(CALL[0], CALL[1])))  # no _meta

    runner = threading.Thread(target=lambda: anyio.run(session), daemon=True)
    runner.start()
    assert first_done.wait(30), "the session's first call did not end"
    holder = fair_client.submit("nap", {"ms": HOLD_MS, "tag": "hold"}, fairness_key=broker.tenant)
    assert wait_until(lambda: broker.in_flight() == 1, 10), "the holding call never started"
    go.set()
    seen = wait_until(lambda: broker.waiting_in(3) == 1, HOLD_MS / 1000)
    runner.join(timeout=30)
    assert holder.result().ok
    assert seen, "the session's second call did not wait in its tenant's lane"
    assert [json.loads(t)["data"] for t in texts] == ["first", "framework"]


def _text(result: Any) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text
