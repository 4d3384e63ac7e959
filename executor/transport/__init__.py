"""kombu's side of a worker: toolexec's Redis transport and what it writes.

``kombu_redis`` subclasses kombu's Redis transport (docs/architecture.md, The kombu
seam); ``inbox`` and ``orphans`` are the inbox and the held set it keeps, and the
watch that gives a dead consumer's messages back; ``lanes`` is the fair take.
The package re-exports the transport's public names, so the alias a worker
selects (``broker_transport``) keeps its name.
"""

from toolexec.transport.kombu_redis import (
    ALLOW_UNTESTED,
    TESTED,
    Channel,
    QoS,
    SentinelChannel,
    SentinelTransport,
    Transport,
    check_versions,
    transport_for,
    version_problem,
)

__all__ = [  # noqa: RUF022 (plain order: test_exports)
    "ALLOW_UNTESTED",
    "Channel",
    "QoS",
    "SentinelChannel",
    "SentinelTransport",
    "TESTED",
    "Transport",
    "check_versions",
    "transport_for",
    "version_problem",
]
