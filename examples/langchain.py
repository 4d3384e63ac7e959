"""A LangChain tool-calling loop whose tool calls run on toolexec workers.

    .venv/bin/python examples/langchain.py                   # a scripted chat model, offline
    OPENAI_API_KEY=... .venv/bin/python examples/langchain.py  # ChatOpenAI

(a real model needs ``pip install langchain-openai``)

``local_stack`` starts Redis, a worker with the demo tools and a weather service
whose first answer for Oslo is a 503; the worker retries it and the model reads the
answer. The loop is LangChain's own: bind the tools, invoke the model, run each
tool call with ``tool.invoke(call, config)`` and send the ``ToolMessage`` back. The
run config's ``thread_id`` is the toolexec run id, so the run guard sees the loop.
"""

from __future__ import annotations

import os
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from toolexec import ToolClient
from toolexec.integrations.langchain import tools
from toolexec.testing import local_stack


class ScriptedChat(BaseChatModel):
    """A stand-in for a chat model: one tool call, then an answer quoting the tool's output."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            reply = AIMessage(f"The tool said: {last.content}")
        else:
            call = {"name": "get_weather", "args": {"city": "Oslo"}, "id": "call-1"}
            reply = AIMessage("", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def chat_model() -> Any:
    if not os.environ.get("OPENAI_API_KEY"):
        return ScriptedChat()
    from langchain_openai import ChatOpenAI  # pip install langchain-openai

    return ChatOpenAI(model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))


def main() -> None:
    with local_stack() as local, ToolClient(local.settings) as client:
        by_name = {t.name: t for t in tools(client)}
        model = chat_model().bind_tools(list(by_name.values()))
        config: Any = {"configurable": {"thread_id": "weather-example"}}
        messages: list[BaseMessage] = [HumanMessage("What is the weather in Oslo?")]
        for _ in range(10):
            reply = model.invoke(messages, config)
            messages.append(reply)
            if not reply.tool_calls:
                break
            messages += [by_name[call["name"]].invoke(call, config) for call in reply.tool_calls]
        print(messages[-1].content)


if __name__ == "__main__":
    main()
