"""A small byte-level BPE tokenizer trained in-process (no hub, no files), for engine tests."""

from __future__ import annotations

import functools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CORPUS = [
    "Hello world, the quick brown fox jumps over the lazy dog.",
    "The capital of France is Paris. The capital of Japan is Tokyo.",
    "Once upon a time there was a model server that streamed tokens.",
    "STOP here. Stop there. The end.",
] * 20

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@functools.cache
def build_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """Byte-level BPE: any text (emoji, CJK) encodes, into several byte tokens when rare."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return fast


@functools.cache
def build_mistral_style_tokenizer() -> PreTrainedTokenizerFast:
    """The byte-level BPE above with Mistral's special tokens (`</s>` as EOS, `[TOOL_CALLS]`)
    and a template that reads `tools` and writes `[TOOL_CALLS]`, as Mistral's do."""
    tok = Tokenizer.from_str(build_tokenizer().backend_tokenizer.to_str())
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="</s>", clean_up_tokenization_spaces=False
    )
    fast.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]", "[INST]"]})
    fast.chat_template = (
        "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}{% endif %}"
        "{% for m in messages %}{% if m['role'] == 'user' %}[INST]{{ m['content'] }}[/INST]"
        "{% elif m['tool_calls'] %}[TOOL_CALLS]{{ m['tool_calls'] | tojson }}</s>"
        "{% else %}{{ m['content'] }}</s>{% endif %}{% endfor %}"
    )
    return fast
