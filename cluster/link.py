"""A keeper's own connection to its runtime: calls and their replies as pickles over one TCP
socket, read and run in order on a thread of the keeper's (docs/decisions.md#dist-link).

A message is a pickle (protocol 5) and its out-of-band buffers, each a frame: a count, the
frames' lengths, then the frames. Large buffers go as they lie and are read into buffers of
their own, so an operand arrives writable and is not copied again."""

from __future__ import annotations

import collections
import concurrent.futures
import hmac
import pickle
import queue
import socket
import struct
import threading
import time
from typing import Any, Callable

import numpy as np

SMALL = 1 << 20  # bytes: a message this small is sent in one write, from the caller's thread
ACCEPT_S = 120.0  # s a keeper waits for its runtime to connect
HANDSHAKE_S = 2.0  # s a connection has to send the token


def _frames(obj: Any) -> list:
    bufs: list = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    return [head, *(b.raw() for b in bufs)]


def _size(frames: list) -> int:
    return sum(memoryview(f).nbytes for f in frames)


def _prefix(frames: list) -> bytes:
    lengths = [memoryview(f).nbytes for f in frames]
    return struct.pack(f"<I{len(lengths)}Q", len(lengths), *lengths)


def _send(sock: socket.socket, frames: list) -> None:
    if _size(frames) < SMALL:
        sock.sendall(b"".join([_prefix(frames), *frames]))
        return
    sock.sendall(_prefix(frames))
    for f in frames:
        sock.sendall(f)


def _exact(sock: socket.socket, n: int) -> memoryview:
    # (a large frame into memory not zeroed first: a bytearray's memset of a 1.6 GiB operand
    # cost a host call ~0.7 s, docs/decisions.md#dist-link)
    buf = bytearray(n) if n < SMALL else np.empty(n, np.uint8)
    view, got = memoryview(buf).cast("B"), 0
    while got < n:
        r = sock.recv_into(view[got:])
        if not r:
            raise ConnectionError("the other end closed the connection")
        got += r
    return view


def _recv(sock: socket.socket) -> list:
    """One message's frames (a broken connection raises ``OSError``); ``_loads`` makes them
    its object, apart, so that a message that cannot be unpickled fails alone."""
    (count,) = struct.unpack("<I", _exact(sock, 4))
    lengths = struct.unpack(f"<{count}Q", _exact(sock, 8 * count))
    if sum(lengths) < SMALL:  # (one read; the frames are views of it, writable)
        blob = _exact(sock, sum(lengths))
        ends = [0]
        for n in lengths:
            ends.append(ends[-1] + n)
        frames = [blob[a:b] for a, b in zip(ends[:-1], ends[1:])]
    else:
        frames, short = [], None
        for n in lengths:
            try:
                frames.append(_exact(sock, n))
            except MemoryError as exc:  # (read past, so the next message is read whole)
                _skip(sock, n)
                short = exc
        if short is not None:
            raise _Unread(short)
    return frames


class _Unread(Exception):
    """A message read past whole, but not kept: ``args[0]`` says why (no memory for it)."""


def _skip(sock: socket.socket, n: int) -> None:
    buf = memoryview(bytearray(min(n, SMALL)))
    while n:
        r = sock.recv_into(buf[:min(n, len(buf))])
        if not r:
            raise ConnectionError("the other end closed the connection")
        n -= r


def _loads(frames: list) -> Any:
    return pickle.loads(frames[0], buffers=frames[1:])


