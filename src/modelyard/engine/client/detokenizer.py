"""Incremental detokenization and stop strings, in the API process.

The engine streams token ids; this module turns them into text deltas for one completion:

1. Decode with vLLM's prefix/read offsets: `decode(ids[prefix:read])` is the text already
   emitted for the window, `decode(ids[prefix:])` the text with the new tokens; the delta is the
   difference. While the new text ends in U+FFFD (an unfinished multi-byte character, or a token
   that only makes sense merged with the next one) nothing is emitted and the offsets stay put.
   The window starts on the last few prompt tokens so a leading space of the first generated
   token comes out right for SentencePiece-style tokenizers.
2. Stop strings: the accumulated text is searched for the earliest stop string after each new
   token; on a match the text is trimmed (the stop string kept only with
   include_stop_str_in_output), `stop_string` is reported (the caller must abort the request
   in the engine) and `num_tokens` says how many of the update's tokens came before it, the
   matching one included (an output of several tokens, e.g. an accepted speculative run, keeps
   exactly the tokens one-at-a-time decoding would have).
3. Hold-back: while not finished, the last (longest stop string - 1) characters are kept back, so
   a partially matched stop string never reaches the client.

Special tokens named in `kept_special_tokens` stay in the text when the others are skipped
(Mistral's `[TOOL_CALLS]`, which its tool-call parser reads).

Contract: with no stop string matched, the concatenation of all deltas (the last one with
finished=True) equals `tokenizer.decode(output_ids, skip_special_tokens=...)` for byte-level BPE
tokenizers (GPT-2, SmolLM2, Llama 3, Qwen2) when the tokenizer does not clean up spaces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from modelyard.engine.client.protocol import Tokenizer
from modelyard.engine.sampling_params import SamplingParams

#: Prompt tokens kept as decoding context in front of the output (vLLM uses 5 too).
PROMPT_CONTEXT_TOKENS = 5

_REPLACEMENT_CHAR = "\ufffd"


@dataclass(slots=True)
class DetokenizedDelta:
    """What one `update` produced."""

    text: str  # new text for the client ("" while waiting for more bytes or held back)
    stop_string: str | None = None  # the stop string that matched; the completion is over
    num_tokens: int = 0  # tokens of the update that belong to the output (see step 2)


def decoder(
    tokenizer: Tokenizer, skip_special_tokens: bool, kept: Sequence[str] = ()
) -> Callable[[list[int]], str]:
    """`tokenizer.decode` for lists of ids, keeping the special tokens `kept` when the others
    are skipped (see `keeping`)."""
    decode = _plain_decoder(tokenizer, skip_special_tokens)
    kept_ids = _special_ids(tokenizer, kept) if skip_special_tokens else {}
    return keeping(decode, kept_ids) if kept_ids else decode


def keeping(decode: Callable[[list[int]], str], kept: dict[int, str]) -> Callable[[list[int]], str]:
    """`decode` that writes the tokens `kept` (id -> text) where they occur: the ids between
    them are decoded apart (a SentencePiece space right after a kept token may be lost)."""

    def run(ids: list[int]) -> str:
        if kept.keys().isdisjoint(ids):
            return decode(ids)
        parts: list[str] = []
        start = 0
        for i, token in enumerate(ids):
            if token in kept:
                parts += [decode(ids[start:i]), kept[token]]
                start = i + 1
        parts.append(decode(ids[start:]))
        return "".join(parts)

    return run


def _special_ids(tokenizer: Tokenizer, tokens: Sequence[str]) -> dict[int, str]:
    """The ids of those `tokens` that are one special token of `tokenizer` (one id that
    decoding with skip_special_tokens drops)."""
    found: dict[int, str] = {}
    for token in tokens:
        ids = tokenizer.encode(token, add_special_tokens=False)
        if len(ids) == 1 and not tokenizer.decode(ids, skip_special_tokens=True):
            found[ids[0]] = token
    return found


def _plain_decoder(tokenizer: Tokenizer, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """A Hugging Face fast tokenizer that does not clean up spaces decodes in its Rust backend
    directly: the same text, without the ~25 us of Python argument handling transformers adds
    to every call (two calls per generated token)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False:
        decode = backend.decode
        return lambda ids: str(decode(ids, skip_special_tokens=skip_special_tokens))
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    """Text of one completion, built token by token. Not thread-safe; one per completion."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> None:
        self._decode = decoder(tokenizer, params.skip_special_tokens, params.kept_special_tokens)
        self._stops = list(params.stop)
        self._include_stop = params.include_stop_str_in_output
        self._hold_back = max((len(s) for s in self._stops), default=1) - 1
        context = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._ids: list[int] = context  # context tokens, then every output token
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._text = ""  # all decoded output text so far (after any stop trimming)
        self._emitted = 0  # characters of _text already handed out
        self._stopped = False

    @property
    def output_text(self) -> str:
        """All the text handed out so far."""
        return self._text[: self._emitted]

    def update(self, new_token_ids: Sequence[int], finished: bool) -> DetokenizedDelta:
        """Add the tokens of one engine output; `finished` flushes everything held back."""
        if self._stopped:
            return DetokenizedDelta(text="")
        previous_len = len(self._text)
        stop: str | None = None
        num_tokens = 0
        for token_id in new_token_ids:
            self._ids.append(token_id)
            self._text += self._decode_next(flush=False)
            num_tokens += 1
            if len(new_token_ids) > 1 and (stop := self._find_stop(previous_len)) is not None:
                break
        if finished and stop is None:
            self._text += self._decode_next(flush=True)
        if stop is None:
            stop = self._find_stop(previous_len)
        if stop is not None:
            self._stopped = True
            finished = True
        end = len(self._text) if finished else max(self._emitted, len(self._text) - self._hold_back)
        delta = self._text[self._emitted : end]
        self._emitted = end
        return DetokenizedDelta(text=delta, stop_string=stop, num_tokens=num_tokens)

    def _decode_next(self, flush: bool) -> str:
        """Text added by the tokens after the read offset; "" while a character is unfinished
        (unless flush)."""
        if self._read_offset >= len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or (
            new_text.endswith(_REPLACEMENT_CHAR) and not flush
        ):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def _find_stop(self, previous_len: int) -> str | None:
        """Trim _text at the earliest stop string that ends in the new text; return it."""
        if not self._stops:
            return None
        start = max(0, previous_len - self._hold_back)
        best: tuple[int, str] | None = None
        for stop in self._stops:
            index = self._text.find(stop, start)
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return None
        index, stop = best
        self._text = self._text[: index + len(stop) if self._include_stop else index]
        self._emitted = min(self._emitted, len(self._text))
        return stop
