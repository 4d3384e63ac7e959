"""Tool schemas in the strict form OpenAI's APIs take, and the model's arguments back from it.

OpenAI's strict mode (``strict: true`` in Chat Completions and the Responses API, and
the OpenAI Agents SDK's default) makes the model's arguments always parse against the
schema, but it accepts only part of JSON Schema: every object is closed
(``additionalProperties: false``) and lists all its properties as required, so a map
(``dict[str, str]``) or a free-form value (``Any``) cannot be said at all. The catalog's
schema is what toolexec validates calls against, so it stays as declared; this module
rewrites it into a strict schema of the same meaning, and turns the model's arguments
back into the catalog's shape before a call::

    an optional property   required and nullable; null stands for "not given"
    a map (dict[str, X])   an array of {"name": ..., "value": ...} pairs
    any JSON value (Any)   a string holding the value as JSON text
    oneOf                  anyOf (the branches of a tool's unions do not overlap)

Keywords strict mode refuses (``default``, ``title``, ...) are left out of the strict
schema: the client still validates the arguments against the catalog's schema, so a
bound the model does not see is still enforced, with an ``invalid_arguments`` error it
can act on. What has no strict form (a tuple, an object with both named and free-form
keys, ``allOf`` of several schemas, ``if``/``then``) raises :class:`StrictSchemaError`,
which says why and how to declare the argument instead; ``@tool`` refuses such a tool.

Pure functions of the schema and the arguments, so every rule is tested without a model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from toolexec.errors import ConfigurationError

__all__ = ["StrictSchemaError", "from_strict", "strict_or_none", "strict_schema"]

#: Keywords a strict schema keeps; the rest are dropped (the catalog's schema, which the
#: client validates against, still has them).
_KEPT = frozenset(
    {
        "type",
        "description",
        "enum",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
    }
)

#: Keywords that change what is valid in ways strict mode has no words for.
_REFUSED = {
    "prefixItems": "a tuple (fixed positions) has no strict form; use a list, or a model "
    "with named fields",
    "patternProperties": "keys constrained by a pattern have no strict form; use a "
    "dict[str, X] or a model with named fields",
    "if": "conditional schemas (if/then/else) have no strict form; split the tool, or use "
    "a union of models",
    "not": "'not' has no strict form; describe the allowed values instead",
    "dependentRequired": "dependent requirements have no strict form; check them in the tool",
    "dependentSchemas": "dependent schemas have no strict form; check them in the tool",
}

_SCALARS = frozenset({"string", "number", "integer", "boolean", "null"})

_PAIRS_NOTE = "A list of name/value pairs (each name at most once)."
_JSON_NOTE = 'Any JSON value, written as JSON text (e.g. {"a": 1}, [1, 2], "text", null).'


class StrictSchemaError(ConfigurationError):
    """A schema has no strict form; the message says where, why and what to declare instead."""


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The strict form of a tool's argument schema (an object schema, as ``@tool`` makes).

    Raises :class:`StrictSchemaError` when part of it cannot be expressed strictly.
    """
    root = {k: v for k, v in schema.items() if k != "$defs"}
    if root.get("type") != "object":
        raise StrictSchemaError(
            "a tool's arguments must be an object with named properties, not "
            f"{json.dumps(root.get('type'))}"
        )
    out = _node(root, "arguments")
    if out.get("type") != "object":  # a map at the root: its keys must be named
        raise StrictSchemaError(
            "a tool's arguments must have named properties; arbitrary keys have no strict "
            "form: declare each argument as a parameter"
        )
    defs = schema.get("$defs")
    if isinstance(defs, Mapping) and defs:
        out["$defs"] = {name: _node(d, f"$defs.{name}") for name, d in defs.items()}
    return out


