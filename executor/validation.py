"""Validation messages a model can act on.

Both the worker (pydantic, authoritative) and the client (JSON Schema from the
catalog, to fail before enqueueing) describe each bad field the same way:
where it is, what was given, what was expected.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema
import pydantic

from toolexec.redaction import is_secret_path, redact, scrub_text, secret_names

__all__ = ["describe_validation_error", "validate_against_schema"]

_MAX_INPUT_REPR = 80


def _shown(value: Any) -> str:
    """What was given, credentials inside it masked (a headers object with an Authorization)."""
    value = redact(value)
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _MAX_INPUT_REPR else text[: _MAX_INPUT_REPR - 1] + "…"


def _location(path: Iterable[Any]) -> str:
    parts = [str(p) for p in path]
    return ".".join(parts) if parts else "(arguments)"


def _given(value: Any, path: Iterable[Any], secrets: frozenset[str]) -> str:
    """What was given, unless it is a secret: a message ends up in logs and Flower."""
    return "a hidden value" if is_secret_path(path, secrets) else _shown(value)


def describe_validation_error(
    exc: pydantic.ValidationError, secrets: frozenset[str] = frozenset()
) -> str:
    """One line per bad field: ``field: problem (given X)``; secret values are not shown."""
    lines = []
    for err in exc.errors(include_url=False):
        where = _location(err["loc"])
        if err["type"] == "missing":
            lines.append(f"{where}: required but missing")
        elif err["type"] == "extra_forbidden":
            lines.append(f"{where}: not an argument of this tool")
        else:
            given = _given(err["input"], err["loc"], secrets)
            lines.append(f"{where}: {err['msg']} (given {given})")
    return "invalid arguments: " + "; ".join(lines)


def validate_against_schema(arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> str | None:
    """A description of everything wrong with ``arguments``, or None if valid."""
    secrets = secret_names(schema)
    validator = jsonschema.Draft202012Validator(schema)
    problems = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if not problems:
        return None
    lines = []
    for err in problems:
        where = _location(err.absolute_path)
        if err.validator == "required" or err.validator == "additionalProperties":
            lines.append(f"{where}: {err.message}")
        elif is_secret_path(err.absolute_path, secrets):
            # jsonschema's own message quotes the value; a secret's must not be quoted.
            rule = f"{err.validator}: {json.dumps(err.validator_value, default=str)}"
            lines.append(f"{where}: does not satisfy {rule} (given a hidden value)")
        elif isinstance(err.instance, dict | list):
            # jsonschema's own message quotes the whole object, credentials and all.
            rule = f"{err.validator}: {json.dumps(err.validator_value, default=str)}"
            lines.append(f"{where}: does not satisfy {rule} (given {_shown(err.instance)})")
        else:
            message = scrub_text(err.message)
            lines.append(f"{where}: {message} (given {_shown(err.instance)})")
    return "invalid arguments: " + "; ".join(lines)
