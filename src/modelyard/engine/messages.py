"""Wire messages between the API process and the engine worker process.

Everything that crosses the process boundary is a msgspec struct defined here; nothing travels
as a bare tuple or dict. The API process sends `EngineCommand`s (a tagged union) and receives
`EngineOutputs`, one per engine step that produced something.

The engine knows nothing about text: prompts arrive as token ids, outputs leave as token ids.
Detokenization and stop strings happen in the API process.
"""

from __future__ import annotations

import enum

import msgspec

from modelyard.engine.sampling_params import SamplingParams
from modelyard.transport.base import Codec


class FinishReason(enum.StrEnum):
    """Why a request ended. Values are the OpenAI `finish_reason` strings where one exists."""

    STOP = "stop"  # EOS, a stop token id, or (API side) a stop string
    LENGTH = "length"  # max_tokens or the model's context length
    ABORT = "abort"  # the client went away, a timeout, or an explicit abort
    ERROR = "error"  # the engine failed this request (the message says why)


class TokenLogprobs(msgspec.Struct, array_like=True):
    """Log-probabilities for one generated position (raw model distribution, log_softmax of the
    logits before temperature and penalties, as vLLM reports by default)."""

    token_id: int  # the sampled token
    logprob: float  # its log-probability
    top_token_ids: list[int]  # the k most likely tokens, most likely first (k = params.logprobs)
    top_logprobs: list[float]  # their log-probabilities, aligned with top_token_ids


# ---------------------------------------------------------------- API process -> worker


class LoRARequest(msgspec.Struct, frozen=True, kw_only=True):
    """The LoRA adapter a request runs with (the API process's registry fills it in)."""

    name: str  # the adapter's model id
    path: str  # its PEFT folder (adapter_config.json + adapter_model.safetensors), server-side
    adapter_id: int  # unique per registration: a re-registered name never shares cached KV


class EngineRequest(msgspec.Struct, tag="add", kw_only=True):
    """Add one request (one completion: the API process fans n > 1 out)."""

    request_id: str  # unique among live requests; the API process owns the namespace
    prompt_token_ids: list[int]  # already tokenized (chat template applied) and length-checked
    sampling_params: SamplingParams  # with n == 1
    priority: int = 0  # higher runs first; under KV pressure the lowest priority is preempted
    arrival_time: float = 0.0  # time.time() when the API process accepted the request
    lora: LoRARequest | None = None  # run with this adapter on top of the base weights


class AbortRequests(msgspec.Struct, tag="abort"):
    """Stop these requests; the scheduler frees their KV blocks at the next step."""

    request_ids: list[str]


class DropLoRAs(msgspec.Struct, tag="drop_loras"):
    """These adapters were unregistered: free their memory once no request uses them."""

    names: list[str]


class Shutdown(msgspec.Struct, tag="shutdown"):
    """Finish nothing more, free everything, exit the worker process with status 0."""


class PinPrefix(msgspec.Struct, tag="pin", kw_only=True):
    """Prefill these tokens once and pin their full KV blocks in the prefix cache (CAG).

    The prefill runs as request `request_id` (max_tokens=1); its final output answers the
    command: finish_reason LENGTH/STOP once the blocks are pinned, ERROR when the pin was
    refused (over the pin budget) or failed. See engine/core/prefixes.py.
    """

    request_id: str  # the prefill request's id (the API process's namespace)
    prefix_id: str  # the pin's id, unique among live pins of this engine
    token_ids: list[int]  # the prefix; only its full blocks are pinned
    ttl_s: float  # the pin is released this many seconds after it is in place
    priority: int = 0  # scheduler priority of the prefill request
    cache_salt: str | None = None  # prefix-cache salt (SamplingParams.cache_salt) of its blocks


class UnpinPrefixes(msgspec.Struct, tag="unpin"):
    """Release these pins now (their blocks stay cached until the cache needs them)."""

    prefix_ids: list[str]


EngineCommand = EngineRequest | AbortRequests | DropLoRAs | Shutdown | PinPrefix | UnpinPrefixes


# ---------------------------------------------------------------- worker -> API process


class EngineOutput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What happened to one request in one step."""

    request_id: str
    new_token_ids: list[int]  # tokens generated this step (usually one)
    new_logprobs: list[TokenLogprobs] | None = None  # aligned with new_token_ids when asked
    finish_reason: FinishReason | None = None  # set on the request's last output
    stop_reason: int | None = None  # the stop token id that ended it, if one did
    error: str | None = None  # with FinishReason.ERROR: a message for the client
    num_prompt_tokens: int = 0  # set on every output (cheap); used for usage accounting
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (first schedule)
    first_scheduled_time: float | None = None  # time.time() when the request first ran; on
    # the first output only, so the API side can report queue time


class SchedulerStats(msgspec.Struct, kw_only=True):
    """A snapshot of the scheduler and KV cache, sent with every EngineOutputs."""

    num_running: int = 0  # requests holding KV blocks and being stepped
    num_waiting: int = 0  # requests queued (new or preempted)
    num_blocks: int = 0  # total KV blocks
    num_free_blocks: int = 0  # blocks with ref count 0 (cached-but-free ones count as free)
    kv_cache_usage: float = 0.0  # 1 - free/total
    prefix_cache_queries: int = 0  # cumulative prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # cumulative prompt tokens found there
    num_preemptions: int = 0  # cumulative
    num_failed_requests: int = 0  # cumulative: requests that made a step fail (failed alone)
    spec_decode_method: str = ""  # the speculative proposer ("" when the model has none)
    spec_decode_num_drafts: int = 0  # cumulative verification runs with >= 1 proposed token
    spec_decode_num_draft_tokens: int = 0  # cumulative tokens proposed
    spec_decode_num_accepted_tokens: int = 0  # cumulative proposed tokens accepted
    spec_decode_num_accepted_tokens_per_pos: list[int] = msgspec.field(default_factory=list)
    # cumulative accepted tokens per draft position (0 = the first proposed token)
    lora_resident: list[str] = msgspec.field(default_factory=list)  # adapters in memory
    lora_resident_bytes: int = 0  # their weights (loaded form + the packed slots)
    lora_loads: int = 0  # cumulative adapter loads from disk
    lora_load_seconds: float = 0.0  # cumulative time spent loading them
    num_aborted: int = 0  # cumulative: live requests aborted (client gone, closed, timed out)
    num_computed_tokens: int = 0  # cumulative tokens run through the model (prefill + decode)
    structured_requests: int = 0  # cumulative requests with an output constraint
    structured_compile_seconds: float = 0.0  # cumulative time compiling their grammars
    structured_mask_seconds: float = 0.0  # cumulative time computing token masks
    structured_mask_steps: int = 0  # cumulative steps with at least one constrained row
    num_pinned_blocks: int = 0  # KV blocks held by pinned prefixes (never evicted)
    num_pinned_prefixes: int = 0  # live pins
    pinned_prefix_hits: int = 0  # cumulative admissions that reused pinned blocks
    prefix_hits: dict[str, int] = {}  # live pin id -> admissions that reused it


class EngineOutputs(msgspec.Struct, tag="outputs", kw_only=True):
    """One message per step that produced outputs (or periodically, as a heartbeat)."""

    outputs: list[EngineOutput]
    stats: SchedulerStats
    timestamp: float  # time.time() in the worker when the message was sent


class EngineReady(msgspec.Struct, tag="ready", kw_only=True):
    """Sent once by the worker after the model loaded and the KV cache was allocated."""

    num_blocks: int
    block_size: int
    max_model_len: int
    tokenizer_path: str  # a folder the API process can load the tokenizer from
    model_path: str  # the resolved weights (after any GGUF conversion)
    dtype: str
    implementation: str  # "native" or "generic"
    rss_bytes: int  # the worker's resident memory after load
    vocab_size: int = 0  # token ids must be in [0, vocab_size) (0: unknown, not checked)
    max_pinned_blocks: int = (
        0  # the pin budget in blocks (engine/core/prefixes.py: pin_limit_blocks)
    )


class EngineFailed(msgspec.Struct, tag="failed", kw_only=True):
    """Sent by the worker when it cannot start (bad weights, out of memory)."""

    error: str


class Heartbeat(msgspec.Struct, tag="heartbeat", kw_only=True):
    """Sent by the worker's pulse thread while one step runs long (a big prefill on a busy
    host), so the client does not take a slow step for a hung worker."""

    timestamp: float  # time.time() in the worker when the message was sent


WorkerMessage = EngineOutputs | EngineReady | EngineFailed | Heartbeat

#: The two directions of the worker's connection (msgspec msgpack, tagged unions).
COMMAND_CODEC: Codec[EngineCommand] = Codec(EngineCommand)
WORKER_MESSAGE_CODEC: Codec[WorkerMessage] = Codec(WorkerMessage)
