"""Fixtures of the unit tests: a private tool registry and a clock that never moves by itself.

Unit tests need no worker and no sleep: tools go into a fresh
:class:`Registry` so that nothing leaks into the default one the worker
serves, and time is a :class:`ManualClock` the test advances by hand.
"""

from __future__ import annotations

import pytest

from executor.clock import ManualClock
from executor.registry import Registry


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()
