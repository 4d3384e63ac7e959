"""Counting one test's own Redis commands on a server that other tests share."""

from __future__ import annotations

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
