"""GET/POST /settings: the shared Chat settings every request gets for the fields it omits, their checks,
the own-page rule (JSON only, no foreign Origin), and their file beside the run config (0600, atomic,
loaded at the next start; a broken file is ignored with a notice)."""
import json
import os
import stat

from strata_control.runconfig_file import load_shared_settings, save_shared_settings, shared_settings_path
from tests.serve.conftest import chat

JSON = {"Content-Type": "application/json"}


def _gens(path):
    """(max_new, keys) of every BGEN line the fake engine got (`BGEN 0 <max_new> [k=v ...] <ids>`)."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        words = line.split()[1:]
        out.append((int(words[1]), words[2:-1]))
    return out


def test_settings_apply_to_requests_that_omit_the_field(server, tmp_path):
    gens = tmp_path / "gens.txt"
    s = server({"record_gen": str(gens)})
    status, view, _ = s.request("GET", "/settings")
    assert status == 200 and view == {"shared": False, "defaults": {}}
    status, view, _ = s.post("/settings", {"defaults": {"temperature": 0.5, "max_tokens": 7}}, headers=JSON)
    assert status == 200 and view["shared"] is True and view["defaults"]["max_tokens"] == 7
    assert s.request("GET", "/settings")[1] == view
    assert s.post("/v1/chat/completions", chat())[0] == 200
    assert s.post("/v1/chat/completions", chat(max_tokens=3, temperature=0))[0] == 200
    (n1, keys1), (n2, keys2) = _gens(gens)
    assert n1 == 7 and "temperature=0.5" in keys1          # the settings fill what the request omits
    assert n2 == 3 and not any(k.startswith("temperature=") and k != "temperature=0" for k in keys2)
    # cleared: back to the server's own defaults
    assert s.post("/settings", {"defaults": None}, headers=JSON)[1] == {"shared": False, "defaults": {}}


def test_settings_errors_name_what_to_change(server):
    s = server()
    status, out, _ = s.post("/settings", {"defaults": {"temperature": 5}}, headers=JSON)
    assert status == 400 and "temperature" in out["error"]["message"]
    status, out, _ = s.post("/settings", {"defaults": {"colour": "red"}}, headers=JSON)
    assert status == 400 and "colour" in out["error"]["message"]
    status, out, _ = s.post("/settings", {"temperature": 0.5}, headers=JSON)
    assert status == 400 and "defaults" in out["error"]["message"]
    status, out, _ = s.post("/settings", {"defaults": {}}, headers={"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in out["error"]["message"]
    status, out, _ = s.post("/settings", {"defaults": {}},
                            headers={**JSON, "Origin": "https://evil.example"})
    assert status == 403
    assert s.request("GET", "/settings")[1] == {"shared": False, "defaults": {}}  # nothing was applied


def test_settings_file_beside_the_config(tmp_path):
    cfg = tmp_path / "run.json"
    path = shared_settings_path(str(cfg))
    assert path == str(tmp_path / "run.shared-settings.json")
    assert shared_settings_path(None) is None
    assert load_shared_settings(path) == (None, [])
    save_shared_settings(path, {"temperature": 0.2})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_shared_settings(path) == ({"temperature": 0.2}, [])
    assert [p for p in os.listdir(tmp_path) if ".tmp" in p] == []
    with open(path, "w") as f:
        f.write('{"defaults": {"temperature": 0.2,}}')
    saved, notices = load_shared_settings(path)
    assert saved is None and "not readable JSON" in notices[0]
    with open(path, "w") as f:
        json.dump([1, 2], f)
    assert load_shared_settings(path)[0] is None


def test_settings_post_saves_to_the_service_path(server, tmp_path):
    s = server()
    s.svc.settings_path = str(tmp_path / "x.shared-settings.json")
    assert s.post("/settings", {"defaults": {"top_k": 20}}, headers=JSON)[0] == 200
    assert load_shared_settings(s.svc.settings_path)[0] == {"top_k": 20}


def test_settings_on_a_full_disk_are_a_507_and_change_nothing(server, small_disk):
    s = server()
    s.svc.settings_path = os.path.join(small_disk.path, "x.shared-settings.json")
    assert s.post("/settings", {"defaults": {"top_k": 20}}, headers=JSON)[0] == 200
    small_disk.fill()
    status, out, _ = s.post("/settings", {"defaults": {"top_k": 30}}, headers=JSON)
    assert status == 507 and "No space left" in out["error"]["message"], out
    assert "x.shared-settings.json" in out["error"]["message"] and small_disk.path not in out["error"]["message"]
    assert load_shared_settings(s.svc.settings_path)[0] == {"top_k": 20}      # the old file, whole
    assert s.request("GET", "/settings")[1]["defaults"] == {"top_k": 20}     # and the server agrees with it
    assert [n for n in os.listdir(small_disk.path) if ".tmp" in n] == []
    small_disk.free()
    assert s.post("/settings", {"defaults": {"top_k": 30}}, headers=JSON)[0] == 200
