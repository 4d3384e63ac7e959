"""What logs, events and Flower show for a call's kwargs (the client computes it)."""

from __future__ import annotations

from celery.utils.saferepr import saferepr

from toolexec.redaction import REPR_LIMIT as _REPR_LIMIT
from toolexec.redaction import shown_kwargs as _shown


def test_small_kwargs_show_exactly_what_celerys_saferepr_would() -> None:
    """The cheap repr replaces saferepr without changing what an operator reads."""
    kwargs = {"arguments": {"url": "http://x/é", "count": 3, "tags": ["a", None, True]}}
    assert _shown(kwargs) == saferepr(kwargs, _REPR_LIMIT)


def test_large_kwargs_are_cut_at_celerys_cap() -> None:
    """A megabyte argument must not become a megabyte header in every event."""
    shown = _shown({"arguments": {"text": "x" * 100_000}})
    assert len(shown) == _REPR_LIMIT
    assert shown.startswith("{'arguments': {'text': 'xxx") and shown.endswith("...")
