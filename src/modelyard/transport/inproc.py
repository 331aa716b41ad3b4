"""In-process fake of the process edge, for tests that need no subprocess and no sockets.

`inproc_pair()` returns an (AsyncConnection, SyncConnection) pair joined by queues. Messages are
still encoded and decoded with the codecs, so wire-format mistakes show up in fast tests too.
"""

from __future__ import annotations

import asyncio
import queue
from typing import Generic, TypeVar

from modelyard.transport.base import Codec

S = TypeVar("S")
R = TypeVar("R")


class _AsyncEnd(Generic[S, R]):
    def __init__(
        self,
        to_worker: queue.Queue[bytes],
        from_worker: queue.Queue[bytes],
        send_codec: Codec[S],
        recv_codec: Codec[R],
    ) -> None:
        self._to_worker = to_worker
        self._from_worker = from_worker
        self._send_codec = send_codec
        self._recv_codec = recv_codec

    async def send(self, message: S) -> None:
        self._to_worker.put(self._send_codec.encode(message))

    async def recv(self) -> R:
        while True:
            try:
                return self._recv_codec.decode(self._from_worker.get_nowait())
            except queue.Empty:
                await asyncio.sleep(0.001)

    def close(self) -> None:
        pass


class _SyncEnd(Generic[S, R]):
    def __init__(
        self,
        to_worker: queue.Queue[bytes],
        from_worker: queue.Queue[bytes],
        send_codec: Codec[S],
        recv_codec: Codec[R],
    ) -> None:
        self._to_worker = to_worker
        self._from_worker = from_worker
        self._send_codec = send_codec
        self._recv_codec = recv_codec

    def send(self, message: S) -> None:
        self._from_worker.put(self._send_codec.encode(message))

    def recv(self, timeout_s: float | None) -> R | None:
        try:
            data = (
                self._to_worker.get(timeout=timeout_s)
                if timeout_s != 0
                else self._to_worker.get_nowait()
            )
        except queue.Empty:
            return None
        return self._recv_codec.decode(data)

    def close(self) -> None:
        pass


def inproc_pair(
    to_worker_codec: Codec[S], from_worker_codec: Codec[R]
) -> tuple[_AsyncEnd[S, R], _SyncEnd[R, S]]:
    """(API-side end sending S / receiving R, worker-side end sending R / receiving S)."""
    to_worker: queue.Queue[bytes] = queue.Queue()
    from_worker: queue.Queue[bytes] = queue.Queue()
    api = _AsyncEnd(to_worker, from_worker, to_worker_codec, from_worker_codec)
    worker: _SyncEnd[R, S] = _SyncEnd(to_worker, from_worker, from_worker_codec, to_worker_codec)
    return api, worker
