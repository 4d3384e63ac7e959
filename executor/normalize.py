"""One canonical form of a call's arguments, for every key derived from them.

Idempotency keys, the last-good-result cache and loop detection must treat
``{"b": 1, "a": 0.10}`` and ``{"a": 0.1, "b": 1}`` as the same call, and
``./data/a.csv`` and ``data//a.csv`` as the same file, or a retried write runs
twice and a loop goes unnoticed. They all go through :func:`canonical_json`.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
from typing import Any

__all__ = ["FLOAT_DIGITS", "arguments_hash", "canonical_json", "digest_bytes", "normalize"]

#: Floats are compared to this many significant digits: beyond it, differences are
#: noise from a model's formatting or binary rounding, not a different request.
FLOAT_DIGITS = 12


def _looks_like_path(text: str) -> bool:
    return "/" in text and "://" not in text and "\n" not in text and len(text) < 4096


def _normalize_path(text: str) -> str:
    normal = posixpath.normpath(text)
    # normpath keeps a leading '//' (POSIX allows it a meaning); for our keys it is one '/'.
    return "/" + normal.lstrip("/") if normal.startswith("//") else normal


def _normalize_float(value: float) -> float | int | str:
    if math.isnan(value) or math.isinf(value):
        return repr(value)  # JSON has no NaN; keep the key stable and distinct
    rounded = float(f"{value:.{FLOAT_DIGITS}g}")
    return int(rounded) if rounded.is_integer() and abs(rounded) < 2**53 else rounded


def normalize(value: Any) -> Any:
    """``value`` with floats rounded, integral floats as ints and paths normalised."""
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return _normalize_float(value)
    if isinstance(value, str):
        return _normalize_path(value) if _looks_like_path(value) else value
    if isinstance(value, dict):
        return {str(k): normalize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalize(v) for v in value]
    return normalize(json.loads(json.dumps(value, default=str)))


def canonical_json(value: Any) -> str:
    """Normalised JSON with sorted keys and no insignificant whitespace."""
    return json.dumps(normalize(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest_bytes(text: str) -> bytes:
    """``text`` as the bytes a digest is taken of: UTF-8, a lone surrogate kept as is.

    A model's JSON can carry ``"\\ud800"``, which strict UTF-8 refuses with an error
    whose ``repr`` quotes the whole text; the digest must not raise (the run guard
    hashes a call before the client refuses it as ``invalid_arguments``), and
    every valid text keeps the digest it always had.
    """
    return text.encode("utf-8", "surrogatepass")


def arguments_hash(tool: str, arguments: Any) -> str:
    """A stable digest of a tool and its normalised arguments."""
    digest = hashlib.sha256(digest_bytes(f"{tool}\0{canonical_json(arguments)}"))
    return digest.hexdigest()
