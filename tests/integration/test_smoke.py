"""A first end-to-end check: one call through a real worker."""

from executor.client import ToolClient
from executor.testing import FlakyServer, Reply


def test_503_twice_then_200_ends_ok_after_three_attempts(
    client: ToolClient, flaky: FlakyServer
) -> None:
    """Given a service failing twice with 503, the third attempt succeeds."""
    path = flaky.unique_path("flaky")
    url = flaky.script(path, Reply(503), Reply(503), Reply(200, {"temp": 21}))
    result = client.call("fetch", {"url": url}, timeout=20)
    assert result.status == "ok", result
    assert result.data == {"temp": 21}
    assert result.attempts == 3
    assert len(flaky.hits(path)) == 3
