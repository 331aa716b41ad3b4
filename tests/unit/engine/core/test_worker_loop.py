import threading
import time

import pytest

from fakes.engine import FakeCore
from modelyard.engine.core.worker import serve
from modelyard.engine.messages import (
    COMMAND_CODEC,
    WORKER_MESSAGE_CODEC,
    AbortRequests,
    EngineOutputs,
    EngineRequest,
    FinishReason,
    Heartbeat,
    Shutdown,
)
from modelyard.engine.sampling_params import SamplingParams
from modelyard.transport.inproc import inproc_pair

pytestmark = pytest.mark.unit


def run_serve(
    core: FakeCore,
    commands: list[object],
    wait_s: float = 0.0,
    pulses: list[Heartbeat] | None = None,
) -> tuple[int, list[EngineOutputs]]:
    """Queue commands, run serve in a thread, return its exit status and the EngineOutputs it
    sent (Heartbeats go to `pulses`)."""
    api, worker = inproc_pair(COMMAND_CODEC, WORKER_MESSAGE_CODEC)
    for command in commands:
        api._to_worker.put(COMMAND_CODEC.encode(command))
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(serve(core, worker)), daemon=True)
    thread.start()
    time.sleep(wait_s)
    api._to_worker.put(COMMAND_CODEC.encode(Shutdown()))
    thread.join(5)
    sent = []
    while not api._from_worker.empty():
        message = WORKER_MESSAGE_CODEC.decode(api._from_worker.get_nowait())
        if isinstance(message, Heartbeat) and pulses is not None:
            pulses.append(message)
            continue
        assert isinstance(message, EngineOutputs)
        sent.append(message)
    return result[0], sent


def add(rid: str, max_tokens: int) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        prompt_token_ids=[4, 5],
        sampling_params=SamplingParams(max_tokens=max_tokens),
    )


def test_runs_requests_to_completion_then_exits_zero_on_shutdown() -> None:
    code, sent = run_serve(FakeCore(), [add("a", 3), add("b", 1)], wait_s=0.2)
    assert code == 0
    outputs = [o for message in sent for o in message.outputs]
    assert [o.new_token_ids[0] for o in outputs if o.request_id == "a"] == [4, 5, 4]
    assert [o.finish_reason for o in outputs if o.request_id == "b"] == [FinishReason.LENGTH]


def test_idle_worker_sends_heartbeats() -> None:
    code, sent = run_serve(FakeCore(num_blocks=9), [], wait_s=1.2)
    assert code == 0
    assert len(sent) >= 2
    assert all(m.outputs == [] and m.stats.num_blocks == 9 for m in sent)


def test_abort_is_applied_before_the_next_step() -> None:
    core = FakeCore()
    code, sent = run_serve(core, [add("x", 100), AbortRequests(request_ids=["x"])], wait_s=0.1)
    assert code == 0
    assert core.aborted == ["x"]
    assert not [o for m in sent for o in m.outputs]  # drained together: x never ran


def test_failed_step_fails_live_requests_with_error_outputs() -> None:
    core = FakeCore(fail_next_step=True)
    code, sent = run_serve(core, [add("a", 5), add("b", 5)], wait_s=0.2)
    assert code == 0
    errors = [o for m in sent for o in m.outputs if o.finish_reason is FinishReason.ERROR]
    assert sorted(o.request_id for o in errors) == ["a", "b"]
    assert all(o.error and "boom" in o.error for o in errors)
    assert sorted(core.aborted) == ["a", "b"]


def test_a_long_step_sends_heartbeats_while_it_runs() -> None:
    """One step of 1.6 s (three heartbeat intervals): the pulse thread speaks for the busy loop."""
    pulses: list[Heartbeat] = []
    core = FakeCore(step_delay_s=1.6)
    start = time.time()
    code, sent = run_serve(core, [add("a", 1)], wait_s=0.1, pulses=pulses)
    assert code == 0
    assert [o.finish_reason for m in sent for o in m.outputs] == [FinishReason.LENGTH]
    assert len(pulses) >= 2
    assert all(start < p.timestamp < start + 1.8 for p in pulses)  # during the step
