"""Worker log lines as JSON: one object per record, with a call's fields on its outcome line."""

from __future__ import annotations

import json
import logging
import sys

from toolexec.results import ErrorInfo, ToolResult
from toolexec.worker.logs import JsonFormatter, NoMessageBodies, call_fields


def _record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("toolexec.worker", logging.INFO, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    return record


def test_a_call_outcome_line_carries_the_call_fields_at_the_top_level() -> None:
    result = ToolResult(
        status="error",
        tool="fetch",
        call_id="c1",
        run_id="r1",
        error=ErrorInfo(type="timeout", message="slow", retryable=True),
        attempts=3,
        elapsed_ms=1234.5,
    )

    line = json.loads(JsonFormatter().format(_record("call %s", "c1", **call_fields(result))))

    assert line["message"] == "call c1"
    assert line["level"] == "INFO" and line["logger"] == "toolexec.worker"
    assert {k: line[k] for k in ("call_id", "run_id", "tool", "attempts", "error_type")} == {
        "call_id": "c1",
        "run_id": "r1",
        "tool": "fetch",
        "attempts": 3,
        "error_type": "timeout",
    }
    assert line["elapsed_ms"] == 1234.5
    assert line["event"] == "call_finished"
    assert line["ts"].endswith("+00:00")


def test_a_success_has_no_error_type() -> None:
    result = ToolResult(status="ok", tool="fetch", call_id="c1", attempts=1, elapsed_ms=5.0)

    assert call_fields(result)["toolexec"]["error_type"] is None


def test_an_exception_and_celerys_task_fields_are_kept_on_one_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = _record("failed", task_id="t1", task_name="tools.fetch")
        record.exc_info = sys.exc_info()

    text = JsonFormatter().format(record)

    assert "\n" not in text
    line = json.loads(text)
    assert (line["task_id"], line["task_name"]) == ("t1", "tools.fetch")
    assert "RuntimeError: boom" in line["exc_info"]


def test_celerys_debug_line_about_a_message_never_carries_its_body() -> None:
    """At DEBUG Celery's pool prints each message it runs, arguments included; the worker's
    filter keeps only the target."""
    record = logging.LogRecord(
        "celery.pool",
        logging.DEBUG,
        __file__,
        1,
        "TaskPool: Apply %s (args:%s kwargs:%s)",
        ("<fn>", "('tools.login', {...}, b'{\"token\": \"s3cret\"}')", "{}"),
        None,
    )

    assert NoMessageBodies().filter(record)

    assert "s3cret" not in record.getMessage()
    assert record.getMessage().startswith("TaskPool: Apply <fn> (message not logged")


def _celery_success(task_id: str) -> logging.LogRecord:
    from celery.app.trace import LOG_SUCCESS

    context = {"id": task_id, "name": "tools.fetch", "return_value": "'ok'", "runtime": 0.1}
    return logging.LogRecord(
        "celery.app.trace", logging.INFO, __file__, 1, LOG_SUCCESS, (context,), None
    )


def test_celerys_success_line_is_dropped_only_for_the_call_this_thread_just_logged() -> None:
    import threading

    from toolexec.worker.logs import AnsweredElsewhere, logged_outcome

    drop = AnsweredElsewhere()
    assert drop.filter(_celery_success("c1"))  # nothing logged yet: Celery's line stays
    logged_outcome("c1")
    assert not drop.filter(_celery_success("c1"))  # the line repeating toolexec's goes
    assert drop.filter(_celery_success("c1"))  # once: a second line of the same id stays
    logged_outcome("c2")
    assert drop.filter(_celery_success("c3"))  # another task's line stays...
    assert drop.filter(_celery_success("c2"))  # ...and the note was for that next line only
    logged_outcome("c4")
    seen: list[bool] = []
    other = threading.Thread(target=lambda: seen.append(drop.filter(_celery_success("c4"))))
    other.start()
    other.join()
    assert seen == [True]  # noted on this thread only
    retry = logging.LogRecord(
        "celery.app.trace",
        logging.INFO,
        __file__,
        1,
        "Task %(name)s[%(id)s] retry",
        ({"id": "c4", "name": "t"},),
        None,
    )
    assert drop.filter(retry)  # not the success line: kept
