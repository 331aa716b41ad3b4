"""ZeroMQ implementation of the process edge: two PUSH/PULL pairs over IPC sockets.

The API process binds both sockets (it outlives workers) in a private temporary folder and hands
the two addresses to the worker, which connects. PUSH/PULL keeps messages in order and never
drops them while both ends live; `linger=0` makes close immediate when a peer is gone.
"""

from __future__ import annotations

import os
import tempfile
import threading
import uuid
from dataclasses import dataclass
from typing import Generic, TypeVar

import zmq
import zmq.asyncio

from modelyard.transport.base import Codec

S = TypeVar("S")
R = TypeVar("R")


@dataclass(frozen=True)
class IpcAddresses:
    """Where a worker connects: to_worker carries commands, from_worker carries results."""

    to_worker: str
    from_worker: str


def new_ipc_addresses(prefix: str = "modelyard") -> IpcAddresses:
    folder = tempfile.mkdtemp(prefix=f"{prefix}-")
    os.chmod(folder, 0o700)
    tag = uuid.uuid4().hex[:8]
    return IpcAddresses(
        to_worker=f"ipc://{folder}/{tag}-in", from_worker=f"ipc://{folder}/{tag}-out"
    )


class AsyncZmqConnection(Generic[S, R]):
    """API-process side: binds both sockets; send/recv never block the event loop."""

    def __init__(self, addresses: IpcAddresses, send_codec: Codec[S], recv_codec: Codec[R]):
        self._ctx = zmq.asyncio.Context()
        self._out = self._ctx.socket(zmq.PUSH)
        self._out.setsockopt(zmq.LINGER, 0)
        self._out.bind(addresses.to_worker)
        self._in = self._ctx.socket(zmq.PULL)
        self._in.setsockopt(zmq.LINGER, 0)
        self._in.bind(addresses.from_worker)
        self._send_codec = send_codec
        self._recv_codec = recv_codec
        self.addresses = addresses

    async def send(self, message: S) -> None:
        await self._out.send(self._send_codec.encode(message), copy=False)

    async def recv(self) -> R:
        data = await self._in.recv(copy=True)
        return self._recv_codec.decode(data)

    def close(self) -> None:
        self._out.close(linger=0)
        self._in.close(linger=0)
        self._ctx.term()
        for address in (self.addresses.to_worker, self.addresses.from_worker):
            path = address.removeprefix("ipc://")
            if os.path.exists(path):
                os.unlink(path)
        folder = os.path.dirname(self.addresses.to_worker.removeprefix("ipc://"))
        if os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)


class SyncZmqConnection(Generic[S, R]):
    """Worker side: connects to the API process's sockets; blocking with timeouts. `send` may
    be called from several threads (a lock serializes them: a zmq socket is not thread-safe)."""

    def __init__(self, addresses: IpcAddresses, send_codec: Codec[S], recv_codec: Codec[R]):
        self._ctx = zmq.Context()
        self._in = self._ctx.socket(zmq.PULL)
        self._in.setsockopt(zmq.LINGER, 0)
        self._in.connect(addresses.to_worker)
        self._out = self._ctx.socket(zmq.PUSH)
        self._out.setsockopt(zmq.LINGER, 0)
        self._out.connect(addresses.from_worker)
        self._poller = zmq.Poller()
        self._poller.register(self._in, zmq.POLLIN)
        self._send_codec = send_codec
        self._recv_codec = recv_codec
        self._send_lock = threading.Lock()

    def send(self, message: S) -> None:
        data = self._send_codec.encode(message)
        with self._send_lock:
            self._out.send(data, copy=False)

    def recv(self, timeout_s: float | None) -> R | None:
        timeout_ms = None if timeout_s is None else int(timeout_s * 1000)
        if not self._poller.poll(timeout_ms):
            return None
        return self._recv_codec.decode(self._in.recv(copy=True))

    def close(self) -> None:
        self._in.close(linger=0)
        self._out.close(linger=0)
        self._ctx.term()
