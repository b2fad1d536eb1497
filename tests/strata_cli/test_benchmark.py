"""strata_cli/benchmark.py: the facts block is redacted (host, user, home paths, keys); `strata bench --json` with
the real model prints figures and none of those."""
import getpass
import json
import os
import socket
import subprocess
import sys

import pytest

from strata_cli.benchmark import redact
from tests.conftest import ENGINE_EXE, ROOT, model_path


def test_redact_host_user_home_and_keys(monkeypatch):
    monkeypatch.setenv("STRATA_API_KEY", "env-key-77")
    home, user, host = os.path.expanduser("~"), getpass.getuser(), socket.gethostname()
    got = redact({"path": f"{home}/models/m.gguf", f"{host}": [f"built by {user} on {host}", "env-key-77",
                  "flag --api-key given-key-9"], "n": 3}, secrets=["given-key-9"])
    text = json.dumps(got)
    assert "~/models/m.gguf" in text and "<host>" in text and "<key>" in text and got["n"] == 3
    for secret in (home + "/", host, "env-key-77", "given-key-9"):
        assert secret not in text
    assert "by <user> on" in text


@pytest.mark.skipif(model_path() is None or not os.access(ENGINE_EXE, os.X_OK),
                    reason="needs the default model and the built engine")
def test_strata_bench_json_has_figures_and_no_host_user_home_or_key(tmp_path):
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    model = home / "models" / "smollm2-135m-instruct.Q4_1.gguf"
    try:
        os.link(model_path(), model)
    except OSError:
        import shutil
        shutil.copy(model_path(), model)
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(tmp_path), "STRATA_API_KEY": "bench-key-31"}
    r = subprocess.run([sys.executable, "-m", "strata_cli", "bench", str(model), "--json", "--ctx", "2048"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    res = report["results"]
    assert res["prefill_tokens"] > 500 and res["prefill_tok_s"] > 0 and res["decode_tok_s"] > 0
    assert res["ttft_ms_median"] > 0 and report["facts"]["model"]["path"] == "~/models/" + model.name
    assert report["facts"]["flags"] == {"--ctx": 2048} and report["facts"]["cores"] >= 1
    for secret in (str(home), socket.gethostname(), "bench-key-31"):
        assert secret not in r.stdout
    user = getpass.getuser()
    assert not any(user == word for word in r.stdout.replace('"', " ").replace("/", " ").split())
