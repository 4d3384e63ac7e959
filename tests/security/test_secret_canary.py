"""A canary secret, sent every way a caller can send one, leaves no trace.

Before: URL userinfo and credential query parameters showed verbatim in
results, worker log lines (``RetryLater``, ``ToolFailed``), httpx's own
"HTTP Request:" lines and Flower's exception field; ``X-Token``,
``X-Goog-Api-Key``, ``Private-Token`` headers and ``pin``/``pass`` body keys
showed in Flower; a validation failure quoted the whole headers object; the run
guard kept raw arguments in Redis for a day. Now failing, timing-out, invalid
and retried calls, through a real worker, a run guard and a real Flower, leave
the canary in none of: the worker's log, the task events, Flower's API, any
Redis key of the database, the results and the replies for the model.
Issue 22, item 8 added an ``X-Session`` header, ``ssn``, ``card_number`` and
``cvv`` body keys and a ``session=`` URL parameter, which all showed before.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from ops_support import FlowerProcess

from security.hostile_support import Deployment, EventLog, deployment, eventually, redis_values
from toolexec.connection import redis_client
from toolexec.context import CallContext
from toolexec.keys import Keys
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.testing import FlakyServer, Reply

pytestmark = pytest.mark.integration

CANARY = f"cnry{uuid.uuid4().hex[:16]}"

#: The canary of the lone-surrogate test (issue 22, item 3), apart from the one above.
SURROGATE_CANARY = f"srgt{uuid.uuid4().hex[:16]}"


@pytest.fixture(scope="module")
def fleet(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    log = tmp_path_factory.mktemp("canary") / "worker.log"
    with deployment(settings, worker_env, log) as found:
        yield found


@pytest.fixture(scope="module")
def flower(fleet: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlowerProcess]:
    env = {**fleet.env, "TOOLEXEC_REDIS_URL": fleet.settings.redis_url or ""}
    log = tmp_path_factory.mktemp("canary-flower") / "flower.log"
    proc = FlowerProcess(env, "admin", "canary-flower-pw", log).start(fleet.worker.hostname)
    yield proc
    proc.stop()


def _url(flaky: FlakyServer, name: str, *replies: Reply) -> str:
    """A scripted path, reached with the canary as URL password and as query parameters."""
    full = flaky.script(flaky.unique_path(name), *replies)
    query = f"?token={CANARY}&key={CANARY}&session={CANARY}"
    return full.replace("http://", f"http://ada:{CANARY}@") + query


def _hostile_calls(flaky: FlakyServer) -> list[tuple[str, dict[str, Any]]]:
    headers = {
        "X-Token": CANARY,
        "X-Goog-Api-Key": CANARY,
        "Private-Token": CANARY,
        "X-Session": CANARY,
    }
    body = {
        "pin": CANARY,
        "pass": CANARY,
        "ssn": CANARY,
        "card_number": CANARY,
        "cvv": CANARY,
        "city": "Paris",
    }
    return [
        # failing: a permanent 403
        ("http_request", {"url": _url(flaky, "deny", Reply(403, {"e": "no"})), "headers": headers}),
        # retried, then answered
        (
            "http_request",
            {
                "url": _url(flaky, "flaky", Reply(503), Reply(200, {"ok": True})),
                "method": "POST",
                "headers": headers,
                "body": body,
                "params": {"sig": CANARY},
            },
        ),
        # timing out on every attempt
        ("http_request", {"url": _url(flaky, "slow", Reply(200, delay=2.0)), "timeout": 0.3}),
        # a Secret-marked argument, retried after a 503
        (
            "sec_login",
            {
                "url": flaky.script(flaky.unique_path("login"), Reply(503), Reply(200)),
                "user": "ada",
                "token": CANARY,
            },
        ),
        # invalid: the client refuses it, quoting what was wrong
        (
            "http_request",
            {"url": "http://h.example/", "headers": {"Authorization": CANARY, "n": 1}},
        ),
        ("http_request", {"url": f"ftp://ada:{CANARY}@h.example/?password={CANARY}"}),
    ]


def _tool_call(index: int, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    function = {"name": tool, "arguments": json.dumps(arguments)}
    return {"id": f"call_{index}", "type": "function", "function": function}


def _invalid_on_the_worker(
    fleet: Deployment, arguments: dict[str, Any] | None = None
) -> ToolResult:
    """A call the client would have refused, published as is: the worker's model refuses it."""
    ctx = CallContext(
        call_id=uuid.uuid4().hex,
        tool="http_request",
        deadline=time.time() + 20,
        submitted_at=time.time(),
        reply_to=uuid.uuid4().hex,
    )
    arguments = arguments or {
        "url": f"http://ada:{CANARY}@h.example/?token={CANARY}",
        "headers": {"Authorization": f"Bearer {CANARY}", "X-Count": 1},
        "method": "TRACE",
    }
    body = [[], {"arguments": arguments, "context": ctx.to_json()}, {}]
    fleet.publish_raw("tools.http_request", json.dumps(body).encode(), id=ctx.call_id)
    redis = redis_client(fleet.settings.redis_url or "")
    popped = redis.blpop([Keys(fleet.settings.key_prefix).reply(ctx.reply_to)], timeout=20)
    assert popped is not None, fleet.log()[-3000:]
    return ToolResult.model_validate_json(popped[1])


