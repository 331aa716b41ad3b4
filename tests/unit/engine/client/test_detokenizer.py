import pytest
from tiny_tokenizer import build_mistral_style_tokenizer, build_tokenizer

from modelyard.api.tools.parsing import parser_for
from modelyard.engine.client.chat_template import tool_format_of
from modelyard.engine.client.detokenizer import IncrementalDetokenizer, decoder
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

TEXTS = [
    "Hello world, the quick brown fox.",
    "Café crème 日本語 🙂👍🏽 naïve — ok",
    " leading space and  double  spaces\nnew line",
]


def stream(
    params: SamplingParams, ids: list[int], prompt: list[int] | None = None, chunk: int = 1
) -> tuple[list[str], str | None]:
    detok = IncrementalDetokenizer(build_tokenizer(), prompt or [], params)
    deltas: list[str] = []
    stop = None
    for i in range(0, len(ids), chunk):
        finished = i + chunk >= len(ids)
        out = detok.update(ids[i : i + chunk], finished=finished)
        deltas.append(out.text)
        if out.stop_string is not None:
            stop = out.stop_string
            break
    return deltas, stop


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 3])
def test_concatenated_deltas_equal_full_decode(text: str, chunk: int) -> None:
    tok = build_tokenizer()
    ids = tok.encode(text)
    prompt = tok.encode("The capital of France is")
    deltas, stop = stream(SamplingParams(), ids, prompt, chunk)
    assert stop is None
    assert "".join(deltas) == tok.decode(ids) == text
    assert all("\ufffd" not in d for d in deltas)


def test_multibyte_character_split_over_tokens_waits_for_all_bytes() -> None:
    tok = build_tokenizer()
    ids = tok.encode("🙂")
    assert len(ids) > 1  # rare emoji: several byte tokens in this small vocab
    deltas, _ = stream(SamplingParams(), ids)
    assert deltas[:-1] == [""] * (len(ids) - 1)
    assert deltas[-1] == "🙂"


def test_special_tokens_skipped_or_kept() -> None:
    tok = build_tokenizer()
    ids = [*tok.encode("Hello"), tok.convert_tokens_to_ids("<|im_end|>"), *tok.encode(" world")]
    skipped, _ = stream(SamplingParams(), ids)
    kept, _ = stream(SamplingParams(skip_special_tokens=False), ids)
    assert "".join(skipped) == tok.decode(ids, skip_special_tokens=True) == "Hello world"
    assert "".join(kept) == tok.decode(ids, skip_special_tokens=False)
    assert "<|im_end|>" in "".join(kept)


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_split_across_tokens_is_trimmed_and_never_leaks(include: bool) -> None:
    tok = build_tokenizer()
    text = "Once upon a time there was END OF STORY and more text"
    ids = tok.encode(text)
    params = SamplingParams(stop=["END OF STORY", "never"], include_stop_str_in_output=include)
    deltas, stop = stream(params, ids)
    assert stop == "END OF STORY"
    expected = "Once upon a time there was " + ("END OF STORY" if include else "")
    assert "".join(deltas) == expected
    # no delta before the last ever contained the start of the stop string
    assert "E" not in "".join(deltas[:-1])


def test_earliest_stop_string_wins_and_partial_match_is_released_at_finish() -> None:
    tok = build_tokenizer()
    ids = tok.encode("abc STOP xyz stop")
    deltas, stop = stream(SamplingParams(stop=["stop", "STOP"]), ids)
    assert stop == "STOP"
    assert "".join(deltas) == "abc "
    # a prefix of a stop string at the very end is released when the engine finishes
    ids = tok.encode("the end ST")
    deltas, stop = stream(SamplingParams(stop=["STOP"]), ids)
    assert stop is None
    assert "".join(deltas) == "the end ST"


def test_hold_back_is_longest_stop_minus_one() -> None:
    tok = build_tokenizer()
    detok = IncrementalDetokenizer(tok, [], SamplingParams(stop=["xyzw"]))
    out = detok.update(tok.encode("Hello world"), finished=False)
    assert out.text == "Hello wo"
    assert detok.update([], finished=True).text == "rld"


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_inside_a_multi_token_update_keeps_the_tokens_up_to_it(
    include: bool,
) -> None:
    tok = build_tokenizer()
    ids = tok.encode("one two three four five")
    params = SamplingParams(stop=["three"], include_stop_str_in_output=include)
    one_at_a_time = IncrementalDetokenizer(tok, [], params)
    used = 0
    text = ""
    for token in ids:
        out = one_at_a_time.update([token], finished=False)
        used, text = used + 1, text + out.text
        if out.stop_string is not None:
            break
    detok = IncrementalDetokenizer(tok, [], params)
    out = detok.update(ids, finished=False)  # e.g. an accepted speculative run
    assert out.stop_string == "three"
    assert out.num_tokens == used < len(ids)
    assert out.text == text == ("one two three" if include else "one two ")


@pytest.mark.parametrize("skip", [True, False])
def test_backend_decoder_gives_the_tokenizers_text(skip: bool) -> None:
    tok = build_tokenizer()
    ids = [tok.eos_token_id, *tok.encode(TEXTS[1]), tok.eos_token_id, *tok.encode(TEXTS[2])]
    assert isinstance(ids[0], int)
    for window in (ids, ids[3:], ids[:5], ids[7:9]):
        assert decoder(tok, skip)(window) == tok.decode(window, skip_special_tokens=skip)
    tok.clean_up_tokenization_spaces = True  # transformers' own decode then (it may clean up)
    assert decoder(tok, skip)(ids) == tok.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("chunk", [1, 2])
def test_a_kept_special_token_stays_and_the_others_are_skipped(chunk: int) -> None:
    """Mistral's `[TOOL_CALLS]` reaches the tool parser; EOS and other special tokens do not
    leak into the text."""
    tok = build_mistral_style_tokenizer()
    marker, inst, eos = (tok.convert_tokens_to_ids(t) for t in ("[TOOL_CALLS]", "[INST]", "</s>"))
    calls = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    ids = [*tok.encode("Sure", add_special_tokens=False), marker, inst]
    ids += [*tok.encode(calls, add_special_tokens=False), eos]
    params = SamplingParams(kept_special_tokens=["[TOOL_CALLS]", "</nope>"])
    detok = IncrementalDetokenizer(tok, [], params)
    pieces = [
        detok.update(ids[i : i + chunk], finished=i + chunk >= len(ids)).text
        for i in range(0, len(ids), chunk)
    ]
    text = "".join(pieces)
    assert text == "Sure[TOOL_CALLS]" + calls
    assert "".join(stream(SamplingParams(), ids)[0]) == "Sure" + calls  # skipped by default
    parsed = parser_for(tool_format_of(tok.chat_template)).parse(text, final=True)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", '{"city": "Paris"}')]
    assert parsed.content == "Sure"
