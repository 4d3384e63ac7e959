"""Each tool as its own Celery task, ``tools.<name>``: the adapter from a verdict to Celery.

The task rebuilds the context, asks the executor for a verdict on this
attempt and maps that value onto Celery, in one place (:meth:`ToolTask.act`):

* :class:`Final`: the runtime concludes the call (fallback decision, then the
  one delivery); the task returns (SUCCESS) or raises :class:`ToolFailed`
  (FAILURE, with the error type in Flower);
* :class:`Retry` and :class:`Defer`: ``Task.retry`` with the countdown the
  policy computed (Celery's own backoff is whole seconds and blind to
  Retry-After and deadlines) and the context carried forward; a deferral uses
  no attempt;
* :class:`NoReply`: another worker answers; the task simply returns.

Everything the task uses lives in the process's
:class:`~toolexec.tasks.runtime.WorkerRuntime`.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any, NoReturn

from celery import Celery, Task
from celery.exceptions import Retry as CeleryRetry

from toolexec.context import CallContext
from toolexec.errors import ErrorType
from toolexec.layers.batch import Batch
from toolexec.pipeline.execution import Defer, Final, Retry, Verdict
from toolexec.redaction import scrub_text, secret_names, shown_kwargs, withhold_arguments
from toolexec.registry import ToolSpec
from toolexec.tasks.runtime import WorkerRuntime, attempt_number, runtime_of

__all__ = [
    "InternalFailure",
    "RetryReason",
    "ToolFailed",
    "ToolTask",
    "attempt_number",
    "internal_message",
    "register_tool_task",
]

log = logging.getLogger("toolexec.worker")

#: Extra seconds past a tool's own limit before prefork's hard limit kills the
#: child: the executor's own limit should always fire first.
_HARD_LIMIT_GRACE_S = 30


class ToolFailed(Exception):
    """A call ended in failure; raised so Celery and Flower show FAILURE."""


class ToolTask(Task):  # type: ignore[misc]
    """Base class of every ``tools.<name>`` task."""

    spec: ToolSpec
    throws = (ToolFailed,)
    acks_late = True
    ignore_result = True
    typing = False  # arguments are validated by the tool's own model

    @property
    def runtime(self) -> WorkerRuntime:
        return runtime_of(self.app)

    def act(
        self, arguments: Any, ctx: CallContext, verdict: Verdict, settlement: Batch | None = None
    ) -> str:
        """Map the executor's verdict onto Celery; see the module doc.

        ``settlement`` holds the attempt's writes that are not sent yet (the
        layers' records); they go out with the answer, or before the message
        comes back: one round trip either way.

        What it returns is Flower's result column, in one short line: Celery
        ``saferepr``s every task's return value for its log line and its
        task-succeeded event, which for a dict costs a dozen times what it
        costs for a string, on every call.
        """
        number = attempt_number(self.request.retries, ctx)
        runtime = self.runtime
        settlement = Batch() if settlement is None else settlement
        if isinstance(verdict, Final):
            step = runtime.conclude(self.spec, arguments, ctx, verdict, number, settlement)
            result = verdict.result
            if result.error is not None:
                raise ToolFailed(
                    f"{result.error.type}: {result.error.message} (attempts: {result.attempts})"
                )
            return f"{result.status} after {result.attempts} attempt(s): {step}"
        if isinstance(verdict, Retry):
            error_type = verdict.error.error_type
            runtime.observers.retrying(self.spec, ctx, number, error_type, settlement)
            runtime.flush(settlement, ctx, verdict.delay)
            # the text reaches Celery's log line and the task-retried event (Flower)
            error = scrub_text(f"{verdict.error.error_type}: {verdict.error.message}")
            why = f"{error}; retrying in {verdict.delay:.3f} s"
            self._again(ctx, verdict.context, verdict.delay, self._retries_allowed(verdict), why)
        runtime.observers.withdrawn(self.spec, ctx, number, settlement)
        runtime.flush(settlement, ctx, verdict.delay if isinstance(verdict, Defer) else 0.0)
        if isinstance(verdict, Defer):
            # Celery counts a deferral as a retry though it used no attempt: always allow it
            why = (
                f"rate limited by toolexec; waiting {verdict.delay:.3f} s for a slot"
                if verdict.context.slot_for
                else f"waiting {verdict.delay:.3f} s on toolexec's retry budget or breaker"
            )
            self._again(ctx, verdict.context, verdict.delay, int(self.request.retries) + 1, why)
        log.info("call %s tool=%s: answered elsewhere (%s)", ctx.call_id, ctx.tool, verdict.reason)
        return f"no_reply: {verdict.reason}"

    def _retries_allowed(self, verdict: Retry) -> int:
        """A retry gets the tool's own allowance plus the deferrals so far."""
        return int(self.max_retries) + verdict.context.deferrals

    def _again(
        self, ctx: CallContext, carried: CallContext, delay: float, allowed: int, why: str
    ) -> NoReturn:
        """Send this call's message again after ``delay`` with ``carried``; raises Celery's Retry.

        The broker refusing the retry ends the call now rather than leave the
        caller waiting for a reply that would never come.
        """
        kwargs = {**self.request.kwargs, "context": carried.to_json()}
        try:
            raise self.retry(
                kwargs=kwargs,
                exc=RetryReason(why),
                countdown=delay,
                max_retries=allowed,
                # Celery would show the retry's kwargs with saferepr, secrets and all.
                kwargsrepr=self._shown(kwargs),
            )
        except CeleryRetry:
            raise
        except Exception as publish_error:
            message = (
                f"a retry could not be scheduled ({type(publish_error).__name__}: "
                f"{publish_error}); last error: {why}"
            )
            number = attempt_number(self.request.retries, ctx)
            self.runtime.fail(carried, ErrorType.INTERNAL_ERROR, message, number)
            raise

    def _shown(self, kwargs: Any) -> str:
        """``kwargsrepr`` of a message this task sends, secrets redacted as the client does."""
        return shown_kwargs(kwargs or {}, secret_names(self.spec.json_schema()))


