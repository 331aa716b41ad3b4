"""Generic path: any AutoModelForCausalLM (GPT-2, OPT, ...), correct but slower.

It ignores the block tables: each request keeps its own transformers cache (DynamicCache) keyed
by request id and runs alone (batch of one) each step. The scheduler still accounts blocks, so
memory stays bounded. When the cache does not hold exactly `start_position` tokens (a request
restarted at 0 after preemption, or one whose prefix the scheduler served from the prefix
cache), the cache is rebuilt from the request's prompt + output tokens.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from modelyard.engine.core.scheduler_output import ScheduledRequest
from modelyard.runner.weights import WeightSource

log = logging.getLogger(__name__)


class GenericModel:
    """Wraps one AutoModelForCausalLM with per-request HF caches."""

    def __init__(
        self,
        path: Path,
        architecture: str,
        dtype: torch.dtype,
        source: WeightSource | None = None,
    ) -> None:
        """`path`: the HF folder; `source`: its weights when the folder holds none (a GGUF
        model: runner.loader)."""
        from transformers import AutoModelForCausalLM

        log.warning(
            "%s runs on the generic transformers path "
            "(per-request caches, no batching; correct but slower than native)",
            architecture,
        )
        if source is None:
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        else:
            self.model = model_from_source(path, source, dtype)
        self.model.eval()  # type: ignore[no-untyped-call]
        self._caches: dict[str, Any] = {}  # request id -> DynamicCache
        self._lengths: dict[str, int] = {}  # request id -> tokens held by its cache
        params = inspect.signature(self.model.forward).parameters
        # transformers renamed past_key_values to cache; use whichever this version takes
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop the caches of finished or aborted requests."""
        for rid in request_ids:
            self._caches.pop(rid, None)
            self._lengths.pop(rid, None)

    def forward(self, requests: Sequence[ScheduledRequest]) -> torch.Tensor:
        """Run each request's chunk; (S, V) logits for the requests with sample=True."""
        rows: list[torch.Tensor] = []
        for req in requests:
            logits = self._run_one(req)  # (V,)
            if req.sample:
                rows.append(logits)
        if not rows:
            return torch.empty((0, 0))
        return torch.stack(rows)

    def _run_one(self, req: ScheduledRequest) -> torch.Tensor:
        from transformers import DynamicCache

        rid = req.request_id
        start = req.start_position
        tokens = list(req.token_ids)
        if self._lengths.get(rid) != start:
            # fresh, restarted, or prefix served elsewhere: rebuild from all known tokens
            known = [*req.prompt_token_ids, *req.output_token_ids]
            tokens = known[:start] + tokens
            self._caches[rid] = DynamicCache(config=self.model.config)
            start = 0
        cache = self._caches[rid]
        ids = torch.tensor([tokens], dtype=torch.long)  # (1, n)
        out = self.model(
            input_ids=ids,
            use_cache=True,
            attention_mask=torch.ones((1, start + len(tokens)), dtype=torch.long),
            **{self._cache_kwarg: cache},
        )
        self._lengths[rid] = start + len(tokens)
        logits: torch.Tensor = out.logits[0, -1].float()  # (V,)
        return logits


def model_from_source(path: Path, source: WeightSource, dtype: torch.dtype) -> Any:
    """The model of the config in `path` with the weights of `source` (ValueError when a
    weight is missing, a tied lm_head needs none, or the source has one the model lacks)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    state = {name: source.tensor(name).to(dtype) for name in source.names()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(f"weights of {path}'s source the model lacks: {unexpected[:5]}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
        missing = [m for m in missing if m != "lm_head.weight"]
    if missing:
        raise ValueError(f"weights missing from {path}'s source: {missing[:5]}")
    return model
