"""Certificates for the tests' TLS, made by the ``openssl`` command (a private CA and a
certificate it signed), and TLS in front of a plain test server, as a load balancer ends it in
front of ``lease-lock serve``: a proxy that ends TLS and passes the bytes on in the clear."""

from __future__ import annotations

import contextlib
import ipaddress
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from benchmarks.chaos_harness.proxy import TcpProxy

__all__ = ["make_certificates", "tls_front"]


def _subject_name(name: str) -> str:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return f"DNS:{name}"
    return f"IP:{name}"


def make_certificates(directory: Path, *names: str, common_name: Optional[str] = None) -> dict[str, str]:
    """A private CA (``ca``) and a certificate (``cert``, key ``key``) it signed for ``names``
    (host names or IP addresses), good for a server and a client alike; the certificate's
    common name is ``common_name``, or else the first name."""
    directory.mkdir(parents=True, exist_ok=True)
    names_of_files = ("ca.key", "ca.pem", "key.pem", "req.csr", "cert.pem")
    ca_key, ca, key, csr, cert = (str(directory / name) for name in names_of_files)
    extensions = directory / "ext.cnf"
    extensions.write_text(
        "subjectAltName=" + ",".join(map(_subject_name, names)) + "\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "keyUsage=digitalSignature,keyEncipherment\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=120)

    # Python 3.13 verifies strictly (VERIFY_X509_STRICT): a CA must state its key usage and a
    # leaf certificate must name the key that signed it.
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
            "-days", "2", "-subj", "/CN=lease-lock test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
            "-subj", f"/CN={common_name or names[0]}")
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
            "-days", "2", "-extfile", str(extensions))
    return {"ca": ca, "cert": cert, "key": key}


@contextlib.contextmanager
def tls_front(upstream_port: int, certificate: str, key: str) -> Iterator[TcpProxy]:
    """A proxy on a free loopback port that ends TLS with ``certificate`` for the block."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, key)
    front = TcpProxy("127.0.0.1", upstream_port, tls=context)
    try:
        yield front
    finally:
        front.close()