class RetryReason(Exception):
    """The text Celery shows as a retry's reason (RETRY in Flower, the log line); no data."""


def _run_tool(self: ToolTask, arguments: Any, context: dict[str, Any]) -> str:
    ctx = CallContext.from_json(context)
    runtime = self.runtime
    number = attempt_number(self.request.retries, ctx)
    # one round trip to admit the attempt (the counter with the layers' asks)
    # and one to settle it (their records, the counter, the answer)
    admission, settlement = Batch(), Batch()
    runtime.observers.started(self.spec, ctx, number, admission)
    try:
        verdict = runtime.executor.attempt(
            self.spec, arguments, ctx, number, admission=admission, settlement=settlement
        )
    except Exception as exc:  # a bug in toolexec; the caller still gets an answer
        message = internal_message(exc, arguments, f"running {self.spec.name}")
        runtime.fail(ctx, ErrorType.INTERNAL_ERROR, message, number, settlement)
        raise InternalFailure(message) from None
    return self.act(arguments, ctx, verdict, settlement)


class InternalFailure(Exception):
    """A call met a bug in toolexec; raised (FAILURE in Flower) in place of what was raised.

    Celery puts the ``repr`` of whatever a task raises, and its traceback with
    every chained exception, into the worker log, the task-failed event and
    Flower's task page; an exception may quote the arguments it failed on (a
    ``UnicodeEncodeError`` carries the whole text). This one carries only the
    masked message and is raised ``from None``, so nothing of the original leaves.
    """


def internal_message(exc: BaseException, arguments: Any, doing: str) -> str:
    """What an unexpected exception says, with the call's arguments withheld; logged here.

    The worker log still gets where it happened: the frames (file, line, code),
    which quote no values, with the masked message.
    """
    message = withhold_arguments(f"{type(exc).__name__}: {exc}", arguments)
    frames = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
    log.error("internal error %s: %s\nTraceback (values withheld):\n%s", doing, message, frames)
    return message


def register_tool_task(celery_app: Celery, spec: ToolSpec) -> Task:
    """Create the Celery task that runs ``spec`` on ``celery_app``."""
    return celery_app.task(
        name=spec.task_name,
        base=ToolTask,
        bind=True,
        spec=spec,
        max_retries=spec.policy.retry.max_attempts - 1,
        time_limit=int(spec.policy.timeout) + _HARD_LIMIT_GRACE_S,
        queue=spec.policy.queue,
    )(_run_tool)
