"""Plain Celery as a user writes it: the baseline of bench/overhead.py.

Nothing of toolexec is imported here. The app has Celery's default settings
(JSON has been Celery's default serializer since 4.0), the Redis broker and the
Redis result backend, and the worker is started as a user starts one:
``celery -A plain_app worker -P threads -c 8 [-E]``. Only the broker URL comes
from the environment (``PLAIN_CELERY_URL``), so that each side of the benchmark
has a server of its own, and the fan-out task goes to a queue of its own, so
that a worker with 100 slots can serve it while another serves the no-ops.
"""

from __future__ import annotations

import os
import time

from celery import Celery

FANOUT_QUEUE = "fanout"


def make_app(url: str) -> Celery:
    """The app as the worker and the caller both build it."""
    app = Celery("plain_app", broker=url, backend=url, set_as_current=False)
    app.conf.task_routes = {"plain_app.sleep": {"queue": FANOUT_QUEUE}}

    @app.task(name="plain_app.noop", shared=False)  # type: ignore[untyped-decorator]
    def noop() -> None:
        """Does nothing: a call's whole round trip is overhead."""

    @app.task(name="plain_app.sleep", shared=False)  # type: ignore[untyped-decorator]
    def sleep(seconds: float) -> float:
        """Sleeps, to see how calls fan out over the worker's slots."""
        time.sleep(seconds)
        return seconds

    return app


#: What ``celery -A plain_app worker`` loads; the caller builds its own with make_app.
app = make_app(os.environ.get("PLAIN_CELERY_URL", "redis://127.0.0.1:6379/0"))
