"""An agent process that calls tools runs kombu and Celery as they ship (issue 23, item 1).

Before: building the app patched ``kombu.transport.redis.Channel``/``QoS`` by
``setattr`` in every process, so after one ``ToolClient.call`` any other kombu
user in the agent's process ran toolexec's worker patch. Now only a worker
selects toolexec's transport (``toolexec.transport``, a subclass), and this
checks, in a fresh process after a real call, that every attribute toolexec
overrides is still the library's own.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from toolexec.settings import Settings
from toolexec.testing import WorkerProcess

pytestmark = pytest.mark.integration

_PROBE = """
import json, sys
from toolexec.client import ToolClient
from toolexec.settings import Settings

with ToolClient(Settings.model_validate_json(sys.argv[1])) as client:
    result = client.call("pause", {"seconds": 0}, timeout=20)

import celery.worker.consumer.consumer as celery_consumer
import kombu.transport.redis as kr
import kombu.transport.virtual.base as virtual

overridden = {
    "Channel": (kr.Channel, ["_connparams", "_brpop_start", "_brpop_read", "QoS"]),
    "QoS": (kr.QoS, ["append", "_remove_from_indices"]),
    "virtual.QoS": (virtual.QoS, ["append"]),
    "Consumer": (celery_consumer.Consumer, [
        "create_task_handler", "ensure_connected", "on_unknown_message", "on_unknown_task",
        "on_invalid_task", "on_decode_error",
    ]),
}
foreign = []
for owner, (cls, names) in overridden.items():
    for name in names:
        value = cls.__dict__.get(name)
        # where the code was written, not __module__ (functools.wraps copies that)
        code = getattr(value, "__code__", None)
        if code is not None:
            own = any(f"/{lib}/" in code.co_filename for lib in ("kombu", "celery"))
            where = code.co_filename
        else:
            where = getattr(value, "__module__", None) or ""
            own = where.startswith(("kombu.", "celery."))
        if value is None or not own:
            foreign.append(f"{owner}.{name}: {where or value!r}")
extra = [n for n in (*vars(kr.Channel), *vars(kr.QoS)) if "toolexec" in n]
print(json.dumps({"ok": result.ok, "foreign": foreign, "extra": extra,
                  "qos": kr.Channel.QoS is kr.QoS}))
"""


def test_after_a_call_every_kombu_and_celery_attribute_is_the_librarys_own(
    settings: Settings, worker: WorkerProcess
) -> None:
    """Given a worker (on toolexec's transport), when a fresh process makes one call, then in
    that process kombu's Redis Channel and QoS and Celery's Consumer are as they ship."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, settings.model_dump_json()],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"ok": True, "foreign": [], "extra": [], "qos": True}
    assert worker.log_path is not None
    assert "toolexec.transport" not in done.stderr
