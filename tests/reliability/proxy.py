"""A TCP proxy on a loopback port in front of a real server, which a test can cut (every connection
reset, nothing accepted) and restore on the same port: a network partition between two services."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.services import free_port


class Proxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:upstream_port`` until :meth:`cut`; :meth:`restore` listens
    again. Use as a context manager."""

    def __init__(self, upstream_port: int):
        self.upstream_port, self.port = upstream_port, free_port()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    def __enter__(self) -> Proxy:
        self.restore()
        return self

    def __exit__(self, *exc_info) -> None:
        self.cut()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Reset every open connection and stop listening (clients see refused connections)."""
        # listener and connections taken in one step under the lock, which _accept checks the listener under:
        # a connection accepted meanwhile is either among these or closed by _accept itself
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        if listener is not None:
            # a close alone leaves the port listening while the accept thread is blocked in accept();
            # shutdown wakes it (EINVAL) and stops the listening at once
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:  # the server itself is down: the client sees its connection closed
                client.close()
                continue
            with self._lock:
                # accepted while cut() ran (its listener since closed, or replaced by restore()): this
                # connection missed the cut's reset, so it is closed here and the old listener's thread ends
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._sockets |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
