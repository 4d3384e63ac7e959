"""Payloads as files in one directory: for one host, or a volume workers and clients share.

Each payload is one file, written to a temporary name and renamed, so a
reader never sees half of one. Its modification time is set to its expiry:
reads past it fail as expired, and a cron job can reclaim space with
``find DIR -type f ! -newermt now -delete`` (or :meth:`purge_expired`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from toolexec.clock import Clock
from toolexec.errors import (
    PayloadExpiredError,
    PayloadMissingError,
    PayloadStoreUnavailableError,
    UsageError,
)

__all__ = ["FilePayloadStore"]

_KEY = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,200}$")


class FilePayloadStore:
    """A :class:`~toolexec.payloads.store.PayloadStore` on a directory."""

    kind = "file"

    def __init__(self, directory: str | Path, clock: Clock) -> None:
        self.directory = Path(directory)
        self.clock = clock
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PayloadStoreUnavailableError(
                f"cannot create the payload directory {self.directory} ({exc})"
            ) from exc

    def put(self, key: str, data: bytes, ttl_s: float) -> None:
        target = self._path(key)
        expires = self.clock.now() + ttl_s
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
        except OSError as exc:
            raise _unwritable(key, self.directory, exc) from exc
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.utime(tmp, (expires, expires))
            os.replace(tmp, target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise _unwritable(key, self.directory, exc) from exc

    def get(self, key: str) -> bytes:
        with self._open(key) as handle:
            return handle.read()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with self._open(key) as handle:
            handle.seek(start)
            return handle.read(max(0, end - start))

    def exists(self, key: str) -> bool:
        try:
            with self._open(key):
                return True
        except PayloadMissingError:
            return False

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def purge_expired(self) -> int:
        """Delete every expired payload; returns how many went."""
        now = self.clock.now()
        gone = 0
        for path in self.directory.iterdir():
            with contextlib.suppress(OSError):
                if path.is_file() and path.stat().st_mtime <= now:
                    path.unlink()
                    gone += 1
        return gone

    @contextlib.contextmanager
    def _open(self, key: str) -> Iterator[BinaryIO]:
        path = self._path(key)
        try:
            handle = path.open("rb")
        except FileNotFoundError:
            raise PayloadMissingError(f"there is no file {path}") from None
        except OSError as exc:
            raise PayloadStoreUnavailableError(f"cannot read {path} ({exc})") from exc
        with handle:
            expires = os.fstat(handle.fileno()).st_mtime
            if expires <= self.clock.now():
                path.unlink(missing_ok=True)
                when = datetime.datetime.fromtimestamp(expires, datetime.UTC).isoformat()
                raise PayloadExpiredError(f"{path} expired at {when}")
            yield handle

    def _path(self, key: str) -> Path:
        if not _KEY.match(key):
            raise UsageError(f"{key!r} is not a payload key (letters, digits, '.', '_', '-')")
        return self.directory / key


def _unwritable(key: str, directory: Path, exc: OSError) -> PayloadStoreUnavailableError:
    return PayloadStoreUnavailableError(f"cannot write payload {key} to {directory} ({exc})")
