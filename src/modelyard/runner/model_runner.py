"""The model runner: one SchedulerOutput in, one RunnerOutput out (the StepRunner protocol).

The implementation (native paged Llama forward or generic transformers model) is chosen in
one place, `choose_implementation`. Each `execute`:
1. drops per-request state of finished requests (seeded generators, generic caches);
2. native: flattens every scheduled token into one batch and builds the step's attention
   metadata once (slot mapping, block tables, masks); generic: runs request by request;
3. computes logits only for the last token of each request with sample=True;
4. samples them (runner.sampler) and returns token ids (+ logprobs); the rows of requests with
   an output constraint are masked first, with masks a worker thread computed during the
   forward (runner.structured).

With speculative decoding (native only), a proposer first fills the speculative slots of the
step's decodes (runner.spec_decode); their tokens run after the decode's own token in the same
forward, logits come from every one of those rows, and `spec_decode.verify` turns them into
accepted drafts plus the target's next token.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Literal

import torch

from modelyard.engine.config import (
    CacheConfig,
    LoRAConfig,
    ModelConfig,
    SpeculativeConfig,
    Switch,
)
from modelyard.engine.core.scheduler_output import (
    DraftResult,
    RunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
)
from modelyard.engine.messages import LoRARequest, SchedulerStats
from modelyard.runner import kernels
from modelyard.runner.attention import AttentionMetadata
from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.loader import ResolvedModel, resolve_model, weight_source
from modelyard.runner.models.arch import native_supports
from modelyard.runner.models.decoder import DecoderModel
from modelyard.runner.models.hf_generic import GenericModel
from modelyard.runner.sampler import Sampler
from modelyard.runner.spec_decode import Proposer, build_proposer, resolve_draft
from modelyard.runner.spec_decode.verify import verify
from modelyard.runner.structured import StructuredOutputs, TokenMasks, apply_masks
from modelyard.runner.structured.matchers import hf_tokenizer_loader

log = logging.getLogger(__name__)

CPU_MAX_MODEL_LEN = 8192
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

ImplementationName = Literal["native", "generic"]


def choose_implementation(resolved: ResolvedModel, requested: str) -> ImplementationName:
    """The one place that picks native vs generic (ValueError if native is impossible)."""
    supported = native_supports(resolved.architecture, resolved.config)
    if requested == "native" and not supported:
        raise ValueError(f"no native implementation for {resolved.architecture}")
    if requested == "generic" or not supported:
        return "generic"
    return "native"


class ModelRunner:
    """Loads a model and its KV cache; runs scheduler steps (implements StepRunner).

    Public attributes: `resolved` (ResolvedModel), `implementation` ("native" | "generic"),
    `dtype` (torch dtype), `block_size`, `model_path` and `tokenizer_path` (str folders for
    EngineReady), plus the StepRunner properties num_kv_blocks, max_model_len, eos_token_ids.
    """

    def __init__(
        self,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        speculative: SpeculativeConfig | None = None,
        lora: LoRAConfig | None = None,
        *,
        kernels: KernelConfig,
    ) -> None:
        """`kernels`: the kernel switches the engine config carries (runner.kernel_config);
        the runner loads the process's kernels with them and hands them to the model."""
        _load_kernels(kernels)
        # decode steps run the kernels' parallel calls with a spinning helper (kernels.team);
        # decode_team off keeps ATen's passive threads for them
        self._team = kernels.decode_team
        if model_config.num_threads is not None:
            torch.set_num_threads(model_config.num_threads)
        self.resolved = resolve_model(model_config.model, model_config.cache_dir)
        config = self.resolved.config
        self.implementation: ImplementationName = choose_implementation(
            self.resolved, model_config.implementation
        )
        self.dtype = _DTYPES[model_config.dtype]
        self.block_size = cache_config.block_size
        self.model_path = str(self.resolved.path)
        self.tokenizer_path = str(self.resolved.tokenizer_path)
        self._max_model_len = _max_model_len(config, model_config.max_model_len)
        self._eos_token_ids = _eos_token_ids(self.resolved)
        if (speculative is not None or lora is not None) and self.implementation != "native":
            raise ValueError("speculative decoding and LoRA need the native implementation")
        draft = resolve_draft(speculative, self.resolved, model_config.cache_dir)
        per_block = DecoderModel.kv_bytes_per_block(config, self.dtype, self.block_size)
        if draft is not None:  # the draft's KV tensors share the target's block ids
            per_block += DecoderModel.kv_bytes_per_block(draft.config, self.dtype, self.block_size)
        self._num_blocks = cache_config.num_blocks or cache_config.kv_cache_bytes // per_block
        if self._num_blocks < 1:
            raise ValueError("kv_cache_bytes is smaller than one KV block")
        self._native: DecoderModel | None = None
        self._generic: GenericModel | None = None
        with torch.inference_mode():
            if self.implementation == "native":
                gguf = _gguf_source(self.resolved, model_config.gguf_blocks, kernels, lora)
                source = weight_source(self.resolved, use_blocks=gguf is not None)
                if gguf is not None:
                    log.info(
                        "linear layers on the quantized blocks of %s (products: %s)",
                        gguf.name,
                        "int8 activations" if kernels.gguf_dot == "q8" else "float32",
                    )
                self._native = DecoderModel(
                    source,
                    self.resolved.architecture,
                    config,
                    dtype=self.dtype,
                    num_blocks=self._num_blocks,
                    block_size=self.block_size,
                    max_model_len=self._max_model_len,
                    kernel_config=kernels,
                    lora=lora,
                )
                source.release()  # the file's pages the load read leave the resident set
            else:
                self._generic = GenericModel(
                    self.resolved.path,
                    self.resolved.architecture,
                    self.dtype,
                    None
                    if self.resolved.gguf is None
                    else weight_source(self.resolved, use_blocks=False),
                )
        self.sampler = Sampler(self._eos_token_ids)
        self.structured = StructuredOutputs(
            hf_tokenizer_loader(self.tokenizer_path, self.vocab_size, self._eos_token_ids)
        )
        self.proposer: Proposer | None = None
        if speculative is not None and self._native is not None:
            self.proposer = build_proposer(
                speculative,
                self._native,
                draft,
                num_blocks=self._num_blocks,
                max_model_len=self._max_model_len,
                team=self._team,
            )

    @property
    def lora(self) -> ModelRunner | None:
        """Itself when it serves LoRA adapters (engine.core.scheduler_output.StepRunner.lora)."""
        return self if self._native is not None and self._native.lora is not None else None

    def check_lora(self, lora: LoRARequest) -> None:
        """Load the adapter (ValueError when it does not fit this model or LoRA is off)."""
        if self._native is None or self._native.lora is None:
            raise ValueError("this model serves no LoRA adapters")
        with torch.inference_mode():
            self._native.lora.check(lora)

    def drop_loras(self, names: list[str]) -> None:
        if self._native is not None and self._native.lora is not None:
            with torch.inference_mode():
                self._native.lora.drop(names)

    def fill_lora_stats(self, stats: SchedulerStats) -> None:
        lora = self._native.lora if self._native is not None else None
        if lora is not None:
            stats.lora_resident = lora.resident
            stats.lora_resident_bytes = lora.resident_bytes
            stats.lora_loads = lora.stats.loads
            stats.lora_load_seconds = lora.stats.load_seconds

    @property
    def num_kv_blocks(self) -> int:
        return self._num_blocks

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self._eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return int(self.resolved.config.vocab_size)

    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        """Run one step; sample for the requests with sample=True (and verify proposals)."""
        self._forget(scheduler_output)
        scheduled = scheduler_output.scheduled
        out = RunnerOutput()
        if not scheduled:
            return out
        with torch.inference_mode():
            drafts = self._propose(scheduled)
            sampled = [r for r in scheduled if r.sample]
            plain = [r for r in sampled if r.request_id not in drafts]
            drafted = [(r, drafts[r.request_id]) for r in sampled if r.request_id in drafts]
            pending = self.structured.start(plain, drafted)  # masks, overlapped with the forward
            logits = self._logits(scheduled, drafts)  # (S + proposed tokens, V)
            masks = pending.result()
            if drafted:
                first_rows = self._verify(logits, sampled, drafts, out, masks.drafts)
                logits = logits[first_rows]  # the plain requests' rows
            if plain:
                tokens, logprobs = self.sampler.sample(logits, plain, masks.plain)
                for req, token, lp in zip(plain, tokens, logprobs, strict=True):
                    out.sampled_token_ids[req.request_id] = token
                    if lp is not None:
                        out.logprobs[req.request_id] = lp
        out.structured = dataclasses.replace(self.structured.stats)
        return out

    def _forget(self, scheduler_output: SchedulerOutput) -> None:
        finished = scheduler_output.finished_request_ids
        self.sampler.forget(finished)
        self.structured.forget(finished)
        if self._generic is not None:
            self._generic.forget(finished)
        if self.proposer is not None:
            self.proposer.forget(finished | scheduler_output.preempted_request_ids)

    def _propose(self, scheduled: list[ScheduledRequest]) -> dict[str, list[int]]:
        """Proposed tokens for the requests with speculative slots (none without a proposer)."""
        speculating = [r for r in scheduled if r.num_spec_tokens]
        if self.proposer is None or not speculating:
            return {}
        return self.proposer.propose(speculating)

    def _verify(
        self,
        logits: torch.Tensor,
        sampled: list[ScheduledRequest],
        drafts: dict[str, list[int]],
        out: RunnerOutput,
        masks: TokenMasks | None,
    ) -> torch.Tensor:
        """Verify the requests with drafts into `out` (rows of `logits`: per sampled request,
        one per proposed token plus one); return the rows of the others. Requests with drafts
        never ask for logprobs (engine.core.spec_decode). `masks`: those of the constrained
        requests' rows (runner.structured)."""
        spans: list[int] = []  # rows of the requests with drafts
        plain_rows: list[int] = []
        row = 0
        for r in sampled:
            n = 1 + len(drafts.get(r.request_id, ()))
            (spans if r.request_id in drafts else plain_rows).extend(range(row, row + n))
            row += n
        checked = [r for r in sampled if r.request_id in drafts]
        draft_lists = [drafts[r.request_id] for r in checked]
        spec_logits = logits[torch.tensor(spans, dtype=torch.long)]
        if masks is not None:  # the constrained requests' rows, per draft prefix
            apply_masks(spec_logits, masks)
        for req, draft, (num_accepted, token) in zip(
            checked,
            draft_lists,
            verify(self.sampler, spec_logits, checked, draft_lists),
            strict=True,
        ):
            out.sampled_token_ids[req.request_id] = token
            out.drafts[req.request_id] = DraftResult(draft, num_accepted)
            if self.proposer is not None:
                self.proposer.verified(req, num_accepted)
        return torch.tensor(plain_rows, dtype=torch.long)

    def _logits(
        self, scheduled: list[ScheduledRequest], drafts: dict[str, list[int]]
    ) -> torch.Tensor:
        if self._generic is not None:
            return self._generic.forward(scheduled)
        if self._native is None:  # pragma: no cover - constructor sets one of them
            raise RuntimeError("no model loaded")
        tokens = [[*r.token_ids, *drafts.get(r.request_id, ())] for r in scheduled]
        lengths = [len(t) for t in tokens]
        meta = AttentionMetadata.build(
            [r.start_position for r in scheduled],
            lengths,
            [r.block_table for r in scheduled],
            self.block_size,
            self._native.sliding_window,
        )
        input_ids = torch.tensor([t for ts in tokens for t in ts], dtype=torch.long)  # (T,)
        rows: list[int] = []
        end = 0
        for r, n in zip(scheduled, lengths, strict=True):
            end += n
            if r.sample:  # the last real token's row, then one per proposed token
                rows.extend(range(end - 1 - len(drafts.get(r.request_id, ())), end))
        sample_rows = torch.tensor(rows, dtype=torch.long)  # (S + proposed,)
        lora_rows = [(r.lora, n) for r, n in zip(scheduled, lengths, strict=True)]
        with kernels.team(meta.all_decodes and self._team), self._lora_step(lora_rows):
            return self._native.forward(input_ids, meta, sample_rows)

    def _lora_step(
        self, rows: list[tuple[LoRARequest | None, int]]
    ) -> AbstractContextManager[None]:
        """The adapters of this forward's rows (nothing to do without LoRA)."""
        lora = self._native.lora if self._native is not None else None
        return lora.step(rows) if lora is not None else contextlib.nullcontext()


