"""The same calls through a worker whose payload store is a directory, then S3.

Only settings change (``TOOLEXEC_PAYLOAD_STORE`` and, for S3, the endpoint):
neither the tools nor the client code. S3 is moto's server mode on 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from payload_support import moto_s3
from payload_tools import make_items, make_text

from toolexec.client import ToolClient
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration

BUCKET = "toolexec-payloads"


@pytest.fixture(scope="module", params=["file", "s3"])
def store_env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The environment that points workers and clients at one payload store."""
    if request.param == "file":
        folder = tmp_path_factory.mktemp("payload-store")
        yield {"TOOLEXEC_PAYLOAD_STORE": f"file://{folder}"}
        return
    with moto_s3() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket=BUCKET
        )
        yield {
            "TOOLEXEC_PAYLOAD_STORE": f"s3://{BUCKET}/results",
            "TOOLEXEC_PAYLOAD_S3_ENDPOINT_URL": endpoint,
            "TOOLEXEC_PAYLOAD_S3_REGION": "us-east-1",
        }


@pytest.fixture(scope="module")
def store_client(
    settings: Settings,
    worker_env: dict[str, str],
    store_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ToolClient]:
    """A worker and a client, both configured for ``store_env``'s store."""
    log = tmp_path_factory.mktemp("store-logs") / "worker.log"
    proc = WorkerProcess(
        "payload_tools", {**worker_env, **store_env}, queues="payloads", log_path=log
    )
    proc.start(settings.redis_url or "", settings.key_prefix)
    with pytest.MonkeyPatch.context() as env:
        for name, value in store_env.items():
            env.setenv(name, value)
        own = settings.model_copy(update=_store_fields())
    try:
        with ToolClient(own) as client:
            yield client
    finally:
        proc.stop()


def _store_fields() -> dict[str, object]:
    """The payload-store settings as the environment gives them (as a worker reads them)."""
    fields = Settings().model_dump()
    return {name: value for name, value in fields.items() if name.startswith("payload_")}


def test_a_large_text_lands_in_the_configured_store_and_comes_back(
    store_client: ToolClient, store_env: dict[str, str]
) -> None:
    """Given a worker and a client on another store, when a tool returns 2 MB of text,
    then the reference names that store and load() gives back the same text."""
    expected = make_text(40_000)

    result = store_client.call("big_text", {"lines": 40_000}, timeout=60)

    assert result.ok, result.error
    ref = result.payload
    assert ref is not None
    assert ref.store == store_env["TOOLEXEC_PAYLOAD_STORE"].split(":")[0]
    assert result.load() == expected
    page = store_client.read_payload(ref, 39_998, 5)
    assert page.entries == expected.split("\n")[39_998:40_000] and page.next_offset is None


def test_a_large_array_pages_by_item_from_the_configured_store(store_client: ToolClient) -> None:
    """Given another store, when a tool returns 100 000 items, then pages are consecutive."""
    expected = make_items(100_000)

    result = store_client.call("big_items", {"count": 100_000}, timeout=60)

    assert result.ok and result.payload is not None
    first = store_client.read_payload(result.payload, 99_990, 6)
    second = store_client.read_payload(result.payload, first.next_offset or 0, 6)
    assert first.entries + second.entries == expected[99_990:]
    assert second.next_offset is None


def test_a_large_argument_travels_through_the_configured_store(store_client: ToolClient) -> None:
    """Given another store, when a 2 MB argument is sent, then the tool sees all of it."""
    document = make_text(40_000)

    result = store_client.call("digest", {"document": document}, timeout=60)

    assert result.ok, result.error
    assert result.data["chars"] == len(document)


def test_the_store_holds_the_payload_where_the_setting_says(
    store_client: ToolClient, store_env: dict[str, str]
) -> None:
    """Given a stored result, then its bytes are in that directory or bucket, by key."""
    result = store_client.call("big_text", {"lines": 40_000}, timeout=60)
    assert result.payload is not None
    where = store_env["TOOLEXEC_PAYLOAD_STORE"]
    if where.startswith("file://"):
        stored = (Path(where.removeprefix("file://")) / result.payload.key).read_bytes()
    else:
        s3 = boto3.client(
            "s3",
            endpoint_url=store_env["TOOLEXEC_PAYLOAD_S3_ENDPOINT_URL"],
            region_name="us-east-1",
        )
        body = s3.get_object(Bucket=BUCKET, Key=f"results/{result.payload.key}")["Body"]
        stored = body.read()
    assert stored == make_text(40_000).encode()
