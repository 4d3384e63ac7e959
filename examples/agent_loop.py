"""A complete agent loop on toolexec: a model's tool calls run on workers, under a run guard.

    .venv/bin/python examples/agent_loop.py                # scripted model, no network
    OPENAI_API_KEY=... .venv/bin/python examples/agent_loop.py     # OpenAI (OPENAI_MODEL)
    ANTHROPIC_API_KEY=... .venv/bin/python examples/agent_loop.py  # Claude (ANTHROPIC_MODEL)

It starts what a deployment runs: Redis (``TOOLEXEC_REDIS_URL``, or an embedded
Valkey), a local weather and orders service that misbehaves on purpose, and a
worker with the demo's tools (``get_weather``, ``query_order``), the built-in
``http_request`` and this module, which adds ``weather_mirror`` as the fallback
of ``get_weather``. Then the loop: the model answers, its tool calls go to
``client.run_tool_calls`` with the run id, the replies go back into the
conversation, until the model answers without calling a tool.

The scripted model plays a run that shows every layer once:

1. retries: the weather service fails twice with 503 for Oslo; the worker
   retries and the model only ever sees the answer;
2. a fallback: for Bergen the service keeps failing; once ``get_weather`` is
   out of attempts its fallback chain asks ``weather_mirror``, and the model
   gets that answer marked ``degraded``, with its source and the primary's error;
3. a nudge, then a disabled tool, then an abort: the model keeps asking for
   the same order; the guard attaches its previous answer, then refuses the
   tool for a turn, then stops the run with a summary the model answers from.

With the scripted model the example is also a check: it exits 1 if one of
these did not happen. With a real model it only shows what happened.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import httpx

import toolexec.tasks.demo_tools  # noqa: F401  get_weather must exist before its fallback is set
from toolexec import RunBudget, Settings, ToolClient, default_registry, tool
from toolexec.adapters import Format, parse_tool_calls
from toolexec.embedded import ensure_embedded, stop_embedded
from toolexec.fallback import Alternative
from toolexec.testing import FlakyServer, Reply, WorkerProcess

#: The worker imports the demo's tools and this file (for the fallback below).
TOOLS_MODULES = "toolexec.tasks.demo_tools,agent_loop"
EXAMPLES = Path(__file__).resolve().parent
SERVICE_URL_ENV = "TOOLEXEC_DEMO_SERVICE_URL"  # read by the tools, in the worker
MAX_TURNS = 20
BUDGET = RunBudget(max_steps=12, max_wall_s=120, repeat_threshold=3)
TASK = "What is the weather in Oslo and in Bergen, and has order A-1001 shipped?"


# -- the fallback the worker runs ----------------------------------------------------


@tool(timeout=2.0, max_attempts=2, backoff_base=0.1, backoff_cap=0.2)
def weather_mirror(city: str, unit: Literal["c", "f"] = "c") -> dict[str, Any]:
    """A copy of the weather service, updated hourly: what get_weather falls back to."""
    base = os.environ[SERVICE_URL_ENV].rstrip("/")
    with httpx.Client(timeout=2.0) as http:
        response = http.get(f"{base}/mirror/weather/{city}")
        response.raise_for_status()
    report = response.json()
    celsius = float(report["temp_c"])
    temperature = celsius if unit == "c" else round(celsius * 9 / 5 + 32, 1)
    return {
        "city": city,
        "temperature": temperature,
        "unit": unit,
        "conditions": report["conditions"],
    }


default_registry.set_fallbacks("get_weather", [Alternative("weather_mirror")])


# -- the models ----------------------------------------------------------------------


@dataclass
class Turn:
    """One model response: what to append to the conversation, and its tool calls."""

    message: dict[str, Any]
    tool_calls: Any = None
    text: str = ""
    tokens: int = 0


class Model(Protocol):
    format: Format
    name: str

    def start(self, task: str) -> list[dict[str, Any]]: ...

    def respond(self, messages: list[dict[str, Any]]) -> Turn: ...

    def replies(self, replies: list[dict[str, Any]]) -> list[dict[str, Any]]: ...


Call = tuple[str, dict[str, Any]]


def _body(message: dict[str, Any]) -> dict[str, Any]:
    content: dict[str, Any] = json.loads(message["content"])
    return content


def _summary(reply: dict[str, Any]) -> dict[str, Any] | None:
    """The guard's summary, when this reply says the run is over."""
    error = _body(reply).get("error") or {}
    if error.get("type") not in ("run_aborted", "run_budget_exhausted"):
        return None
    summary: dict[str, Any] = error["details"]["summary"]
    return summary


def _data(result: Any) -> Any:
    """A result as the summary keeps it: the model's view, or its start as text if long."""
    return result.get("data") if isinstance(result, dict) else result


