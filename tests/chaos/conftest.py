"""The chaos scenarios: each test starts its own Redis, broker and workers and kills them.

They use no session fixture of the other suites: a server a test kills must
be its own. The rig and the scenarios are ``rigs.chaos``, shared with
``bench/chaos.py``; the workers load ``bench/chaos_tools.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from rigs.chaos import Rig, rig

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def make_rig(tmp_path: Path) -> Callable[..., AbstractContextManager[Rig]]:
    def make(**kwargs: object) -> AbstractContextManager[Rig]:
        return rig(tmp_path, BENCH, **kwargs)  # type: ignore[arg-type]

    return make


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[Rig]:
    with rig(tmp_path, BENCH, workers=2) as built:
        yield built
