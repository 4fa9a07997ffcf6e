"""TLS in front of a plain test server, as a load balancer ends it in front of ``lease-lock
serve``: a self-signed certificate made by the ``openssl`` command, and a thread that accepts
TLS connections and passes their bytes on to the server and back."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import ssl
import subprocess
import threading
from pathlib import Path

__all__ = ["TlsFront", "make_certificate"]


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


class TlsFront:
    """Accepts TLS on ``127.0.0.1:<port>`` with ``certificate`` and forwards each connection's
    bytes to ``upstream_port`` in the clear."""

    def __init__(self, upstream_port: int, certificate: Path, key: Path) -> None:
        self._upstream_port = upstream_port
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(certificate, key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._mutex = threading.Lock()
        threading.Thread(target=self._accept, name=f"tls-front-{self.port}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            secured = self._context.wrap_socket(client, server_side=True)
        except (OSError, ssl.SSLError):
            client.close()  # a client that refused our certificate
            return
        upstream = socket.create_connection(("127.0.0.1", self._upstream_port), timeout=30)
        upstream.settimeout(None)
        # Each side's small writes go out at once, as a balancer's would: without this, Nagle's
        # algorithm holds a write back until the peer's delayed acknowledgement (40 ms).
        for end in (secured, upstream):
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._mutex:
            self._open.update((secured, upstream))
        threading.Thread(target=self._pump, args=(upstream, secured), daemon=True).start()
        self._pump(secured, upstream)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    def __enter__(self) -> TlsFront:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._listener.close()
        with self._mutex:
            open_sockets, self._open = self._open, set()
        for end in open_sockets:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

