"""What a newcomer sees before any worker ran: ``toolexec call`` and ``toolexec tools``."""

from __future__ import annotations

import json
import uuid

from click.testing import CliRunner

from toolexec.ops.cli import EXIT_NO_CATALOG, cli


def _env(redis_url: str) -> dict[str, str]:
    """A Redis where this prefix was never used: no worker ever published here."""
    return {"TOOLEXEC_REDIS_URL": redis_url, "TOOLEXEC_KEY_PREFIX": f"fresh-{uuid.uuid4().hex}"}


def test_a_call_before_any_worker_is_no_worker_and_says_how_to_start_one(redis_url: str) -> None:
    done = CliRunner().invoke(cli, ["call", "echo", '{"text":"hi"}'], env=_env(redis_url))

    assert done.exit_code == 1, done.output
    seen = json.loads(done.stdout)  # what the model reads: one JSON object, no record fields
    assert seen["status"] == "error" and "call_id" not in seen
    error = seen["error"]
    assert error["type"] == "no_worker" and error["retryable"] is True
    assert "no worker has published a tool catalog" in error["message"]
    assert "toolexec worker --tools" in error["message"]


def test_call_full_prints_the_whole_record(redis_url: str) -> None:
    done = CliRunner().invoke(
        cli,
        ["call", "echo", "{}", "--full", "--run-id", "r1", "--timeout", "5"],
        env=_env(redis_url),
    )

    record = json.loads(done.stdout)
    assert record["run_id"] == "r1" and record["call_id"] and record["attempts"] == 0
    assert record["error"]["type"] == "no_worker"


def test_call_checks_its_options_before_calling(redis_url: str) -> None:
    runner = CliRunner()
    bad_timeout = runner.invoke(cli, ["call", "echo", "{}", "--timeout", "0"], env=_env(redis_url))
    bad_key = runner.invoke(
        cli, ["call", "echo", "{}", "--idempotency-key", "x" * 10_000], env=_env(redis_url)
    )

    assert bad_timeout.exit_code == 2 and "--timeout" in bad_timeout.output
    assert bad_key.exit_code != 0 and "idempotency" in str(bad_key.exception or bad_key.output)


def test_tools_without_a_catalog_says_so_and_fails(redis_url: str) -> None:
    for fmt in ("catalog", "openai"):
        done = CliRunner().invoke(cli, ["tools", "--format", fmt], env=_env(redis_url))

        assert done.exit_code == EXIT_NO_CATALOG != 0, done.output
        assert done.stdout == ""
        assert "no worker has published a catalog" in done.stderr
        assert "toolexec worker --tools" in done.stderr
