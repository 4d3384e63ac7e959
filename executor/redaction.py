"""Secrets out of what operators see: the argument text in logs, events and Flower.

Celery copies a task's ``kwargsrepr`` into its log lines, every task event
and Flower's pages, so the text is computed here, with secrets replaced by
``***``. A secret is known in two ways, both without tool code:

* the tool's schema marks the argument: declare it ``Annotated[str, Secret]``
  (the schema says ``writeOnly: true``, ``format: password``, ``x-secret:
  true``) or ``pydantic.SecretStr`` (``writeOnly`` and ``format: password``);
  the client reads the schema from the catalog, the worker from the spec;
* a mapping key is a well-known credential name at any depth, such as the
  ``Authorization``, ``Cookie`` or ``X-Api-Key`` headers of ``http_request``
  or an ``api_key`` query parameter.

The tool still receives the real value: only the text shown is redacted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field

__all__ = [
    "REDACTED",
    "REPR_LIMIT",
    "Secret",
    "is_secret_path",
    "is_secret_schema",
    "redact",
    "secret_names",
    "shown_kwargs",
]

#: What a secret value is shown as.
REDACTED = "***"

#: Celery's own cap (``kwargsrepr_maxsize``) on the repr shown in logs, events, Flower.
REPR_LIMIT = 1024

#: Mark a tool argument as secret: ``token: Annotated[str, Secret]``.
Secret: Any = Field(json_schema_extra={"writeOnly": True, "format": "password", "x-secret": True})

#: Keys whose value is a credential wherever they appear (headers, query params, bodies).
_CREDENTIAL_KEY = re.compile(
    r"^(?:proxy-)?authorization$|^(?:set-)?cookie$|^x-(?:api|auth)-(?:key|token)$"
    r"|^api[-_]?key$|^(?:access|refresh|id)[-_]token$|^client[-_]secret$|^password$|^secret$",
    re.IGNORECASE,
)


def is_secret_schema(prop: Mapping[str, Any]) -> bool:
    """Whether one property's JSON schema marks its value as secret."""
    if prop.get("writeOnly") is True or prop.get("x-secret") is True:
        return True
    if prop.get("format") == "password":
        return True
    variants = [*prop.get("anyOf", ()), *prop.get("oneOf", ()), *prop.get("allOf", ())]
    return any(isinstance(v, Mapping) and is_secret_schema(v) for v in variants)


def secret_names(schema: Any) -> frozenset[str]:
    """Names of the properties marked secret anywhere in ``schema`` (nested models too).

    Names, not paths: a nested model's secret field is redacted under that name
    wherever it appears, which errs on the side of showing less. The answer is
    cached per schema object: clients ask once per call, with the same catalog entry.
    """
    cached = _NAMES_CACHE.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    found = _walk_secret_names(schema)
    if len(_NAMES_CACHE) >= _NAMES_CACHE_SIZE:
        _NAMES_CACHE.clear()
    _NAMES_CACHE[id(schema)] = (schema, found)  # the reference keeps the id from reuse
    return found


_NAMES_CACHE: dict[int, tuple[Any, frozenset[str]]] = {}
_NAMES_CACHE_SIZE = 1024


def _walk_secret_names(schema: Any) -> frozenset[str]:
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            props = node.get("properties")
            if isinstance(props, Mapping):
                found.update(
                    name
                    for name, prop in props.items()
                    if isinstance(prop, Mapping) and is_secret_schema(prop)
                )
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return frozenset(found)


def redact(value: Any, secrets: frozenset[str] = frozenset()) -> Any:
    """``value`` with the values of secret and credential keys replaced, at any depth.

    Copies only what changes: with no secret inside, ``value`` itself comes back.
    """
    if isinstance(value, dict):
        out: dict[Any, Any] | None = None
        for key, item in value.items():
            new = REDACTED if _is_secret_key(key, secrets) else redact(item, secrets)
            if new is not item:
                out = out if out is not None else dict(value)
                out[key] = new
        return value if out is None else out
    if isinstance(value, list | tuple):
        items = [redact(item, secrets) for item in value]
        changed = any(new is not old for new, old in zip(items, value, strict=True))
        return items if changed else value
    return value


def is_secret_path(path: Any, secrets: frozenset[str]) -> bool:
    """Whether any step of a field's location names a secret (a validation error's ``loc``)."""
    return any(_is_secret_key(step, secrets) for step in path)


def _is_secret_key(key: Any, secrets: frozenset[str]) -> bool:
    return isinstance(key, str) and (key in secrets or _CREDENTIAL_KEY.match(key) is not None)


def shown_kwargs(kwargs: Mapping[str, Any], secrets: frozenset[str] = frozenset()) -> str:
    """The repr of a call's kwargs that logs, events and Flower show, cut at Celery's cap.

    Celery's default, ``saferepr``, walks the value in pure Python: about 75 µs a
    call, close to a tenth of a publish. The kwargs are JSON, so the built-in
    ``repr`` is safe and shows the same text.
    """
    arguments = kwargs.get("arguments")  # the call's context holds no secrets
    shown = {**kwargs, "arguments": redact(arguments, secrets)} if arguments else kwargs
    text = repr(shown)
    return text if len(text) <= REPR_LIMIT else text[: REPR_LIMIT - 3] + "..."
