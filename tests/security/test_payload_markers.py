"""Issue 18, item 8: payload markers in model input.

Before: the worker put back any ``$toolexec_payload`` marker it found in a
call's arguments, so a model that wrote one read whatever payload it could
name, and the errors said whether a key existed and how large it was. Now only
markers the client signed (HMAC, deployment secret) are resolved, checked
before the store is asked anything.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hostile_input_support import isolated_worker

from toolexec.client import ToolClient
from toolexec.connection import redis_client
from toolexec.errors import ErrorType
from toolexec.keys import Keys
from toolexec.payloads import MarkerSigner, marker_signer
from toolexec.payloads.offload import ARGUMENT_MARKER
from toolexec.payloads.signing import SIGNATURE_KEY
from toolexec.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ToolClient]:
    with isolated_worker(settings, worker_env, tmp_path_factory.mktemp("markers")) as (_, c):
        yield c


@pytest.fixture(scope="module")
def victim(client: ToolClient) -> dict[str, Any]:
    """A payload another call stored: a 100 KB result, as its reference's JSON."""
    result = client.call("hi_capped", {"kilobytes": 100}, timeout=30)
    assert result.payload is not None
    return result.payload.model_dump(mode="json")


def _refused(result: Any) -> str:
    assert result.status == "error" and result.error is not None, result
    assert result.error.type == ErrorType.INVALID_ARGUMENTS
    assert "did not make" in result.error.message
    message: str = result.error.message
    return message


def test_a_model_written_marker_does_not_read_another_calls_payload(
    client: ToolClient, victim: dict[str, Any]
) -> None:
    result = client.call("hi_echo", {"value": {ARGUMENT_MARKER: victim}}, timeout=20)

    message = _refused(result)
    assert "y" * 100 not in str(result.model_dump())  # nothing of the payload came back
    assert victim["key"] not in message and f"{victim['size_bytes']:,}" not in message


def test_the_refusal_is_the_same_whether_the_key_exists_or_not(
    client: ToolClient, victim: dict[str, Any]
) -> None:
    missing = {**victim, "key": uuid.uuid4().hex}

    there = _refused(client.call("hi_echo", {"value": {ARGUMENT_MARKER: victim}}, timeout=20))
    gone = _refused(client.call("hi_echo", {"value": {ARGUMENT_MARKER: missing}}, timeout=20))

    assert there == gone


@pytest.mark.parametrize("signature", ["", "0" * 64, "not hex", None, 5, "deadbeef" * 8])
def test_a_forged_signature_is_refused(
    client: ToolClient, victim: dict[str, Any], signature: Any
) -> None:
    marker = {ARGUMENT_MARKER: victim, SIGNATURE_KEY: signature}

    _refused(client.call("hi_echo", {"value": marker}, timeout=20))


def test_a_signed_marker_moved_to_another_argument_is_refused(
    client: ToolClient, victim: dict[str, Any]
) -> None:
    signer = marker_signer(client.settings, client.redis)
    signed_for_other = {ARGUMENT_MARKER: victim, SIGNATURE_KEY: signer.sign("document", victim)}

    _refused(client.call("hi_echo", {"value": signed_for_other}, timeout=20))


def test_the_clients_own_offloading_still_round_trips(client: ToolClient) -> None:
    big = "".join(f"line {i}\n" for i in range(10_000))  # ~90 KB: stored apart by the client

    result = client.call("hi_echo", {"value": big}, timeout=30)

    assert result.status == "ok"
    # the echo is as big as the argument: over the 32 KB threshold, so stored apart too
    assert result.payload is not None and result.data != big, result  # data: a preview
    assert result.load() == big


def test_the_secret_is_created_once_in_redis_and_shared(redis_url: str) -> None:
    settings = Settings(redis_url=redis_url, key_prefix=f"sec-{uuid.uuid4().hex[:8]}")
    rdb: redis.Redis = redis_client(redis_url)
    ref = {"key": "k", "size_bytes": 1}

    first = marker_signer(settings, rdb).sign("doc", ref)
    second = marker_signer(settings, redis_client(redis_url)).sign("doc", ref)
    configured = marker_signer(
        Settings(redis_url=redis_url, payload_secret="s3cret-from-the-operator"), rdb
    )

    assert first == second
    assert rdb.ttl(Keys(settings.key_prefix).payload_secret()) == -1
    assert configured.sign("doc", ref) != first
    assert configured.verify("doc", ref, configured.sign("doc", ref))
    assert not MarkerSigner.fixed(b"other").verify("doc", ref, first)
    rdb.delete(Keys(settings.key_prefix).payload_secret())
