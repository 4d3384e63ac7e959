"""The framework integrations' pure parts: no framework on import, and where run ids come from."""

from __future__ import annotations

import gc
import subprocess
import sys
import uuid
from types import SimpleNamespace

from toolexec.integrations.common import RunIds, decoded, run_id_in
from toolexec.integrations.langchain import run_id_of


def test_importing_toolexec_imports_no_agent_framework() -> None:
    code = (
        "import sys, toolexec, toolexec.client, toolexec.integrations, toolexec.strict\n"
        "loaded = [m for m in ('agents', 'pydantic_ai', 'langchain_core') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_context_names_its_run_by_attribute_or_key_when_the_id_is_usable() -> None:
    assert run_id_in(SimpleNamespace(run_id="r-1")) == "r-1"
    assert run_id_in({"run_id": "r-2"}) == "r-2"
    assert run_id_in({"run_id": uuid.UUID(int=1)}) == str(uuid.UUID(int=1))
    assert run_id_in(None) is None and run_id_in({}) is None
    assert run_id_in({"run_id": "a\nb"}) is None  # ids go into keys and log lines
    assert run_id_in({"run_id": "x" * 500}) is None


def test_langchain_takes_the_run_id_from_the_run_config_in_order() -> None:
    both = {"configurable": {"run_id": "c", "thread_id": "t"}, "metadata": {"run_id": "m"}}
    assert run_id_of(both) == "c"
    assert run_id_of({"configurable": {"thread_id": "t"}, "metadata": {"run_id": "m"}}) == "m"
    assert run_id_of({"configurable": {"thread_id": "t"}}) == "t"
    parent = uuid.uuid4()
    assert run_id_of({}, SimpleNamespace(parent_run_id=parent)) == str(parent)  # type: ignore[arg-type]
    assert run_id_of(None) is None


class _Run:
    """Stands in for a framework's per-run object (the Agents SDK's RunConfig)."""


def test_a_run_object_keeps_one_id_until_it_is_dropped() -> None:
    ids = RunIds("agents")
    one, two = _Run(), _Run()
    first = ids.of(one)
    assert first is not None and first.startswith("agents-")
    assert ids.of(one) == first and ids.of(two) not in (None, first)
    del one
    gc.collect()
    assert len(ids._ids) == 1
    assert ids.of(42) is None  # cannot be weakly referenced: no id, the call runs unguarded


def test_arguments_that_are_not_a_json_object_go_on_as_text() -> None:
    assert decoded('{"a": 1}') == {"a": 1}
    assert decoded("") == {}
    assert decoded("[1]") == "[1]" and decoded("{broken") == "{broken"
