import pytest

from modelyard.engine.client.output_processor import merge_outputs
from modelyard.engine.client.protocol import CompletionDelta, RequestMetrics, RequestOutput
from modelyard.engine.messages import FinishReason, TokenLogprobs

pytestmark = pytest.mark.unit


def logprob(token: int) -> TokenLogprobs:
    return TokenLogprobs(token_id=token, logprob=-0.5, top_token_ids=[token], top_logprobs=[-0.5])


def output(generated: int, *deltas: CompletionDelta, finished: bool = False) -> RequestOutput:
    return RequestOutput(
        request_id="r",
        deltas=list(deltas),
        num_prompt_tokens=3,
        num_cached_tokens=0,
        num_generated_tokens=generated,
        finished=finished,
        metrics=RequestMetrics(arrival_time=1.0),
    )


def test_merge_joins_each_completions_deltas_and_keeps_the_newer_state() -> None:
    older = output(
        3,
        CompletionDelta(index=0, text="Hel", token_ids=[1, 2], logprobs=[logprob(1), logprob(2)]),
        CompletionDelta(index=1, text="A", token_ids=[7]),
    )
    newer = output(
        5,
        CompletionDelta(
            index=0,
            text="lo",
            token_ids=[3],
            logprobs=[logprob(3)],
            finish_reason=FinishReason.STOP,
            stop_reason="!",
        ),
        CompletionDelta(index=2, text="Z", token_ids=[9]),
        finished=True,
    )
    merged = merge_outputs(older, newer)
    by_index = {d.index: d for d in merged.deltas}
    assert sorted(by_index) == [0, 1, 2]
    first = by_index[0]
    assert (first.text, first.token_ids) == ("Hello", [1, 2, 3])
    assert [lp.token_id for lp in first.logprobs or []] == [1, 2, 3]
    assert (first.finish_reason, first.stop_reason) == (FinishReason.STOP, "!")
    assert (by_index[1].text, by_index[1].token_ids, by_index[1].logprobs) == ("A", [7], None)
    assert by_index[2].token_ids == [9]
    assert merged.finished
    assert merged.num_generated_tokens == 5
