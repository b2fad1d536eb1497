"""strata_control/runconfig_file.py: reading the run config, mending joined args, naming the model."""
import pytest

from strata_control.runconfig_file import (
    ConfigError, aliases, check_config, default_model_name, lift_reasoning_effort_arg, read_config,
    split_joined_args)


def write(tmp_path, data: bytes):
    p = tmp_path / "strata-test.json"
    p.write_bytes(data)
    return str(p)


def test_bom_tolerated(tmp_path):
    assert read_config(write(tmp_path, b'\xef\xbb\xbf{"model_name": "m"}')) == {"model_name": "m"}


def test_missing_comma_in_args_names_line_column_and_hint(tmp_path):
    path = write(tmp_path, b'{\n  "args": ["--threads" "4"],\n  "host": "x"\n}')
    with pytest.raises(ConfigError) as e:
        read_config(path)
    msg = str(e.value)
    assert "line 2 column 24" in msg and "Expecting ','" in msg
    assert '"args"' in msg and "commas" in msg


def test_mistake_outside_args_has_no_args_hint(tmp_path):
    path = write(tmp_path, b'{"args": ["--threads", "4"],\n "host": "x",\n}')
    with pytest.raises(ConfigError) as e:
        read_config(path)
    assert "line 3 column 1" in str(e.value) and "commas" not in str(e.value)


def test_not_an_object_and_not_utf8(tmp_path):
    with pytest.raises(ConfigError, match="JSON object"):
        read_config(write(tmp_path, b"[1, 2]"))
    with pytest.raises(ConfigError, match="UTF-8"):
        read_config(write(tmp_path, b'{"a": "\xff"}'))
    with pytest.raises(ConfigError, match="cannot read"):
        read_config(str(tmp_path / "absent.json"))


def test_split_joined_args_but_never_a_value():
    args, notices = split_joined_args(["--threads 4", "--model", "/my models/a b.gguf", "--kv", "q8_0",
                                       "--max-context=4096", "--serve"])
    assert args == ["--threads", "4", "--model", "/my models/a b.gguf", "--kv", "q8_0",
                    "--max-context=4096", "--serve"]
    assert len(notices) == 1 and "--threads 4" in notices[0]
    # a value that itself looks like a joined flag stays whole when it is in a value place
    assert split_joined_args(["--model", "--odd name.gguf"])[0] == ["--model", "--odd name.gguf"]
    assert split_joined_args(["-0.5 x"])[0] == ["-0.5 x"]
    with pytest.raises(ConfigError):
        split_joined_args("--threads 4")


def test_lift_reasoning_effort_arg():
    cfg, notices = lift_reasoning_effort_arg({"args": ["--threads", "2", "--reasoning-effort", "xhigh"]})
    assert cfg == {"args": ["--threads", "2"], "reasoning_effort": "high"} and notices
    cfg, _ = lift_reasoning_effort_arg({"args": ["--reasoning-effort=off"]})
    assert cfg["reasoning_effort"] == "none" and cfg["args"] == []
    cfg, notices = lift_reasoning_effort_arg({"args": ["--reasoning-effort", "low"], "reasoning_effort": "high"})
    assert cfg["reasoning_effort"] == "high" and "wins" in notices[0]
    with pytest.raises(ConfigError, match="unknown reasoning effort"):
        lift_reasoning_effort_arg({"args": ["--reasoning-effort", "ultra"]})
    assert lift_reasoning_effort_arg({"args": ["--threads", "2"]}) == ({"args": ["--threads", "2"]}, [])


def test_default_model_name():
    assert default_model_name("/x/SmolLM2-135M-Instruct.Q4_1.gguf") == "smollm2-135m-instruct"
    assert default_model_name({"general.name": "SmolLM2 135M Instruct"}) == "smollm2-135m-instruct"
    assert default_model_name({"general.name": "Smollm2 135M 8k Lc100K Mix1 Ep2", "general.basename": "smollm2",
                               "general.size_label": "135M"}) == "smollm2-135m"
    assert default_model_name("Qwen3-8B-Q4_K_M.gguf") == "qwen3-8b"
    assert default_model_name("model-f16.gguf") == "model"
    assert default_model_name({"path": "/m/Llama-3.2-1B.IQ4_XS.gguf"}) == "llama-3.2-1b"


def test_aliases():
    assert aliases("a, b,,a") == ["a", "b"]
    assert aliases(["x", " y "]) == ["x", "y"]
    assert aliases(None) == []
    with pytest.raises(ConfigError):
        aliases(3)


def test_check_config():
    cfg, notices = check_config({"args": ["--threads 2"], "sampling": {"temperature": 0.5, "repeat_penalty": 1.1,
                                                                      "foo": 1},
                                 "aliases": "x,y", "reasoning_effort": "max"})
    assert cfg["args"] == ["--threads", "2"]
    assert cfg["sampling"] == {"temperature": 0.5, "repetition_penalty": 1.1}
    assert cfg["aliases"] == ["x", "y"] and cfg["reasoning_effort"] == "high"
    assert any("foo" in n for n in notices)
    for bad in ({"sampling": {"top_k": 0}}, {"sampling": {"seed": 0}}, {"sampling": {"temperature": -1}},
                {"reasoning_budget_tokens": -3}, {"anthropic_thinking": "sometimes"}, {"reasoning_effort": "x"}):
        with pytest.raises(ConfigError):
            check_config(bad)