class ScriptedModel:
    """Plays a fixed run in OpenAI's format; reads the replies like a model would."""

    format: Format = "openai"
    name = "scripted model (no network)"

    def __init__(self) -> None:
        self.ids = iter(range(1, 1000))
        order = [("query_order", {"order_id": "A-1001"})]
        self.script: list[Callable[[list[dict[str, Any]]], list[Call]]] = [
            lambda last: [("get_weather", {"city": "Oslo"}), *order],
            lambda last: [("get_weather", {"city": "Bergen"})],
            *[lambda last: order] * 4,  # "has it shipped yet?", again and again
        ]

    def start(self, task: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": task}]

    def respond(self, messages: list[dict[str, Any]]) -> Turn:
        mine = max(i for i, m in enumerate(messages) if m["role"] in ("user", "assistant"))
        last = messages[mine + 1 :]  # the replies to this model's latest tool calls
        stopped = next((s for m in last if (s := _summary(m)) is not None), None)
        calls = self.script.pop(0)(last) if self.script and stopped is None else []
        if not calls:
            text = self._answer(stopped)
            return Turn({"role": "assistant", "content": text}, text=text)
        tool_calls = [
            {
                "id": f"call_{next(self.ids)}",
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps(args)},
            }
            for tool, args in calls
        ]
        message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
        return Turn(message, tool_calls)

    def _answer(self, stopped: dict[str, Any] | None) -> str:
        """Wrap up from the guard's summary, the only memory of the run a model needs."""
        if stopped is None:
            return "I have no more tool calls to make."
        found = "; ".join(
            # the guard keeps a hash of each call's arguments, never the values (secrets)
            f"{r['tool']} -> {json.dumps(_data(r['result']))}"
            for r in stopped["last_results"]
        )
        stuck = stopped["stuck_on"]
        return (
            f"The run guard stopped me after {stopped['rounds']} turns (I kept calling "
            f"{stuck.get('tool')}). What the tools returned: {found}."
        )

    def replies(self, replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return replies


class OpenAIModel:
    """A real chat-completions model; its SDK objects go to run_tool_calls as they are."""

    format: Format = "openai"

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        import openai

        self.sdk = openai.OpenAI()
        self.name = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
        self.tools = tools

    def start(self, task: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": task}]

    def respond(self, messages: list[dict[str, Any]]) -> Turn:
        # Plain dicts of the shapes the SDK's TypedDicts describe (the tests check them).
        response = self.sdk.chat.completions.create(
            model=self.name, messages=cast(Any, messages), tools=cast(Any, self.tools)
        )
        message = response.choices[0].message
        usage = response.usage.total_tokens if response.usage else 0
        param: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:  # only the fields a request may carry back
            param["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        return Turn(param, message.tool_calls, message.content or "", usage)

    def replies(self, replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return replies


class AnthropicModel:
    """A real Claude model; ``tool_use`` blocks in, ``tool_result`` blocks back."""

    format: Format = "anthropic"

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        import anthropic

        self.sdk = anthropic.Anthropic()
        self.name = os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-5")
        self.tools = tools

    def start(self, task: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": task}]

    def respond(self, messages: list[dict[str, Any]]) -> Turn:
        response = self.sdk.messages.create(
            model=self.name,
            max_tokens=1024,
            messages=cast(Any, messages),
            tools=cast(Any, self.tools),
        )
        content = [block.model_dump(exclude_none=True) for block in response.content]
        text = " ".join(b.text for b in response.content if b.type == "text")
        calls = [b for b in response.content if b.type == "tool_use"]
        usage = response.usage.input_tokens + response.usage.output_tokens
        return Turn({"role": "assistant", "content": content}, calls or None, text, usage)

    def replies(self, replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": replies}]


# -- the loop ------------------------------------------------------------------------


@dataclass
class Transcript:
    """What the model was told, call by call, for the report and the checks."""

    calls: list[tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    answer: str = ""

    def kinds(self, tool: str | None = None) -> list[str]:
        return [_kind(reply) for name, _, reply in self.calls if tool is None or name == tool]


def _kind(reply: dict[str, Any]) -> str:
    if "guard" in reply:
        return str(reply["guard"]["verdict"])
    if reply.get("degraded"):
        return f"degraded from {reply.get('source')}"
    return str((reply.get("error") or {}).get("type") or reply["status"])


def _line(tool: str, args: dict[str, Any], reply: dict[str, Any]) -> str:
    call = f"{tool}({json.dumps(args)})"
    if "guard" in reply:
        return f"  ! {call} ran; nudge: {reply['guard']['hint']}"
    error = reply.get("error")
    data = json.dumps(reply.get("data"))[:100]
    if reply.get("degraded"):
        why = (reply.get("fallback") or {}).get("primary_error", {}).get("type")
        return f"  ~ {call} -> {why}; answered by the fallback {reply.get('source')}: {data}"
    if error is None:
        return f"  ✓ {call} -> {data}"
    return f"  ✗ {call} -> {error['type']}: {error['message']}"


def agent_loop(
    model: Model, client: ToolClient, run_id: str, say: Callable[[str], None]
) -> Transcript:
    """The loop an agent framework runs, with toolexec doing the tool side."""
    guard = client.run_guard(run_id, BUDGET)
    messages = model.start(TASK)
    transcript = Transcript()
    for number in range(1, MAX_TURNS + 1):
        turn = model.respond(messages)
        messages.append(turn.message)
        if turn.tokens:
            guard.report_tokens(turn.tokens)
        if not turn.tool_calls:
            transcript.answer = turn.text
            say(f"turn {number}: the model answers:\n  {turn.text}")
            return transcript
        replies = client.run_tool_calls(turn.tool_calls, format=model.format, guard=guard)
        messages.extend(model.replies(replies))
        say(f"turn {number}:")
        for call, reply in zip(
            parse_tool_calls(turn.tool_calls, model.format), replies, strict=True
        ):
            body = _body(reply)
            transcript.calls.append((call.tool, call.arguments, body))
            say(_line(call.tool, call.arguments, body))
    say(f"the model was still calling tools after {MAX_TURNS} turns")
    return transcript


# -- what the example starts -------------------------------------------------------------


def _script(service: FlakyServer) -> None:
    weather = {"temp_c": 4.0, "conditions": "light rain"}
    service.script("/weather/Oslo", Reply(503), Reply(503), Reply(200, weather))
    service.script("/weather/Bergen", Reply(503))  # the last reply repeats: down for good
    service.script("/mirror/weather/Bergen", Reply(200, {"temp_c": 7.0, "conditions": "cloudy"}))
    service.script("/orders/A-1001", Reply(200, {"order_id": "A-1001", "status": "shipped"}))


@contextmanager
def services(say: Callable[[str], None]) -> Iterator[tuple[Settings, FlakyServer]]:
    """Redis, the service and a worker under a key prefix of their own; all stopped after."""
    base = Settings.from_env()
    data_dir = Path(tempfile.mkdtemp(prefix="toolexec-agent-"))
    embedded = None if base.redis_url else ensure_embedded(data_dir)
    url = base.redis_url or (embedded.url if embedded else "")
    prefix = f"agent-{uuid.uuid4().hex[:8]}"
    settings = Settings.from_env(
        redis_url=url, key_prefix=prefix, default_queue=prefix, data_dir=data_dir, task_events=False
    )
    service = FlakyServer().start()
    os.environ[SERVICE_URL_ENV] = service.url
    env = {
        "TOOLEXEC_REDIS_URL": url,
        "TOOLEXEC_KEY_PREFIX": prefix,
        "TOOLEXEC_DEFAULT_QUEUE": prefix,
        "TOOLEXEC_TASK_EVENTS": "false",
        "TOOLEXEC_DATA_DIR": str(data_dir),
        "TOOLEXEC_HTTP_ALLOW": "127.0.0.1",
        SERVICE_URL_ENV: service.url,
    }
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")])
    worker = WorkerProcess(TOOLS_MODULES, env, concurrency=8, cwd=data_dir)
    try:
        _script(service)
        worker.start(url, prefix)
        say(f"worker ready (tools from {TOOLS_MODULES}); service at {service.url}")
        yield settings, service
    finally:
        worker.stop()
        service.stop()
        if embedded is not None and embedded.started_here:
            stop_embedded(data_dir)


def _model(client: ToolClient) -> tuple[Model, bool]:
    """A real model when an API key is set, else the script; and whether it is scripted."""
    if os.environ.get("OPENAI_API_KEY"):
        return OpenAIModel(client.tool_definitions("openai")), False
    if os.environ.get("ANTHROPIC_API_KEY"):
        return AnthropicModel(client.tool_definitions("anthropic")), False
    return ScriptedModel(), True


def checks(transcript: Transcript, service: FlakyServer) -> list[tuple[str, bool]]:
    """What the scripted run must have shown."""
    weather = transcript.kinds("get_weather")
    return [
        (
            "retries: Oslo answered after the service failed twice (3 requests, 1 result)",
            len(service.hits("/weather/Oslo")) == 3 and weather[:1] == ["ok"],
        ),
        (
            "fallback: Bergen answered by weather_mirror after 3 failed attempts, marked degraded",
            weather[1:2] == ["degraded from weather_mirror"]
            and len(service.hits("/weather/Bergen")) == 3
            and len(service.hits("/mirror/weather/Bergen")) == 1,
        ),
        ("nudge: a repeated call ran with a hint", "nudge" in transcript.kinds()),
        ("disable: the repeated tool was refused", "tool_disabled" in transcript.kinds()),
        ("abort: the run was stopped with a summary", "run_aborted" in transcript.kinds()),
        (
            "the model answered from the abort's summary",
            "stopped me" in transcript.answer and "shipped" in transcript.answer,
        ),
    ]


def main() -> int:
    def say(text: str) -> None:
        print(text, flush=True)

    with services(say) as (settings, service), ToolClient(settings) as client:
        model, scripted = _model(client)
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        limits = f"{BUDGET.max_steps} steps, {BUDGET.max_wall_s:g} s"
        say(f"agent loop with {model.name}, run {run_id}, budget {limits}\n")
        transcript = agent_loop(model, client, run_id, say)
        if not scripted:
            return 0
        results = checks(transcript, service)
    say("")
    for label, passed in results:
        say(f"{'✓' if passed else '✗'} {label}")
    return 0 if all(passed for _, passed in results) else 1


if __name__ == "__main__":
    sys.exit(main())
