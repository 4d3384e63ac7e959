"""Flower's basic auth cannot be split open, switched off, nor its loopback guard skipped.

Before: ``toolexec flower`` passed ``user:password`` in ``FLOWER_BASIC_AUTH``,
which Flower splits on commas: with the password ``Fl0wer,pass`` the real
password was refused while ``admin:Fl0wer`` and ``pass`` got in, and with
``Fl0wer-pass,`` an empty ``Authorization: Basic`` header got full access
(sending tasks, shutting workers down). ``toolexec flower -- --address=0.0.0.0``
listened on every interface without auth. Now such passwords and pass-through
options are refused before Flower starts, and a real Flower lets in only the
exact pair.

Issue 22, item 7. Before: with toolexec's credentials set, a ``flowerconfig.py``
holding ``basic_auth = []`` in the working directory, or ``FLOWER_Conf`` naming
such a file (Flower matches ``FLOWER_*`` names in any case; toolexec dropped
only upper-case ones), let anyone read ``/tasks`` and ``/workers`` and use the
API; ``FLOWER_UNAUTHENTICATED_API=true`` was passed on and opened the API to any
origin; a non-ASCII password made every request a 500. Now toolexec's Flower
reads only its own config file, drops every ``FLOWER_*`` variable but a
documented few, refuses the API opener and a non-ASCII password at start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from ops_support import FlowerProcess, free_port, wait_until

from toolexec.ops.cli import cli
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess
from toolexec.worker.app import create_app

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


def _flower_env(
    env: dict[str, str], user: str | None, password: str | None
) -> dict[str, str | None]:
    """``env`` with toolexec's Flower credentials set to the pair given, or unset."""
    full_env: dict[str, str | None] = {**env}
    for name in ("TOOLEXEC_FLOWER_USER", "TOOLEXEC_FLOWER_PASSWORD"):
        full_env[name] = None
    if user is not None and password is not None:
        full_env |= {"TOOLEXEC_FLOWER_USER": user, "TOOLEXEC_FLOWER_PASSWORD": password}
    return full_env


