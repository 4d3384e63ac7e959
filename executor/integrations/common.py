"""What every framework integration shares: picking tools from the catalog, naming the run.

Kept free of any framework, so it is tested on its own.
"""

from __future__ import annotations

import json
import uuid
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from toolexec.bounds import checked_id
from toolexec.errors import UsageError
from toolexec.fairness import Lane
from toolexec.stores.catalog import Catalog, CatalogEntry

if TYPE_CHECKING:
    from toolexec.client import ToolClient

__all__ = ["Lane", "RunIds", "decoded", "fairness_key_in", "run_id_in", "selected"]


def selected(client: ToolClient, names: Iterable[str] | None) -> list[tuple[str, CatalogEntry]]:
    """The catalog's tools (all, or those named), in name order.

    An unknown name is a mistake in the agent's code, so it is refused here, naming
    the tools there are, rather than leaving the model a tool that always fails.
    """
    catalog: Catalog = client.catalog()
    if names is None:
        return sorted(catalog.items())
    wanted = [names] if isinstance(names, str) else list(names)
    unknown = sorted(set(wanted) - set(catalog))
    if unknown:
        raise UsageError(
            f"no tool named {', '.join(map(repr, unknown))} in the catalog; the workers "
            f"publish: {', '.join(sorted(catalog)) or 'nothing yet (is a worker running?)'}"
        )
    return [(name, catalog[name]) for name in dict.fromkeys(wanted)]


def decoded(raw: str) -> Any:
    """A model's JSON arguments as an object; text that is not one goes on as it is, and
    the client answers ``invalid_arguments`` saying what is wrong with it."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    return value if isinstance(value, dict) else raw


def run_id_in(value: Any) -> str | None:
    """A usable run id held by a framework's context object: ``.run_id`` or ``["run_id"]``."""
    found = value.get("run_id") if isinstance(value, Mapping) else getattr(value, "run_id", None)
    if found is None:
        return None
    try:
        return checked_id(str(found), "run_id")
    except UsageError:
        return None


def fairness_key_in(value: Any) -> str | None:
    """The fairness key a framework's context names: ``.fairness_key`` or ``["fairness_key"]``.

    One set of tools often serves many tenants' runs, so the tenant travels with
    the run's context rather than with the tools. Not checked here: the client
    refuses a bad key with a ``UsageError`` saying what is allowed, before anything
    is sent, which is better than a tenant's calls silently losing their lane.
    """
    if isinstance(value, Mapping):
        found = value.get("fairness_key")
    else:
        found = getattr(value, "fairness_key", None)
    return found if found is None or isinstance(found, str) else str(found)


class RunIds:
    """A run id per framework run object, for frameworks whose runs carry none.

    Keyed by the object's identity and forgotten with it, so a run object that the
    framework drops frees its entry; objects that cannot be weakly referenced get no id.
    """

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._ids: dict[int, tuple[weakref.ref[Any], str]] = {}

    def of(self, owner: Any) -> str | None:
        key = id(owner)
        known = self._ids.get(key)
        if known is not None and known[0]() is owner:
            return known[1]
        try:
            ref = weakref.ref(owner, lambda _: self._ids.pop(key, None))
        except TypeError:
            return None
        run_id = f"{self._prefix}-{uuid.uuid4().hex[:16]}"
        self._ids[key] = (ref, run_id)
        return run_id
