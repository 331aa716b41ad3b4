"""The in-process fake of the process edge: messages cross it encoded with the codecs, both
ways, so a wire-format mistake fails in a fast test as it would over ZeroMQ."""

from __future__ import annotations

import msgspec
import pytest

from modelyard.transport.base import Codec
from modelyard.transport.inproc import inproc_pair

pytestmark = pytest.mark.unit


class Ping(msgspec.Struct, tag="ping", kw_only=True):
    seq: int


class Pong(msgspec.Struct, tag="pong", kw_only=True):
    seq: int
    note: str = ""


async def test_messages_cross_both_ways_in_order() -> None:
    api, worker = inproc_pair(Codec(Ping), Codec(Pong))
    await api.send(Ping(seq=1))
    await api.send(Ping(seq=2))
    assert worker.recv(0) == Ping(seq=1)
    assert worker.recv(0.01) == Ping(seq=2)
    assert worker.recv(0) is None  # nothing left: no wait with a timeout of 0
    worker.send(Pong(seq=2, note="ok"))
    assert await api.recv() == Pong(seq=2, note="ok")


async def test_a_message_of_the_wrong_type_fails_to_decode() -> None:
    api, worker = inproc_pair(Codec(Pong), Codec(Pong))  # the API side sends what it should not
    await api.send(Ping(seq=1))  # type: ignore[arg-type]
    with pytest.raises(msgspec.ValidationError):
        worker.recv(0)
