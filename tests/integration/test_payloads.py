"""Large results and arguments through a real worker: claim checks, previews, paging.

A worker of its own serves tests/payload_tools.py on the ``payloads`` queue and
leaves ``payloads-parked`` alone, so a message published there can be read off
Redis and measured. Results come back on reply lists (toolexec.stores.replies), which
the tests read before the client pops them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from integration_support import stall_queue
from payload_tools import PARKED_QUEUE, make_items, make_text

from toolexec.client import CallHandle, ToolClient
from toolexec.clock import ManualClock
from toolexec.connection import redis_client
from toolexec.errors import PayloadExpiredError, PayloadMissingError
from toolexec.keys import Keys
from toolexec.payloads.tokens import estimate_tokens, json_bytes
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration

MESSAGE_LIMIT = 4096
TEN_MB_LINES = 185_186  # make_text: 54 bytes a line, 10 000 044 bytes


@pytest.fixture(scope="module")
def payload_worker(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    log = tmp_path_factory.mktemp("payload-logs") / "worker.log"
    proc = WorkerProcess("payload_tools", worker_env, queues="payloads", log_path=log)
    proc.start(settings.redis_url or "", settings.key_prefix)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def pclient(settings: Settings, payload_worker: WorkerProcess) -> Iterator[ToolClient]:
    with ToolClient(settings) as tool_client:
        yield tool_client


@pytest.fixture(scope="module")
def raw(settings: Settings) -> Iterator[redis.Redis]:
    client = redis_client(settings.redis_url or "", decode_responses=False)
    yield client
    client.close()


def reply_entry(raw: redis.Redis, keys: Keys, handle: CallHandle) -> bytes:
    """The reply the worker pushed for ``handle``, read before the client pops it."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        entries = raw.lrange(keys.reply(handle.call_id), 0, -1)
        if entries:
            return bytes(entries[0])
        time.sleep(0.02)
    raise AssertionError("the worker pushed no reply within 60 s")


def call_and_measure(
    client: ToolClient, raw: redis.Redis, tool: str, arguments: dict[str, object]
) -> tuple[ToolResult, int]:
    handle = client.submit(tool, arguments, timeout=60)
    entry = reply_entry(raw, client.keys, handle)
    result = handle.result()
    assert result.ok, result.error
    # toolexec tasks ignore results: Celery's backend holds nothing for the call
    assert raw.exists(f"celery-task-meta-{handle.call_id}") == 0
    return result, len(entry)


def test_a_10_mb_text_comes_back_as_a_small_reply_with_head_and_tail(
    pclient: ToolClient, raw: redis.Redis, settings: Settings
) -> None:
    """Given a tool returning 10 MB of text, when it is called, then the reply is < 4 KB,
    the preview fits the token budget and shows head, tail and what was left out."""
    expected = make_text(TEN_MB_LINES)

    result, reply_bytes = call_and_measure(pclient, raw, "big_text", {"lines": TEN_MB_LINES})

    assert reply_bytes < MESSAGE_LIMIT
    ref = result.payload
    assert ref is not None
    assert ref.size_bytes == len(expected.encode()) >= 10_000_000
    assert (ref.unit, ref.count, ref.content_type) == (
        "lines",
        TEN_MB_LINES,
        "text/plain; charset=utf-8",
    )
    preview = result.data
    assert estimate_tokens(json_bytes(preview)) <= settings.payload_token_budget
    assert preview["partial"] is True and "read_payload" in preview["note"]
    lines = preview["text"].split("\n")
    assert lines[0] == expected[:61].split("\n")[0]
    assert lines[-1] == f"{TEN_MB_LINES - 1:08d} the quick brown fox jumps over the lazy dog."
    omitted = next(line for line in lines if "lines omitted" in line)
    assert omitted == f"… {TEN_MB_LINES - (len(lines) - 1):,} lines omitted …"


def test_load_returns_the_identical_text_and_fetch_the_identical_bytes(
    pclient: ToolClient, raw: redis.Redis
) -> None:
    """Given a stored 10 MB result, when loaded, then it is byte for byte the tool's text."""
    expected = make_text(TEN_MB_LINES)
    result, _ = call_and_measure(pclient, raw, "big_text", {"lines": TEN_MB_LINES})
    assert result.payload is not None

    assert result.load() == expected
    fetched = pclient.fetch_payload(result.payload)
    assert fetched == expected.encode()
    assert hashlib.sha256(fetched).hexdigest() == result.payload.sha256


def test_paging_a_text_returns_consecutive_lines(pclient: ToolClient, raw: redis.Redis) -> None:
    """Given a stored text, when read in pages, then the pages are consecutive slices."""
    expected = make_text(TEN_MB_LINES).split("\n")[:-1]
    result, _ = call_and_measure(pclient, raw, "big_text", {"lines": TEN_MB_LINES})
    assert result.payload is not None

    offset: int | None = 185_170
    pages = []
    while offset is not None:
        page = pclient.read_payload(result.payload, offset, 4)
        pages.append(page.entries)
        offset = page.next_offset

    assert pages == [expected[i : i + 4] for i in range(185_170, TEN_MB_LINES, 4)]
    by_key = pclient.read_payload(result.payload.key, 100_000, 3)
    assert by_key.entries == expected[100_000:100_003]


