"""Per-request sampling parameters.

`SamplingParams` travels from the API process to the engine worker inside `EngineRequest`
(a msgspec struct, so it is part of the wire format). `validate()` raises `InvalidParamError`
(a ValueError) naming the offending field; the HTTP layer turns that into a 400. Integers are
bounded so that they fit their wire type (and torch's int64) wherever they travel.

Stop strings (`stop`) are applied in the API process by the detokenizer, never in the engine:
the engine knows only token ids.
"""

from __future__ import annotations

import msgspec

from modelyard.engine.constraints import Constraint

#: Largest number of top alternatives a request may ask for (`logprobs`).
MAX_LOGPROBS = 20
#: Longest `cache_salt`, in characters (after the API process composed it).
MAX_CACHE_SALT_CHARS = 2048
#: Integer fields travel as 64-bit integers (msgspec); seeds take the whole signed range.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Counts (n, top_k, max_tokens, min_tokens) stay within 32 bits.
INT32_MAX = 2**31 - 1


class InvalidParamError(ValueError):
    """A request field has a value the engine refuses; `param` names the field (HTTP 400)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param} {message}")
        self.param = param
        self.detail = message  # the message without the field name

    def renamed(self, param: str) -> InvalidParamError:
        """The same error for a request field with another name (max_completion_tokens...)."""
        return InvalidParamError(param, self.detail)


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How to pick the next token and when to stop. Defaults follow vLLM."""

    n: int = 1
    """Number of completions for the prompt. The API process fans `n > 1` out into `n` engine
    requests that share the prompt's KV blocks through the prefix cache."""
    temperature: float = 1.0
    """0 means greedy (argmax); otherwise logits are divided by it before softmax."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability sums to top_p."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 or -1 disables."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the most likely token's."""
    repetition_penalty: float = 1.0
    """>1 discourages tokens already in the prompt or the output (CTRL-style, divides positive
    logits, multiplies negative ones)."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token already in the output (OpenAI semantics)."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per occurrence in the output (OpenAI semantics)."""
    seed: int | None = None
    """Per-request random seed: the same seed gives the same tokens whatever the batch mates."""
    max_tokens: int | None = 16
    """Most tokens to generate; None means up to the model's context length."""
    min_tokens: int = 0
    """EOS and stop token ids are masked until this many tokens were generated."""
    ignore_eos: bool = False
    """Keep generating past EOS (benchmarks)."""
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    """Extra token ids that end the generation (the token is kept in the output ids)."""
    stop: list[str] = msgspec.field(default_factory=list)
    """Stop strings, applied by the API process's detokenizer; excluded from the text unless
    include_stop_str_in_output."""
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    """None: no logprobs. k >= 0: the sampled token's logprob plus the k most likely tokens'."""
    skip_special_tokens: bool = True
    kept_special_tokens: list[str] = msgspec.field(default_factory=list)
    """Special tokens the text keeps even when skip_special_tokens drops the others (Mistral's
    tool-call marker `[TOOL_CALLS]` on requests offering tools); applied by the API process's
    detokenizer. A string that is not one special token of the model changes nothing."""
    speculate: bool | None = None
    """Speculative decoding for this request: None follows the model's policy (long outputs
    only), True asks for it regardless of max_tokens, False turns it off. No effect on a model
    without a draft; requests with logprobs never speculate."""
    constraint: Constraint | None = None
    """Structured output: the text must match this (engine/constraints.py). Each step masks
    the tokens the grammar forbids before sampling, so logprobs are those of the constrained
    distribution (drafts of speculative decoding are verified against the masked ones too); the
    request ends with EOS once the grammar accepts, and min_tokens does not hold its EOS back."""
    cache_salt: str | None = None
    """Not a sampling knob: the request's prefix-cache salt (vLLM's `cache_salt`, composed by
    the API process with the tenant's). Mixed into the hash of the first KV block, so requests
    of different salts never share cached KV (engine/core/request.py). It rides with the parameters
    so that every engine client carries it unchanged."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> SamplingParams:
        """Raise InvalidParamError (a ValueError) naming the first invalid field; return self
        for chaining."""
        for name in ("n", "top_k", "max_tokens", "min_tokens", "logprobs"):
            value = getattr(self, name)
            _check(value is None or value <= INT32_MAX, name, f"must be <= {INT32_MAX}")
        _check(
            self.seed is None or INT64_MIN <= self.seed <= INT64_MAX,
            "seed",
            "must be a signed 64-bit integer",
        )
        _check(self.n >= 1, "n", "must be >= 1")
        _check(0.0 <= self.temperature <= 100.0, "temperature", "must be in [0, 100]")
        _check(0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]")
        _check(self.top_k >= -1, "top_k", "must be -1, 0 (disabled) or positive")
        _check(0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]")
        _check(0.0 < self.repetition_penalty <= 10.0, "repetition_penalty", "must be in (0, 10]")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]")
        _check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be >= 1")
        _check(self.min_tokens >= 0, "min_tokens", "must be >= 0")
        _check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            "must be <= max_tokens",
        )
        _check(
            self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
            "logprobs",
            f"must be in [0, {MAX_LOGPROBS}]",
        )
        _check(
            all(0 <= t <= INT32_MAX for t in self.stop_token_ids),
            "stop_token_ids",
            "must be token ids (>= 0)",
        )
        _check(
            self.constraint is None or not self.ignore_eos,
            "ignore_eos",
            "cannot be combined with structured output",
        )
        _check(all(s != "" for s in self.stop), "stop", "must not contain empty strings")
        _check(
            self.cache_salt is None or 0 < len(self.cache_salt) <= MAX_CACHE_SALT_CHARS,
            "cache_salt",
            f"must be a non-empty string of at most {MAX_CACHE_SALT_CHARS} characters",
        )
        return self


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise InvalidParamError(field, message)
