"""Large results and arguments kept out of the queue: a store, previews and paging.

See :mod:`toolexec.payloads.store` for the stores, :mod:`.preview` for what the
model sees, :mod:`.offload` for when a value is stored, and :mod:`.reader`
for reading it back.
"""

from toolexec.payloads.encoding import Encoded, Index, decode, encode
from toolexec.payloads.file_store import FilePayloadStore
from toolexec.payloads.offload import (
    ARGUMENT_MARKER,
    Limits,
    Offloader,
    PayloadLayer,
    WorkerPayloads,
    resolve_arguments,
    store_arguments,
    worker_payloads,
)
from toolexec.payloads.preview import build_preview
from toolexec.payloads.reader import PayloadPage, PayloadReader
from toolexec.payloads.redis_store import RedisPayloadStore
from toolexec.payloads.signing import MarkerSigner, marker_signer
from toolexec.payloads.store import PayloadStore, open_store
from toolexec.payloads.tokens import estimate_tokens

__all__ = [
    "ARGUMENT_MARKER",
    "Encoded",
    "FilePayloadStore",
    "Index",
    "Limits",
    "MarkerSigner",
    "Offloader",
    "PayloadLayer",
    "PayloadPage",
    "PayloadReader",
    "PayloadStore",
    "RedisPayloadStore",
    "WorkerPayloads",
    "build_preview",
    "decode",
    "encode",
    "estimate_tokens",
    "marker_signer",
    "open_store",
    "resolve_arguments",
    "store_arguments",
    "worker_payloads",
]