def strict_or_none(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """The strict form of ``schema``, or None when it has none (the tool then goes non-strict).

    For schemas toolexec did not declare (a remote MCP server's, a worker of another
    version's): OpenAI takes strict and non-strict tools side by side.
    """
    try:
        return strict_schema(schema)
    except StrictSchemaError:
        return None


def _checked(s: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(s, Mapping):
        raise StrictSchemaError(f"{where}: {s!r:.60} is not a schema")
    for keyword, why in _REFUSED.items():
        if keyword in s:
            raise StrictSchemaError(f"{where}: {why}")
    return s


def _node(s: Any, where: str) -> dict[str, Any]:
    if s is True or s == {}:
        return _json_text({})
    s = _checked(s, where)
    if "$ref" in s:
        return _described({"$ref": s["$ref"]}, s)
    if "allOf" in s:
        return _all_of(s, where)
    branches = s.get("anyOf", s.get("oneOf"))
    if branches is not None:
        return _described({"anyOf": [_node(b, where) for b in branches]}, s)
    if "const" in s:
        return _kept({**s, "enum": [s["const"]]})
    kind = s.get("type")
    if kind is None and "enum" not in s:
        return _json_text(s)
    if kind == "object":
        return _object(s, where)
    if kind == "array":
        return _array(s, where)
    if isinstance(kind, list) and not set(kind) <= _SCALARS:
        raise StrictSchemaError(
            f"{where}: a type list with {sorted(set(kind) - _SCALARS)} has no strict form; "
            "use a union (X | Y) of separate types"
        )
    return _kept(s)


def _kept(s: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in s.items() if k in _KEPT}


def _described(out: dict[str, Any], s: Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(s.get("description"), str):
        out["description"] = s["description"]
    return out


def _json_text(s: Mapping[str, Any]) -> dict[str, Any]:
    said = s.get("description")
    text = f"{said} {_JSON_NOTE}" if isinstance(said, str) and said else _JSON_NOTE
    return {"type": "string", "description": text}


def _all_of(s: Mapping[str, Any], where: str) -> dict[str, Any]:
    parts = s["allOf"]
    if not isinstance(parts, list) or len(parts) != 1:
        raise StrictSchemaError(
            f"{where}: allOf of several schemas has no strict form; declare one model that "
            "has all the fields"
        )
    merged = {**{k: v for k, v in s.items() if k != "allOf"}, **parts[0]}
    return _described(_node(merged, where), s)


def _object(s: Mapping[str, Any], where: str) -> dict[str, Any]:
    properties = s.get("properties")
    extra = s.get("additionalProperties")
    if properties:
        if extra not in (None, False):
            raise StrictSchemaError(
                f"{where}: an object with named fields and free-form extra keys has no strict "
                "form; forbid extra keys (extra='forbid'), or move them into a field of type "
                "dict[str, X]"
            )
        return _closed(s, properties, where)
    if extra is False:
        return _described(
            {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
            s,
        )
    return _pairs(s, {} if extra in (None, True) else extra, where)


def _closed(s: Mapping[str, Any], properties: Mapping[str, Any], where: str) -> dict[str, Any]:
    required = set(s.get("required") or ())
    out: dict[str, Any] = {}
    for name, prop in properties.items():
        converted = _node(prop, f"{where}.{name}")
        if name not in required and not _takes_null(converted):
            converted = _nullable(converted, prop)
        out[name] = converted
    return _described(
        {
            "type": "object",
            "properties": out,
            "required": list(properties),
            "additionalProperties": False,
        },
        s,
    )


def _nullable(converted: dict[str, Any], original: Any) -> dict[str, Any]:
    """An optional property, required in strict form: null means "leave it out"."""
    default = original.get("default") if isinstance(original, Mapping) else None
    said = converted.pop("description", None)
    note = "null: not given" + (f", {json.dumps(default)}" if default is not None else "")
    text = f"{said} [{note}]" if isinstance(said, str) and said else f"Optional [{note}]."
    kind = converted.get("type")
    if isinstance(kind, str) and "enum" not in converted and kind in _SCALARS:
        return {**converted, "type": [kind, "null"], "description": text}
    return {"anyOf": [converted, {"type": "null"}], "description": text}


def _pairs(s: Mapping[str, Any], value: Any, where: str) -> dict[str, Any]:
    said = s.get("description")
    text = f"{said} {_PAIRS_NOTE}" if isinstance(said, str) and said else _PAIRS_NOTE
    pair = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "value": _node(value, f"{where}[value]")},
        "required": ["name", "value"],
        "additionalProperties": False,
    }
    return {"type": "array", "items": pair, "description": text}


def _array(s: Mapping[str, Any], where: str) -> dict[str, Any]:
    items = s.get("items", {})
    return {**_kept(s), "items": _node(items, f"{where}[]")}


def _takes_null(s: Mapping[str, Any]) -> bool:
    kind = s.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    if None in (s.get("enum") or ()):
        return True
    return any(_takes_null(b) for b in s.get("anyOf", ()) if isinstance(b, Mapping))


# -- the model's arguments, back in the catalog's shape -------------------------------


def from_strict(arguments: Any, schema: Mapping[str, Any]) -> Any:
    """The model's arguments under :func:`strict_schema`'s form, in ``schema``'s shape again.

    Never raises: a value that does not have the expected strict shape is passed on
    as it is, and the client's validation against ``schema`` says what is wrong.
    """
    defs = schema.get("$defs")
    try:
        return _back(arguments, schema, defs if isinstance(defs, Mapping) else {}, 0)
    except (TypeError, ValueError, KeyError, RecursionError):
        return arguments


_MAX_DEPTH = 64


def _resolve(s: Any, defs: Mapping[str, Any]) -> Any:
    ref = s.get("$ref") if isinstance(s, Mapping) else None
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return defs.get(ref.removeprefix("#/$defs/"), {})
    return s


def _back(value: Any, s: Any, defs: Mapping[str, Any], depth: int) -> Any:
    s = _resolve(s, defs)
    if depth > _MAX_DEPTH or (not isinstance(s, Mapping) and s is not True):
        return value
    if s is True or s == {} or _free(s):
        return _parsed(value)
    if isinstance(s.get("allOf"), list) and len(s["allOf"]) == 1:
        return _back(value, {**s, "allOf": None, **_resolve(s["allOf"][0], defs)}, defs, depth + 1)
    branches = s.get("anyOf", s.get("oneOf"))
    if isinstance(branches, list):
        return _branch(value, branches, defs, depth)
    if s.get("type") == "object":
        return _back_object(value, s, defs, depth)
    if s.get("type") == "array" and isinstance(value, list):
        return [_back(item, s.get("items", {}), defs, depth + 1) for item in value]
    return value


def _free(s: Mapping[str, Any]) -> bool:
    shaping = ("type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf")
    return not any(s.get(k) is not None for k in shaping)


def _parsed(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:  # plain text the model did not quote: that text is the value
        return value


def _branch(value: Any, branches: list[Any], defs: Mapping[str, Any], depth: int) -> Any:
    if value is None:
        return None
    for branch in branches:
        resolved = _resolve(branch, defs)
        if isinstance(resolved, Mapping) and resolved.get("type") == "null":
            continue
        candidate = _back(value, resolved, defs, depth + 1)
        if _fits(candidate, resolved, defs):
            return candidate
    return value


def _fits(value: Any, s: Any, defs: Mapping[str, Any]) -> bool:
    import jsonschema

    try:
        jsonschema.validate(value, {**s, "$defs": dict(defs)} if isinstance(s, Mapping) else s)
    except (jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True


def _back_object(value: Any, s: Mapping[str, Any], defs: Mapping[str, Any], depth: int) -> Any:
    properties = s.get("properties")
    if properties:
        if not isinstance(value, Mapping):
            return value
        required = set(s.get("required") or ())
        out: dict[str, Any] = {}
        for name, item in value.items():
            prop = properties.get(name)
            if prop is None:
                out[name] = item
            elif item is None and name not in required and not _null_allowed(prop, defs):
                continue  # strict form's "not given"
            else:
                out[name] = _back(item, prop, defs, depth + 1)
        return out
    extra = s.get("additionalProperties")
    if extra is False:
        return value
    inner = {} if extra in (None, True) else extra
    if isinstance(value, list) and all(_is_pair(p) for p in value):
        return {p["name"]: _back(p["value"], inner, defs, depth + 1) for p in value}
    if isinstance(value, Mapping):
        return {k: _back(v, inner, defs, depth + 1) for k, v in value.items()}
    return value


def _is_pair(item: Any) -> bool:
    return isinstance(item, Mapping) and set(item) == {"name", "value"}


def _null_allowed(s: Any, defs: Mapping[str, Any]) -> bool:
    s = _resolve(s, defs)
    if not isinstance(s, Mapping):
        return s is True
    if _free(s):
        return True
    if "const" in s and s["const"] is None:
        return True
    branches = [*(s.get("anyOf") or ()), *(s.get("oneOf") or ()), *(s.get("allOf") or ())]
    return _takes_null(s) or any(_null_allowed(b, defs) for b in branches)
