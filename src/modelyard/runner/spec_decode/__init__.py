"""The runner's side of speculative decoding: proposers and verification.

engine.core.spec_decode states the policy (who speculates, how many slots); here a `Proposer` fills
a step's speculative slots before the target's forward, and `verify.verify` checks the proposed
tokens against the target's logits after it. `build_proposer` is the one place that picks the
proposer for a SpeculativeConfig.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import torch

from modelyard.engine.config import SpeculativeConfig
from modelyard.engine.core.scheduler_output import ScheduledRequest
from modelyard.runner.loader import ResolvedModel, resolve_model, weight_source
from modelyard.runner.models.arch import native_supports
from modelyard.runner.models.decoder import DecoderModel
from modelyard.runner.spec_decode.draft import DraftProposer, self_draft_model
from modelyard.runner.spec_decode.ngram import NgramProposer


class Proposer(Protocol):
    """Fills speculative slots; may keep per-request state (a draft model's progress)."""

    def propose(self, requests: Sequence[ScheduledRequest]) -> dict[str, list[int]]:
        """request id -> up to num_spec_tokens proposed tokens (missing: none proposed)."""
        ...

    def verified(self, request: ScheduledRequest, num_accepted: int) -> None:
        """The target accepted the first `num_accepted` of the request's proposal."""
        ...

    def forget(self, request_ids: Iterable[str]) -> None:
        """These requests finished or lost their KV blocks (preempted)."""
        ...


def resolve_draft(
    config: SpeculativeConfig | None, target: ResolvedModel, cache_root: str
) -> ResolvedModel | None:
    """The separate draft model of method=draft, checked against the target (ValueError); a
    GGUF draft is converted under `cache_root` as the target is."""
    if config is None or config.method != "draft" or config.draft_model is None:
        return None
    draft = resolve_model(config.draft_model, cache_root)
    if not native_supports(draft.architecture, draft.config):
        raise ValueError(f"draft model {config.draft_model!r}: no native implementation")
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft model {config.draft_model!r} has vocab size {draft.config.vocab_size}, "
            f"the target {target.config.vocab_size}: they must share the tokenizer"
        )
    return draft


def build_proposer(
    config: SpeculativeConfig,
    target: DecoderModel,
    draft: ResolvedModel | None,
    *,
    num_blocks: int,
    max_model_len: int,
    team: bool,
) -> Proposer:
    """The proposer of a speculative config, over the loaded target."""
    if config.method == "ngram":
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    if config.method == "self_draft":
        model = self_draft_model(target, config.draft_layers)
        return DraftProposer(
            model, block_size=target.block_size, shares_target_cache=True, team=team
        )
    if draft is None:  # pragma: no cover - resolve_draft ran for method=draft
        raise ValueError("speculative method 'draft' without a draft model")
    with torch.inference_mode():
        model = DecoderModel(
            weight_source(draft, use_blocks=False),
            draft.architecture,
            draft.config,
            dtype=target.dtype,
            num_blocks=num_blocks,
            block_size=target.block_size,
            max_model_len=max_model_len,
            kernel_config=target.kernel_config,
        )
    return DraftProposer(model, block_size=target.block_size, shares_target_cache=False, team=team)


__all__ = ["Proposer", "build_proposer", "resolve_draft"]
