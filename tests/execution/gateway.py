"""A TCP gateway between the platform and Ray's dashboard port, which a test can cut and mend: a network partition
between the control plane and a Ray cluster that keeps running (same head, same node ids, nothing restarted).

While cut, nothing listens on the gateway's port (a connection is refused at once, as with a head that is down)
and every connection open through it is closed. Mended, it listens on the same port again and forwards each new
connection to the target. Threads only; it stops with the test process.
"""

from __future__ import annotations

import contextlib
import socket
import threading

ACCEPT_POLL_SECONDS = 0.2
CHUNK = 65536


class Gateway:
    def __init__(self, target_port: int, port: int) -> None:
        self.target_port = target_port
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None

    def mend(self) -> None:
        """Listen and forward (again)."""
        assert self._listener is None, "the gateway is open already"
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(ACCEPT_POLL_SECONDS)
        self._listener = listener
        self._accepting = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._accepting.start()

    def cut(self) -> None:
        """Stop listening and close every connection open through the gateway."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if self._accepting is not None:
            self._accepting.join(timeout=5)
            self._accepting = None
        with self._lock:
            open_now, self._open = self._open, set()
        for sock in open_now:
            _close(sock)

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by cut()
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                _close(client)  # the target is down: the caller sees its connection closed
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(CHUNK):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with self._lock:
                    self._open.discard(sock)
                _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
