"""Every Redis key toolexec writes, built in one place.

Each TTL sits next to its key with the reason for its length, so that an
operator reading ``redis-cli --scan`` can tell what a key is and when it goes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Keys"]


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix, so several deployments can share a server."""

    prefix: str = "toolexec"

    def catalog(self) -> str:
        """Hash: tool name -> JSON catalog entry, published by every worker at start.

        No TTL: an entry stays until a worker publishes a newer one, so clients
        can validate calls even while every worker is restarting.
        """
        return f"{self.prefix}:catalog"

    def workers(self) -> str:
        """Sorted set: worker hostname scored by its last catalog heartbeat (epoch s)."""
        return f"{self.prefix}:workers"

    def reply(self, reply_to: str) -> str:
        """List a worker pushes final results onto; the caller pops them.

        TTL: :data:`REPLY_TTL_S` past the call's deadline, so that replies for
        callers that died or gave up do not pile up.
        """
        return f"{self.prefix}:reply:{reply_to}"


#: A reply nobody collects within this long after its deadline is garbage.
REPLY_TTL_S = 300
