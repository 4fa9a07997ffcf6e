"""TLS in front of a plain test server, as a load balancer ends it in front of ``lease-lock
serve``: a self-signed certificate made by the ``openssl`` command, and a proxy that ends TLS
with it and passes the bytes on to the server in the clear."""

from __future__ import annotations

import contextlib
import ipaddress
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

from benchmarks.chaos_harness.proxy import TcpProxy

__all__ = ["make_certificate", "tls_front"]


def _subject_name(name: str) -> str:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return f"DNS:{name}"
    return f"IP:{name}"


def make_certificate(directory: Path, *names: str) -> tuple[Path, Path]:
    """A self-signed certificate for ``names`` (host names or IP addresses) and its key."""
    certificate, key = directory / "certificate.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", f"/CN={names[0]}", "-addext", "subjectAltName=" + ",".join(map(_subject_name, names)),
            "-keyout", str(key), "-out", str(certificate),
        ],
        check=True, capture_output=True, timeout=120,
    )
    return certificate, key


@contextlib.contextmanager
def tls_front(upstream_port: int, certificate: Path, key: Path) -> Iterator[TcpProxy]:
    """A proxy on a free loopback port that ends TLS with ``certificate`` for the block."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, key)
    front = TcpProxy("127.0.0.1", upstream_port, tls=context)
    try:
        yield front
    finally:
        front.close()
