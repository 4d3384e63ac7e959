"""A pydantic-ai agent whose tool calls run on toolexec workers; offline unless OPENAI_API_KEY."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))  # named pydantic_ai.py, this file would shadow
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # the package: skip it
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from toolexec import ToolClient
from toolexec.integrations.pydantic_ai import toolset
from toolexec.testing import local_stack  # Redis, a weather service that fails once, a worker


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A stand-in model: asks for the weather, then answers with what the tool returned."""
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart("get_weather", {"city": "Oslo"})])
    return ModelResponse(parts=[TextPart(f"The tool said: {messages[-1].parts[0].content}")])


with local_stack() as local, ToolClient(local.settings) as client:
    model = "openai:gpt-4o-mini" if os.environ.get("OPENAI_API_KEY") else FunctionModel(scripted)
    agent = Agent(model, toolsets=[toolset(client)])
    print(agent.run_sync("What is the weather in Oslo?").output)
