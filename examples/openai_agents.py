"""An OpenAI Agents SDK agent whose tool calls run on toolexec workers.

    .venv/bin/python examples/openai_agents.py                   # a scripted model, offline
    OPENAI_API_KEY=... .venv/bin/python examples/openai_agents.py  # OpenAI (OPENAI_MODEL)

``local_stack`` starts what a deployment runs (Redis, a worker with the demo tools,
and a weather service whose first answer for Oslo is a 503). The tools are the
catalog's, in strict mode (the SDK's default); the worker retries the 503 and the
model reads the answer. The scripted model asks for the weather the way a model in
strict mode does (``unit: null`` for "not given"), then answers with what it read.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, ModelResponse, RunConfig, Runner, Usage
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from toolexec import ToolClient
from toolexec.integrations.openai_agents import function_tools
from toolexec.testing import local_stack


class ScriptedModel(Model):
    """A stand-in for a model: one tool call, then an answer quoting the tool's output."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kw: Any
    ) -> ModelResponse:
        outputs = [
            i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        if not outputs:
            arguments = json.dumps({"city": "Oslo", "unit": None})
            call = ResponseFunctionToolCall(
                type="function_call", call_id="call-1", name="get_weather", arguments=arguments
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(
            type="output_text", text=f"The tool said: {outputs[-1]['output']}", annotations=[]
        )
        message = ResponseOutputMessage(
            id="msg-1", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kw: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


async def main() -> None:
    real = bool(os.environ.get("OPENAI_API_KEY"))
    model: Any = os.environ.get("OPENAI_MODEL", "gpt-4o-mini") if real else ScriptedModel()
    with local_stack() as local, ToolClient(local.settings) as client:
        agent = Agent(
            name="weather", instructions="Use the tools.", model=model, tools=function_tools(client)
        )
        # offline, nothing may leave the machine: the SDK's traces go to OpenAI
        result = await Runner.run(
            agent, "What is the weather in Oslo?", run_config=RunConfig(tracing_disabled=not real)
        )
        print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main())