def test_a_canary_secret_is_nowhere_after_failing_timing_out_invalid_and_retried_calls(
    fleet: Deployment, flower: FlowerProcess, flaky: FlakyServer
) -> None:
    calls = _hostile_calls(flaky)
    with EventLog(fleet.client) as events:
        results = [fleet.client.call(tool, arguments, timeout=20) for tool, arguments in calls]
        results.append(_invalid_on_the_worker(fleet))
        replies = fleet.client.run_tool_calls(
            [_tool_call(i, tool, arguments) for i, (tool, arguments) in enumerate(calls)],
            run_id=f"run-{uuid.uuid4().hex[:8]}",
            timeout=20,
        )
        ids = [r.call_id for r in results]
        final = eventually(
            lambda: all(
                flower.task(i).get("state") in ("SUCCESS", "FAILURE") for i in [*ids[:4], ids[6]]
            ),
            timeout=30,
        )
        seen = eventually(
            lambda: (
                {e.get("uuid") for e in events.events if e["type"] == "task-retried"}
                >= {ids[1], ids[3]}
            ),
            timeout=15,
        )

    # the calls did what they were sent to do, so the places below had something to hide
    statuses = [(r.status, r.error.type if r.error else None) for r in results]
    assert results[0].error is not None and results[0].error.type == "forbidden", statuses
    assert results[1].ok and results[3].ok, statuses
    assert results[2].error is not None, statuses
    assert "timeout" in (results[2].error.type, results[2].error.details["last_error"]["type"])
    assert results[4].error is not None and results[4].error.type == "invalid_arguments"
    assert results[5].error is not None and results[5].error.type == "invalid_arguments"
    assert results[6].error is not None and results[6].error.type == "invalid_arguments"
    assert "headers" in results[6].error.message, results[6].error.message
    assert results[1].attempts == 2 and results[3].attempts == 2
    assert final and seen
    assert "HTTP Request:" in fleet.log()  # httpx's own lines were logged, scrubbed
    assert any(e["type"] == "task-failed" for e in events.events)

    places = {
        "results": "\n".join(r.model_dump_json() for r in results),
        "replies for the model": json.dumps(replies),
        "worker log": fleet.log(),
        "task events": json.dumps(events.events, default=str),
        "flower api": json.dumps([flower.task(i) for i in ids])
        + json.dumps(flower.api("/api/tasks")),
    }
    redis = redis_client(fleet.settings.redis_url or "")
    for key, value in redis_values(redis):
        places[f"redis key {key}"] = value
    leaks = [where for where, text in places.items() if CANARY in text]
    assert leaks == [], {where: _around(places[where]) for where in leaks}
    assert all(isinstance(r, ToolResult) for r in results)


def _around(text: str) -> str:
    at = text.index(CANARY)
    return text[max(0, at - 300) : at + 100]


def test_a_lone_surrogate_is_invalid_arguments_and_the_secrets_beside_it_stay_hidden(
    fleet: Deployment, flower: FlowerProcess, flaky: FlakyServer
) -> None:
    """Issue 22, item 3. Before: ``"\\ud800"`` in an argument made the arguments' digest
    raise UnicodeEncodeError on the worker; the call ended internal_error and the error's
    repr, the whole argument text with the API key and the bearer token, went to the
    worker log, the task-failed event and Flower. Now the client answers invalid_arguments
    before publishing (from a dict, and from a model's JSON), the worker does the same for
    a message from elsewhere, and the secret is in none of those places."""
    url = flaky.script(flaky.unique_path("surrogate"), Reply(200, {"ok": True}))
    arguments = {
        "url": url,
        "params": {"api_key": SURROGATE_CANARY, "q": "\ud800"},
        "headers": {"Authorization": f"Bearer {SURROGATE_CANARY}"},
    }
    with EventLog(fleet.client) as events:
        results = [
            fleet.client.call("http_request", arguments, timeout=20),
            _invalid_on_the_worker(fleet, arguments),
        ]
        replies = fleet.client.run_tool_calls(
            [_tool_call(0, "http_request", arguments)],
            run_id=f"run-{uuid.uuid4().hex[:8]}",
            timeout=20,
        )
        ids = [r.call_id for r in results]
        shown = eventually(
            lambda: flower.task(ids[1]).get("state") in ("SUCCESS", "FAILURE"), timeout=30
        )

    assert shown, flower.task(ids[1])
    for result in results:
        assert result.error is not None and result.error.type == "invalid_arguments", result
        assert "params.q" in result.error.message and "surrogate" in result.error.message
    assert "invalid_arguments" in replies[0]["content"], replies
    assert flaky.hits(urlsplit(url).path) == []  # no request went out
    places = {
        "results": "\n".join(r.model_dump_json() for r in results),
        "replies for the model": json.dumps(replies),
        "worker log": fleet.log(),
        "task events": json.dumps(events.events, default=str),
        "flower api": json.dumps([flower.task(i) for i in ids]),
    }
    leaks = [where for where, text in places.items() if SURROGATE_CANARY in text]
    assert leaks == [], {where: places[where][-2000:] for where in leaks}
    assert "internal error" not in fleet.log()
