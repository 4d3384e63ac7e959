"""``toolexec.fallback``: the task that starts a chain and runs its cache and explanation steps.

Thin like the tool tasks: it rebuilds the context, asks the runtime's
:class:`~toolexec.fallback.chain.ChainRunner` what comes next and has the
runtime carry it out (send the next step, or deliver the answer through the
one delivery, to the call and every call that joined it). It runs on the
primary tool's queue, where workers import the primary's module and so its
argument mappings. It is never retried: a chain step that cannot go on answers
with the explanation rather than leave the caller waiting.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, Task

from toolexec.context import CallContext
from toolexec.fallback.state import FALLBACK_TASK
from toolexec.tasks.runtime import attempt_number, runtime_of
from toolexec.tasks.tool_task import InternalFailure, internal_message

__all__ = ["FallbackTask", "register_fallback_task"]


class FallbackTask(Task):  # type: ignore[misc]
    """Base of ``toolexec.fallback``: it raises nothing that retries."""

    acks_late = True
    ignore_result = True
    typing = False


def _run_fallback(self: FallbackTask, arguments: Any, context: dict[str, Any]) -> dict[str, Any]:
    ctx = CallContext.from_json(context)
    runtime = runtime_of(self.app)
    try:
        action = runtime.chains.advance(ctx, arguments)
    except Exception as exc:  # a bug in toolexec: its text may quote the arguments
        raise InternalFailure(
            internal_message(exc, arguments, f"in the fallback chain of {ctx.tool}")
        ) from None
    return {"step": runtime.carry_out(ctx, action, attempt_number(self.request.retries, ctx))}


def register_fallback_task(celery_app: Celery) -> Task:
    """Create ``toolexec.fallback`` on ``celery_app``; its queue is chosen per message."""
    return celery_app.task(name=FALLBACK_TASK, base=FallbackTask, bind=True)(_run_fallback)
