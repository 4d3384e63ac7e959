"""The message guard: it stands between the broker and Celery's task handlers.

Celery's consumer builds one function that receives every task message
(``Consumer.create_task_handler``). toolexec's consumer
(:class:`toolexec.worker.consumer.Consumer`) hands that function to the guard this
bootstep creates, and the guard sees each message first, so that:

* a malformed message (``toolexec.pipeline.poison.message_problem``, or anything
  Celery's handler raises while parsing it) is refused: logged once with its
  id and never its body, dead-lettered to ``Keys.deadletter`` and rejected,
  while the worker keeps serving; without it the exception stops the worker;
* a message whose caller stopped waiting (past its deadline and grace) is
  acknowledged without running or answering (``toolexec.pipeline.expiry``);
* a message for a task this worker lacks (a tool deployed to some workers
  only) is handed back to its queue for a worker that has it, a bounded
  number of times, and then answered and dead-lettered. Celery would log its
  whole body at ERROR, drop it and write a ``celery-task-meta-*`` key for an
  id anyone can choose.

It also refuses a message whose ``eta`` lies beyond its call's deadline (or
beyond ``eta_horizon_s`` without one), and any with an ``eta`` once the worker
holds ``worker_max_scheduled`` of them (``toolexec.pipeline.poison.eta_problem``); and it
is where the Redis transport's refusals of items that are no envelope at all
(:mod:`toolexec.transport.inbox`) are dead-lettered.

It is the narrowest seam Celery offers that sees every message before its
handler does, for every task (tools, the fallback task and Celery's own), and
it needs no change to Celery's ``strategies`` dict.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis
from celery import bootsteps
from celery.exceptions import InvalidTaskError
from celery.worker import state as worker_state
from kombu.exceptions import ContentDisallowed, DecodeError

from toolexec.connection import fail_fast_client, redis_url
from toolexec.context import CallContext
from toolexec.errors import ErrorType
from toolexec.fairness import is_amqp
from toolexec.keys import DEADLETTER_MAX, DEADLETTER_TTL_S, Keys
from toolexec.pipeline.execution import error_result
from toolexec.pipeline.poison import (
    HANDBACK_HEADER,
    MAX_HANDBACKS,
    GiveUp,
    call_context,
    eta_problem,
    fingerprint,
    handback_count,
    message_problem,
    short_hash,
    unknown_task_fate,
)
from toolexec.results import ErrorInfo
from toolexec.stores.replies import deliver
from toolexec.tasks.stale import StaleMessages
from toolexec.transport import inbox
from toolexec.worker import amqp_caps
from toolexec.worker.app import settings_of
from toolexec.worker.logs import oneline

__all__ = ["MessageGuard"]

log = logging.getLogger("toolexec.worker")

Handler = Callable[..., Any]

#: What Celery's handler raises on a message it cannot parse (bad headers,
#: a body of the wrong shape, content it refuses): a refusal, not a crash.
_PARSE_ERRORS = (
    TypeError,
    ValueError,
    KeyError,
    AttributeError,
    OverflowError,
    InvalidTaskError,
    ContentDisallowed,
    DecodeError,
)


class _Guard:
    """What the step does with a message; one per consumer."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        settings = settings_of(consumer.app)
        self._keys = Keys(settings.key_prefix)
        self._url = redis_url(settings)
        self._redis: redis.Redis | None = None
        self._stale = StaleMessages(consumer)
        self._horizon_s = settings.eta_horizon_s
        self._max_scheduled = settings.worker_max_scheduled
        # a fairness key's max_in_flight on RabbitMQ is checked here, before Celery's handler
        self._capping = settings.rabbitmq_fairness and is_amqp(str(consumer.app.conf.broker_url))
        if self._capping:
            amqp_caps.connect()
        inbox.set_refusal_sink(self.dead_letter_raw)

    def _client(self) -> redis.Redis:
        if self._redis is None:
            self._redis = fail_fast_client(self._url)
        return self._redis

    def guarding(self, handler: Handler, known: Mapping[str, Any]) -> Handler:
        """Celery's ``on_task_received`` behind the guard; ``known``: Celery's task strategies."""

        def on_task_received(message: Any) -> Any:
            headers = message.headers
            name = headers.get("task") if isinstance(headers, Mapping) else None
            problem = _problem(message) if isinstance(name, str) else "its task header is no name"
            if problem is not None:
                self.refuse(message, problem)
                return None
            if name not in known:
                self.on_unknown(str(name), message)
                return None
            if self._stale.dropped(message, _payload(message)) or self._refused_for_eta(message):
                return None
            if self._capping and not amqp_caps.admit(self._consumer, message, time.time()):
                return None
            try:
                return handler(message)
            except _PARSE_ERRORS as exc:
                self.refuse(message, f"Celery could not read it ({type(exc).__name__})")
                return None

        return on_task_received

    def _refused_for_eta(self, message: Any) -> bool:
        """Refuse (and answer its caller) a message whose eta the worker cannot hold."""
        problem = self._eta_problem(message)
        if problem is not None:
            self.refuse(message, problem)
            self._answer(
                call_context(_payload(message)),
                problem,
                "Call again without a delay beyond the call's timeout, or later.",
            )
        return problem is not None

    def _eta_problem(self, message: Any) -> str | None:
        scheduled = len(worker_state.scheduled_requests)
        return eta_problem(
            message.headers,
            _payload(message),
            time.time(),
            self._horizon_s,
            scheduled,
            self._max_scheduled,
        )

    def on_unknown(self, name: str, message: Any) -> None:
        headers = message.headers if isinstance(message.headers, Mapping) else {}
        context = call_context(_payload(message))
        fate = unknown_task_fate(name, handback_count(headers), context, time.time())
        if isinstance(fate, GiveUp):
            self.refuse(message, f"unregistered task of type {oneline(name)!r}: {fate.reason}")
            self._answer(context, fate.reason)
            return
        log.warning(
            "Received unregistered task of type %r id=%s; handing it back for a worker "
            "that has it (%d of at most %d, in %.1f s)",
            oneline(name),
            oneline(headers.get("id")),
            fate.count,
            MAX_HANDBACKS,
            fate.delay,
        )
        self._consumer.timer.call_after(fate.delay, self._hand_back, (message, fate.count))

    def _hand_back(self, message: Any, count: int) -> None:
        """Publish a copy with the count raised, then acknowledge; on failure requeue as is."""
        info = message.delivery_info or {}
        properties = {
            k: v
            for k, v in (message.properties or {}).items()
            if k in ("correlation_id", "reply_to", "priority")
        }
        try:
            with self._consumer.app.producer_pool.acquire(block=True) as producer:
                producer.publish(
                    message.body,
                    exchange=info.get("exchange") or "",
                    routing_key=info.get("routing_key"),
                    headers={**message.headers, HANDBACK_HEADER: count},
                    content_type=message.content_type,
                    content_encoding=message.content_encoding,
                    retry=True,
                    **properties,
                )
            message.ack()
        except Exception as exc:  # the broker keeps the message: it comes back by itself
            log.warning("could not hand a message back (%s); requeued", type(exc).__name__)
            with contextlib.suppress(Exception):
                message.reject(requeue=True)

    def refuse(self, message: Any, reason: str) -> None:
        """Log once (id, task, reason; never the body), dead-letter, reject."""
        headers = message.headers if isinstance(message.headers, Mapping) else {}
        task_id, task = oneline(headers.get("id")), oneline(headers.get("task"))
        info = message.delivery_info if isinstance(message.delivery_info, Mapping) else {}
        log.error(
            "refused task message id=%s task=%s queue=%s sha256=%s: %s; dead-lettered "
            "(body not logged)",
            task_id,
            task,
            oneline(info.get("routing_key")),
            short_hash(message.body),
            oneline(reason),
        )
        self._dead_letter(message, task_id, task, reason)
        with contextlib.suppress(Exception):
            message.reject_log_error(log, self._consumer.connection_errors, requeue=False)

    def _dead_letter(self, message: Any, task_id: str, task: str, reason: str) -> None:
        info = message.delivery_info if isinstance(message.delivery_info, Mapping) else {}
        self._record(
            {
                "id": task_id,
                "task": task,
                "queue": oneline(info.get("routing_key")),
                "reason": reason,
                "at": time.time(),
                "content_type": oneline(message.content_type),
                **fingerprint(message.body),
            }
        )

    def dead_letter_raw(self, queue: str, item: bytes, reason: str, headers: Any) -> None:
        """Record an item the transport refused before it became a message
        (toolexec.transport.inbox)."""
        found = headers if isinstance(headers, Mapping) else {}
        self._record(
            {
                "id": oneline(found.get("id")),
                "task": oneline(found.get("task")),
                "queue": oneline(queue),
                "reason": reason,
                "at": time.time(),
                "content_type": "",
                **fingerprint(item),
            }
        )

    def _record(self, entry: dict[str, Any]) -> None:
        key = self._keys.deadletter()
        try:
            pipe = self._client().pipeline(transaction=False)
            pipe.lpush(key, json.dumps(entry))
            pipe.ltrim(key, 0, DEADLETTER_MAX - 1)
            pipe.expire(key, DEADLETTER_TTL_S)
            pipe.execute()
        except redis.RedisError as exc:  # the refusal itself must still happen
            log.warning("could not record a dead letter: %s", type(exc).__name__)

    def _answer(
        self,
        context: Mapping[str, Any] | None,
        reason: str,
        suggestion: str = "The tool is being deployed or no longer served; try again later.",
    ) -> None:
        """Tell a waiting caller that no worker took the call, rather than let it time out."""
        if context is None:
            return
        try:
            ctx = CallContext.from_json(dict(context))
            now = time.time()
            info = ErrorInfo(
                type=ErrorType.UNAVAILABLE,
                message=f"no worker that runs the tool {ctx.tool!r} took the call ({reason}).",
                retryable=True,
                suggestion=suggestion,
            )
            result = error_result(ctx, info, attempts=0, now=now)
            deliver(self._client(), self._keys, ctx.reply_to, result, ctx.deadline - now)
        except Exception as exc:  # a context of the wrong shape: nobody to answer
            log.warning("could not answer the caller of a dropped message: %s", type(exc).__name__)


def _payload(message: Any) -> Any:
    try:
        return message.payload
    except Exception:
        return None


def _problem(message: Any) -> str | None:
    try:
        payload = message.payload
    except ContentDisallowed as exc:
        return str(exc)
    except Exception as exc:
        return f"its body cannot be decoded ({type(exc).__name__})"
    return message_problem(message.headers, payload)


class MessageGuard(bootsteps.Step):  # type: ignore[misc]
    """Gives the consumer its guard before it starts consuming (see the module docstring)."""

    name = "toolexec.message_guard"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        # read by toolexec.worker.consumer.Consumer, which puts it in front of Celery's handler
        parent.toolexec_guard = _Guard(parent)
