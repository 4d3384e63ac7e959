"""``toolexec.fallback``: the task that starts a chain and runs its cache and explanation steps.

Thin like the tool tasks: it rebuilds the context, asks the worker's
:class:`~toolexec.fallback.chain.ChainRunner` what comes next and carries it out
(send the next step, or deliver the answer). It runs on the primary tool's
queue, where workers import the primary's module and so its argument
mappings. It is never retried: a chain step that cannot go on answers with
the explanation rather than leave the caller waiting.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, Task

from toolexec.context import CallContext
from toolexec.fallback.chain import Action, Deliver, Send
from toolexec.fallback.state import FALLBACK_TASK
from toolexec.ops.metrics import record_fallback
from toolexec.tasks.tool_task import ToolTask, worker_state

__all__ = ["FallbackTask", "carry_out", "register_fallback_task"]

log = logging.getLogger("toolexec.fallback")


def carry_out(task: ToolTask, ctx: CallContext, action: Action) -> str:
    """Do what a chain decided; returns what happened, for Flower's result column.

    A step that cannot be sent (the broker refused it) ends the chain with its
    explanation, delivered at once.
    """
    if isinstance(action, Deliver):
        task._finish(ctx, action.result)
        if action.result.source is not None:
            record_fallback(action.result.tool, action.result.source)
        return f"answered from {action.result.source}"
    try:
        _send(task.app, action)
    except Exception as exc:
        log.exception("could not send fallback step %s of call %s", action.task, ctx.call_id)
        step_ctx = CallContext.from_json(action.kwargs["context"])
        reason = f"could not send {action.task} ({type(exc).__name__}: {exc})"
        task._finish(ctx, worker_state(task.app).chains.explain_now(step_ctx, reason))
        return "answered with the explanation: " + reason
    return f"sent {action.task} ({action.task_id})"


def _send(celery_app: Celery, action: Send) -> None:
    celery_app.send_task(
        action.task,
        kwargs=action.kwargs,
        kwargsrepr=action.shown,
        task_id=action.task_id,
        queue=action.queue,
        ignore_result=True,
    )


class FallbackTask(ToolTask):
    """Base of ``toolexec.fallback``: a tool task's delivery; it raises nothing that retries."""


def _run_fallback(self: FallbackTask, arguments: Any, context: dict[str, Any]) -> dict[str, Any]:
    ctx = CallContext.from_json(context)
    action = worker_state(self.app).chains.advance(ctx, arguments)
    return {"step": carry_out(self, ctx, action)}


def register_fallback_task(celery_app: Celery) -> Task:
    """Create ``toolexec.fallback`` on ``celery_app``; its queue is chosen per message."""
    return celery_app.task(name=FALLBACK_TASK, base=FallbackTask, bind=True)(_run_fallback)
