"""Fixtures for the end-to-end tests: real workers, real Redis, a misbehaving service.

The session-wide pieces (Redis, the shared worker, the FlakyServer, the
client) come from ``tests/conftest.py``; these add what several integration
modules need: a port nothing listens on, a client whose broker is gone (it can
only answer calls that never reach the broker), and a raw Celery app to publish
messages the client would have refused.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery
from integration_support import closed_port

from toolexec.client import ToolClient
from toolexec.keys import Keys
from toolexec.settings import Settings
from toolexec.testing import WorkerProcess
from toolexec.worker.app import create_app


@pytest.fixture(scope="session")
def keys(settings: Settings) -> Keys:
    return Keys(settings.key_prefix)


@pytest.fixture
def client_without_broker(settings: Settings, worker: WorkerProcess) -> Iterator[ToolClient]:
    """A client that reads the real catalog but cannot publish anything.

    A call it answers without raising BrokerUnavailableError was, by
    construction, never enqueued.
    """
    offline = settings.model_copy(update={"broker_url": f"redis://127.0.0.1:{closed_port()}/0"})
    with ToolClient(offline) as tool_client:
        yield tool_client


@pytest.fixture(scope="session")
def raw_app(settings: Settings, worker: WorkerProcess) -> Iterator[Celery]:
    """A Celery app with the workers' settings, to publish what the client would refuse."""
    celery_app = create_app(settings)
    yield celery_app
    celery_app.close()
