"""Strict-mode schemas: every tool converts (or is refused saying why), and arguments come back.

The OpenAI Agents SDK's own strict check (``FunctionTool(strict_json_schema=True)``)
is the judge of what strict mode accepts; before this, it raised ``UserError:
additionalProperties should not be set for object types`` on ``http_request``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import jsonschema
import pydantic
import pytest
from agents import FunctionTool

import toolexec.tasks.http  # noqa: F401  http_request
from toolexec.errors import ConfigurationError
from toolexec.registry import Registry, default_registry, tool
from toolexec.stores.catalog import to_definitions
from toolexec.strict import StrictSchemaError, from_strict, strict_or_none, strict_schema

TESTS = Path(__file__).resolve().parents[1]

#: The tools the suite's workers serve, each a module of ordinary pydantic-typed tools.
TOOL_MODULES = [
    "tooldefs",
    "breaker_tools",
    "fallback_tools",
    "hostile_input_tools",
    "idempotency_tools",
    "mcp_front_tools",
    "observability_tools",
    "payload_tools",
    "runtime_tools",
    "security_tools",
    "tracing_tools",
    "toolexec.tasks.demo_tools",
]


async def _never(ctx: Any, raw: str) -> str:
    raise AssertionError("not called")


def _sdk_accepts(schema: dict[str, Any]) -> dict[str, Any]:
    made = FunctionTool(name="t", description="d", params_json_schema=schema, on_invoke_tool=_never)
    assert made.strict_json_schema is True
    return made.params_json_schema


def test_every_tool_the_suite_declares_converts_and_the_agents_sdk_accepts_it() -> None:
    sys.path.insert(0, str(TESTS))
    try:
        for module in TOOL_MODULES:
            importlib.import_module(module)
    finally:
        sys.path.remove(str(TESTS))
    specs = list(default_registry)
    assert "http_request" in {s.name for s in specs} and len(specs) > 30
    for spec in specs:
        _sdk_accepts(strict_schema(spec.json_schema()))


def test_http_requests_free_form_fields_become_pairs_and_json_text_and_come_back() -> None:
    spec = default_registry.get("http_request")
    assert spec is not None
    original = spec.json_schema()
    strict = strict_schema(original)
    assert strict["additionalProperties"] is False
    assert sorted(strict["required"]) == sorted(original["properties"])
    headers = strict["properties"]["headers"]["anyOf"][0]
    assert headers["type"] == "array" and headers["items"]["required"] == ["name", "value"]
    assert strict["properties"]["body"]["type"] == ["string", "null"]
    # what a model in strict mode sends: every field, null for "not given"
    sent = {
        "url": "https://api.example.com/x",
        "method": "POST",
        "params": [{"name": "q", "value": "1"}],
        "headers": [{"name": "X-Id", "value": "7"}],
        "body": '{"a": [1, 2]}',
        "timeout": None,
    }
    back = from_strict(sent, original)
    assert back == {
        "url": "https://api.example.com/x",
        "method": "POST",
        "params": {"q": "1"},
        "headers": {"X-Id": "7"},
        "body": {"a": [1, 2]},
    }
    spec.arguments.model_validate(back)  # what the tool body will be called with
    jsonschema.validate(sent, strict)


class Place(pydantic.BaseModel):
    city: str
    country: str | None = None


def test_the_meaning_is_kept_for_ordinary_pydantic_types() -> None:
    registry = Registry()

    @tool(registry=registry)
    def plan(
        places: list[Place],
        mode: Literal["car", "train"] = "train",
        limits: dict[str, int] | None = None,
        note: Annotated[str, pydantic.Field(max_length=20)] = "",
        extra: Any = None,
    ) -> None:
        """Plan a trip."""

    spec = registry.get("plan")
    assert spec is not None
    original = spec.json_schema()
    strict = _sdk_accepts(strict_schema(original))
    sent = {
        "places": [{"city": "Oslo", "country": None}],
        "mode": None,
        "limits": [{"name": "days", "value": 3}],
        "note": None,
        "extra": "[1, 2]",
    }
    jsonschema.validate(sent, strict)
    back = from_strict(sent, original)
    # optional fields left out come back out, so their defaults apply; a nullable one stays
    assert back == {
        "places": [{"city": "Oslo", "country": None}],
        "limits": {"days": 3},
        "extra": [1, 2],
    }
    jsonschema.validate(back, original)
    # arguments already in the catalog's shape pass through unchanged
    plain = {"places": [{"city": "Oslo"}], "limits": {"days": 3}, "mode": "car"}
    assert from_strict(plain, original) == plain


def test_a_tool_with_no_strict_form_is_refused_at_declaration_saying_how_to_fix_it() -> None:
    registry = Registry()
    with pytest.raises(ConfigurationError) as refused:

        @tool(registry=registry)
        def pair(point: tuple[int, int]) -> None:
            """A tuple has no strict form."""

    message = str(refused.value)
    assert "'pair'" in message and "strict mode" in message
    assert "arguments.point" in message and "use a list, or a model" in message
    assert registry.get("pair") is None


def test_schemas_toolexec_did_not_declare_go_non_strict() -> None:
    open_object = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "additionalProperties": {"type": "string"},
    }
    with pytest.raises(StrictSchemaError, match="extra='forbid'"):
        strict_schema(open_object)
    assert strict_or_none(open_object) is None
    catalog: Any = {
        "remote": {"description": "r", "parameters": open_object, "policy": {"queue": "q"}},
        "fine": {
            "description": "f",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "policy": {"queue": "q"},
        },
    }
    responses = {d["name"]: d for d in to_definitions(catalog, "openai-responses", strict=True)}
    assert responses["remote"]["strict"] is False
    assert responses["remote"]["parameters"] == open_object
    assert responses["fine"]["strict"] is True and responses["fine"]["type"] == "function"
    assert responses["fine"]["parameters"]["required"] == ["x"]
    chat = {d["function"]["name"]: d for d in to_definitions(catalog, "openai", strict=True)}
    assert chat["fine"]["function"]["strict"] is True
    assert "strict" not in to_definitions(catalog, "openai")[0]["function"]
    # the Responses API takes a tool without "strict" as strict: that shape always says
    assert all(d["strict"] is False for d in to_definitions(catalog, "openai-responses"))


def test_arguments_that_are_not_in_the_strict_shape_are_passed_on_for_validation() -> None:
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "object", "additionalProperties": {"type": "string"}}},
        "required": ["tags"],
    }
    for odd in ("not an object", {"tags": [1, 2]}, {"tags": "x"}, None):
        assert from_strict(odd, schema) == odd
