"""The client's Redis transport: kombu's, with one redis-py client per connection pool.

kombu's Redis channel builds a new ``redis.Redis`` for every command it sends
and for every publish batch (``Channel._create_client``), and building one
copies redis-py's table of reply callbacks into a case-insensitive dict: on a
client making one call at a time that was the dearest part of sending it. A
``redis.Redis`` is only a handle on its connection pool and is safe to share
between threads, so this channel keeps one per pool, as the worker's transport
does (``toolexec.transport``, which a client never loads). Nothing else
differs from kombu's transport; :func:`sending_transport` says which URLs it
serves.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

__all__ = ["SendingChannel", "SendingTransport", "sending_transport"]

_CLIENT = "_toolexec_sending_client"


class SendingChannel(kombu_redis.Channel):
    """kombu's Redis channel keeping its redis-py client for its current pool."""

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the polling client, which kombu already keeps
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        pool, kept = self.pool, self.__dict__.get(_CLIENT)
        if kept is None or kept.connection_pool is not pool:
            kept = self.__dict__[_CLIENT] = super()._create_client()  # type: ignore[no-untyped-call]
        return kept


class SendingTransport(kombu_redis.Transport):
    """kombu's Redis transport on :class:`SendingChannel`."""

    Channel = SendingChannel


def sending_transport(broker_url: str) -> str | None:
    """The transport a client sends ``broker_url``'s calls with; None: kombu's own."""
    scheme = broker_url.partition("://")[0].lower()
    if scheme in ("redis", "rediss", "socket"):
        return f"{__name__}:SendingTransport"
    return None
