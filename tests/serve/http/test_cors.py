"""CORS is closed unless --cors opens it: exact origins, `*` (any page, llama-server's default) or `localhost`
(pages of this machine); a preflight answers 200 with the methods of every route and the headers asked for;
every API route gets the headers (not only /v1/); /cors-proxy is a 403 as llama-server's when its proxy is off."""
import argparse

from serve import bootstrap
from tests.serve.conftest import chat

PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}


def _preflight(s, origin, path="/completions"):
    status, _, r = s.request("OPTIONS", path, headers={"Origin": origin, **PREFLIGHT})
    assert status == 200
    return r


def test_closed_by_default(server):
    s = server({"turns": [{"text": "ok"}]})
    r = _preflight(s, "http://localhost:3000")
    assert r.getheader("Access-Control-Allow-Origin") is None
    assert r.getheader("Access-Control-Allow-Credentials") is None
    page = {"Origin": "https://web.example", "Content-Type": "application/json"}
    assert s.post("/v1/chat/completions", chat(), headers=page)[0] == 403


def test_star_echoes_any_origin_on_every_api_route(server):
    s = server({"turns": [{"text": "ok"}]}, cors_origins=["*"])
    for path in ("/completions", "/v1/chat/completions", "/api/chat", "/tokenize"):
        r = _preflight(s, "web.mydomain.fr", path)
        assert r.getheader("Access-Control-Allow-Origin") == "web.mydomain.fr", path
        assert r.getheader("Access-Control-Allow-Credentials") == "true"
        assert r.getheader("Access-Control-Allow-Methods") == "GET, POST, DELETE, OPTIONS"
        assert r.getheader("Access-Control-Allow-Headers") == "Authorization"  # what the page asked for
    page = {"Origin": "https://web.example", "Content-Type": "application/json"}
    status, _, r = s.post("/v1/chat/completions", chat(), headers=page)
    assert status == 200 and r.getheader("Access-Control-Allow-Origin") == "https://web.example"
    status, _, r = s.request("GET", "/", headers={"Origin": "https://web.example"})
    assert r.getheader("Access-Control-Allow-Origin") is None   # a page of its own: same origin only


def test_localhost_reflects_local_pages_only(server):
    s = server({"turns": [{"text": "ok"}]}, cors_origins=["localhost"])
    for origin in ("http://localhost", "http://localhost:8080", "http://127.0.0.1:3000", "http://[::1]",
                   "https://[::1]:3000"):
        assert _preflight(s, origin).getheader("Access-Control-Allow-Origin") == origin, origin
    for origin in ("http://web.mydomain.fr", "http://notlocalhost", "http://localhost.evil.com", "null",
                   "file://localhost"):
        assert _preflight(s, origin).getheader("Access-Control-Allow-Origin") is None, origin
    page = {"Origin": "http://localhost:3000", "Content-Type": "application/json"}
    assert s.post("/v1/chat/completions", chat(), headers=page)[0] == 200
    page["Origin"] = "http://localhost.evil.com"
    assert s.post("/v1/chat/completions", chat(), headers=page)[0] == 403


def test_cors_flag_joins_the_config_list(capsys):
    ns = argparse.Namespace(cors=["*", "https://a.example, https://b.example"], host=None, port=None,
                            api_key=None, parent_pid=None, quiet=True)
    opts = bootstrap.options(ns, {"cors_origins": ["https://c.example"]})
    assert opts.cors_origins == ["https://c.example", "*", "https://a.example", "https://b.example"]
    assert "CORS is open to every origin" in capsys.readouterr().err
    ns.cors = None
    assert bootstrap.options(ns, {}).cors_origins == []


def test_cors_proxy_is_disabled(server):
    s = server({"turns": [{"text": "ok"}]}, cors_origins=["*"])
    status, body, _ = s.request("GET", "/cors-proxy?url=http://127.0.0.1:1/")
    assert status == 403 and body["error"]["type"] == "feature_disabled"
