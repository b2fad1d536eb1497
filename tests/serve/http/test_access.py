"""Who may ask what (serve/http/access.py): opaque origins, browser POSTs, the Host check beyond loopback, what an
error or /health may tell a client, one engine log per server, private files."""
import json
import os
import socket
import stat
import subprocess
import sys
import threading

import pytest

from serve.engine_client.engine import StrataEngine
from serve.http.server import Options, make_server
from serve.generation.service import Service
from tests.conftest import ROOT, fake_argv
from tests.serve.conftest import Running, chat
from tokenizer.bpe import ByteTokenizer

JSON = {"Content-Type": "application/json"}
SECRET = "/home/alice/models/secret-model.gguf"   # a local path an engine log line quotes


# ---------------------------------------------------------------- origins and browsers
@pytest.mark.parametrize("origin", ["null", "file://", "data:text/html,hi"])
def test_opaque_origins_are_refused_on_api_routes_without_a_key(server, origin):
    s = server()
    status, out, _ = s.post("/v1/chat/completions", chat(), headers={"Origin": origin, **JSON})
    assert status == 403 and "API key" in out["error"]["message"]
    assert s.request("GET", "/v1/models", headers={"Origin": origin})[0] == 403
    assert s.request("GET", "/health", headers={"Origin": origin})[0] == 200   # public, and pages too
    assert s.request("GET", "/", headers={"Origin": origin})[0] == 200


def test_opaque_origin_passes_with_a_key_or_when_listed(server):
    keyed = server(api_keys=["k"])
    headers = {"Origin": "null", "Authorization": "Bearer k", **JSON}
    assert keyed.post("/v1/chat/completions", chat(), headers=headers)[0] == 200
    listed = server(cors_origins=["null"])
    assert listed.post("/v1/chat/completions", chat(), headers={"Origin": "null", **JSON})[0] == 200


def test_browser_posts_must_be_json(server):
    s = server()
    own = f"http://127.0.0.1:{s.port}"
    for headers in ({"Origin": own, "Content-Type": "text/plain;charset=UTF-8"},   # a CORS-simple fetch
                    {"Sec-Fetch-Site": "same-origin", "Content-Type": "text/plain"},
                    {"Origin": own}):
        status, out, _ = s.post("/v1/chat/completions", chat(), headers=headers)
        assert status == 415 and "application/json" in out["error"]["message"], headers
    assert s.post("/v1/chat/completions", chat(), headers={"Origin": own, **JSON})[0] == 200
    # curl -d sends a form type and no Origin: not a browser, still served (the README's example)
    curl = {"Content-Type": "application/x-www-form-urlencoded"}
    assert s.post("/v1/chat/completions", chat(), headers=curl)[0] == 200


# ---------------------------------------------------------------- Host beyond loopback
def _serve_on(tmp_path, host, **opts):
    engine = StrataEngine(fake_argv(tmp_path), [], log_path=str(tmp_path / "engine.log"))
    engine.start()
    svc = Service(engine, ByteTokenizer(), "fake-model", config={})
    httpd = make_server(svc, Options(host=host, port=0, quiet=True, **opts))
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return Running(httpd, svc)


def _stop(run):
    run.httpd.shutdown()
    run.httpd.server_close()
    run.svc.engine.close()


def test_host_check_accepts_docker_and_own_names_only_beyond_loopback(tmp_path):
    wide = _serve_on(tmp_path, "0.0.0.0")
    try:
        for name in ("host.docker.internal", socket.gethostname(), socket.gethostname() + ".local"):
            assert wide.request("GET", "/v1/models", headers={"Host": f"{name}:8080"})[0] == 200, name
        assert wide.request("GET", "/v1/models", headers={"Host": "evil.example"})[0] == 403
    finally:
        _stop(wide)
    local = _serve_on(tmp_path, "127.0.0.1")
    try:
        assert local.request("GET", "/v1/models", headers={"Host": "host.docker.internal"})[0] == 403
    finally:
        _stop(local)


# ---------------------------------------------------------------- what a client is told
def _dead_engine_server(server, tmp_path, **opts):
    """A server whose engine died mid-answer after writing a local path to its log."""
    s = server({"stderr_start": [f"error: cannot map {SECRET}"], "turns": [{"text": "abc", "die_after": 1}]},
               **opts)
    s.post("/v1/chat/completions", chat(), headers={"Authorization": "Bearer k"})
    return s


def test_health_gives_a_short_reason_and_a_trusted_status_the_detail(server, tmp_path, capfd):
    s = _dead_engine_server(server, tmp_path)
    status, out, _ = s.request("GET", "/health")
    message = out["error"]["message"]
    assert status == 503 and "exit code 3" in message
    assert "/home/alice" not in message and "log:" not in message and "cannot map" not in message
    _, st, _ = s.request("GET", "/v1/status")  # no key, a loopback client: trusted
    assert SECRET in st["engine_note"] and st["engine_log"] == str(tmp_path / "engine.log")
    assert SECRET in capfd.readouterr().err  # the operator's copy, on the server's console


