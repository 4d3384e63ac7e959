"""A poison message must not take down the worker that reads it.

Before: Celery 5.7's handler raised an uncaught TypeError/ValueError on each of
these bodies, the worker exited and the message went back to the head of the
queue, so every restarted worker died right after "ready". Now each is refused,
logged once with its id and never its body, dead-lettered, and the worker
serves the next call.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest

from security.hostile_support import FLEETS, Deployment, dead_letters, eventually, fleet_of
from toolexec.connection import redis_client
from toolexec.keys import Keys
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

#: A string that must never appear in a log: it rides inside every poison body.
MARK = f"poison-{uuid.uuid4().hex}"

POISON_BODIES: list[object] = [
    None,
    5,
    True,
    1.5,
    MARK,
    [],
    [[]],
    [[], {}],
    [[], {"arguments": {"text": MARK}}, {}, MARK],
    {"a": MARK},
    [MARK, {}, {}],
    [[], [MARK], {}],
    [[], {}, MARK],
]


@pytest.fixture(scope="module", params=FLEETS)
def fleet(
    request: pytest.FixtureRequest,
    settings: Settings,
    worker_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    log = tmp_path_factory.mktemp("poison") / f"worker-{request.param}.log"
    with fleet_of(request.param, settings, worker_env, log) as found:
        yield found


def _refusals(fleet: Deployment, task_id: str) -> int:
    return sum(
        1 for line in fleet.log().splitlines() if f"refused task message id={task_id} " in line
    )


def test_every_poison_body_is_refused_dead_lettered_and_the_worker_keeps_serving(
    fleet: Deployment,
) -> None:
    """Given a live worker, when each poison body is published as a call of a registered tool,
    then each is logged once by id (never its body), dead-lettered with a TTL, the worker
    process is still running, and a normal call afterwards succeeds."""
    ids = [fleet.publish_raw("tools.sec_echo", json.dumps(body).encode()) for body in POISON_BODIES]

    refused_all = eventually(lambda: all(_refusals(fleet, i) >= 1 for i in ids), timeout=30)
    result = fleet.client.call("sec_echo", {"text": "still serving"}, timeout=20)

    log = fleet.log()
    assert refused_all, log[-4000:]
    assert [_refusals(fleet, i) for i in ids] == [1] * len(ids)
    assert MARK not in log
    assert fleet.alive()
    assert result.ok, result
    assert result.data == "still serving"
    redis = redis_client(fleet.settings.redis_url or "")
    key = Keys(fleet.settings.key_prefix).deadletter()
    letters = {entry["id"]: entry for entry in dead_letters(redis, key)}
    assert set(ids) <= set(letters)
    assert all(MARK not in json.dumps(entry) for entry in letters.values())
    assert all(letters[i]["task"] == "tools.sec_echo" for i in ids)
    assert len(letters[ids[0]]["sha256"]) == 64
    assert 0 < redis.ttl(key) <= 7 * 86_400


@pytest.mark.parametrize(
    "headers",
    [
        {"id": "forged\nINFO call x status=ok"},
        {"expires": "not a time"},
        {"eta": "yesterday-ish"},
        {"retries": "many"},
        {"timelimit": ["soon", None]},
    ],
    ids=["newline-id", "bad-expires", "bad-eta", "bad-retries", "bad-timelimit"],
)
def test_a_well_shaped_body_with_hostile_headers_is_refused_too(
    fleet: Deployment, headers: dict[str, object]
) -> None:
    """Given a good body with a header Celery would choke on (or that would forge a log line),
    then the message is refused without stopping the worker and the tool does not run."""
    # a live deadline and a reply list of its own: a run would answer there (deadline 0 never ran)
    reply_to = f"r-{uuid.uuid4().hex}"
    deadline = time.time() + 60
    context = {"call_id": "x", "tool": "sec_echo", "deadline": deadline, "reply_to": reply_to}
    body = json.dumps([[], {"arguments": {"text": MARK}, "context": context}, {}]).encode()
    before = fleet.log().count("refused task message")

    fleet.publish_raw("tools.sec_echo", body, **headers)

    assert eventually(lambda: fleet.log().count("refused task message") > before), fleet.log()[
        -3000:
    ]
    assert "\nINFO call x status=ok" not in fleet.log()
    assert MARK not in fleet.log()
    assert fleet.client.call("sec_echo", {"text": "ok"}, timeout=20).ok
    replies = Keys(fleet.settings.key_prefix).reply(reply_to)  # a later call ran: no run of x
    assert redis_client(fleet.settings.redis_url or "").llen(replies) == 0
    assert fleet.alive()


def test_a_body_that_is_not_json_is_refused_without_logging_it(fleet: Deployment) -> None:
    """Given bytes that do not decode as the JSON they claim to be, then the message is
    refused and dead-lettered by id, and neither the bytes nor a traceback are logged."""
    task_id = fleet.publish_raw("tools.sec_echo", f"[[], {{'{MARK}': ".encode())

    assert eventually(lambda: f"refused task message id={task_id} " in fleet.log())
    assert MARK not in fleet.log()
    assert fleet.client.call("sec_echo", {"text": "ok"}, timeout=20).ok
    assert fleet.alive()
