"""Whether this pytest run keeps toolexec's state on a Redis Cluster, and its broker then."""

from __future__ import annotations

import os

__all__ = ["CLUSTER_BROKER", "broker_url", "cluster_run"]

#: The broker of a cluster run when TOOLEXEC_TEST_BROKER_URL names none: a cluster
#: cannot be Celery's broker, and RabbitMQ is what a fleet on a cluster uses.
CLUSTER_BROKER = "amqp://guest:guest@127.0.0.1:5672//"


def cluster_run() -> bool:
    """``TOOLEXEC_TEST_CLUSTER=1``: the session's Redis is a local cluster (make test-cluster)."""
    return os.environ.get("TOOLEXEC_TEST_CLUSTER", "") not in ("", "0")


def broker_url() -> str | None:
    explicit = os.environ.get("TOOLEXEC_TEST_BROKER_URL") or None
    return explicit or (CLUSTER_BROKER if cluster_run() else None)
