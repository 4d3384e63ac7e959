"""The RabbitMQ the suite's RabbitMQ modules run against, or the reason they are skipped.

A module calls :func:`require_rabbitmq` at import: without a RabbitMQ answering at
``TOOLEXEC_TEST_RABBITMQ_URL`` (default guest on 127.0.0.1:5672) it is skipped and
says why, so a machine without RabbitMQ still runs everything else.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from kombu import Connection

from toolexec.connection import redact_url
from toolexec.settings import Settings

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


@dataclass(frozen=True)
class AmqpRun:
    """A module's own run on RabbitMQ: its queue, settings and workers' environment."""

    queue: str
    settings: Settings
    env: dict[str, str]


def amqp_run(settings: Settings, worker_env: dict[str, str], tag: str, flag: str) -> AmqpRun:
    """A queue and key prefix of the run's own (the modules share the node's default
    vhost), with one opt-in setting on for clients and workers alike (``flag``:
    ``rabbitmq_fairness`` or ``rabbitmq_priorities``); the workers import this folder's
    ``fairness_tools``, which serve ``FAIRNESS_QUEUE``."""
    run = uuid.uuid4().hex[:8]
    queue = f"toolexec-{tag}-{run}"
    own = settings.model_copy(
        update={
            "broker_url": RABBITMQ_URL,
            "key_prefix": f"{settings.key_prefix}-{tag}-{run}",
            flag: True,
        }
    )
    here = str(Path(__file__).parent)
    env = {
        **worker_env,
        "PYTHONPATH": os.pathsep.join([here, worker_env["PYTHONPATH"]]),
        "TOOLEXEC_BROKER_URL": RABBITMQ_URL,
        "TOOLEXEC_KEY_PREFIX": own.key_prefix,
        f"TOOLEXEC_{flag.upper()}": "true",
        "FAIRNESS_QUEUE": queue,
    }
    return AmqpRun(queue, own, env)
