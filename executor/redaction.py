"""Secrets out of what operators see: the argument text in logs, events and Flower.

Celery copies a task's ``kwargsrepr`` into its log lines, every task event
and Flower's pages, so the text is computed here, with secrets replaced by
``***``. A secret is known in two ways, both without tool code:

* the tool's schema marks the argument: declare it ``Annotated[str, Secret]``
  (the schema says ``writeOnly: true``, ``format: password``, ``x-secret:
  true``) or ``pydantic.SecretStr`` (``writeOnly`` and ``format: password``);
  the client reads the schema from the catalog, the worker from the spec;
* a mapping key looks like a credential at any depth: a list of names
  (``Authorization``, ``Cookie``) is not enough, so a key is split into words
  (``X-Goog-Api-Key`` is x, goog, api, key; ``accessToken`` is access, token)
  and any word such as token, secret, password, pass, pin, auth, cookie,
  session, signature, ssn, cvv, or ``key`` next to api, private, access or
  secret, ``card`` next to number or credit, marks it; a last word such as
  count, type or url makes it a name about a credential, shown;
* inside any text (string arguments, error messages, log lines): the userinfo
  of a URL, query parameters and fragments with such names, and ``key``,
  ``code`` or ``s`` when their value looks like a token (letters and digits,
  8 or more), ``Bearer``/``Basic`` credentials and ``password=...``-style pairs
  (:func:`scrub_text`).

docs/security.md states the rule and why it is this one.

The tool still receives the real value: only the text shown is redacted.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field

__all__ = [
    "REDACTED",
    "REPR_LIMIT",
    "Secret",
    "is_credential_name",
    "is_secret_path",
    "is_secret_schema",
    "redact",
    "scrub_text",
    "secret_names",
    "shown_kwargs",
    "withhold_arguments",
]

#: What a secret value is shown as.
REDACTED = "***"

#: Celery's own cap (``kwargsrepr_maxsize``) on the repr shown in logs, events, Flower.
REPR_LIMIT = 1024

#: Mark a tool argument as secret: ``token: Annotated[str, Secret]``.
Secret: Any = Field(json_schema_extra={"writeOnly": True, "format": "password", "x-secret": True})

#: Words that make a key a credential wherever they appear in it.
_SECRET_WORDS = frozenset(
    {
        "token", "secret", "secrets", "password", "passwd", "pass", "pwd", "passphrase",
        "pin", "auth", "authorization", "cookie", "cookies", "credential", "credentials",
        "signature", "sig", "apikey", "otp", "jwt", "bearer", "sessionid", "privatekey",
        "session", "ssn", "cvv", "cvc", "cardnumber", "creditcard", "ccnumber",
    }
)  # fmt: skip

#: Words that are a credential only beside one of their qualifiers: ``api_key``,
#: ``X-Goog-Api-Key``, ``private-key``, ``card_number``, ``credit_card``,
#: ``security_code``; a bare ``key`` (a cache or S3 object key), ``card`` (a board's
#: card) or ``code`` stays shown as an argument.
_QUALIFIED = {
    "key": frozenset({"api", "private", "access", "secret", "signing", "master", "client"}),
    "card": frozenset({"number", "num", "no", "credit", "debit"}),
    "code": frozenset({"security", "verification", "card"}),
    "security": frozenset({"social"}),
}

#: Query parameter names that hold a credential in some APIs and not in others:
#: Google's ``key``, the ``code`` of an OAuth redirect, a signature ``s``; but also a
#: lookup ``key``, a promo ``code``, WordPress's search ``s``. Their values are masked
#: when they look like a token (:func:`_looks_like_token`).
_QUERY_AMBIGUOUS = frozenset({"key", "code", "s"})

#: A token's shape: 8 or more characters of the URL-safe alphabets (base64, hex, JWT,
#: percent-encoding), letters and digits both. A generated key has both; a word, a
#: number or a path (``reports/q1.csv``) does not pass.
_TOKEN = re.compile(r"[A-Za-z0-9_~+=%.-]{8,}")

#: A last word that makes the key describe a credential instead of holding one:
#: ``token_count``, ``password_policy``, ``auth_url`` are shown.
_ABOUT_WORDS = frozenset(
    {"count", "limit", "max", "min", "length", "size", "type", "kind", "url", "uri",
     "endpoint", "expiry", "expires", "ttl", "policy", "seen", "used", "budget", "header",
     "timeout", "name"}
)  # fmt: skip

_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")


@functools.lru_cache(maxsize=4096)
def is_credential_name(name: str) -> bool:
    """Whether a key, header or parameter name looks like it holds a credential.

    Kept per name: every log line the worker writes is scrubbed, and its names
    (``tool=``, ``status=``, ``attempts=``) are the same on every call.
    """
    words = [w.lower() for w in _WORD.findall(name)]
    if not words or words[-1] in _ABOUT_WORDS:
        return False
    if _SECRET_WORDS.intersection(words):
        return True
    if any(_QUALIFIED.get(word, frozenset()).intersection(words) for word in words):
        return True
    return "".join(words) in _SECRET_WORDS


def _looks_like_token(value: str) -> bool:
    """Whether a value starts with a generated credential's shape (see ``_TOKEN``).

    Its start only: in free text the value runs on to the next space or ``&``,
    so an error message's ``?key=AIza...: 403`` keeps its colon in the value.
    """
    found = _TOKEN.match(value)
    if found is None:
        return False
    token = found.group(0)
    return any(c.isdigit() for c in token) and any(c.isalpha() for c in token)


#: What :func:`scrub_text` looks for: a cheap test first, since most text has none.
_MAYBE = re.compile(r":|=|bearer|basic|digest|token", re.IGNORECASE)
_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s'\"<>`]+")
_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)([^/?#@]*)@", re.IGNORECASE)
_PAIR = re.compile(r"([?&#;]|^)([^=&#;?\s]+)=([^&#;\s]*)")
_SCHEME_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic|token|digest)(\s+)[A-Za-z0-9._~+/=:-]{6,}")
_TEXT_PAIR = re.compile(r"(?<![\w-])([\w-]{2,40})(?=([=:]\s?)([^\s&,;#'\"]+))")


def _mask_pair(match: re.Match[str], query: bool) -> str:
    name, value = match.group(2), match.group(3)
    ambiguous = query and name.lower() in _QUERY_AMBIGUOUS and _looks_like_token(value)
    credential = is_credential_name(name) or ambiguous
    return f"{match.group(1)}{name}={REDACTED}" if credential else match.group(0)


def _scrub_url(match: re.Match[str]) -> str:
    url = _USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", match.group(0))
    head, sep, rest = url.partition("?") if "?" in url else url.partition("#")
    if not sep:
        return url
    return head + sep + _PAIR.sub(lambda m: _mask_pair(m, query=True), rest)


def _mask_text_pairs(text: str) -> str:
    """``name=value`` or ``name: value`` with a credential name gets its value masked.

    The value is matched ahead without being consumed, so that in
    ``failed: password=x`` the pair ``failed: password`` does not hide the next.
    """
    parts, last = [], 0
    for match in _TEXT_PAIR.finditer(text):
        name, sep, value = match.groups()
        if match.start() < last or value == REDACTED or not is_credential_name(name):
            continue
        start = match.end() + len(sep)
        parts += [text[last:start], REDACTED]
        last = start + len(value)
    return "".join([*parts, text[last:]])


def scrub_text(text: str) -> str:
    """``text`` with URL userinfo, credential parameters and scheme credentials masked.

    For text that leaves the process without being a mapping: error messages
    (``connection refused for https://u:pw@host/?token=...``), string arguments
    and log lines of any library (httpx logs each request's full URL at INFO).
    """
    if not _MAYBE.search(text):
        return text
    text = _URL.sub(_scrub_url, text)
    text = _SCHEME_CREDENTIAL.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return _mask_text_pairs(text)


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
    if isinstance(value, str):
        scrubbed = scrub_text(value)
        return value if scrubbed == value else scrubbed
    return value


def is_secret_path(path: Any, secrets: frozenset[str]) -> bool:
    """Whether any step of a field's location names a secret (a validation error's ``loc``)."""
    return any(_is_secret_key(step, secrets) for step in path)


def _is_secret_key(key: Any, secrets: frozenset[str]) -> bool:
    return isinstance(key, str) and (key in secrets or is_credential_name(key))


def shown_kwargs(kwargs: Mapping[str, Any], secrets: frozenset[str] = frozenset()) -> str:
    """The repr of a call's kwargs that logs, events and Flower show, cut at Celery's cap.

    Celery's default, ``saferepr``, walks the value in pure Python: about 75 µs a
    call, close to a tenth of a publish. The kwargs are JSON, so the built-in
    ``repr`` is safe and shows the same text.
    """
    arguments = kwargs.get("arguments")
    shown = {**kwargs, "arguments": redact(arguments, secrets)} if arguments else kwargs
    context = kwargs.get("context")  # ids and timings, but also the last error's text
    if context:
        shown = {**shown, "context": redact(context)}
    text = repr(shown)
    return text if len(text) <= REPR_LIMIT else text[: REPR_LIMIT - 3] + "..."


#: Argument strings shorter than this are not hunted in an error's text: "GET" or "1"
#: would mask every word like it, and a secret is longer.
_MIN_WITHHELD = 4

#: How many argument strings an error's text is checked against, at most.
_MAX_WITHHELD = 10_000


def _argument_strings(arguments: Any) -> list[str]:
    """The string values in ``arguments`` worth hunting for, longest first."""
    found: set[str] = set()
    stack = [arguments]
    while stack and len(found) < _MAX_WITHHELD:
        node = stack.pop()
        if isinstance(node, str):
            if len(node) >= _MIN_WITHHELD:
                found.add(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return sorted(found, key=len, reverse=True)


def _spellings(value: str) -> set[str]:
    """How an error's text may quote ``value``: as is, as ``repr`` or JSON does."""
    return {
        value,
        repr(value)[1:-1],
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
    }


def withhold_arguments(text: str, arguments: Any) -> str:
    """``text`` with every argument string it quotes (and any credential) masked.

    For the text of an unexpected exception, which may quote what it failed on
    (a ``UnicodeEncodeError``'s ``repr`` carries the whole string it could not
    encode): the schema's secret names do not help there, since the text is no
    mapping, so every argument value it repeats is taken out, secret or not.
    """
    for value in _argument_strings(arguments):
        for spelling in _spellings(value):
            if spelling and spelling in text:
                text = text.replace(spelling, REDACTED)
    return scrub_text(text)
