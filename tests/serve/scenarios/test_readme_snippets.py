"""The README's curl and SDK snippets run as written and print their replies (issue 10): each is taken from
README.md, pointed at a test server (only the port changes) and run; the real-model side is
tests/serve/scenarios/test_first_answer_real.py."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

FAKE_REPLY = "Hello from the fake engine."


def _snippets():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, re.S)
    python = next(body for lang, body in blocks if lang == "python" and "OpenAI(" in body)
    curl = next(body for lang, body in blocks if body.startswith("curl ") and "/v1/chat/completions" in body)
    return python, curl


def test_the_sdk_snippets_print_their_replies(server):
    pytest.importorskip("openai", reason="the OpenAI SDK is a test-only client (requirements-test.txt)")
    pytest.importorskip("anthropic", reason="the Anthropic SDK is a test-only client (requirements-test.txt)")
    s = server()
    python, _ = _snippets()
    code = python.replace("127.0.0.1:8080", f"127.0.0.1:{s.port}")
    assert code != python
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [FAKE_REPLY] * 3  # plain, streamed, Anthropic


def test_the_curl_snippet_answers(server):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    s = server()
    _, curl = _snippets()
    argv = [a.replace("localhost:8080", f"localhost:{s.port}") for a in shlex.split(curl.replace("\\\n", " "))]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout)["choices"][0]["message"]["content"] == FAKE_REPLY
