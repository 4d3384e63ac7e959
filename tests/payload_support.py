"""Test helpers for payload stores: moto's S3 in server mode, on 127.0.0.1 only."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

import pytest

#: moto accepts any credentials; boto3 refuses to sign without some.
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def moto_s3() -> Iterator[str]:
    """An S3-compatible server (moto) on a free local port; yields its endpoint URL.

    The fake credentials are put in the environment for the duration, so this
    process and any worker it starts can sign requests. Skips the test, saying
    why, when moto is missing or cannot start.
    """
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        pytest.skip(f"moto[server] is not installed ({exc}); pip install -e '.[dev]'")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    try:
        server.start()
    except Exception as exc:
        pytest.skip(f"moto's S3 server could not start on 127.0.0.1:{port}: {exc}")
    saved = {name: os.environ.get(name) for name in FAKE_AWS}
    os.environ.update(FAKE_AWS)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
