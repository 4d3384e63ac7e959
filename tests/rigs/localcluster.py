"""A Redis Cluster of local ``redis-server`` processes, for the tests and the benchmarks.

A cluster cannot be faked: what matters is that the servers refuse a script or a
transaction whose keys span slots, and that a replica takes over when its
master dies. So this starts real servers on free loopback ports, joins them with
``redis-cli --cluster create`` and waits until every node reports the cluster
ok. Nothing here listens beyond 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

__all__ = ["ClusterUnavailable", "LocalCluster", "cluster_binaries"]


class ClusterUnavailable(RuntimeError):
    """This machine cannot run a local cluster (the message says why)."""


def cluster_binaries() -> tuple[str, str]:
    """``redis-server`` and ``redis-cli``, or :class:`ClusterUnavailable` saying what lacks."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        raise ClusterUnavailable(
            "a local Redis Cluster needs redis-server and redis-cli on PATH "
            "(e.g. apt-get install redis-server)"
        )
    return server, cli


def _free_port() -> int:
    # A cluster node also listens on port + 10000 (the cluster bus): both must be free.
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port + 10_000 < 65_536 and _port_free(port + 10_000):
            return port
    raise ClusterUnavailable("no free pair of loopback ports (port, port + 10000)")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class LocalCluster:
    """``masters`` masters with ``replicas`` replicas each, in ``workdir``.

    ``node_timeout_ms`` is how long a master may be silent before the others
    count it failed and its replica is elected: short, so a failover test takes
    seconds, not the default 15.
    """

    workdir: Path
    masters: int = 3
    replicas: int = 0
    node_timeout_ms: int = 1_000
    ports: list[int] = field(default_factory=list)
    _procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL toolexec takes, every node a seed."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self, timeout: float = 60.0) -> LocalCluster:
        """Start the servers, make them one cluster and wait until it serves every slot."""
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> LocalCluster:
        server, cli = cluster_binaries()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ports = [_free_port() for _ in range(self.masters * (1 + self.replicas))]
        for port in self.ports:
            self._spawn(server, port)
        for port in self.ports:
            self._wait_listening(port, timeout)
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        replicas = ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        subprocess.run(
            [cli, "--cluster", "create", *nodes, *replicas],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        self.wait_ok(timeout)
        return self

    def _spawn(self, server: str, port: int) -> None:
        node_dir = self.workdir / str(port)
        node_dir.mkdir(exist_ok=True)
        args = [
            server,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--cluster-enabled", "yes",
            "--cluster-config-file", f"nodes-{port}.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--dir", str(node_dir),
            "--save", "",
            "--appendonly", "no",
            # A replica syncs at once, and may be elected however long its master was
            # gone: a test kills a master seconds after the cluster formed.
            "--repl-diskless-sync-delay", "0",
            "--cluster-replica-validity-factor", "0",
            "--logfile", str(node_dir / "redis.log"),
        ]  # fmt: skip
        self._procs[port] = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def _wait_listening(self, port: int, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                return
            if self._procs[port].poll() is not None:
                raise ClusterUnavailable(f"redis-server on port {port} exited at start")
            time.sleep(0.05)
        raise ClusterUnavailable(f"redis-server on port {port} did not listen in {timeout} s")

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, decode_responses=True, socket_timeout=2.0)

    def alive_ports(self) -> list[int]:
        return [p for p, proc in self._procs.items() if proc.poll() is None]

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says ``cluster_state:ok`` and knows the same masters."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(self._ok(port) for port in self.alive_ports()):
                return
            time.sleep(0.1)
        raise ClusterUnavailable(f"the cluster was not ok within {timeout} s")

    def _ok(self, port: int) -> bool:
        with contextlib.closing(self.node(port)) as node:
            try:
                info = node.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
                replication = node.info("replication")
            except redis.RedisError:
                return False
        state = info.get("cluster_state") if isinstance(info, dict) else None
        if state != "ok" and "cluster_state:ok" not in str(info):
            return False
        # a replica counts once it holds its master's data: only then can it take over
        return replication.get("role") != "slave" or replication.get("master_link_status") == "up"

    def role(self, port: int) -> str:
        with contextlib.closing(self.node(port)) as node:
            return str(node.execute_command("ROLE")[0])  # type: ignore[no-untyped-call]

    def master_ports(self) -> list[int]:
        return [p for p in self.alive_ports() if self.role(p) == "master"]

    def replica_of(self, master: int) -> list[int]:
        """Ports of the live replicas that follow ``master``."""
        out = []
        for port in self.alive_ports():
            with contextlib.closing(self.node(port)) as node:
                role = node.execute_command("ROLE")  # type: ignore[no-untyped-call]
            if str(role[0]) == "slave" and int(role[2]) == master:
                out.append(port)
        return out

    def kill(self, port: int) -> None:
        """SIGKILL one node: no goodbye to the cluster, as when a host dies."""
        proc = self._procs[port]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
