"""What requests a benchmark sends: prompts of target token lengths and output lengths.

A `Workload` yields `RequestSpec`s. Lengths come from a `LengthDist` (fixed, uniform, normal),
or, with a JSONL dataset, from the file itself. Prompts of a target token length are cut from a
fixed English text with the given tokenizer (exact length, `--tokenizer` folder), or, without a
tokenizer, made of that many words from a word list (about one token per common word for
Llama-family tokenizers; the report uses the server's `usage` counts where it sends them).
Every choice comes from a seeded `random.Random`: the same seed gives the same requests.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

_WORD_TEXT = """
the of and to in is was for on that with as by at from his her an are were be this which or had
but not have they one all their has been its new more who can time would after two first other
into some there about these people year when she out over also only could city world state river
model server token light water house music story paper garden morning answer number question
simple window market school family summer winter letter mountain forest animal island language
history science country village doctor teacher
"""
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A distribution of positive integer lengths."""

    kind: str  # "fixed" | "uniform" | "normal"
    a: float  # fixed: the value; uniform: low; normal: mean
    b: float = 0.0  # uniform: high (inclusive); normal: standard deviation

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "normal"):
            raise ValueError(f"length distribution must be fixed|uniform|normal, not {self.kind!r}")
        if self.a < 1 or self.b < 0:
            raise ValueError("lengths must be >= 1 and spreads >= 0")
        if self.kind == "uniform" and self.b < self.a:
            raise ValueError("uniform:low,high needs low <= high")

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        """`128`, `fixed:128`, `uniform:64,256`, `normal:128,32`."""
        kind, _, rest = text.partition(":")
        if not rest:
            kind, rest = "fixed", kind
        try:
            nums = [float(x) for x in rest.split(",")]
        except ValueError as exc:
            raise ValueError(f"bad length distribution {text!r}") from exc
        if len(nums) != (1 if kind == "fixed" else 2):
            raise ValueError(f"bad length distribution {text!r}")
        return cls(kind, nums[0], nums[1] if len(nums) > 1 else 0.0)

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        return max(1, round(rng.gauss(self.a, self.b)))


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send."""

    prompt: str  # the prompt text (chat: the user message)
    prompt_tokens: int  # its length in tokens (exact with a tokenizer, else the target)
    max_tokens: int  # output length asked for


class PromptTokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class PromptBuilder:
    """Builds a prompt of `n` tokens, different per call (a random start in the source text)."""

    def __init__(self, tokenizer: PromptTokenizer | None, rng: random.Random) -> None:
        self.tokenizer = tokenizer  # exact lengths when given
        self.rng = rng
        words = [self.rng.choice(_WORDS) for _ in range(4096)]
        self._words = words
        self._ids = tokenizer.encode(" ".join(words), add_special_tokens=False) if tokenizer else []

    def build(self, n: int) -> tuple[str, int]:
        """(prompt text, its token length)."""
        if self.tokenizer is None:
            start = self.rng.randrange(len(self._words))
            words = [self._words[(start + i) % len(self._words)] for i in range(n)]
            return " ".join(words), n
        start = self.rng.randrange(len(self._ids))
        ids = [self._ids[(start + i) % len(self._ids)] for i in range(n)]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text, len(self.tokenizer.encode(text, add_special_tokens=False))


def load_tokenizer(folder: str | None) -> PromptTokenizer | None:
    """A Hugging Face tokenizer from a local folder (never the hub), or None."""
    if not folder:
        return None
    from transformers import AutoTokenizer

    tok: PromptTokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)  # type: ignore[assignment]
    return tok


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """How to make the requests of a run."""

    input_len: LengthDist  # prompt length in tokens
    output_len: LengthDist  # max_tokens
    dataset: str | None = None  # JSONL: {"prompt": str, "output_len"?: int} per line
    seed: int = 0  # the same seed gives the same requests


class Workload:
    """An endless, seeded stream of RequestSpecs (cycles through a dataset)."""

    def __init__(self, config: WorkloadConfig, tokenizer: PromptTokenizer | None = None) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.builder = PromptBuilder(tokenizer, self.rng)
        self.tokenizer = tokenizer
        self.rows = _read_dataset(config.dataset) if config.dataset else []

    def __iter__(self) -> Iterator[RequestSpec]:
        i = 0
        while True:
            yield self._make(i)
            i += 1

    def _make(self, i: int) -> RequestSpec:
        if self.rows:
            row = self.rows[i % len(self.rows)]
            prompt = str(row["prompt"])
            out = int(row.get("output_len") or self.config.output_len.sample(self.rng))
            n = (
                len(self.tokenizer.encode(prompt, add_special_tokens=False))
                if self.tokenizer
                else len(prompt.split())
            )
            return RequestSpec(prompt=prompt, prompt_tokens=n, max_tokens=out)
        text, n = self.builder.build(self.config.input_len.sample(self.rng))
        return RequestSpec(
            prompt=text, prompt_tokens=n, max_tokens=self.config.output_len.sample(self.rng)
        )


def _read_dataset(path: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{path}:{lineno}: each line must be an object with a 'prompt' string")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows
