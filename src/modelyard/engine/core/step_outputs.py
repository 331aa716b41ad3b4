"""A request's EngineOutput for one step (engine.core.scheduler): its new tokens appended through
the stop checks, or the error that failed it.

Stop checks, in order, on each new token: a stop token id, then EOS unless ignore_eos — both
only once at least `min_tokens` tokens were generated BEFORE this one (the same rule the
sampler's mask follows); then max_tokens; then the context length -> LENGTH. As in vLLM, the
stop token is kept in the output ids; `stop_reason` is set for stop_token_ids only (not EOS).
A step may bring several tokens (accepted speculative drafts, then the target's own): they are
appended one by one, and a stop ends the request there (the rest are dropped).
"""

from __future__ import annotations

from collections.abc import Set

from modelyard.engine.core.request import Request, RequestStatus
from modelyard.engine.messages import EngineOutput, FinishReason, TokenLogprobs


def append_tokens(
    request: Request,
    token_ids: list[int],
    logprobs: TokenLogprobs | None,
    *,
    eos_token_ids: Set[int],
    max_model_len: int,
) -> tuple[EngineOutput, RequestStatus | None]:
    """Append until a stop check ends the request; its output and the finished status (None:
    it goes on). The caller finishes the request."""
    num_before = request.num_output_tokens
    status: RequestStatus | None = None
    for token_id in token_ids:
        request.append_output_token(token_id)
        status = check_stop(request, token_id, eos_token_ids, max_model_len)
        if status is not None:
            break
    want_logprobs = logprobs is not None and request.sampling_params.logprobs is not None
    output = EngineOutput(
        request_id=request.request_id,
        new_token_ids=request.output_token_ids[num_before:],
        new_logprobs=[logprobs] if want_logprobs and logprobs is not None else None,
        finish_reason=status.finish_reason if status is not None else None,
        stop_reason=request.stop_reason,
        num_prompt_tokens=request.num_prompt_tokens,
        num_cached_tokens=request.num_cached_tokens,
        first_scheduled_time=request.first_scheduled_time if num_before == 0 else None,
    )
    return output, status


def check_stop(
    request: Request, token_id: int, eos_token_ids: Set[int], max_model_len: int
) -> RequestStatus | None:
    """The status `token_id` (just appended) finishes the request with; None: not finished."""
    params = request.sampling_params
    if request.num_output_tokens - 1 >= params.min_tokens:
        if token_id in params.stop_token_ids:
            request.stop_reason = token_id
            return RequestStatus.FINISHED_STOPPED
        if not params.ignore_eos and token_id in eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
    if params.max_tokens is not None and request.num_output_tokens >= params.max_tokens:
        return RequestStatus.FINISHED_LENGTH
    if request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None


def error_output(request: Request, error: str) -> EngineOutput:
    """The one final output of a request that made a step fail (Scheduler.fail_requests)."""
    return EngineOutput(
        request_id=request.request_id,
        new_token_ids=[],
        finish_reason=FinishReason.ERROR,
        error=error,
        num_prompt_tokens=request.num_prompt_tokens,
    )
