"""A TCP proxy on loopback that a test controls: forward, freeze, or cut.

It stands between a client and a real server (PostgreSQL, Redis) to produce the two
faults a client cannot tell from a real outage:

- :meth:`TcpProxy.freeze`: bytes stop flowing both ways, connections stay open and new
  ones are accepted but never answered (a server stopped with SIGSTOP, a network stall);
- :meth:`TcpProxy.cut`: every connection is closed and new ones are refused (a server
  restart); :meth:`TcpProxy.restore` brings it back;
- :meth:`TcpProxy.lose_reply_to`: the request reaches the server and runs, and its
  reply is dropped and its connection closed (a network cut, or a server that died
  between running a command and sending the reply).

It runs on its own threads, so a frozen proxy never blocks the test's event loop.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

__all__ = ["TcpProxy", "proxied_url", "tcp_proxy"]


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream``; :attr:`port` is chosen by the OS."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port: int = self._server.getsockname()[1]
        self._frozen = threading.Event()
        self._down = threading.Event()
        self._lose_marker: bytes | None = None
        self.replies_lost = 0
        """How many replies :meth:`lose_reply_to` dropped."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._threads: list[threading.Thread] = []
        self._start(self._accept)

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        self._server.settimeout(0.05)
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                continue
            if self._down.is_set():
                client.close()  # refused, as by a server that is not listening yet
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            self._start(self._pump, client, upstream)

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        peers = {client: upstream, upstream: client}
        doomed = False  # this connection sent the request whose reply is to be lost
        try:
            while not self._stop.is_set():
                if self._frozen.is_set():
                    # Read nothing: the kernel buffers fill and the sender stalls too.
                    self._stop.wait(0.02)
                    if self._down.is_set():
                        return
                    continue
                readable, _, _ = select.select(list(peers), [], [], 0.05)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client and self._lose_marker is not None:
                        with self._lock:
                            marker = self._lose_marker
                            if marker is not None and marker in data:
                                self._lose_marker = None
                                doomed = True
                    elif sock is upstream and doomed:
                        self.replies_lost += 1
                        return  # the reply is dropped, both sockets closed
                    peers[sock].sendall(data)
        except (OSError, ValueError):
            # cut() closes the sockets under this thread: a closed socket's fileno is -1,
            # which select() refuses with ValueError rather than OSError.
            return
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.close()

    @property
    def url_host(self) -> str:
        """``127.0.0.1:<port>``, for a URL through the proxy."""
        return f"127.0.0.1:{self.port}"

    def freeze(self) -> None:
        """Stop forwarding: every call in flight or sent later waits forever."""
        self._frozen.set()

    def thaw(self) -> None:
        """Forward again (what was sent while frozen is delivered now)."""
        self._frozen.clear()

    def lose_reply_to(self, marker: bytes) -> None:
        """On the next connection whose client sends bytes containing ``marker``,
        forward them, then drop the server's next answer and close both sides: the
        request was received and run, its reply never arrives. Once."""
        with self._lock:
            self._lose_marker = marker

    def cut(self) -> None:
        """Close every connection and refuse new ones, as a stopped server would."""
        self._down.set()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def restore(self) -> None:
        """Accept and forward again (after :meth:`cut` or :meth:`freeze`)."""
        self._frozen.clear()
        self._down.clear()

    def close(self) -> None:
        """Stop every thread and close every socket."""
        self.cut()
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)
        self._server.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextlib.contextmanager
def tcp_proxy(host: str, port: int) -> Iterator[TcpProxy]:
    """A :class:`TcpProxy` to ``host:port``, closed afterwards."""
    with TcpProxy((host, port)) as proxy:
        yield proxy


@contextlib.contextmanager
def proxied_url(url: str, default_port: int) -> Iterator[tuple[str, TcpProxy]]:
    """``url`` with its server reached through a :class:`TcpProxy` (its user, database
    and query kept), and the proxy."""
    parts = urlsplit(url)
    with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or default_port) as proxy:
        user = f"{parts.username}@" if parts.username else ""
        yield urlunsplit(parts._replace(netloc=user + proxy.url_host)), proxy
