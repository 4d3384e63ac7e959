"""Payloads in S3 or any S3-compatible object store (MinIO, Ceph, moto).

boto3 is an optional dependency (``pip install toolexec[s3]``); credentials
come from boto3's usual chain (environment, profile, instance role). S3's
lifecycle rules expire objects only in whole days, so each object carries its
own expiry as metadata and reads past it fail as expired; add a lifecycle
rule on the prefix (a day or more past ``TOOLEXEC_PAYLOAD_TTL_S``) to reclaim
the space.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from toolexec.clock import Clock
from toolexec.errors import (
    ConfigurationError,
    PayloadExpiredError,
    PayloadMissingError,
    PayloadStoreUnavailableError,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["S3PayloadStore"]

_EXPIRES = "toolexec-expires-at"  # object metadata: epoch seconds
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}


class S3PayloadStore:
    """A :class:`~toolexec.payloads.store.PayloadStore` on one bucket and key prefix."""

    kind = "s3"

    def __init__(self, client: S3Client, bucket: str, prefix: str, clock: Clock) -> None:
        if not bucket:
            raise ConfigurationError("an S3 payload store needs a bucket: s3://bucket/prefix")
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.clock = clock

    @classmethod
    def connect(
        cls,
        bucket: str,
        prefix: str,
        *,
        endpoint_url: str | None,
        region: str | None,
        clock: Clock,
    ) -> S3PayloadStore:
        """A store with a boto3 client of its own (boto3 clients are thread-safe)."""
        try:
            import boto3
        except ImportError as exc:
            raise ConfigurationError(
                "the S3 payload store needs boto3: pip install 'toolexec[s3]'"
            ) from exc
        from botocore.config import Config

        config = Config(
            connect_timeout=5, read_timeout=60, retries={"mode": "standard", "max_attempts": 3}
        )
        client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
        return cls(client, bucket, prefix, clock)

    def put(self, key: str, data: bytes, ttl_s: float) -> None:
        expires = self.clock.now() + ttl_s
        self._call(
            "put_object",
            key,
            Body=data,
            Metadata={_EXPIRES: repr(expires)},
            Expires=datetime.datetime.fromtimestamp(expires, datetime.UTC),
        )

    def get(self, key: str) -> bytes:
        return self._read(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            if not self.exists(key):
                raise PayloadMissingError(
                    f"there is no object s3://{self.bucket}/{self._name(key)}"
                )
            return b""
        return self._read(key, f"bytes={start}-{end - 1}")

    def exists(self, key: str) -> bool:
        try:
            head = self._call("head_object", key)
        except PayloadMissingError:
            return False
        return not self._expired(head)

    def delete(self, key: str) -> None:
        self._call("delete_object", key)

    def _read(self, key: str, byte_range: str | None = None) -> bytes:
        extra = {"Range": byte_range} if byte_range else {}
        response = self._call("get_object", key, **extra)
        with response["Body"] as body:
            if self._expired(response):
                self._call("delete_object", key)
                raise PayloadExpiredError(
                    f"s3://{self.bucket}/{self._name(key)} expired at {_when(response)}"
                )
            data: bytes = body.read()
        return data

    def _expired(self, response: Any) -> bool:
        stamp = response.get("Metadata", {}).get(_EXPIRES)
        return stamp is not None and float(stamp) <= self.clock.now()

    def _call(self, operation: str, key: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        name = self._name(key)
        try:
            return getattr(self.client, operation)(Bucket=self.bucket, Key=name, **kwargs)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _MISSING_CODES:
                raise PayloadMissingError(f"there is no object s3://{self.bucket}/{name}") from None
            raise PayloadStoreUnavailableError(
                f"S3 refused {operation} on s3://{self.bucket}/{name} ({code}: {exc})"
            ) from exc
        except BotoCoreError as exc:
            raise PayloadStoreUnavailableError(
                f"cannot reach S3 for s3://{self.bucket}/{name} ({type(exc).__name__}: {exc})"
            ) from exc

    def _name(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key


def _when(response: Any) -> str:
    stamp = float(response["Metadata"][_EXPIRES])
    return datetime.datetime.fromtimestamp(stamp, datetime.UTC).isoformat()