def test_status_detail_needs_the_key_on_a_keyed_server(server, tmp_path):
    s = _dead_engine_server(server, tmp_path, api_keys=["k"])
    status, out, _ = s.request("GET", "/health")
    assert status == 503 and SECRET not in json.dumps(out)
    assert s.request("GET", "/v1/status")[0] == 401
    _, st, _ = s.request("GET", "/v1/status", headers={"Authorization": "Bearer k"})
    assert SECRET in st["engine_note"]


def test_error_bodies_carry_no_log_tail_or_paths(server, tmp_path, monkeypatch):
    log_line = f"error: cannot map {SECRET}"
    s = server({"state": str(tmp_path / "st"),
                "starts": [{"stderr_start": [log_line], "turns": [{"text": "ab", "die_after": 1}]},
                           {"exit_before_ready": 9, "stderr_start": [log_line]}]})
    _, events, _ = s.stream(chat())  # the engine dies mid-answer: a final SSE error event
    message = events[-1]["error"]["message"]
    assert "exit code 3" in message and "/home/alice" not in message and "log:" not in message
    status, out, _ = s.post("/v1/chat/completions", chat())  # the restart fails, quoting its log
    message = out["error"]["message"]
    assert status == 503 and "exit code 9" in message and "the next request restarts it" in message
    assert "/home/alice" not in message and "cannot map" not in message

    def boom(svc, body, ctx):
        raise RuntimeError(f"cannot read {SECRET}")
    monkeypatch.setitem(sys.modules["serve.http.routes"].GET_ROUTES, "/v1/models", boom)
    status, out, _ = s.request("GET", "/v1/models")
    assert status == 500 and "RuntimeError" in out["error"]["message"] and "alice" not in out["error"]["message"]


def test_public_text_cuts_log_tails_and_paths_but_not_routes_or_urls():
    from serve.core.errors import public_text
    text = ("the engine could not be started (/opt/x/build/strata-engine: [Errno 2] No such file: "
            "'/opt/x/build/strata-engine'); see ~/.cache/strata/engine-8080.log; log: loading /m/a.gguf | boom")
    assert public_text(text) == ("the engine could not be started (strata-engine: [Errno 2] No such file: "
                                 "'strata-engine'); see engine-8080.log")
    joined = ("the engine stopped (exit code 3); log: a /x/y | b; the engine exited before READY (exit code 9); "
              "log: c; d; the next request restarts it")  # two notes joined by the Service
    assert public_text(joined) == ("the engine stopped (exit code 3); the engine exited before READY (exit code 9)"
                                   "; the next request restarts it")
    plain = "POST /v1/chat/completions at http://127.0.0.1:8080/v1 said 7/8"
    assert public_text(plain) == plain


# ---------------------------------------------------------------- logs and files
def _build_in_child(tmp_path, *flags):
    """serve.bootstrap.build in a fresh process (its own pid, a private cache): (engine log path, modes)."""
    code = ("import json, os, sys; from strata_cli import parser; from serve.bootstrap import build;"
            "svc, _ = build(parser().parse_args(['serve', '--tokenizer', 'bytes', '--engine', 'x', *sys.argv[1:]]));"
            "log = svc.engine.log_path; d = os.path.dirname(log);"
            "print(json.dumps([log, os.stat(log).st_mode & 0o777, os.stat(d).st_mode & 0o777]))")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code, *flags], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_each_server_has_its_own_private_engine_log(tmp_path):
    first, second = _build_in_child(tmp_path, "--port", "0"), _build_in_child(tmp_path, "--port", "0")
    assert first[0] != second[0]  # two --port 0 servers shared engine-0.log
    assert not os.path.exists(first[0])  # that process ended: its log was cleared away by the next
    fixed = _build_in_child(tmp_path, "--port", "8123")
    assert fixed[0].endswith("engine-8123.log")
    for _, file_mode, dir_mode in (second, fixed):
        assert file_mode == 0o600 and dir_mode == 0o700


def test_tokenizer_cache_is_private(tmp_path):
    from types import SimpleNamespace
    from tokenizer import vocab as strata_vocab
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    tok = SimpleNamespace(pre="default", pre_family="default", pre_pattern=".", n_vocab=2, special_ids={},
                          add_bos=False, token_types=[1, 1], chat_template="{{ x }}")
    out = strata_vocab.write_dir(tmp_path / "cache" / "tok", str(gguf), {"tokenizer.ggml.tokens": ["a", "b"]}, tok)
    for folder in (tmp_path / "cache", tmp_path / "cache" / "tok", out):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
    for name in os.listdir(out):
        assert stat.S_IMODE(os.stat(out / name).st_mode) == 0o600, name
