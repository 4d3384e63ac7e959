"""toolexec's catalog as native tools of agent frameworks, one module per framework.

``toolexec.integrations.openai_agents`` (the OpenAI Agents SDK),
``toolexec.integrations.pydantic_ai`` and ``toolexec.integrations.langchain``; each
is installed with the extra of the same name (``pip install toolexec[pydantic-ai]``)
and imports its framework only when it is imported itself, so ``import toolexec``
never does. Every tool they build calls through a :class:`~toolexec.ToolClient`
(validation, queues, retries, breakers, fallbacks, payloads, the run guard) and
hands the model what :meth:`~toolexec.ToolResult.content` renders.
"""

__all__: list[str] = []
