"""serve/core/sampling.py: validation, the merge order and the engine's GEN keys (UPSTREAM §3.1)."""
import pytest

from serve.core.events import BadRequest, Sampling
from serve.core.sampling import (
    card_sampling, check_config_sampling, check_request_sampling, engine_keys, merge_sampling)


def keys(**fields):
    return engine_keys(merge_sampling({}, {}, {}, check_request_sampling(fields)))


def test_greedy_when_temperature_zero_or_absent():
    assert keys() == []
    assert keys(temperature=0) == []
    # an explicit 0 in the request beats a card's temperature
    merged = merge_sampling(card_sampling("llama"), {"temperature": 0.8}, {}, check_request_sampling(
        {"temperature": 0}))
    assert merged["temperature"] == 0 and not any(k.startswith("temperature=") for k in engine_keys(merged))


def test_engine_key_rules():
    assert keys(temperature=0.7, top_p=0.95, seed=3) == ["temperature=0.7", "top_p=0.95", "seed=3"]
    assert keys(top_p=1.0) == []
    assert keys(top_k=20) == ["top_k=20"]
    assert keys(top_k=0) == ["top_k=64"] and keys(top_k=500) == ["top_k=64"] and keys(top_k=-1) == ["top_k=64"]
    assert keys(min_p=0) == [] and keys(min_p=0.05) == ["min_p=0.05"]
    assert keys(repetition_penalty=1.0, frequency_penalty=0, presence_penalty=0) == []
    assert keys(repeat_penalty=1.1) == ["penalty_repeat=1.1", "penalty_last_n=64"]
    assert keys(presence_penalty=1.5, penalty_last_n=128) == ["penalty_present=1.5", "penalty_last_n=128"]
    assert keys(frequency_penalty=-0.5, repeat_last_n=0) == ["penalty_freq=-0.5", "penalty_last_n=64"]
    assert keys(penalty_last_n=32) == []   # no penalty on: no window
    assert keys(seed=0) == [] and keys(seed=-1) == []
    assert keys(logit_bias={"15": 5, "3": -100, "7": 0.25}) == ["logit_bias=3:-100,7:0.25,15:5"]
    assert keys(logit_bias=[[2, 1.5]]) == ["logit_bias=2:1.5"]


def test_numeric_strings_are_numbers():
    s = check_request_sampling({"temperature": "0.5", "top_k": "12", "seed": 7.0})
    assert (s.temperature, s.top_k, s.seed) == (0.5, 12, 7)


@pytest.mark.parametrize("field,value,words", [
    ("temperature", 2.5, "from 0 to 2"), ("temperature", True, "from 0 to 2"), ("temperature", "hot", "number"),
    ("top_p", 0, "above 0"), ("top_p", 1.5, "at most 1"), ("top_k", 2.5, "integer"), ("min_p", 2, "0 to 1"),
    ("repetition_penalty", 0, "above 0"), ("presence_penalty", 3, "-2 to 2"), ("penalty_last_n", -5, ">= 0"),
    ("seed", "x", "integer"), ("temperature", float("nan"), "from 0 to 2"),
])
def test_bad_values_name_field_and_range(field, value, words):
    with pytest.raises(BadRequest) as e:
        check_request_sampling({field: value})
    assert e.value.param == field and f"`{field}`" in e.value.message and words in e.value.message
    assert e.value.status == 400


@pytest.mark.parametrize("bias", [{"x": 1}, {"5": 101}, {"-1": 3}, "nope", [[1, 2, 3]], {"5": "a"}])
def test_bad_logit_bias(bias):
    with pytest.raises(BadRequest) as e:
        check_request_sampling({"logit_bias": bias})
    assert e.value.param == "logit_bias"


def test_merge_order_and_none_never_wins():
    card = {"temperature": 0.2, "top_p": 0.9}
    config = {"temperature": 0.6, "top_k": 30}
    settings = {"top_k": 10, "seed": None}
    request = Sampling(seed=5)
    assert merge_sampling(card, config, settings, request) == {"temperature": 0.6, "top_p": 0.9, "top_k": 10,
                                                               "seed": 5}
    assert merge_sampling(card, None, {"repeat_penalty": 1.2}, {}) == {"temperature": 0.2, "top_p": 0.9,
                                                                       "repetition_penalty": 1.2}


def test_cards():
    assert card_sampling("llama") == {"temperature": 0.2, "top_p": 0.9}
    assert card_sampling("qwen3", thinking=True)["temperature"] == 0.6
    assert card_sampling("qwen3", thinking=False)["temperature"] == 0.7
    assert card_sampling("llama", thinking=True) == card_sampling("llama")
    assert card_sampling("unknown-arch") == {}


def test_config_block():
    values, notices = check_config_sampling({"temperature": 0.3, "repeat_last_n": 32, "what": 1,
                                             "experimental_speed_projection": True})
    assert values == {"temperature": 0.3, "penalty_last_n": 32, "experimental_speed_projection": True}
    assert notices == ["config: unknown sampling key 'what' ignored"]
    for bad in ({"top_k": 65}, {"presence_penalty": -1}, {"experimental_speed_projection": 1}, [1]):
        with pytest.raises(BadRequest):
            check_config_sampling(bad)


def test_shared_settings_checked_field_by_field():
    from serve.core.sampling import check_shared_settings
    assert check_shared_settings(None) == {}
    assert check_shared_settings({"temperature": "0.5", "top_k": 20, "seed": 3, "reasoning_effort": "xhigh",
                                  "reasoning_budget_tokens": 0, "max_tokens": 100, "top_p": None,
                                  "experimental_speed_projection": True}) == {
        "temperature": 0.5, "top_k": 20, "seed": 3, "reasoning_effort": "high", "reasoning_budget_tokens": 0,
        "max_tokens": 100, "experimental_speed_projection": True}
    for bad, field in (({"temperature": 2.5}, "defaults.temperature"), ({"top_p": 0}, "defaults.top_p"),
                       ({"top_k": 0}, "defaults.top_k"), ({"max_tokens": True}, "defaults.max_tokens"),
                       ({"reasoning_budget_tokens": -1}, "defaults.reasoning_budget_tokens"),
                       ({"experimental_speed_projection": 1}, "defaults.experimental_speed_projection"),
                       ({"stop": ["x"]}, "defaults.stop"), ("hot", "defaults")):
        with pytest.raises(BadRequest) as e:
            check_shared_settings(bad)
        assert e.value.param == field and field in e.value.message, bad
    # the settings layer sits between the config and the request
    merged = merge_sampling({"temperature": 0.2}, {"temperature": 0.5, "top_p": 0.8},
                            check_shared_settings({"temperature": 0.9}), check_request_sampling({}))
    assert merged == {"temperature": 0.9, "top_p": 0.8}