def _nodelay(sock: socket.socket) -> None:
    # (a reply is one small write the caller waits for: Nagle's algorithm would hold it)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Server:
    """The keeper's end: listens on ``host`` for its runtime (the first connection that sends
    ``token``), then reads messages and answers each with ``serve(message)`` in order, on a
    thread of its own. ``serve`` returns (reply, then): ``then()``, if not None, runs once the
    reply is sent."""

    def __init__(self, host: str, token: bytes, serve: Callable):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, 0), family=family)
        self.address = self._sock.getsockname()[:2]
        threading.Thread(target=self._run, args=(token, serve), daemon=True,
                         name="vbatch-keeper-link").start()

    def _accept(self, token: bytes) -> socket.socket | None:
        deadline = time.monotonic() + ACCEPT_S
        with self._sock:
            while True:
                try:
                    # (a deadline over all connections: one that never sends its token, or
                    # many such, cannot keep the thread waiting for good)
                    self._sock.settimeout(max(deadline - time.monotonic(), 0.001))
                    conn, _ = self._sock.accept()
                except OSError:  # (timed out: the runtime went another way, or went)
                    return None
                try:
                    conn.settimeout(HANDSHAKE_S)
                    if hmac.compare_digest(bytes(_exact(conn, len(token))), token):
                        conn.settimeout(None)
                        _nodelay(conn)
                        return conn
                except OSError:
                    pass
                conn.close()

    def _run(self, token: bytes, serve: Callable) -> None:
        conn = self._accept(token)
        if conn is None:
            return
        with conn:
            while True:
                try:
                    frames = _recv(conn)
                    msg = _loads(frames)
                except OSError:  # (the runtime closed, or its process ended)
                    return
                except _Unread as exc:  # (no memory for it: that call's error, not the link's)
                    reply, then = ("err", exc.args[0]), None
                except Exception as exc:  # noqa: BLE001 - (a class this worker cannot import)
                    reply, then = ("err", exc), None
                else:
                    reply, then = serve(msg)
                try:
                    frames = _frames(reply)
                except Exception as exc:  # noqa: BLE001 - an answer that cannot travel
                    frames = _frames(("err", RuntimeError(
                        f"the worker's answer could not be sent: {exc!r}")))
                try:
                    _send(conn, frames)
                except OSError:
                    return
                finally:
                    if then is not None:
                        then()
                    # (not held until the next message comes: a large operand, or its reply)
                    msg = reply = frames = None


class Link:
    """The runtime's end: ``call(message)`` sends it and returns a future of its reply. Small
    messages are written from the caller's thread; large ones by a thread of the link's, so a
    caller does not wait out a transfer, in the order they were called either way. A broken
    connection fails every pending call with a ``ConnectionError``."""

    def __init__(self, address: tuple, token: bytes, timeout: float = 5.0):
        sock = socket.create_connection(address, timeout)
        sock.sendall(token)
        sock.settimeout(None)
        _nodelay(sock)
        self._sock = sock
        self._lock = threading.Lock()
        self._pending: collections.deque = collections.deque()
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._writing = 0  # messages handed to the writer and not yet sent
        self._broken: BaseException | None = None
        threading.Thread(target=self._read, daemon=True, name="vbatch-link-read").start()
        threading.Thread(target=self._write, daemon=True, name="vbatch-link-write").start()

    def call(self, message: Any) -> concurrent.futures.Future:
        """Send ``message``; never blocks on the socket (what the socket does not take at once
        goes to the writer thread, after what is queued there), so neither a caller nor the
        client's event loop waits for a busy keeper, and the lock is never held across a
        blocking write (the reader takes it for each reply)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        frames = _frames(message)
        with self._lock:
            if self._broken is not None:
                fut.set_exception(ConnectionError(str(self._broken)))
                return fut
            self._pending.append(fut)
            if not self._writing and _size(frames) < SMALL:
                data = b"".join([_prefix(frames), *frames])
                try:
                    sent = self._sock.send(data, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    self._fail(exc)
                    return fut
                if sent == len(data):
                    return fut
                frames = memoryview(data)[sent:]  # (the rest, framed already)
            self._writing += 1
            self._out.put(frames)
        return fut

    def close(self) -> None:
        with self._lock:
            self._fail(ConnectionError("the link was closed"))
        self._out.put(None)

    def _write(self) -> None:
        while True:
            frames = self._out.get()
            if frames is None:
                return
            try:
                if isinstance(frames, memoryview):
                    self._sock.sendall(frames)
                else:
                    _send(self._sock, frames)
                frames = None
            except OSError as exc:
                with self._lock:
                    self._fail(exc)
            with self._lock:
                self._writing -= 1

    def _read(self) -> None:
        while True:
            try:
                frames = _recv(self._sock)
            except _Unread as exc:  # (no memory for the reply: that call's error)
                frames, reply = None, ("err", exc.args[0])
            except OSError as exc:
                with self._lock:
                    self._fail(exc)
                return
            with self._lock:
                fut = self._pending.popleft()
            try:
                if frames is not None:
                    reply = _loads(frames)
            except Exception as exc:  # noqa: BLE001 - (a class the client cannot import)
                reply = ("err", exc)
            if fut.set_running_or_notify_cancel():  # (False: its waiter was cancelled)
                fut.set_result(reply)
            # (not held until the next reply: a large one, and what its callbacks hold)
            fut = reply = frames = None

    def _fail(self, exc: BaseException) -> None:
        """(under the lock) Every pending call fails, and any later one."""
        if self._broken is None:
            self._broken = exc
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        while self._pending:
            fut = self._pending.popleft()
            if fut.set_running_or_notify_cancel():
                fut.set_exception(ConnectionError(str(exc)))
