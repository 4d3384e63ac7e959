"""The RabbitMQ the suite's RabbitMQ modules run against, or the reason they are skipped.

A module calls :func:`require_rabbitmq` at import: without a RabbitMQ answering at
``TOOLEXEC_TEST_RABBITMQ_URL`` (default guest on 127.0.0.1:5672) it is skipped and
says why, so a machine without RabbitMQ still runs everything else.
"""

from __future__ import annotations

import os

import pytest
from kombu import Connection

from toolexec.connection import redact_url

RABBITMQ_URL = os.environ.get("TOOLEXEC_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _unreachable(url: str) -> str | None:
    try:
        with Connection(url, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def require_rabbitmq() -> str:
    """The URL of a reachable RabbitMQ; skips the calling module when there is none."""
    why = _unreachable(RABBITMQ_URL)
    if why is not None:
        pytest.skip(
            f"no RabbitMQ reachable at {redact_url(RABBITMQ_URL)} ({why}); start one or set "
            "TOOLEXEC_TEST_RABBITMQ_URL to run the RabbitMQ cases",
            allow_module_level=True,
        )
    return RABBITMQ_URL
