"""The README's curl and SDK snippets run as written and print their replies (issue 10), and every command it names
exists (its --help answers): each snippet is taken from
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


def _readme_commands():
    """The commands README.md names: `./strata WORD`, `strata WORD` (the commands table) and `python3 tools/X.py`."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    script = set(re.findall(r"\./strata ([a-z][a-z_-]*)", text))
    table = set(re.findall(r"`strata ([a-z][a-z_-]*)", text))
    tools = set(re.findall(r"python3 (tools/[\w/]+\.py)", text))
    return sorted(script), sorted(table - script), sorted(tools)


def _answers_help(argv) -> bool:
    done = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          stdin=subprocess.DEVNULL)
    return done.returncode == 0 and bool(done.stdout.strip())


def test_every_command_the_readme_names_exists():
    """Each `./strata WORD` answers `--help` (`./strata test` has no help of its own: the script must route it),
    each `strata WORD` of the commands table answers `python -m strata_cli WORD --help`, and each
    `python3 tools/X.py` answers `--help`."""
    script, table, tools = _readme_commands()
    assert {"serve", "test"} <= set(script) and {"chat", "bench"} <= set(table) and tools, \
        (script, table, tools)
    bash = open(os.path.join(ROOT, "strata"), encoding="utf-8").read()
    for word in script:
        if word == "test":   # `./strata test --help` would run the set-up and the suite: read the script instead
            assert re.search(r"^\s+test\)$", bash, re.M), "./strata has no `test)` command"
            continue
        assert _answers_help([os.path.join(ROOT, "strata"), word]), f"./strata {word} --help"
    for word in table:
        assert _answers_help([sys.executable, "-m", "strata_cli", word]), f"strata {word} --help"
    for path in tools:
        assert os.path.exists(os.path.join(ROOT, path)), f"{path} is named in README.md and missing"
        assert _answers_help([sys.executable, os.path.join(ROOT, path)]), f"python3 {path} --help"


def test_the_command_check_fails_on_a_command_that_does_not_exist():
    assert not _answers_help([sys.executable, "-m", "strata_cli", "no-such-command"])
    assert not _answers_help([os.path.join(ROOT, "strata"), "no-such-command"])
