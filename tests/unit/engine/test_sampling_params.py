import msgspec
import pytest

from modelyard.engine.messages import EngineCommand, EngineRequest
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"n": 0}, "n"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_validate_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} "):
        SamplingParams(**kwargs).validate()  # type: ignore[arg-type]


def test_defaults_are_valid_and_greedy_is_temperature_zero() -> None:
    assert SamplingParams().validate().greedy is False
    assert SamplingParams(temperature=0.0).greedy is True


def test_engine_request_round_trips_through_msgpack_as_tagged_union() -> None:
    request = EngineRequest(
        request_id="r1",
        prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(temperature=0.0, stop_token_ids=[7], seed=3),
        priority=2,
        arrival_time=1.5,
    )
    data = msgspec.msgpack.encode(request)
    decoded = msgspec.msgpack.decode(data, type=EngineCommand)
    assert decoded == request
