"""One retried call, traced end to end, printed as a tree: no tracing backend needed.

Starts a local service that answers 503, 503, then 200, a real worker and a
loopback OTLP/HTTP receiver (``toolexec.ops.traces``); the worker and this
process (the agent) export their spans to it through the standard ``OTEL_*``
variables. The agent calls the built-in ``http_request`` inside a span of its
own, as an LLM framework would, and prints the trace the way
``toolexec trace CALL_ID`` does. Redis: ``TOOLEXEC_REDIS_URL``, else the
embedded Valkey. Needs ``pip install 'toolexec[ops,otel]'``.

Usage: ``python examples/trace_one_call.py``
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from opentelemetry import trace

from toolexec import Settings, ToolClient
from toolexec.connection import redis_url
from toolexec.ops.traces import OtlpReceiver, render_call
from toolexec.testing import FlakyServer, Reply, WorkerProcess


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="toolexec-trace-") as tmp, OtlpReceiver() as receiver:
        otel = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        os.environ.update({**otel, "OTEL_SERVICE_NAME": "agent"})
        # a prefix of its own: no breaker or budget state left by an earlier run
        prefix = f"trace-{uuid.uuid4().hex[:6]}"
        settings = Settings.from_env(key_prefix=prefix, default_queue=prefix)
        url = redis_url(settings)
        env = {
            **otel,
            "OTEL_SERVICE_NAME": "worker",
            "TOOLEXEC_REDIS_URL": url,
            "TOOLEXEC_KEY_PREFIX": prefix,
            "TOOLEXEC_DEFAULT_QUEUE": prefix,
            "TOOLEXEC_HTTP_ALLOW": "127.0.0.1",  # the local service below
        }
        worker = WorkerProcess("", env, log_path=Path(tmp) / "worker.log")
        worker.start(url, prefix)
        try:
            with FlakyServer() as service, ToolClient(settings) as client:
                flaky = service.script("/orders/42", Reply(503), Reply(503), Reply(200))
                with trace.get_tracer("my-agent").start_as_current_span("agent step 3"):
                    result = client.call("http_request", {"url": flaky}, run_id="run-7")
                print(f"call {result.call_id}: {result.status} after {result.attempts} attempts\n")
            time.sleep(1.0)  # the worker's last batch of spans
            trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]
            print(render_call(receiver.snapshot(), result.call_id))
        finally:
            worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