def _load_kernels(config: KernelConfig) -> None:
    """Load the process's kernels as `config` says, before anything asks whether they are
    there (the sampler, the generic model's steps)."""
    kernels.load(config)


def _gguf_source(
    resolved: ResolvedModel, switch: Switch, config: KernelConfig, lora: LoRAConfig | None
) -> Path | None:
    """The GGUF file whose blocks the linear layers keep, if any: `gguf_blocks: on`, or `auto`
    (the default) with the kernels loaded, no LoRA and MODELYARD_WEIGHTS not int8; `off`
    dequantizes the weights to float."""
    if switch == "off" or resolved.gguf is None:
        if switch == "on":
            log.warning("GGUF blocks asked for, but %s is not a GGUF file", resolved.source)
        return None
    if switch == "auto" and (lora is not None or config.weights == "int8" or not kernels.loaded()):
        return None
    return resolved.gguf


def _max_model_len(config: object, requested: int | None) -> int:
    own = getattr(config, "max_position_embeddings", None) or CPU_MAX_MODEL_LEN
    if requested is not None:
        if requested > own:
            raise ValueError(f"max_model_len {requested} exceeds the model's {own}")
        return requested
    return int(min(own, CPU_MAX_MODEL_LEN))


def _eos_token_ids(resolved: ResolvedModel) -> list[int]:
    """EOS ids from generation_config.json when present, else from config.json."""
    from transformers import GenerationConfig

    eos: object = None
    with contextlib.suppress(OSError):
        eos = GenerationConfig.from_pretrained(resolved.path).eos_token_id
    if eos is None:
        eos = getattr(resolved.config, "eos_token_id", None)
    if eos is None:
        return []
    if isinstance(eos, int):
        return [eos]
    return [int(e) for e in eos]  # type: ignore[attr-defined]
