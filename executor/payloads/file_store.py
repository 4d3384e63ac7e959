"""Payloads as files in one directory: for one host, or a volume workers and clients share.

Each payload is one file, written to a temporary name and renamed, so a
reader never sees half of one. Its modification time is set to its expiry:
reads past it fail as expired, and a cron job can reclaim space with
``find DIR -type f ! -newermt now -delete`` (or :meth:`purge_expired`).

A read never deletes: a key can come from a model (``read_payload``), and an
expired read must not remove whatever old file sits in the directory. Nor does
it follow a symbolic link: someone who can write into the directory could
otherwise make a payload read any file the process may read.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from toolexec.clock import Clock
from toolexec.errors import (
    PayloadExpiredError,
    PayloadMissingError,
    PayloadStoreUnavailableError,
)
from toolexec.payloads.store import KEY_PATTERN, check_key

__all__ = ["FilePayloadStore"]

_TMP_PREFIX = ".tmp-"


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
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=self.directory)
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
        except (PayloadMissingError, PayloadExpiredError):
            return False

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def purge_expired(self) -> int:
        """Delete every expired payload (regular files with a payload's name); how many went."""
        now = self.clock.now()
        gone = 0
        for path in self.directory.iterdir():
            ours = KEY_PATTERN.fullmatch(path.name) or path.name.startswith(_TMP_PREFIX)
            with contextlib.suppress(OSError):
                info = path.lstat()  # a link is not a payload, whatever it points at
                if ours and stat.S_ISREG(info.st_mode) and info.st_mtime <= now:
                    path.unlink()
                    gone += 1
        return gone

    @contextlib.contextmanager
    def _open(self, key: str) -> Iterator[BinaryIO]:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            raise PayloadMissingError(f"there is no file {path}") from None
        except OSError as exc:
            if os.path.islink(path):
                raise PayloadMissingError(f"{path} is a symbolic link, not a payload") from None
            raise PayloadStoreUnavailableError(f"cannot read {path} ({exc})") from exc
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):  # a FIFO or device would block or never end
                raise PayloadMissingError(f"{path} is not a regular file, not a payload")
            if info.st_mtime <= self.clock.now():
                when = datetime.datetime.fromtimestamp(info.st_mtime, datetime.UTC).isoformat()
                raise PayloadExpiredError(f"{path} expired at {when}")
            yield handle

    def _path(self, key: str) -> Path:
        return self.directory / check_key(key)


def _unwritable(key: str, directory: Path, exc: OSError) -> PayloadStoreUnavailableError:
    return PayloadStoreUnavailableError(f"cannot write payload {key} to {directory} ({exc})")
