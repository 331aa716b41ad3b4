"""The process edge between the API process and a worker process, as Protocols.

The API process owns an `AsyncConnection` (asyncio, never blocks the loop); the worker owns a
`SyncConnection` (blocking, with timeouts). Both carry typed msgspec messages; the codec is chosen
by the caller (`Codec`). `transport.zmq_ipc` is the real implementation over ZeroMQ IPC
sockets; `transport.inproc` is an in-process fake for tests that need no subprocess.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import msgspec

Send = TypeVar("Send", contravariant=True)
Recv = TypeVar("Recv", covariant=True)
T = TypeVar("T")


class AsyncConnection(Protocol[Send, Recv]):
    async def send(self, message: Send) -> None: ...

    async def recv(self) -> Recv:
        """Wait for the next message (cancellable)."""
        ...

    def close(self) -> None: ...


class SyncConnection(Protocol[Send, Recv]):
    def send(self, message: Send) -> None: ...

    def recv(self, timeout_s: float | None) -> Recv | None:
        """Block up to timeout_s (None: forever, 0: poll); None when nothing arrived."""
        ...

    def close(self) -> None: ...


class Codec(Generic[T]):
    """msgpack encoding of one message type (a struct or a tagged union of structs)."""

    def __init__(self, message_type: type[T] | object) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(message_type)

    def encode(self, message: object) -> bytes:
        return self._encoder.encode(message)

    def decode(self, data: bytes) -> T:
        return self._decoder.decode(data)
