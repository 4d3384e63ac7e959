"""Flower's basic auth cannot be split open, nor its loopback guard skipped.

Before: ``toolexec flower`` passed ``user:password`` in ``FLOWER_BASIC_AUTH``,
which Flower splits on commas: with the password ``Fl0wer,pass`` the real
password was refused while ``admin:Fl0wer`` and ``pass`` got in, and with
``Fl0wer-pass,`` an empty ``Authorization: Basic`` header got full access
(sending tasks, shutting workers down). ``toolexec flower -- --address=0.0.0.0``
listened on every interface without auth. Now such passwords and pass-through
options are refused before Flower starts, and a real Flower lets in only the
exact pair.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path

import pytest
from ops_support import FlowerProcess, free_port, wait_until

from toolexec.app import create_app
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration

USER = "admin"
PASSWORD = "Fl0wer-pass"


def _basic(credentials: str) -> str:
    return "Basic " + b64encode(credentials.encode()).decode()


def _status(url: str, authorization: str | None, method: str = "GET") -> int:
    request = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _run_flower(
    env: dict[str, str], *args: str, user: str | None = None, password: str | None = None
) -> tuple[subprocess.CompletedProcess[str], int]:
    """``toolexec flower`` as an operator runs it; expected to refuse, so it must exit."""
    port = free_port()
    full_env = {**os.environ, **env}
    for name in ("TOOLEXEC_FLOWER_USER", "TOOLEXEC_FLOWER_PASSWORD"):
        full_env.pop(name, None)
    if user is not None and password is not None:
        full_env |= {"TOOLEXEC_FLOWER_USER": user, "TOOLEXEC_FLOWER_PASSWORD": password}
    done = subprocess.run(
        [sys.executable, "-m", "toolexec", "flower", f"--port={port}", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, port


@pytest.fixture(scope="module")
def flower(
    worker: WorkerProcess, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FlowerProcess]:
    log = tmp_path_factory.mktemp("flower") / "flower.log"
    proc = FlowerProcess(worker_env, USER, PASSWORD, log).start(worker.hostname)
    yield proc
    proc.stop()


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Basic",
        "Basic ",
        "Basic =",
        _basic(""),
        _basic(":"),
        _basic(f"{USER}:"),
        _basic(f"{USER}:Fl0wer"),
        _basic("pass"),
        _basic(f"{USER}:{PASSWORD} "),
        f"Bearer {PASSWORD}",
    ],
    ids=lambda a: repr(a),
)
def test_a_real_flower_lets_in_only_the_exact_pair(
    flower: FlowerProcess, authorization: str | None
) -> None:
    """Given ``toolexec flower`` behind basic auth, then an empty, partial or wrong
    Authorization header gets 401 on the API and on the page that can shut workers down,
    and the exact pair gets in."""
    for path in ("/api/tasks", "/api/workers", "/workers"):
        assert _status(flower.url + path, authorization) == 401, path
    assert _status(flower.url + "/api/tasks", _basic(f"{USER}:{PASSWORD}")) == 200


@pytest.mark.parametrize(
    "authorization",
    [None, "Basic ", _basic(f"{USER}:"), _basic(f"{USER}:Fl0wer"), _basic("pass")],
    ids=lambda a: repr(a),
)
def test_the_shutdown_post_without_the_exact_pair_is_refused_and_the_worker_lives(
    flower: FlowerProcess, worker: WorkerProcess, settings: Settings, authorization: str | None
) -> None:
    """Given Flower behind basic auth, when Flower's own API is asked to shut the worker down
    without the exact pair, then it answers 401 and the worker still answers a ping sent
    after it: a worker handles broadcast commands in order, so a shutdown that got
    through would have ended it before the ping."""
    url = f"{flower.url}/api/worker/shutdown/{worker.hostname}"

    assert _status(url, authorization, method="POST") == 401

    app = create_app(settings)
    try:
        replies = app.control.ping(destination=[worker.hostname], timeout=5) or []
    finally:
        app.close()
    assert [name for reply in replies for name in reply] == [worker.hostname]
    assert worker.process is not None and worker.process.poll() is None


@pytest.mark.parametrize("password", ["Fl0wer,pass", "Fl0wer-pass,", ",Fl0wer-x", "ab,,cd"])
def test_a_password_flower_would_split_on_commas_is_refused_before_it_starts(
    worker_env: dict[str, str], password: str
) -> None:
    """Given a password with a comma, then ``toolexec flower`` exits with an explanation that
    does not quote it, and nothing listens on its port."""
    done, port = _run_flower(worker_env, user=USER, password=password)

    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "commas" in output
    assert password not in output.replace("TOOLEXEC_FLOWER_USER/TOOLEXEC_FLOWER_PASSWORD", "")
    assert _port_closed(port)


@pytest.mark.parametrize(
    "passthrough",
    [
        ["--", "--address=0.0.0.0"],
        ["--", "--address", "0.0.0.0"],
        ["--", "--basic_auth=x:y"],
        ["--", "--basic-auth=,"],
        ["--", "--conf=/tmp/flowerconfig.py"],
        ["--", "--port=5555"],
        ["--", "--unix_socket=/tmp/flower.sock"],
    ],
    ids=lambda p: " ".join(p),
)
@pytest.mark.parametrize("with_auth", [False, True], ids=["no-auth", "auth"])
def test_pass_through_options_cannot_get_around_the_guard(
    worker_env: dict[str, str], passthrough: list[str], with_auth: bool
) -> None:
    """Given options passed through to Flower that set its address, port, auth or config
    file, then ``toolexec flower`` refuses them (with or without auth) and exits."""
    user, password = (USER, PASSWORD) if with_auth else (None, None)
    done, port = _run_flower(worker_env, *passthrough, user=user, password=password)

    assert done.returncode != 0, done.stdout + done.stderr
    assert "refusing option" in done.stdout + done.stderr
    assert _port_closed(port)


def test_flower_variables_in_the_environment_cannot_move_it_off_loopback(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    """Given FLOWER_ADDRESS=0.0.0.0 and a FLOWER_BASIC_AUTH with an empty pair in the
    operator's environment and no toolexec credentials, then Flower listens on loopback only
    and its API lets no one in (the empty pair is gone with the variable)."""
    port = free_port()
    env = {**os.environ, **worker_env, "FLOWER_ADDRESS": "0.0.0.0", "FLOWER_BASIC_AUTH": "a:b,"}
    for name in ("TOOLEXEC_FLOWER_USER", "TOOLEXEC_FLOWER_PASSWORD"):
        env.pop(name, None)
    with (tmp_path / "flower.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolexec", "flower", f"--port={port}"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        listening = wait_until(lambda: _listeners(port), 30, "Flower to listen")
        empty = _status(f"http://127.0.0.1:{port}/api/tasks", "Basic ")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)

    assert all(line.startswith("127.0.0.1:") for line in listening), listening
    assert empty == 401


def _listeners(port: int) -> list[str]:
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=False
    ).stdout
    return [line.split()[3] for line in out.splitlines() if line.strip()]


def _port_closed(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_the_attack_itself_still_works_on_flower_started_without_toolexec(
    worker: WorkerProcess, worker_env: dict[str, str], tmp_path: Path
) -> None:
    """Given plain ``celery flower`` with ``FLOWER_BASIC_AUTH=admin:Fl0wer-pass,`` (what
    ``toolexec flower`` used to pass for that password), then ``Authorization: Basic =`` gets
    in: why toolexec refuses such a password instead of passing it on."""
    env = {**worker_env, "FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD},"}
    command = ("-m", "celery", "-A", "toolexec.app", "flower", "--address=127.0.0.1")
    proc = FlowerProcess(env, USER, PASSWORD, tmp_path / "flower.log", command=command)
    proc.start(worker.hostname)
    try:
        empty = _status(proc.url + "/api/tasks", "Basic =")
    finally:
        proc.stop()

    assert empty == 200
