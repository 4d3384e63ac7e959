"""Issue 22, item 6: a tool's return value took down or stalled its worker.

Before: a tool returning an endless generator grew the worker to an 8 GB
allocation and the allocator aborted it (every call in flight went with it);
a 300 MB single-line string took 35 s before ``result_too_large``, since the
encoder rescanned the line from its start at every mark. Now a stream is read
only up to the result limit, a text longer than the limit is refused before
it is encoded, and encoding is linear (tests/unit/test_payloads_encoding.py
counts the bytes it reads). Each test runs a real worker and checks that it is
the same process, still serving, afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hostile_input_support import isolated_worker

from toolexec.client import ToolClient
from toolexec.errors import ErrorType
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration

RESULT_LIMIT = 2_000_000


@pytest.fixture(scope="module")
def limited(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, ToolClient]]:
    with isolated_worker(
        settings,
        worker_env,
        tmp_path_factory.mktemp("streams"),
        "limits_tools",
        TOOLEXEC_PAYLOAD_MAX_BYTES=str(RESULT_LIMIT),
    ) as pair:
        yield pair


def _pid(client: ToolClient) -> int:
    result = client.call("lim_pid", {}, timeout=15)
    assert result.ok, result.error
    return int(result.data)


def test_an_endless_generator_is_refused_at_the_limit_and_the_worker_goes_on(
    limited: tuple[WorkerProcess, ToolClient],
) -> None:
    worker, client = limited
    before = _pid(client)

    result = client.call("lim_endless", {}, timeout=20)

    assert result.error is not None, result.data
    assert result.error.type == ErrorType.RESULT_TOO_LARGE
    assert f"{RESULT_LIMIT:,}" in result.error.message
    # about 2 000 000 / 8 items; a worker that reads the stream to its end draws 5 000 000
    drawn = client.call("lim_drawn", {}, timeout=15).data
    assert drawn <= RESULT_LIMIT // 8 + 1
    assert _pid(client) == before and worker.process is not None
    assert worker.process.poll() is None


def test_a_text_far_past_the_limit_is_refused_and_the_worker_goes_on(
    limited: tuple[WorkerProcess, ToolClient],
) -> None:
    worker, client = limited
    before = _pid(client)

    result = client.call("lim_big_line", {"megabytes": 40}, timeout=20)

    assert result.error is not None
    assert result.error.type == ErrorType.RESULT_TOO_LARGE
    assert "at least 40,000,000 bytes" in result.error.message
    assert _pid(client) == before and worker.process is not None
    assert worker.process.poll() is None
    assert client.call("lim_big_line", {"megabytes": 1}, timeout=15).ok  # under the limit: stored
