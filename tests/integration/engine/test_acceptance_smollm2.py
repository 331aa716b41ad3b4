"""Issue 2 acceptance on the default model, SmolLM2-135M-Instruct (Q4_1 GGUF, read in place),
through the whole engine (scheduler + KV cache + native paged runner, in this process): greedy
tokens equal transformers `generate` on the file's weights dequantized, one prompt at a time
(teacher-forced: see HFReference; `generate` itself for the
batch of one and for bfloat16), in float32 for a batch of 1 and of 32 mixed-length prompts,
with prefix caching, chunked prefill and forced preemption; a bfloat16 smoke run of a batch."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from acceptance_helpers import (
    BATCH_LENGTHS,
    KERNELS,
    MAX_TOKENS,
    HFReference,
    check_batch,
    check_chunked_prefill,
    check_preemption,
    check_prefix_caching,
    load_runner,
    make_core,
    mixed_prompts,
    run_core,
)

from modelyard.cache_dir import cache_dir_from_environment
from modelyard.runner import bf16_widen
from modelyard.runner.loader import DEFAULT_MODEL, resolve_model, weight_source
from modelyard.runner.model_runner import ModelRunner

CACHE_DIR = cache_dir_from_environment()  # where the GGUF conversion is cached

pytestmark = pytest.mark.integration

TEXT = """\
The lighthouse stood at the edge of the northern cliffs for more than two hundred years.
Every evening the keeper climbed the spiral stairs, trimmed the wick, polished the great
lens and watched the beam sweep across the water. Ships that passed in the night counted the
flashes to know where they were: three short, one long, then darkness for ten seconds.
In the winter of the great storm, waves reached the lantern room and the glass cracked, yet
the light never went out. The keeper wrote in the log that the sea had been angry for six
days and that a fishing boat had found the harbour only because of the beam.
Years later engineers replaced the oil lamp with electric bulbs and then with a small
automatic lantern powered by the sun. The keeper's house became a museum where children
read the old logs, tried on heavy oilskin coats and learned how to tie a bowline knot.
Scientists now use the cliffs to study seabirds. Puffins return every spring to dig
burrows in the soft turf, and gannets dive from great heights to catch mackerel. On clear
days visitors can see whales far out in the bay, and in autumn the seals gather on the rocks
below to give birth to their pups, which are covered in thick white fur for their first
weeks of life. The museum sells postcards, maps of the coastal path and small books about
the history of navigation, from the first stone towers lit by fires to the satellites that
guide ships today. A kettle is always on in the kitchen, and the volunteers are happy to
explain how the clockwork that turned the lens was wound by hand every four hours.
"""

SYSTEM = (
    "You are a careful and friendly assistant for a small coastal museum. Answer visitors' "
    "questions about the lighthouse, its keepers, the seabirds and the history of navigation "
    "in two or three short sentences. If you do not know an answer, say so honestly and "
    "suggest asking one of the volunteers at the front desk, who know the building well."
)
QUESTIONS = [
    "When was the lighthouse built?",
    "Can I see puffins here?",
    "What happened during the great storm?",
    "How did the lens turn?",
    "Do you sell maps?",
    "Are there whales in the bay?",
    "Who wrote the logs?",
    "Is the museum open in winter?",
]


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    runner = load_runner(DEFAULT_MODEL, num_blocks=192)
    assert runner.implementation == "native"
    assert (
        Path(runner.model_path) == resolve_model(DEFAULT_MODEL, CACHE_DIR).path
    )  # the cached conversion
    return runner


@pytest.fixture(scope="module")
def ref(runner: ModelRunner) -> HFReference:
    source = weight_source(runner.resolved, use_blocks=False)  # the GGUF dequantized
    return HFReference(runner.model_path, teacher_forced=True, source=source)


@pytest.fixture(scope="module")
def tokenizer(runner: ModelRunner) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(runner.tokenizer_path)


@pytest.fixture(scope="module")
def corpus(tokenizer: object) -> list[int]:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)  # type: ignore[attr-defined]
    assert len(ids) > 320
    return [int(t) for t in ids]


@pytest.fixture(scope="module")
def batch(corpus: list[int]) -> dict[str, list[int]]:
    return mixed_prompts(corpus, BATCH_LENGTHS, "mixed")


def test_batch_of_one(runner: ModelRunner, ref: HFReference, batch: dict[str, list[int]]) -> None:
    longest = max(batch, key=lambda rid: len(batch[rid]))
    run = check_batch(runner, ref, {longest: batch[longest]})
    assert run.tokens[longest] == ref.greedy(batch[longest])  # generate itself, too


def test_batch_of_32_mixed_lengths(
    runner: ModelRunner, ref: HFReference, batch: dict[str, list[int]]
) -> None:
    assert len(batch) == 32
    run = check_batch(runner, ref, batch)
    assert len({tuple(t) for t in run.tokens.values()}) > 16


def test_prefix_caching(runner: ModelRunner, ref: HFReference, tokenizer: object) -> None:
    render = tokenizer.apply_chat_template  # type: ignore[attr-defined]
    prompts = {}
    for i, question in enumerate(QUESTIONS):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        text = render(messages, tokenize=False, add_generation_prompt=True)
        prompts[f"sys-{i}"] = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    check_prefix_caching(runner, ref, prompts)


def test_chunked_prefill(
    runner: ModelRunner, ref: HFReference, corpus: list[int], batch: dict[str, list[int]]
) -> None:
    check_chunked_prefill(runner, ref, corpus[10:310], batch["mixed-13"])


def test_forced_preemption(
    runner: ModelRunner, ref: HFReference, batch: dict[str, list[int]]
) -> None:
    several = {rid: ids for rid, ids in batch.items() if 40 <= len(ids) <= 58}
    assert len(several) == 5
    check_preemption(runner, ref, several)


@pytest.mark.parametrize("prefill_sdpa", [False, True], ids=["kernel-prefill", "sdpa-prefill"])
def test_bfloat16_batch_smoke(
    runner: ModelRunner,
    ref: HFReference,
    batch: dict[str, list[int]],
    prefill_sdpa: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bf16 tokens equal transformers' bf16 `generate`, except where its logits tie.

    bf16 logits are coarse (a step of 0.125 at 16-32), so two top logits often tie exactly or
    sit one step apart, and a last-bit difference anywhere (transformers attends one request
    without a mask; the engine batches) decides the tie. Where a request's tokens part from
    `generate`, ours must be within one bf16 step of transformers' best at that point (after
    the same tokens), and the request stops being compared there.

    The prompts' attention: by default the kernel attends prefill rows (SDPA's arithmetic in
    another summation order), so a prompt's last bits, and with them near-ties from the first
    token on, may differ; measured: 2 of these 5 requests part, one at an exact tie, one at
    the first token one step below the best. With MODELYARD_PREFILL_SDPA's switch the prompts
    get SDPA's bits, as transformers attends them, and at most one request may part, unless
    the bf16 GEMM sums in its own order as well: where the kernels have no AVX-512
    (runner.bf16_widen) it sums K in the float32 GEMM's chunks, not torch's order; measured
    there (forced AVX2): 2 of 5 part with SDPA's prefill, each at a near-tie."""
    config = dataclasses.replace(KERNELS, prefill_sdpa=prefill_sdpa)
    bf16 = load_runner(DEFAULT_MODEL, dtype="bfloat16", num_blocks=48, kernels=config)
    prompts = {rid: ids for rid, ids in batch.items() if len(ids) in (5, 12, 23, 40, 64)}
    run = run_core(make_core(bf16), prompts)
    parted = 0
    for rid, ids in prompts.items():
        ours, expected = run.tokens[rid], ref.greedy(ids, MAX_TOKENS, "bfloat16")
        assert len(ours) == len(expected)
        if ours == expected:
            continue
        parted += 1
        i = next(i for i, (a, b) in enumerate(zip(ours, expected, strict=True)) if a != b)
        logits = ref.next_logits([*ids, *expected[:i]], "bfloat16")
        best = float(logits.max())
        step = 2.0 ** (math.floor(math.log2(abs(best))) - 7)  # one bf16 step at that size
        assert float(logits[ours[i]]) >= best - step, (rid, i, ours[i], expected[i])
    allowed = 1 if prefill_sdpa and not bf16_widen.available(config) else 2
    assert parted <= allowed, f"{parted} of {len(prompts)} requests parted from generate"
