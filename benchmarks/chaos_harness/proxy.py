"""A loopback TCP proxy that can slow down, stall or cut the connections passing through it.

Pure Python, one thread per direction per connection; it listens on ``127.0.0.1`` only. Give
each worker its own proxy and a fault can hit one worker's network without touching the others.

- ``latency``: every chunk waits this many seconds before it is forwarded (each direction, so a
  round trip gains twice the value);
- ``stall()`` / ``resume()``: hold every byte (both directions) until resumed; the sockets stay
  open, so clients see a silent peer, not an error;
- ``cut()``: reset every open connection at once (new connections are still accepted);
- ``tls``: an ``ssl.SSLContext`` for the server side ends TLS at the proxy, as a load balancer
  does, and forwards in the clear (a client that refuses the certificate is let go).

A :class:`ProxyGroup` puts one proxy in front of each server of a multi-server backend (the
members of an etcd cluster) and acts on all of them at once, so that one worker's whole
network is hit, not just its path to one member.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
import time
from typing import Optional

__all__ = ["ProxyGroup", "TcpProxy"]

_CHUNK = 65536


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``(target_host, target_port)``."""

    def __init__(self, target_host: str, target_port: int, tls: Optional[ssl.SSLContext] = None) -> None:
        self.target = (target_host, target_port)
        self._tls = tls
        self.latency = 0.0
        self._flowing = threading.Event()
        self._flowing.set()
        self._mutex = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._tls is not None:
                try:
                    client = self._secured(client, self._tls)
                except OSError:
                    continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            if self._tls is not None:
                # A TLS record per small write, each sent at once: Nagle's algorithm would
                # hold a write back until the peer's delayed acknowledgement (40 ms).
                upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._mutex:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._sockets.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _secured(client: socket.socket, tls: ssl.SSLContext) -> socket.socket:
        client.settimeout(10)  # a client stuck in its handshake must not hold the listener
        try:
            secured = tls.wrap_socket(client, server_side=True)
        except OSError:  # ssl.SSLError included: a client that refused the certificate
            client.close()
            raise
        secured.settimeout(None)
        secured.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return secured

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(_CHUNK)
                if not data:
                    break
                if self.latency:
                    time.sleep(self.latency)
                self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(source, sink)

    def _drop(self, *sockets: socket.socket) -> None:
        with self._mutex:
            for sock in sockets:
                self._sockets.discard(sock)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def stall(self) -> None:
        """Hold all traffic until :meth:`resume`."""
        self._flowing.clear()

    def resume(self) -> None:
        """Let held traffic through again."""
        self._flowing.set()

    def cut(self) -> int:
        """Reset every open connection (RST, as a dropped NAT entry or a crashed peer would
        look); returns how many sockets were cut."""
        with self._mutex:
            victims = list(self._sockets)
            self._sockets.clear()
        for sock in victims:
            try:
                # Linger 0 makes close() send RST instead of a polite FIN.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                # shutdown wakes the pump thread blocked in recv(); close alone would not.
                sock.shutdown(socket.SHUT_RD)
            except OSError:
                pass
            with contextlib.suppress(OSError):
                sock.close()
        return len(victims)

    def close(self) -> None:
        """Stop accepting and cut everything."""
        with self._mutex:
            self._closed = True
        self.resume()
        self._listener.close()
        self.cut()


class ProxyGroup:
    """One :class:`TcpProxy` per ``(host, port)`` target; every fault acts on all of them."""

    def __init__(self, targets: list[tuple[str, int]]) -> None:
        self.proxies = [TcpProxy(host, port) for host, port in targets]

    @property
    def ports(self) -> list[int]:
        """The local ports, in the order of the targets."""
        return [proxy.port for proxy in self.proxies]

    @property
    def latency(self) -> float:
        """Seconds each chunk waits in every proxy of the group."""
        return self.proxies[0].latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        for proxy in self.proxies:
            proxy.latency = seconds

    def stall(self) -> None:
        """Hold the traffic of every proxy until :meth:`resume`."""
        for proxy in self.proxies:
            proxy.stall()

    def resume(self) -> None:
        """Let every proxy's traffic through again."""
        for proxy in self.proxies:
            proxy.resume()

    def cut(self) -> int:
        """Reset every connection of every proxy; how many sockets were cut."""
        return sum(proxy.cut() for proxy in self.proxies)

    def close(self) -> None:
        """Close every proxy."""
        for proxy in self.proxies:
            proxy.close()
