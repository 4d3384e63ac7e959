"""Bad calls never run a tool body: checked by the client, and again by the worker.

Calls made through ``client_without_broker`` (a client whose broker port is
closed) prove that nothing was enqueued: any publish would have raised
BrokerUnavailableError. Hits at the FlakyServer prove whether ``record`` ran.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from celery import Celery

from toolexec.client import ToolClient
from toolexec.context import CallContext
from toolexec.errors import ErrorType, UsageError
from toolexec.keys import Keys
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.stores.replies import ReplyBox
from toolexec.testing import FlakyServer

pytestmark = pytest.mark.integration


def _error_type(result: ToolResult) -> ErrorType | None:
    return result.error.type if result.error else None


@pytest.mark.parametrize(
    "bad",
    [
        {"count": "many"},
        {"count": 1, "unit": "kelvin"},
        {"count": 1, "shell": "rm -rf /"},
        {},
    ],
    ids=["wrong-type", "not-in-enum", "unknown-field", "missing-required"],
)
def test_invalid_arguments_are_refused_by_the_client_without_enqueueing(
    client_without_broker: ToolClient, flaky: FlakyServer, bad: dict[str, Any]
) -> None:
    """Given arguments that break ``record``'s schema, the client answers; the body never runs."""
    path = flaky.unique_path("record-client")

    result = client_without_broker.call("record", {"url": flaky.url + path, **bad}, timeout=10)

    assert _error_type(result) == ErrorType.INVALID_ARGUMENTS, result
    assert result.error is not None and result.error.retryable is False
    assert result.attempts == 0
    assert flaky.hits(path) == []


def _publish_raw(celery_app: Celery, arguments: Any) -> CallContext:
    """Send ``tools.record`` as a producer that skipped the client's checks would."""
    now = time.time()
    ctx = CallContext(
        call_id=uuid.uuid4().hex,
        tool="record",
        deadline=now + 10,
        submitted_at=now,
        reply_to=uuid.uuid4().hex,
    )
    celery_app.send_task(
        "tools.record",
        kwargs={"arguments": arguments, "context": ctx.to_json()},
        task_id=ctx.call_id,
        queue="tools",
    )
    return ctx


def _await_reply(client: ToolClient, keys: Keys, ctx: CallContext) -> ToolResult:
    box = ReplyBox(keys, ctx.reply_to, [ctx.call_id])
    box.collect(client.redis, wait=15)
    assert ctx.call_id in box.results, "the worker sent no reply"
    return box.results[ctx.call_id]


@pytest.mark.parametrize(
    "bad",
    [
        {"count": "many"},
        {"count": 1, "unit": "kelvin"},
        {"count": 1, "shell": "rm -rf /"},
        {},
        "not an object",
    ],
    ids=["wrong-type", "not-in-enum", "unknown-field", "missing-required", "not-an-object"],
)
def test_worker_refuses_invalid_arguments_that_bypassed_the_client(
    raw_app: Celery,
    client: ToolClient,
    keys: Keys,
    flaky: FlakyServer,
    bad: dict[str, Any] | str,
) -> None:
    """Given a raw message with bad arguments, the worker answers invalid_arguments unrun."""
    path = flaky.unique_path("record-raw")
    arguments = {"url": flaky.url + path, **bad} if isinstance(bad, dict) else bad

    result = _await_reply(client, keys, _publish_raw(raw_app, arguments))

    assert _error_type(result) == ErrorType.INVALID_ARGUMENTS, result
    assert result.attempts == 0
    assert flaky.hits(path) == []


def test_raw_message_with_valid_arguments_does_run(
    raw_app: Celery, client: ToolClient, keys: Keys, flaky: FlakyServer
) -> None:
    """The control for the test above: the same raw path with good arguments hits the service."""
    path = flaky.unique_path("record-raw-ok")

    result = _await_reply(
        client, keys, _publish_raw(raw_app, {"url": flaky.url + path, "count": 3, "unit": "f"})
    )

    assert result.status == "ok", result
    assert result.data == {"count": 3, "unit": "f"}
    assert len(flaky.hits(path)) == 1
    assert json.loads(flaky.hits(path)[0].body) == {"count": 3, "unit": "f"}


def test_unknown_tool_lists_the_known_tools_without_enqueueing(
    client_without_broker: ToolClient,
) -> None:
    """Given a tool name no worker publishes, the model is told which names exist."""
    result = client_without_broker.call("fetch_weather", {"city": "Oslo"})

    assert _error_type(result) == ErrorType.UNKNOWN_TOOL
    assert result.error is not None
    assert "'fetch_weather'" in result.error.message
    assert result.error.suggestion is not None
    for known in ("fetch", "record", "pause", "http_request"):
        assert known in result.error.suggestion
    assert result.attempts == 0


def test_arguments_as_a_json_string_are_accepted(client: ToolClient) -> None:
    """Given arguments as a JSON string (as models often send them), the call runs."""
    result = client.call("pause", '{"seconds": 0.01}', timeout=10)

    assert result.status == "ok", result
    assert result.data == 0.01


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        ('{"seconds": 0.01', "not valid JSON"),
        ("[0.01]", "must be a JSON object, not list"),
        ([0.01], "must be a JSON object, not list"),
        ("42", "must be a JSON object, not int"),
    ],
    ids=["broken-json", "json-array", "list", "json-number"],
)
def test_malformed_arguments_are_invalid_arguments_without_enqueueing(
    client_without_broker: ToolClient, arguments: Any, complaint: str
) -> None:
    """Given arguments that are not a JSON object, the client says so and sends nothing."""
    result = client_without_broker.call("pause", arguments)

    assert _error_type(result) == ErrorType.INVALID_ARGUMENTS
    assert result.error is not None
    assert complaint in result.error.message
    assert result.attempts == 0


def test_oversized_arguments_are_refused_with_the_limit_in_the_message(
    client_without_broker: ToolClient, settings: Settings
) -> None:
    """Given arguments over the largest a payload store takes, the model reads the size,
    the limit, a way out. (Under that, large arguments are stored, not refused.)"""
    limit = settings.max_argument_bytes
    offline = client_without_broker.settings.model_copy(update={"payload_max_bytes": limit})
    huge = {"url": "http://127.0.0.1:9/x", "count": 1, "unit": "x" * limit}

    with ToolClient(offline) as client:  # settings are read when a client is built
        result = client.call("record", huge)

    assert _error_type(result) == ErrorType.INVALID_ARGUMENTS
    assert result.error is not None
    assert f"the limit is {limit:,}" in result.error.message
    assert "reference" in result.error.message
    assert result.attempts == 0


@pytest.mark.parametrize("name", [42, None, "", b"pause"], ids=["int", "none", "empty", "bytes"])
def test_tool_name_that_is_not_a_string_is_a_usage_error(client: ToolClient, name: Any) -> None:
    """A caller passing a non-string tool name gets UsageError, from call and call_many alike."""
    with pytest.raises(UsageError, match="tool name"):
        client.call(name, {})
    with pytest.raises(UsageError):
        client.call_many([(name, {})])
