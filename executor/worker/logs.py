"""Worker logs as text or as one JSON object per line (``TOOLEXEC_LOG_FORMAT=json``).

Log shippers (Loki, Elasticsearch, CloudWatch) index JSON fields without
parsing rules, so each call's outcome line carries its call id, run id, tool,
status, error type, attempts and elapsed time as fields: an operator can
follow one agent run across workers with one query. ``toolexec worker``
installs the formatter on the handlers Celery sets up, so Celery's own lines
(received, retry, failure) become JSON too; Celery's "succeeded" line of an
answered call is left out (:class:`AnsweredElsewhere`), since the call's own
line says the same.

A line logged while a span is current (an attempt, when ``OTEL_*`` turns
tracing on) carries its ``trace_id`` and ``span_id``, so logs, metrics
(exemplars) and traces join on one id.

Whatever the format, every line is scrubbed on its way to a handler (URL
credentials and credential parameters masked, control characters escaped so
no id can forge a line), and the worker never logs a message's body: at DEBUG
Celery's pool would print each message it runs (up to 1024 characters of
headers and body), and a body holds the call's arguments, secrets included.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from datetime import UTC, datetime
from typing import Any

from celery import signals
from celery.app.trace import LOG_SUCCESS

from toolexec.redaction import scrub_text
from toolexec.results import ToolResult
from toolexec.tracing import current_ids

__all__ = [
    "AnsweredElsewhere",
    "JsonFormatter",
    "NoMessageBodies",
    "Scrubbed",
    "call_fields",
    "drop_duplicate_success_lines",
    "escape_controls",
    "install",
    "logged_outcome",
    "oneline",
    "scrub_handlers",
]

#: The attribute of a log record that carries structured fields (``extra={FIELDS: {...}}``).
FIELDS = "toolexec"


#: What a value shown in a text log line may not contain: a newline (or any
#: other control character) in an id would let a caller write a line of its own.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape_controls(text: str) -> str:
    """``text`` with control characters (newlines included) written as escapes."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def oneline(value: Any, limit: int = 200) -> str:
    """``value`` as text for one log line: control characters escaped, cut at ``limit``.

    Ids come from messages anyone with broker access can write; a run id of
    ``"r1\\nINFO call ... status=ok"`` must show as one line, not two.
    """
    text = escape_controls(value if isinstance(value, str) else repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Scrubbed(logging.Filter):
    """On every handler: one line per record, with credentials masked, whoever logged it.

    Handler filters see the records of every logger, third-party ones too:
    httpx logs each request's full URL at INFO (``HTTP Request: GET
    https://...?token=...``), and an exception's text often quotes a URL.
    Ids and tool output inside a message could hold a newline and forge the
    next line, so control characters are escaped; a traceback keeps its lines.
    """

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format: logging reports it itself
            return True
        clean = escape_controls(scrub_text(message))
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = scrub_text(self._formatter.formatException(record.exc_info))
        return True


def scrub_handlers(logger: logging.Logger | None = None, **_: Any) -> None:
    """Put :class:`Scrubbed` on the handlers of ``logger`` (the root logger by default)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, Scrubbed) for f in handler.filters):
            handler.addFilter(Scrubbed())


def call_fields(result: ToolResult) -> dict[str, Any]:
    """``extra=`` for the line that reports a call's outcome."""
    return {
        FIELDS: {
            "event": "call_finished",
            "call_id": result.call_id,
            "run_id": result.run_id,
            "tool": result.tool,
            "status": result.status,
            "error_type": None if result.error is None else str(result.error.type),
            "attempts": result.attempts,
            "elapsed_ms": result.elapsed_ms,
        }
    }


_logged = threading.local()


def logged_outcome(task_id: str) -> None:
    """This thread just logged the outcome of task ``task_id``'s call (its one line)."""
    _logged.task_id = task_id


class AnsweredElsewhere(logging.Filter):
    """Drops Celery's "Task ... succeeded" line of an attempt whose call's line is logged.

    On Celery's ``celery.app.trace`` logger. toolexec logs each answered call in
    one line with its fields (status, attempts, elapsed time, run id), on the
    thread that then returns from the task; Celery's own success line right
    after it says the same with fewer facts, and each line is a record, a scrub
    and a write on every call. Only the line of the task whose outcome this
    thread logged last is dropped, and only as the next line of Celery's trace
    on that thread: a retry, a failure, a fallback step, a call handed on and
    any other task keep Celery's lines.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        task_id = getattr(_logged, "task_id", None)
        if task_id is None:
            return True
        _logged.task_id = None  # a note stands for this thread's next trace line only
        args = record.args
        ours = isinstance(args, dict) and args.get("id") == task_id
        return not (record.msg is LOG_SUCCESS and ours)


def drop_duplicate_success_lines() -> None:
    """Put :class:`AnsweredElsewhere` on Celery's task-trace logger, once."""
    trace = logging.getLogger("celery.app.trace")
    if not any(isinstance(f, AnsweredElsewhere) for f in trace.filters):
        trace.addFilter(AnsweredElsewhere())


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, process, structured fields.

    Celery's task loggers add ``task_id`` and ``task_name`` to their records;
    they are kept when present.
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.processName,
            "pid": record.process,
        }
        for name in ("task_id", "task_name"):
            value = getattr(record, name, None)
            if value not in (None, "???"):
                line[name] = value
        ids = current_ids()  # formatted on the thread that logged, inside its span
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class NoMessageBodies(logging.Filter):
    """Keeps the arguments of a call out of Celery's DEBUG line about handing it to the pool."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("TaskPool: Apply"):
            record.msg = "TaskPool: Apply %s (message not logged: its arguments may hold secrets)"
            record.args = record.args[:1] if isinstance(record.args, tuple) else ()
        return True


def _use_json(logger: logging.Logger | None = None, **_: Any) -> None:
    for handler in (logger or logging.getLogger()).handlers:
        handler.setFormatter(JsonFormatter())


def install(log_format: str) -> None:
    """Make the worker's log handlers write ``log_format`` (``text`` leaves Celery's own)."""
    pool = logging.getLogger("celery.pool")
    if not any(isinstance(f, NoMessageBodies) for f in pool.filters):
        pool.addFilter(NoMessageBodies())
    signals.after_setup_logger.connect(scrub_handlers, weak=False)
    signals.after_setup_task_logger.connect(scrub_handlers, weak=False)
    if log_format == "json":
        signals.after_setup_logger.connect(_use_json, weak=False)
        signals.after_setup_task_logger.connect(_use_json, weak=False)
        logging.captureWarnings(True)  # Celery's warnings too, as JSON lines
