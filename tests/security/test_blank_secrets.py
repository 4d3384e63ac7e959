"""Issue 22, item 2: an empty or blank secret is a secret not set, for every reader.

Before: ``TOOLEXEC_MCP_TOKEN=`` (what ``${VAR:-}`` in a compose file passes) got
past the bind check, which tested ``is not None``, while the HTTP app, which
tested truthiness, served ``initialize`` and ``tools/call`` without auth on
every interface; ``TOOLEXEC_PAYLOAD_SECRET=`` signed payload markers with an
empty HMAC key anyone can compute, so a model could write a marker the worker
resolved; a blank Flower password was a password. Now settings read a blank
secret as unset: the MCP front and Flower refuse a bind beyond loopback,
naming the variable, and markers are signed with the deployment's own secret.
The wildcard binds here are only ever refused: no traffic goes beyond loopback.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile_input_support import isolated_worker

from toolexec.client import ToolClient
from toolexec.errors import ErrorType
from toolexec.payloads.offload import ARGUMENT_MARKER
from toolexec.payloads.signing import SIGNATURE_KEY
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _refused_at_start(args: list[str], env: dict[str, str], port: int, log: Path) -> str:
    """Run a server command that must exit without listening; its output.

    A wildcard bind is reached on 127.0.0.1 too, so a server that started anyway
    is seen there, stopped at once, and fails the test (without waiting it out).
    """
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolexec", *args],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    end = time.monotonic() + 60
    try:
        while proc.poll() is None and time.monotonic() < end:
            assert not _listening(port), f"it started: {log.read_text()[-2000:]}"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert proc.returncode not in (0, None), log.read_text()[-2000:]
    return log.read_text()


def test_an_empty_mcp_token_does_not_serve_mcp_beyond_loopback(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    """Given ``TOOLEXEC_MCP_TOKEN=``, then ``toolexec mcp --http 0.0.0.0:PORT`` exits naming
    the variable, and nothing listens on the port (blank ones: tests/unit/test_settings.py)."""
    port = _free_port()
    env = {**worker_env, "TOOLEXEC_MCP_TOKEN": ""}

    output = _refused_at_start(["mcp", "--http", f"0.0.0.0:{port}"], env, port, tmp_path / "o")

    assert "TOOLEXEC_MCP_TOKEN" in output
    assert not _listening(port)


def test_a_blank_flower_password_does_not_serve_flower_beyond_loopback(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    """Given a user and a blank password, then ``toolexec flower --address 0.0.0.0`` exits as
    it does without credentials, and nothing listens on the port."""
    port = _free_port()
    env = {**worker_env, "TOOLEXEC_FLOWER_USER": "admin", "TOOLEXEC_FLOWER_PASSWORD": "   "}
    args = ["flower", "--address", "0.0.0.0", f"--port={port}"]

    output = _refused_at_start(args, env, port, tmp_path / "o")

    assert "without authentication" in output and "TOOLEXEC_FLOWER_PASSWORD" in output
    assert not _listening(port)


@pytest.fixture(scope="module")
def blank_secret_client(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ToolClient]:
    """A worker and a client both given ``TOOLEXEC_PAYLOAD_SECRET=`` (empty)."""
    log_dir = tmp_path_factory.mktemp("blank-secret")
    with isolated_worker(settings, worker_env, log_dir, TOOLEXEC_PAYLOAD_SECRET="") as (_, c):
        blank = c.settings.model_copy(
            update={"payload_secret": Settings(payload_secret="").payload_secret}
        )
        with ToolClient(blank) as client:
            yield client


def _signed_with_the_empty_key(name: str, ref: dict[str, Any]) -> str:
    """The signature anyone can compute when the key is empty: what a model would write."""
    message = json.dumps([name, ref], sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(b"", message, hashlib.sha256).hexdigest()


def test_an_empty_payload_secret_is_unset_so_a_marker_signed_with_it_is_refused(
    blank_secret_client: ToolClient,
) -> None:
    """Given worker and client with an empty payload secret, when a model writes a marker to
    another call's stored result signed with the empty key, then the worker refuses it and
    returns nothing of that payload; the client's own offloading still works."""
    client = blank_secret_client
    victim = client.call("hi_capped", {"kilobytes": 100}, timeout=30)
    assert victim.payload is not None, victim
    ref = victim.payload.model_dump(mode="json")
    forged = {ARGUMENT_MARKER: ref, SIGNATURE_KEY: _signed_with_the_empty_key("value", ref)}

    result = client.call("hi_echo", {"value": forged}, timeout=20)
    big = "".join(f"line {i}\n" for i in range(10_000))  # stored apart by the client
    own = client.call("hi_echo", {"value": big}, timeout=30)

    assert result.error is not None and result.error.type == ErrorType.INVALID_ARGUMENTS, result
    assert "y" * 100 not in result.model_dump_json()
    assert own.status == "ok", own
    assert (own.load() if own.payload is not None else own.data) == big
