"""How many tokens a text costs a model, estimated without a tokenizer.

The heuristic is about four bytes of UTF-8 per token: close for English prose
and JSON keys on the BPE tokenizers of current models, low by up to a third
for dense code, numbers or non-Latin scripts. A real tokenizer would need its
vocabulary at run time (tiktoken downloads one), and the budget only has to
keep a preview in the right range, so budgets should leave slack.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["BYTES_PER_TOKEN", "MIN_TOKEN_BUDGET", "budget_bytes", "estimate_tokens", "json_bytes"]

BYTES_PER_TOKEN = 4

#: The smallest budget a preview fits in: its note alone takes ~120 tokens.
MIN_TOKEN_BUDGET = 200


def estimate_tokens(size_bytes: int) -> int:
    """Tokens of a text of ``size_bytes`` UTF-8 bytes, rounded up."""
    return -(-size_bytes // BYTES_PER_TOKEN)


def budget_bytes(tokens: int) -> int:
    """The most bytes a text may have to stay within ``tokens``."""
    return tokens * BYTES_PER_TOKEN


def json_bytes(value: Any) -> int:
    """Bytes of ``value`` as the model reads it: JSON, non-ASCII kept as is."""
    return len(json.dumps(value, ensure_ascii=False).encode())
