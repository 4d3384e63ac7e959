"""Issue 18, item 10: isolation between callers.

Before: idempotency keys were one global namespace (the same key under another
tool was a mismatch, and a second caller reusing a key got the first caller's
stored result back), and any client that knew a run id could read, forget or
re-budget that run. Now a key is scoped by its tool, and by the caller's tenant
(``TOOLEXEC_TENANT``) when one is set, and so is a run's guard state.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from hostile_input_support import isolated_worker

from toolexec.client import ToolClient
from toolexec.context import CallContext
from toolexec.errors import ErrorType
from toolexec.idempotency import record_id
from toolexec.keys import Keys
from toolexec.policies import RunBudget
from toolexec.settings import Settings


def _ctx(tool: str, key: str | None = None, tenant: str | None = None, run: str | None = None):
    now = time.time()
    return CallContext(
        call_id=uuid.uuid4().hex,
        tool=tool,
        deadline=now + 10,
        submitted_at=now,
        reply_to="r",
        run_id=run,
        idempotency_key=key,
        tenant=tenant,
    )


def test_a_callers_key_is_scoped_by_tool_and_tenant() -> None:
    same = record_id("idempotent", "h", _ctx("send_mail", "K"))

    assert record_id("idempotent", "h", _ctx("send_mail", "K")) == same
    assert record_id("idempotent", "h", _ctx("delete_repo", "K")) != same
    assert record_id("idempotent", "h", _ctx("send_mail", "K", tenant="acme")) != same
    assert record_id("idempotent", "h", _ctx("send_mail", "K", tenant="acme")) == record_id(
        "idempotent", "h", _ctx("send_mail", "K", tenant="acme")
    )


def test_derived_and_coalesced_records_are_scoped_by_tenant() -> None:
    run_a = record_id("idempotent", "h", _ctx("t", run="r1", tenant="a"))
    run_b = record_id("idempotent", "h", _ctx("t", run="r1", tenant="b"))
    read_a = record_id("coalesce", "h", _ctx("t", tenant="a"))
    read_b = record_id("coalesce", "h", _ctx("t", tenant="b"))

    assert run_a != run_b and read_a != read_b


def test_a_tenant_is_part_of_a_runs_key() -> None:
    acme, other = Keys("p", tenant="acme"), Keys("p", tenant="other")
    assert Keys("p").run("r1") != acme.run("r1") != other.run("r1")


def test_a_tenants_last_good_results_are_its_own(redis_url: str) -> None:
    """A fallback answers from the cache of the caller's own tenant, never another's."""
    from toolexec.clock import ManualClock
    from toolexec.connection import redis_client
    from toolexec.fallback import LastGood
    from toolexec.fallback.cache import LastGoodCache

    cache = LastGoodCache(
        redis_client(redis_url), Keys(f"sec-{uuid.uuid4().hex[:8]}"), ManualClock()
    )
    step = LastGood(ttl_s=60)
    cache.store("forecast", {"city": "Oslo"}, step, {"for": "acme"}, tenant="acme")

    mine = cache.lookup("forecast", {"city": "Oslo"}, step, tenant="acme")
    theirs = cache.lookup("forecast", {"city": "Oslo"}, step, tenant="globex")
    untenanted = cache.lookup("forecast", {"city": "Oslo"}, step)

    assert mine is not None and mine.data == {"for": "acme"}
    assert theirs is None and untenanted is None
    cache.redis.delete(cache.key("forecast", {"city": "Oslo"}, "acme"))


# -- through a real worker -----------------------------------------------------------------


@pytest.fixture(scope="module")
def clients(
    settings: Settings, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ToolClient, ToolClient, ToolClient]]:
    """A worker, and clients of no tenant, tenant acme and tenant globex."""
    with isolated_worker(settings, worker_env, tmp_path_factory.mktemp("isolation")) as (_, c):
        acme = ToolClient(c.settings.model_copy(update={"tenant": "acme"}))
        globex = ToolClient(c.settings.model_copy(update={"tenant": "globex"}))
        try:
            yield c, acme, globex
        finally:
            acme.close()
            globex.close()


@pytest.mark.integration
def test_the_same_key_under_another_tool_is_another_call(
    clients: tuple[ToolClient, ToolClient, ToolClient],
) -> None:
    """Before: idempotency_mismatch, since keys were global."""
    client, _, _ = clients
    key = uuid.uuid4().hex

    first = client.call("hi_echo", {"value": 1}, idempotency_key=key, timeout=20)
    other_tool = client.call("hi_capped", {"kilobytes": 1}, idempotency_key=key, timeout=20)
    mismatch = client.call("hi_echo", {"value": 2}, idempotency_key=key, timeout=20)

    assert first.status == "ok" and other_tool.status == "ok" and not other_tool.replayed
    assert mismatch.error is not None
    assert mismatch.error.type == ErrorType.IDEMPOTENCY_MISMATCH  # within a tool: as before


@pytest.mark.integration
def test_another_tenant_neither_replays_nor_learns_of_a_key(
    clients: tuple[ToolClient, ToolClient, ToolClient],
) -> None:
    """Before: a second caller reusing a key got the first caller's stored result back,
    or an idempotency_mismatch that told it the key was in use."""
    untenanted, acme, globex = clients
    key = uuid.uuid4().hex

    theirs = acme.call("hi_echo", {"value": "acme's secret"}, idempotency_key=key, timeout=20)
    same_args = untenanted.call(
        "hi_echo", {"value": "acme's secret"}, idempotency_key=key, timeout=20
    )
    other_args = globex.call("hi_echo", {"value": "y"}, idempotency_key=key, timeout=20)
    acme_again = acme.call("hi_echo", {"value": "x"}, idempotency_key=key, timeout=20)

    assert theirs.status == "ok"
    assert same_args.status == "ok" and not same_args.replayed
    assert other_args.status == "ok" and other_args.data == "y"
    assert acme_again.error is not None  # acme's own reuse is still a mismatch
    assert acme_again.error.type == ErrorType.IDEMPOTENCY_MISMATCH


@pytest.mark.integration
def test_another_tenant_cannot_read_forget_or_rebudget_a_run(
    clients: tuple[ToolClient, ToolClient, ToolClient],
) -> None:
    _, acme, globex = clients
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    calls = [{"id": "c1", "function": {"name": "hi_echo", "arguments": '{"value": 1}'}}]
    acme.run_tool_calls(calls, run_id=run_id, budget=RunBudget(max_steps=5), timeout=20)

    seen_by_globex = globex.run_guard(run_id).view()
    globex.run_guard(run_id).forget()
    globex.run_tool_calls(calls, run_id=run_id, budget=RunBudget(max_steps=1), timeout=20)

    assert not seen_by_globex.exists
    view = acme.run_guard(run_id).view()
    assert view.exists and view.rounds == 1 and view.budget.max_steps == 5
