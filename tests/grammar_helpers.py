"""A byte-level llguidance tokenizer for grammar tests: token id = byte value, 256 = EOS."""

from __future__ import annotations

import llguidance
import llguidance.hf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

EOS = 256
VOCAB = 257


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character map (the byte-level alphabet), in byte order."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_tokenizer() -> llguidance.LLTokenizer:
    """The 257-token byte-level vocabulary as llguidance sees it."""
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in enumerate(_byte_chars())}
    vocab["<eos>"] = EOS
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    return llguidance.hf.from_tokenizer(fast, n_vocab=VOCAB, eos_token=EOS)
