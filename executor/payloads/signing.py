"""Only the client's own offloading may put a payload reference in a call's arguments.

The worker puts a stored argument back wherever it finds a marker, so a marker a
model wrote into its arguments would make the worker read any payload it can
name (another call's document, another run's result), and the worker's errors
would tell the model whether a key exists and how large it is. So the client
signs each marker it makes with an HMAC-SHA256 keyed by a deployment secret,
over the argument's name and the reference, and the worker resolves only a
marker whose signature checks, before it asks the store anything.

The secret is ``TOOLEXEC_PAYLOAD_SECRET`` when set (the same on clients and
workers). Otherwise the first process that needs one creates 32 random bytes in
Redis (``Keys.payload_secret``, SET NX, no TTL), and every client and worker of
the deployment reads the same one: anyone who can read that Redis can already
write payloads and messages, so it protects exactly against what it must, input
that came through a model.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Callable
from typing import Any

import redis

from toolexec.errors import PayloadStoreUnavailableError
from toolexec.keys import Keys
from toolexec.settings import Settings

__all__ = ["SIGNATURE_KEY", "MarkerSigner", "marker_signer"]

#: The key beside ``$toolexec_payload`` in a marker that holds its signature.
SIGNATURE_KEY = "$toolexec_signature"


class MarkerSigner:
    """Signs and checks argument markers; the secret is fetched on first use."""

    def __init__(self, secret: Callable[[], bytes]) -> None:
        self._fetch = secret
        self._secret: bytes | None = None
        self._lock = threading.Lock()

    @classmethod
    def fixed(cls, secret: bytes) -> MarkerSigner:
        return cls(lambda: secret)

    def _key(self) -> bytes:
        with self._lock:
            if self._secret is None:
                self._secret = self._fetch()
            return self._secret

    def sign(self, name: str, ref: dict[str, Any]) -> str:
        """The signature of the marker of argument ``name`` holding ``ref`` (its JSON)."""
        message = json.dumps([name, ref], sort_keys=True, separators=(",", ":")).encode()
        return hmac.new(self._key(), message, hashlib.sha256).hexdigest()

    def verify(self, name: str, ref: Any, signature: Any) -> bool:
        if not isinstance(ref, dict) or not isinstance(signature, str):
            return False
        return hmac.compare_digest(self.sign(name, ref), signature)


def _from_redis(client: redis.Redis, keys: Keys) -> bytes:
    """The deployment's secret in Redis, created by whichever process asks first."""
    try:
        client.set(keys.payload_secret(), secrets.token_hex(32), nx=True)
        value = client.get(keys.payload_secret())
    except redis.RedisError as exc:
        raise PayloadStoreUnavailableError(
            f"the key that signs payload markers cannot be read from Redis "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if value is None:  # deleted between the two commands: ask again
        return _from_redis(client, keys)
    return value if isinstance(value, bytes) else str(value).encode()


def marker_signer(settings: Settings, client: redis.Redis) -> MarkerSigner:
    """The signer of a deployment: ``TOOLEXEC_PAYLOAD_SECRET``, or the secret kept in Redis."""
    if settings.payload_secret is not None:
        return MarkerSigner.fixed(settings.payload_secret.get_secret_value().encode())
    keys = Keys(settings.key_prefix)
    return MarkerSigner(lambda: _from_redis(client, keys))
