"""The catalog turns registered tools into the definitions model APIs take."""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, Literal, cast

import pytest
from pydantic import Field

from toolexec.connection import redis_client
from toolexec.keys import Keys
from toolexec.registry import Registry, tool
from toolexec.stores import catalog


@pytest.fixture
def tools(registry: Registry) -> catalog.Catalog:
    """A catalog built from real specs, as a worker would publish it."""

    @tool(registry=registry, queue="maps")
    def geocode(
        place: Annotated[str, Field(description="A place name.")],
        country: str | None = None,
    ) -> dict[str, float]:
        """Coordinates of a place."""
        return {"lat": 0.0, "lon": 0.0}

    @tool(registry=registry)
    def convert(amount: float, to: Literal["EUR", "USD"] = "EUR") -> float:
        """Convert money between currencies."""
        return amount

    return {spec.name: spec.catalog_entry("tools") for spec in registry}


def test_openai_definitions_are_functions_sorted_by_name(tools: catalog.Catalog) -> None:
    definitions = catalog.to_definitions(tools, "openai")
    assert [d["function"]["name"] for d in definitions] == ["convert", "geocode"]
    convert, geocode = definitions
    assert convert["type"] == "function"
    assert set(convert["function"]) == {"name", "description", "parameters"}
    assert convert["function"]["description"] == "Convert money between currencies."
    parameters = geocode["function"]["parameters"]
    assert parameters["type"] == "object" and parameters["required"] == ["place"]
    assert parameters["properties"]["place"]["description"] == "A place name."


def test_anthropic_definitions_carry_an_input_schema(tools: catalog.Catalog) -> None:
    definitions = catalog.to_definitions(tools, "anthropic")
    assert [set(d) for d in definitions] == [{"name", "description", "input_schema"}] * 2
    convert = definitions[0]
    assert convert["name"] == "convert"
    assert convert["input_schema"]["properties"]["to"]["enum"] == ["EUR", "USD"]
    assert convert["input_schema"]["additionalProperties"] is False


def test_openai_is_the_default_format(tools: catalog.Catalog) -> None:
    assert catalog.to_definitions(tools) == catalog.to_definitions(tools, "openai")


def test_both_shapes_describe_the_same_schema(tools: catalog.Catalog) -> None:
    openai = catalog.to_definitions(tools, "openai")
    anthropic = catalog.to_definitions(tools, "anthropic")
    for o, a in zip(openai, anthropic, strict=True):
        assert o["function"]["parameters"] == a["input_schema"]
        assert o["function"]["description"] == a["description"]


def test_definitions_are_plain_json(tools: catalog.Catalog) -> None:
    definitions = catalog.to_definitions(tools, "anthropic")
    assert json.loads(json.dumps(definitions)) == definitions


def test_an_unknown_format_is_refused(tools: catalog.Catalog) -> None:
    with pytest.raises(ValueError, match="gemini"):
        catalog.to_definitions(tools, cast(Any, "gemini"))


def test_catalog_entries_carry_task_queue_and_policy(tools: catalog.Catalog) -> None:
    assert tools["geocode"]["task"] == "tools.geocode"
    assert tools["geocode"]["policy"]["queue"] == "maps"
    assert tools["convert"]["policy"]["queue"] == "tools"
    assert tools["convert"]["policy"]["max_attempts"] == 3


def test_a_published_catalog_reads_back_the_same(
    registry: Registry, tools: catalog.Catalog, redis_url: str
) -> None:
    """Through a real Redis: what a worker publishes is what a client reads."""
    keys = Keys(prefix=f"unit-{uuid.uuid4().hex[:8]}")
    client = redis_client(redis_url)
    try:
        published = catalog.publish(client, keys, registry, "tools", "w1@host", now=1000.0)
        assert published == 2
        assert catalog.read(client, keys) == tools
        assert catalog.workers_seen(client, keys, since=999.0) == ["w1@host"]
        assert catalog.workers_seen(client, keys, since=1000.5) == []
    finally:
        client.delete(keys.catalog(), keys.workers())
        client.close()
