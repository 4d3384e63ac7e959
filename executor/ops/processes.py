"""``toolexec worker`` on every core: one worker process per core, each with its own slots.

One threads worker process shares one GIL among its slots: Celery's and
toolexec's own work per call (about a millisecond of CPU) bounds it to a few
hundred calls a second whatever the machine has. So by default ``toolexec
worker`` starts one worker process per core (``--processes N`` to choose),
each a whole Celery worker with its own thread slots, consumer, inbox and
orphan watch, all consuming the same queues, and watches them:

* each process is named ``<name>.p<i>@<host>`` (the name the worker would
  have had, and its index), so ``toolexec status`` and ``toolexec health``
  show them apart, and the broker sees one consumer per process (the orphan
  watch gives a dead process's messages back to the others: ``toolexec.transport.orphans``);
* a process that exits while the worker is not stopping is started again
  after a second; its calls in flight come back through the orphan watch
  (one that exits with a start-up error's code stops the worker instead);
* SIGTERM / SIGINT go to every process (a second SIGINT too: Celery's cold
  stop), and the supervisor waits for them all.

Every process finds the same Redis: the supervisor checks the servers (and
starts the embedded Valkey, one per project, ``toolexec.embedded``) before it
starts any process, and the processes find that server through its URL file.
The decisions (how many processes, their names, their arguments) are pure
functions; :class:`Supervisor` is the thin loop around them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

__all__ = [
    "ProcessPlan",
    "Supervisor",
    "plan_processes",
    "process_label",
    "process_name",
]

#: A process that exited is started again after this long (and no sooner than its last start).
RESTART_S = 1.0

#: Exit codes of a process that cannot start (a bad argument or tools module, a server
#: out of reach): starting it again would fail the same way, so the worker stops.
FATAL_CODES = frozenset({1, 2, 3})

#: The environment variable that tells a worker process it is process i of N (``i/N``).
PROCESS_ENV = "TOOLEXEC_WORKER_PROCESS"


@dataclass(frozen=True)
class ProcessPlan:
    processes: int
    reason: str


def plan_processes(cores: int, processes: int | None, configured: bool) -> ProcessPlan:
    """How many worker processes to run, and the sentence that says why (pure).

    Only the default pool is multiplied: a pool or slots given explicitly (or
    an autoscaled prefork pool, which grows processes of its own) are taken as
    given, as ``toolexec.ops.pool_default`` takes them.
    """
    if processes is not None:
        return ProcessPlan(processes, f"{processes} worker process(es), as configured")
    if configured:
        return ProcessPlan(
            1, "1 worker process (a pool or slots were given: --processes N for more)"
        )
    if cores <= 1:
        return ProcessPlan(1, "1 worker process (this machine has one core)")
    return ProcessPlan(cores, f"{cores} worker processes, one per core (--processes N to choose)")


def process_name(hostname: str, index: int) -> str:
    """Process ``index``'s worker name: ``<name>.p<index>@<host>`` (Celery's ``%h`` kept)."""
    name, at, host = hostname.partition("@")
    return f"{name}.p{index}{at}{host}"


def process_label(hostname: str, names: Sequence[str]) -> str | None:
    """``"1/2"`` for a worker that is process 1 of a worker of 2 processes among ``names``.

    None for a worker started as one process (pure: from the names alone).
    """
    base = _base(hostname)
    if base is None:
        return None
    siblings = [n for n in names if (other := _base(n)) is not None and other[0] == base[0]]
    return f"{base[1]}/{len(siblings)}"


def _base(hostname: str) -> tuple[str, int] | None:
    name, at, host = hostname.partition("@")
    head, dot, tail = name.rpartition(".p")
    if not dot or not tail.isdigit():
        return None
    return f"{head}{at}{host}", int(tail)


def _say(line: str) -> None:
    """A line on stderr, as the command's other messages: the supervisor has no log set-up."""
    print(f"toolexec worker: {line}", file=sys.stderr, flush=True)


def child_argv(argv: Sequence[str], hostname: str, index: int) -> list[str]:
    """The command that runs process ``index`` of a worker started with ``argv`` (pure)."""
    return [
        sys.executable,
        "-m",
        "toolexec",
        "worker",
        *argv,
        "--processes",
        "1",
        "--hostname",
        process_name(hostname, index),
    ]


@dataclass
class _Child:
    index: int
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0


class Supervisor:
    """Runs ``count`` worker processes until told to stop; starts again one that exits."""

    def __init__(
        self, count: int, argv: Sequence[str], hostname: str, *, metrics_port: int | None = None
    ) -> None:
        self.count = count
        self.argv = list(argv)
        self.hostname = hostname
        self.metrics_port = metrics_port
        self.children = [_Child(i) for i in range(1, count + 1)]
        self._stopping = threading.Event()
        self._signals = 0
        self._fatal = 0

    def run(self) -> int:
        """Start every process, watch them, and return once all have stopped after a signal."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)
        for child in self.children:
            self._start(child)
        while not self._stopping.is_set():
            for child in self.children:
                self._watch(child)
            self._stopping.wait(0.2)
        return self._wait_all()

    def _start(self, child: _Child) -> None:
        env = {**os.environ, PROCESS_ENV: f"{child.index}/{self.count}"}
        command = child_argv(self.argv, self.hostname, child.index)
        if self.metrics_port is not None:  # one port each: process i on port + i - 1
            command += ["--metrics-port", str(self.metrics_port + child.index - 1)]
        child.process = subprocess.Popen(command, env=env)  # our own command
        child.started_at = time.monotonic()
        name = process_name(self.hostname, child.index)
        _say(f"process {child.index} of {self.count} started (pid {child.process.pid}, {name})")

    def _watch(self, child: _Child) -> None:
        assert child.process is not None
        code = child.process.poll()
        if code is None or self._stopping.is_set():
            return
        if code in FATAL_CODES:
            _say(f"process {child.index} exited with code {code}: stopping the worker")
            self._fatal = code
            self._forward(signal.SIGTERM, None)
            return
        if time.monotonic() - child.started_at < RESTART_S:
            return  # it died at once: wait out the pause, then try again
        _say(
            f"process {child.index} of {self.count} (pid {child.process.pid}) exited with code "
            f"{code}; starting it again (the calls it held come back through the orphan watch)"
        )
        self._start(child)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        self._stopping.set()
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signum)

    def _wait_all(self) -> int:
        worst = self._fatal
        for child in self.children:
            if child.process is not None:
                code = child.process.wait()
                worst = worst or (code if code > 0 else 0)
        return worst