def _run_flower(
    env: dict[str, str], *args: str, user: str | None = None, password: str | None = None
) -> tuple[subprocess.CompletedProcess[str], int]:
    """``toolexec flower`` as an operator runs it; expected to refuse, so it must exit."""
    port = free_port()
    full_env = {
        k: v for k, v in {**os.environ, **_flower_env(env, user, password)}.items() if v is not None
    }
    done = subprocess.run(
        [sys.executable, "-m", "toolexec", "flower", f"--port={port}", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, port


def _refusal_in_process(
    env: dict[str, str], *args: str, user: str | None = None, password: str | None = None
) -> tuple[int, str, int]:
    """The same command line run by the CLI in this process: its exit code, output, port.

    The refusals happen before Flower is imported, in the command itself, so the
    answer is the one an operator gets; a process per case would only add its start-up
    (about 1.5 s each). One case of each kind runs as a real process too, below.
    """
    port = free_port()
    results: list[Result] = []
    command = ["flower", f"--port={port}", *args]
    environment = _flower_env(env, user, password)
    # A guard that let it through would start Flower in this thread: a daemon one, so the
    # test fails instead of hanging.
    runner = threading.Thread(
        target=lambda: results.append(CliRunner().invoke(cli, command, env=environment)),
        daemon=True,
    )
    runner.start()
    runner.join(30)
    if not results:
        pytest.fail(f"toolexec {' '.join(command)} did not refuse: it is serving")
    result = results[0]
    return result.exit_code, result.output, port


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
    code, output, port = _refusal_in_process(worker_env, user=USER, password=password)

    assert code != 0
    assert "commas" in output
    assert password not in output.replace("TOOLEXEC_FLOWER_USER/TOOLEXEC_FLOWER_PASSWORD", "")
    assert _port_closed(port)


PASSTHROUGH = [
    ["--", "--address=0.0.0.0"],
    ["--", "--address", "0.0.0.0"],
    ["--", "--basic_auth=x:y"],
    ["--", "--basic-auth=,"],
    ["--", "--conf=/tmp/flowerconfig.py"],
    ["--", "--port=5555"],
    ["--", "--unix_socket=/tmp/flower.sock"],
]


@pytest.mark.parametrize("passthrough", PASSTHROUGH, ids=lambda p: " ".join(p))
@pytest.mark.parametrize("with_auth", [False, True], ids=["no-auth", "auth"])
def test_pass_through_options_cannot_get_around_the_guard(
    worker_env: dict[str, str], passthrough: list[str], with_auth: bool
) -> None:
    """Given options passed through to Flower that set its address, port, auth or config
    file, then ``toolexec flower`` refuses them (with or without auth) and exits."""
    user, password = (USER, PASSWORD) if with_auth else (None, None)
    code, output, port = _refusal_in_process(worker_env, *passthrough, user=user, password=password)

    assert code != 0, output
    assert "refusing option" in output
    assert _port_closed(port)


def test_the_console_command_refuses_a_comma_password_and_a_guarded_option(
    worker_env: dict[str, str],
) -> None:
    """Given the same refusals through ``python -m toolexec flower`` in a process of its
    own, then it exits non-zero saying why, does not quote the password, and nothing
    listens on its port: the in-process cases above are what an operator gets."""
    password = "Fl0wer,pass"
    done, port = _run_flower(worker_env, user=USER, password=password)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "commas" in output
    assert password not in output.replace("TOOLEXEC_FLOWER_USER/TOOLEXEC_FLOWER_PASSWORD", "")
    assert _port_closed(port)

    done, port = _run_flower(worker_env, *PASSTHROUGH[0], user=USER, password=PASSWORD)
    assert done.returncode != 0 and "refusing option" in done.stdout + done.stderr
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
    command = ("-m", "celery", "-A", "toolexec.worker.app", "flower", "--address=127.0.0.1")
    proc = FlowerProcess(env, USER, PASSWORD, tmp_path / "flower.log", command=command)
    proc.start(worker.hostname)
    try:
        empty = _status(proc.url + "/api/tasks", "Basic =")
    finally:
        proc.stop()

    assert empty == 200


EVIL_CONFIG = "basic_auth = []\n"


@pytest.mark.parametrize("where", ["working-directory", "FLOWER_Conf"])
def test_a_config_file_from_outside_toolexec_cannot_turn_basic_auth_off(
    worker_env: dict[str, str], tmp_path: Path, where: str
) -> None:
    """Given credentials in settings and a config file with ``basic_auth = []``, in the
    working directory or named by ``FLOWER_Conf``, then pages and API stay at 401 without
    credentials, and the pair still gets in."""
    evil = tmp_path / "flowerconfig.py"
    evil.write_text(EVIL_CONFIG)
    env = {**worker_env, "FLOWER_Conf": str(evil)} if where == "FLOWER_Conf" else worker_env
    cwd = tmp_path if where == "working-directory" else None
    proc = FlowerProcess(env, USER, PASSWORD, tmp_path / "flower.log", cwd=cwd).start(None)
    try:
        statuses = {p: _status(proc.url + p, None) for p in ("/tasks", "/workers", "/api/tasks")}
        allowed = _status(proc.url + "/api/workers", _basic(f"{USER}:{PASSWORD}"))
    finally:
        proc.stop()

    assert statuses == {"/tasks": 401, "/workers": 401, "/api/tasks": 401}, proc.log()[-2000:]
    assert allowed == 200


def _exits_before_listening(env: dict[str, str], tmp_path: Path) -> str:
    """``toolexec flower`` that must refuse to start: its output; fails fast if it listens."""
    port = free_port()
    log = tmp_path / "flower.log"
    full_env = {**os.environ, **env}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolexec", "flower", f"--port={port}"],
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: proc.poll() is not None or not _port_closed(port), 60, "an exit")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode != 0 and _port_closed(port), log.read_text()[-2000:]
    return log.read_text()


def test_flower_unauthenticated_api_is_refused_at_start(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    """Given ``FLOWER_UNAUTHENTICATED_API=true`` (on loopback, where toolexec needs no
    credentials), then ``toolexec flower`` does not start: that variable opens the API to
    any web page."""
    env = {**worker_env, "FLOWER_UNAUTHENTICATED_API": "true"}
    env = {k: v for k, v in env.items() if not k.startswith("TOOLEXEC_FLOWER_")}

    output = _exits_before_listening(env, tmp_path)

    assert "refusing FLOWER_UNAUTHENTICATED_API" in output


def test_a_non_ascii_password_is_refused_at_start(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    """Given a non-ASCII password (which made every Flower request a 500), then ``toolexec
    flower`` exits saying why, without quoting it."""
    password = "pässwörd-Ünïcode"
    env = {**worker_env, "TOOLEXEC_FLOWER_USER": USER, "TOOLEXEC_FLOWER_PASSWORD": password}

    output = _exits_before_listening(env, tmp_path)

    assert "non-ASCII" in output and password not in output
