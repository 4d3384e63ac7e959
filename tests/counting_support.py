"""Counting one test's own Redis commands on a server that other tests share."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

import pytest
import redis


@dataclass
class Counted:
    """Connections of their own, named, whose commands the server counts one by one.

    The server-wide count (``INFO commandstats``) also holds other tests' workers:
    the session's server is shared by a test process. Valkey 8+ counts per
    connection (``tot-cmds`` in ``CLIENT LIST``).
    """

    url: str  # the session's URL with this name: every client built from it is counted
    name: str
    observer: redis.Redis

    def sent(self) -> int:
        mine = [c for c in self.observer.client_list() if c.get("name") == self.name]
        if mine and "tot-cmds" not in mine[0]:
            pytest.skip("this server does not count commands per connection (Valkey 8+ does)")
        return sum(int(c["tot-cmds"]) for c in mine)


class Watched:
    """The commands one named connection sends, as the server's MONITOR reports them.

    ``tot-cmds`` counts the commands a script runs as the connection's own; MONITOR
    tells the commands the client sent (``EVALSHA``) from those a script ran (reported
    as ``lua``). :meth:`sent_by` ends with an ``ECHO`` of its own on that connection and
    waits for it, so every command sent before it has been seen: no sleep.
    """

    def __init__(self, url: str) -> None:
        self._monitor = redis.Redis.from_url(url).monitor()
        self._seen: list[dict[str, object]] = []
        self._lock = threading.Lock()
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for entry in self._monitor.listen():
                with self._lock:
                    self._seen.append(entry)
        except (redis.ConnectionError, ValueError):  # closed by close()
            return

    def mark(self, client: redis.Redis, timeout: float = 10.0) -> int:
        """Where the commands ``client`` sent so far end in what was seen."""
        marker = f"mark-{uuid.uuid4().hex}"
        client.echo(marker)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                for index, entry in enumerate(self._seen):
                    if marker in str(entry.get("command")):
                        return index
            time.sleep(0.01)
        raise AssertionError("MONITOR did not report the marker")

    def sent_between(self, start: int, end: int, ports: set[str]) -> list[str]:
        """The commands the clients on ``ports`` themselves sent (not a script's) in a span."""
        with self._lock:
            span = self._seen[start:end]
        return [
            str(e["command"]).split(" ", 1)[0].upper()
            for e in span
            if e.get("client_type") != "lua" and str(e.get("client_port")) in ports
        ]

    def close(self) -> None:
        self._monitor.connection.disconnect()


def ports_of(observer: redis.Redis, name: str) -> set[str]:
    """The local ports of the connections named ``name``, as the server sees them."""
    return {
        str(entry["addr"]).rsplit(":", 1)[1]
        for entry in observer.client_list()
        if entry.get("name") == name
    }