def test_a_100_000_item_array_shows_first_items_and_total_and_pages_by_item(
    pclient: ToolClient, raw: redis.Redis, settings: Settings
) -> None:
    """Given a tool returning 100 000 objects, when called, then the reply is < 4 KB, the
    preview has the first items and the total, and load and paging give the items back."""
    expected = make_items(100_000)

    result, reply_bytes = call_and_measure(pclient, raw, "big_items", {"count": 100_000})

    assert reply_bytes < MESSAGE_LIMIT
    ref = result.payload
    assert ref is not None and (ref.unit, ref.count) == ("items", 100_000)
    preview = result.data
    assert estimate_tokens(json_bytes(preview)) <= settings.payload_token_budget
    assert preview["total_items"] == 100_000
    assert 1 <= len(preview["items"]) < 100
    assert preview["items"] == expected[: len(preview["items"])]
    assert result.load() == expected
    assert pclient.fetch_payload(ref) == json.dumps(expected, separators=(",", ":")).encode()
    first = pclient.read_payload(ref, 50_000, 7)
    second = pclient.read_payload(ref, first.next_offset or 0, 7)
    assert first.entries + second.entries == expected[50_000:50_014]


def test_a_log_preview_lists_error_lines_first(pclient: ToolClient, raw: redis.Redis) -> None:
    """Given a large log with rare errors, when previewed, then its ERROR lines come first."""
    result, _ = call_and_measure(pclient, raw, "big_log", {"lines": 50_000, "every": 5_000})

    problems = result.data["warnings_and_errors"]
    assert problems[0] == "line 5,001: 2026-01-01T00:00:00Z ERROR job 5000 failed: disk full"
    assert len(problems) == 9
    assert "about 9 WARN/ERROR lines" in result.data["note"]


def test_a_tools_own_token_budget_bounds_its_preview(pclient: ToolClient, raw: redis.Redis) -> None:
    """Given @tool(payload_token_budget=200), when it returns a large text, then the
    preview stays within 200 tokens even though the settings allow more."""
    result, _ = call_and_measure(pclient, raw, "terse_text", {"lines": 2_000})

    assert result.payload is not None
    assert estimate_tokens(json_bytes(result.data)) <= 200


def test_a_large_argument_leaves_the_broker_message_small(
    pclient: ToolClient, raw: redis.Redis, settings: Settings
) -> None:
    """Given a 10 MB document argument, when the call is published, then the message on
    the broker is < 4 KB and carries a reference instead of the document."""
    if (settings.broker_url or "redis").startswith("amqp"):
        pytest.skip("reads the parked message from a Redis broker's list; this run's is RabbitMQ")
    raw.delete(PARKED_QUEUE)
    stall_queue(pclient.redis, pclient.keys, PARKED_QUEUE)
    pclient.submit("parked_digest", {"document": make_text(TEN_MB_LINES)}, timeout=5)

    messages = raw.lrange(PARKED_QUEUE, 0, -1)
    raw.delete(PARKED_QUEUE)

    assert len(messages) == 1
    assert len(messages[0]) < MESSAGE_LIMIT
    envelope = json.loads(messages[0])
    _args, kwargs, _embed = json.loads(base64.b64decode(envelope["body"]))
    ref = kwargs["arguments"]["document"]["$toolexec_payload"]
    assert ref["size_bytes"] == TEN_MB_LINES * 54 and ref["unit"] == "lines"


def test_the_worker_resolves_a_stored_argument_before_running_the_tool(
    pclient: ToolClient,
) -> None:
    """Given a 10 MB document argument, when the tool runs, then it sees the whole document."""
    document = make_text(TEN_MB_LINES)

    result = pclient.call("digest", {"document": document}, timeout=60)

    assert result.ok, result.error
    assert result.data == {
        "chars": len(document),
        "sha256": hashlib.sha256(document.encode()).hexdigest(),
    }


def test_an_expired_reference_is_a_clear_error(
    pclient: ToolClient, raw: redis.Redis, settings: Settings
) -> None:
    """Given a stored result whose TTL has run out, when it is loaded, then the client
    raises PayloadExpiredError saying what expired and what to do, not a crash."""
    result, _ = call_and_measure(pclient, raw, "big_text", {"lines": 2_000})
    ref = result.payload
    assert ref is not None and ref.expires_at is not None
    payload_key = pclient.keys.payload(ref.key)
    raw.pexpire(payload_key, 1)  # Redis's own expiry, after a millisecond
    raw.pexpire(payload_key + ".index", 1)
    while raw.exists(payload_key):
        time.sleep(0.005)

    later = ToolClient(settings, clock=ManualClock(ref.expires_at + 1))
    with pytest.raises(PayloadExpiredError) as expired:
        later.fetch_payload(ref)
    with pytest.raises(PayloadExpiredError):
        later.read_payload(ref, 0, 10)
    later.close()

    message = str(expired.value)
    assert ref.key in message and "expired at" in message and "Call the tool again" in message
    with pytest.raises(PayloadMissingError, match="not in the redis payload store"):
        result.load()  # by this client's clock it should still be there: missing, not expired


def test_a_reference_read_through_another_kind_of_store_says_so(
    pclient: ToolClient, raw: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    """Given a result stored in Redis, when a client configured for a directory reads it,
    then the error names both stores and the setting to fix."""
    result, _ = call_and_measure(pclient, raw, "big_text", {"lines": 2_000})
    assert result.payload is not None
    elsewhere = settings.model_copy(update={"payload_store": f"file://{tmp_path}"})

    with ToolClient(elsewhere) as other, pytest.raises(PayloadMissingError) as lost:
        other.fetch_payload(result.payload)

    assert "redis store" in str(lost.value) and "TOOLEXEC_PAYLOAD_STORE" in str(lost.value)
