"""Issue 18, item 7: model input must not raise what the client promises never to raise.

The client raises only :class:`UsageError` (misuse, before anything is
published) and infrastructure errors; everything a model can get wrong is a
typed ``invalid_arguments`` result. A client whose broker is gone proves the
"before anything is published" part: a call that got as far as publishing would
raise :class:`BrokerUnavailableError` instead. Hypothesis throws random JSON and
random tool-call shapes at the client and the adapters.
"""

from __future__ import annotations

import json
import math
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from hostile_input_support import isolated_worker
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from toolexec.adapters import ToolCall, parse_tool_calls
from toolexec.bounds import MAX_ARGUMENT_DEPTH
from toolexec.client import ToolClient
from toolexec.context import CallContext
from toolexec.errors import BrokerUnavailableError, ErrorType, InfrastructureError, UsageError
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.stores.replies import ReplyBox
from toolexec.worker.app import create_app

pytestmark = pytest.mark.integration

PROPERTY = hsettings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.fixture(scope="module")
def worker_and_client(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ToolClient]:
    with isolated_worker(settings, worker_env, tmp_path_factory.mktemp("model-input")) as (
        _,
        client,
    ):
        yield client


@pytest.fixture(scope="module")
def online(worker_and_client: ToolClient) -> ToolClient:
    return worker_and_client


@pytest.fixture(scope="module")
def offline(online: ToolClient) -> Iterator[ToolClient]:
    """The same catalog, but no broker: whatever reaches publishing raises BrokerUnavailable."""
    dead = online.settings.model_copy(
        update={"broker_url": f"redis://127.0.0.1:{_closed_port()}/0"}
    )
    with ToolClient(dead) as client:
        client.catalog(refresh=True)
        yield client


def _invalid(result: ToolResult, words: str) -> None:
    assert result.status == "error" and result.error is not None, result
    assert result.error.type == ErrorType.INVALID_ARGUMENTS, result.error
    assert words in result.error.message, result.error.message


# -- nesting -------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_ARGUMENT_DEPTH + 1, 300, 495, 500, 5_000, 50_000])
def test_deeply_nested_arguments_are_invalid_arguments_not_a_crash(
    offline: ToolClient, depth: int
) -> None:
    """Before: ~500 levels raised RecursionError in redact()."""
    value = nested(depth)

    as_dict = offline.call("hi_echo", {"value": value})
    as_text = offline.call("hi_echo", '{"value": ' + "[" * depth + "]" * depth + "}")

    _invalid(as_dict, "levels deep")
    _invalid(as_text, "levels deep")


def test_nesting_up_to_the_limit_still_runs(online: ToolClient) -> None:
    value = nested(MAX_ARGUMENT_DEPTH - 1)

    result = online.call("hi_echo", {"value": value}, timeout=20)

    assert result.status == "ok" and result.data == value


@pytest.mark.parametrize("depth", [300, 495])
def test_the_worker_refuses_deep_arguments_that_skipped_the_client(
    online: ToolClient, depth: int
) -> None:
    """Before: a message with 300-495 levels answered internal_error on the worker."""
    now = time.time()
    ctx = CallContext(
        call_id=uuid.uuid4().hex,
        tool="hi_echo",
        deadline=now + 15,
        submitted_at=now,
        reply_to=uuid.uuid4().hex,
    )
    producer: Celery = create_app(online.settings)
    try:
        producer.send_task(
            "tools.hi_echo",
            kwargs={"arguments": {"value": nested(depth)}, "context": ctx.to_json()},
            task_id=ctx.call_id,
            queue=online.settings.default_queue,
        )
    finally:
        producer.close()
    box = ReplyBox(online.keys, ctx.reply_to, [ctx.call_id])
    box.collect(online.redis, wait=20)

    _invalid(box.results[ctx.call_id], "levels deep")


# -- malformed tool calls ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "calls",
    [
        [{}],  # before: KeyError
        {"tool_calls": 5},  # before: TypeError
        {"choices": 5},
        [{"id": 5, "function": {"name": "hi_echo"}}],
        [{"type": "tool_use", "name": "hi_echo", "input": {}}],
        "not calls",
        [5],
    ],
)
def test_a_malformed_tool_call_list_is_a_usage_error_before_publishing(
    offline: ToolClient, calls: Any
) -> None:
    fmt = "anthropic" if "tool_use" in json.dumps(calls) else "openai"
    with pytest.raises(UsageError):
        offline.run_tool_calls(calls, format=fmt)


@pytest.mark.parametrize(
    "call",
    [
        {"id": "c1", "function": 5},
        {"id": "c1", "function": {"name": 7, "arguments": "{}"}},
        {"id": "c1", "function": {"name": "hi_echo", "arguments": "[" * 3000 + "]" * 3000}},
        {"id": "c1", "function": {"name": "hi_echo", "arguments": '{"value": NaN}'}},
        {"id": "c1", "function": {"name": "hi_echo", "arguments": "{not json"}},
        {"id": "c1", "type": "custom", "custom": 3},
    ],
)
def test_a_malformed_call_from_the_model_is_an_invalid_arguments_reply(
    offline: ToolClient, call: dict[str, Any]
) -> None:
    """Each answers the model without a publish (no BrokerUnavailableError)."""
    [reply] = offline.run_tool_calls([call])

    assert reply["tool_call_id"] == "c1"
    assert json.loads(reply["content"])["error"]["type"] == "invalid_arguments"


