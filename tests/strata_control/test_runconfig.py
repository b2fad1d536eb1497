"""strata_control.runconfig: finding, reading, checking, merging and editing run configs."""
import json
import os
import stat

import pytest

from strata_control.runconfig_file import ConfigError
from strata_control import runconfig as rc


def test_found_beside_the_model_before_the_config_folder(tmp_path):
    model = tmp_path / "models" / "m.gguf"
    model.parent.mkdir()
    cfgdir = tmp_path / "cfg"
    cfgdir.mkdir()
    (cfgdir / "strata-m.json").write_text("{}")
    assert rc.find_run_config(str(model), "m", str(cfgdir)) == str(cfgdir / "strata-m.json")
    (model.parent / "strata-m.json").write_text("{}")
    assert rc.find_run_config(str(model), "m", str(cfgdir)) == str(model.parent / "strata-m.json")
    assert rc.find_run_config(str(model), "other", str(cfgdir)) is None


def test_bom_tolerated_and_unknown_keys_reported_by_name(tmp_path):
    p = tmp_path / "strata-m.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({"threads": 2, "colour": "blue", "idle_unload": 5,
                                                 "sampling": {"temperature": 0.2}}).encode())
    cfg, notices = rc.load(str(p))
    assert cfg == {"threads": 2, "colour": "blue", "idle_unload": 5, "sampling": {"temperature": 0.2}}
    assert [n for n in notices if "'colour'" in n] and [n for n in notices if "'idle_unload'" in n]
    assert all(n.startswith("strata-m.json: unknown key") for n in notices)


@pytest.mark.parametrize("cfg, says", [({"threads": "4"}, "'threads' must be a whole number"),
                                       ({"threads": 0}, "'threads' is 0; it must be 1..1024"),
                                       ({"kv": "q4"}, "'kv' must be 'f16' or 'q8_0'"),
                                       ({"fit_max_tokens": 1}, "true or false"),
                                       ({"sampling": {"temperature": -1}}, "temperature")])
def test_bad_values_name_the_key(cfg, says):
    with pytest.raises(ConfigError, match=says):
        rc.check_keys(cfg)


def test_merge_card_then_run_config_then_flags():
    values, sources = rc.merge({"max_context": 8192, "threads": 4}, {"threads": 2, "parallel": 4},
                               {"parallel": 2, "max_context": None})
    assert values == {"max_context": 8192, "threads": 2, "parallel": 2}
    assert sources == {"max_context": "card", "threads": "run config", "parallel": "flag"}


def test_edit_checks_every_change_first_and_keeps_a_bak(tmp_path):
    p = tmp_path / "strata-m.json"
    p.write_text(json.dumps({"threads": 2, "aliases": ["a"]}))
    with pytest.raises(ConfigError, match="'threads' cannot be changed here"):
        rc.edit({"threads": 2}, {"threads": 3})
    with pytest.raises(ConfigError, match="repeat_stop_tokens"):
        rc.edit({}, {"aliases": ["b"], "repeat_stop_tokens": -1})
    new = rc.edit({"threads": 2, "aliases": ["a"]}, {"aliases": None, "fit_max_tokens": True})
    assert new == {"threads": 2, "fit_max_tokens": True}
    rc.save_edit(str(p), new)
    assert json.loads(p.read_text()) == new and json.loads((tmp_path / "strata-m.json.bak").read_text()) == \
        {"threads": 2, "aliases": ["a"]}
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600


def test_the_key_table_lists_every_key_once():
    table = rc.key_table().splitlines()
    assert len(table) == len(rc.KEYS) + 1
    assert all(any(line.startswith(k + " ") for line in table) for k in rc.KEYS)


def test_the_readme_documents_every_key():
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md"), encoding="utf-8").read()
    table = readme[readme.index("### Run config keys"):readme.index("### Model lifecycle")]
    assert all(f"| `{k}` |" in table for k in rc.KEYS)
