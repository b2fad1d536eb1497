"""POST /config on a Lifecycle server: the keys a running server can take apply at once (idle_unload_s per
model, the sampling and reasoning defaults), the others at the next start, and the answer says which."""
import json
import os
import time

import pytest

from tests.serve.conftest import lifecycle_servers


@pytest.fixture
def lifecycle_server(tmp_path):
    yield from lifecycle_servers(tmp_path)

JS = {"Content-Type": "application/json"}


def test_config_changes_say_when_they_apply_and_live_ones_apply_now(lifecycle_server, tmp_path):
    path = tmp_path / "strata-alpha.json"
    path.write_text(json.dumps({"idle_unload_s": 600}))
    run = lifecycle_server(lazy=False, config_path=str(path))
    assert run.svc.tick() is None
    status, saved, _ = run.post("/config", {"changes": {"idle_unload_s": 5, "sampling": {"temperature": 0.25},
                                                        "repeat_stop_tokens": 9, "aliases": ["a"]}}, headers=JS)
    assert status == 200
    assert saved["applies"] == {"idle_unload_s": "now", "sampling": "now", "repeat_stop_tokens": "now",
                                "aliases": "next_start"}
    alpha = run.svc.entries[0]
    assert alpha.svc.repeat_stop == 9
    assert run.request("GET", "/props")[1]["default_generation_settings"]["params"]["temperature"] == 0.25
    run.svc.clock = lambda: time.monotonic() + 6      # idle 6 s: over the new 5 s limit, far under the old 600
    assert run.svc.tick() == "unloaded (idle)" and not run.svc.loaded()
    status, saved, _ = run.post("/config", {"changes": {"sampling": None, "repeat_stop_tokens": None}}, headers=JS)
    assert status == 200 and saved["applies"] == {"sampling": "now", "repeat_stop_tokens": "now"}
    assert "sampling" not in alpha.svc.config and alpha.svc.repeat_stop == 256


def test_a_config_edit_on_a_full_disk_is_a_507_and_applies_nothing(lifecycle_server, small_disk):
    path = os.path.join(small_disk.path, "strata-alpha.json")
    with open(path, "w") as f:
        json.dump({"idle_unload_s": 600}, f)
    run = lifecycle_server(lazy=False, config_path=path)
    small_disk.fill()
    status, out, _ = run.post("/config", {"changes": {"repeat_stop_tokens": 9, "aliases": ["a"]}},
                              headers=JS)
    assert status == 507 and "strata-alpha.json" in out["error"]["message"], out
    with open(path) as f:
        assert json.load(f) == {"idle_unload_s": 600}
    assert run.svc.entries[0].svc.repeat_stop == 256                 # nothing applied live either
    assert sorted(os.listdir(small_disk.path)) == [".filler", "strata-alpha.json"]