# -- the caller's own parameters --------------------------------------------------------------


@pytest.mark.parametrize(
    "timeout", [math.nan, math.inf, -math.inf, "5", True, -1, 0, [5], {"s": 5}]
)
def test_a_bad_timeout_is_a_usage_error_before_publishing(
    offline: ToolClient, timeout: Any
) -> None:
    """Before: nan published the call and returned at once; "5" raised TypeError."""
    with pytest.raises(UsageError, match="timeout"):
        offline.call("hi_echo", {"value": 1}, timeout=timeout)
    with pytest.raises(UsageError, match="timeout"):
        offline.run_tool_calls(
            [{"id": "c1", "function": {"name": "hi_echo", "arguments": "{}"}}], timeout=timeout
        )


@pytest.mark.parametrize("run_id", [5, b"r1", "", "x" * 300, "run\nINFO forged line", ["r"]])
def test_a_bad_run_id_is_a_usage_error_before_publishing(offline: ToolClient, run_id: Any) -> None:
    """Before: run_id=5 raised after the call was published."""
    with pytest.raises(UsageError, match="run_id"):
        offline.call("hi_echo", {"value": 1}, run_id=run_id)
    with pytest.raises(UsageError, match="run_id"):
        offline.run_tool_calls(
            [{"id": "c1", "function": {"name": "hi_echo", "arguments": "{}"}}], run_id=run_id
        )


def test_a_good_call_on_the_offline_client_does_reach_publishing(offline: ToolClient) -> None:
    """The control: the offline client really does raise once a call gets that far."""
    with pytest.raises(BrokerUnavailableError):
        offline.call("hi_echo", {"value": 1}, timeout=5, run_id="r-ok")


# -- random input ----------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=40,
)


@PROPERTY
@given(arguments=json_values | st.text(max_size=60))
def test_random_arguments_give_a_result_or_reach_publishing(
    offline: ToolClient, arguments: Any
) -> None:
    try:
        result = offline.call("hi_echo", arguments, timeout=5)
    except BrokerUnavailableError:
        return  # valid arguments: the client went as far as publishing
    assert result.status == "error" and result.error is not None
    assert result.error.type == ErrorType.INVALID_ARGUMENTS


@hsettings(max_examples=25, deadline=None)
@given(
    value=json_values.filter(lambda v: "NaN" not in json.dumps(v) and "Inf" not in json.dumps(v))
)
def test_random_json_through_a_real_worker_comes_back_or_is_refused(
    online: ToolClient, value: Any
) -> None:
    result = online.call("hi_echo", {"value": value}, timeout=20)

    assert result.status == "ok", result.error
    assert result.data == value


_KEYS = ["id", "type", "function", "name", "arguments", "input", "tool_calls", "choices",
         "message", "content", "custom"]  # fmt: skip
shapes = st.recursive(
    st.none()
    | st.integers()
    | st.sampled_from(["function", "tool_use", "custom", "hi_echo", "c1", "{}", "text"])
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(_KEYS), children, max_size=5)
    ),
    max_leaves=30,
)


@hsettings(max_examples=400, deadline=None)
@given(shape=shapes, fmt=st.sampled_from(["openai", "anthropic"]))
def test_random_tool_call_shapes_parse_or_are_a_usage_error(shape: Any, fmt: str) -> None:
    try:
        calls = parse_tool_calls(shape, fmt)  # type: ignore[arg-type]
    except UsageError:
        return
    assert all(isinstance(c, ToolCall) and isinstance(c.id, str) and c.id for c in calls)


@PROPERTY
@given(shape=shapes, fmt=st.sampled_from(["openai", "anthropic"]))
def test_random_tool_call_shapes_through_the_client_never_raise_anything_else(
    offline: ToolClient, shape: Any, fmt: str
) -> None:
    try:
        replies = offline.run_tool_calls(shape, format=fmt, timeout=5)  # type: ignore[arg-type]
    except (UsageError, InfrastructureError):
        return
    assert isinstance(replies, list)


@pytest.mark.parametrize(
    "url",
    ["http://a{b}.com/", "http://a b.com/", "http://[::1/", "http://" + "a" * 300 + ".com/"],
)
def test_a_strange_url_reaches_publishing_instead_of_raising_in_the_breaker_check(
    offline: ToolClient, url: str
) -> None:
    """Before: braces, blanks or a long host made the per-host breaker's name raise
    UsageError, and an unparsable URL raised ValueError, on the client."""
    with pytest.raises(BrokerUnavailableError):
        offline.call("http_request", {"url": url}, timeout=5)


@hsettings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tail=st.text(max_size=80))
def test_random_urls_reach_publishing_or_are_invalid_arguments(
    offline: ToolClient, tail: str
) -> None:
    try:
        result = offline.call("http_request", {"url": "http://" + tail}, timeout=5)
    except BrokerUnavailableError:
        return
    assert result.error is not None and result.error.type == ErrorType.INVALID_ARGUMENTS


@pytest.mark.parametrize("tokens", [math.nan, math.inf, -1, 1.5, "100", True, 10**13])
def test_token_usage_from_outside_is_a_whole_number(offline: ToolClient, tokens: Any) -> None:
    guard = offline.run_guard(f"tokens-{uuid.uuid4().hex[:8]}")

    with pytest.raises(UsageError, match="tokens"):
        guard.report_tokens(tokens)
    assert not guard.view().exists  # nothing was written
