"""MCP tools in the web app, in a real browser (the page and browser fixtures: scenarios/conftest.py).

An MCP server made with the official SDK (test-only) runs in this process on its own port; the page connects to it
straight from the browser (CORS as the SDK's browser examples set it), and the fake engine is scripted to call its
tool, so the call is deterministic: the page shows it, nothing runs before the user approves, the MCP server sees
the call, its result goes back in the next request, and the answer uses it.
"""
import json
import socket
import threading
import time

import pytest

from tests.serve.scenarios.conftest import answers_done, ask

pytest.importorskip("playwright.sync_api", reason="playwright (requirements-test.txt) drives the browser; "
                    "./strata test installs it")
mcpserver = pytest.importorskip("mcp.server.mcpserver", reason="the official MCP SDK, 2.x (requirements-test.txt)")

MCP_CALL = ("<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n"
            "</function>\n</tool_call>")


@pytest.fixture
def mcp_server(request):
    """-> (url, calls): an MCP server with tools `add` and `explode` over streamable HTTP (parametrized: "sse",
    the older HTTP+SSE transport; "nocors", no CORS, which a browser on another origin cannot use); calls lists
    what ran."""
    import uvicorn
    from mcp.server.mcpserver.exceptions import ToolError
    from starlette.middleware.cors import CORSMiddleware
    calls = []
    srv = mcpserver.MCPServer("strata-test")

    @srv.tool()
    def add(a: int, b: int) -> str:
        """Add two integers"""
        calls.append(("add", a, b))
        return f"The sum is {a + b}"

    @srv.tool()
    def explode() -> str:
        """A tool that always fails"""
        calls.append(("explode",))
        raise ToolError("the fuse is lit")      # the SDK's way to fail with a message the client sees

    mode = getattr(request, "param", "http")
    sse = mode == "sse"
    app = srv.sse_app() if sse else srv.streamable_http_app()
    if mode != "nocors":
        app = CORSMiddleware(app, allow_origins=["*"], allow_methods=["GET", "POST", "DELETE"], allow_headers=["*"],
                             expose_headers=["Mcp-Session-Id"])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the MCP server did not start"
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/{'sse' if sse else 'mcp'}", calls
    server.should_exit = True
    t.join(10)
    sock.close()
    assert not t.is_alive(), "the MCP server did not stop"


def add_mcp_server(pg, url):
    pg.click("#open-settings")
    pg.wait_for_selector("#settings[open]")
    pg.fill("#mcp-url", url)
    pg.click("#mcp-add")
    pg.wait_for_function("document.getElementById('mcp-list').textContent.includes('tools: add')")
    pg.click("#settings-cancel")


def prompts(gens):
    """Each GEN's prompt as text (the fake engine's ids are bytes below 256)."""
    return [bytes(i for i in map(int, line.split()[-1].split(",")) if i < 256).decode("utf-8", "replace")
            for line in gens.read_text().splitlines()]


@pytest.mark.parametrize("mcp_server", ["http", "sse"], indirect=True)
def test_an_mcp_tool_runs_after_approval_and_the_answer_uses_it(server, mcp_server, page, tmp_path):
    url, calls = mcp_server
    gens = tmp_path / "gens.txt"
    s = server({"record_gen": str(gens), "turns": [{"text": MCP_CALL}, {"echo": r"The sum is \d+"}]})
    page.goto(f"http://127.0.0.1:{s.port}/")
    add_mcp_server(page, url)
    ask(page, "What is 2 + 3?")
    page.wait_for_selector(".msg.tool.pending .approve")
    assert "MCP tool: add" in page.inner_text(".msg.tool .tool-name")
    assert json.loads(page.inner_text(".msg.tool pre.args")) == {"a": 2, "b": 3}
    assert calls == []                                   # nothing runs before the user says so
    assert "Add two integers" in prompts(gens)[0]        # the MCP tool was offered to the model
    page.click(".msg.tool button[data-act=approve]")
    page.wait_for_function("document.querySelector('.msg.tool pre.result')?.textContent === 'The sum is 5'")
    answers_done(page, 2)
    assert calls == [("add", 2, 3)]                      # the MCP server ran it, once
    assert "The sum is 5" in prompts(gens)[1]             # the result went back to the model
    assert page.locator(".msg.assistant").nth(1).locator(".md.body").inner_text() == "The sum is 5"
    page.reload()                                        # the conversation, tool turn included, is kept
    page.wait_for_selector(".msg.tool.done")
    assert page.locator(".msg.assistant").count() == 2


def test_a_denied_call_does_not_run_and_the_model_is_told(server, mcp_server, page, tmp_path):
    url, calls = mcp_server
    gens = tmp_path / "gens.txt"
    s = server({"record_gen": str(gens), "turns": [{"text": MCP_CALL}, {"echo": r"The user denied[^;]*"}]})
    page.goto(f"http://127.0.0.1:{s.port}/")
    add_mcp_server(page, url)
    ask(page, "What is 2 + 3?")
    page.click(".msg.tool.pending button[data-act=deny]")
    answers_done(page, 2)
    assert calls == []
    assert "denied" in page.inner_text(".msg.tool .tool-name")
    assert page.locator(".msg.assistant").nth(1).locator(".md.body").inner_text() == "The user denied this tool call"


def test_a_failing_tool_is_shown_and_always_allow_skips_the_question(server, mcp_server, page, tmp_path):
    url, calls = mcp_server
    explode = "<tool_call>\n<function=explode>\n</function>\n</tool_call>"
    s = server({"turns": [{"text": explode}, {"echo": r"the fuse is lit"}, {"text": explode}, {"text": "Gave up."}]})
    page.goto(f"http://127.0.0.1:{s.port}/")
    add_mcp_server(page, url)
    ask(page, "Light it")
    page.click(".msg.tool.pending button[data-act=always]")
    answers_done(page, 2)
    assert "the fuse is lit" in page.inner_text(".msg.tool.error pre.result")     # the error is shown
    assert page.locator(".msg.assistant").nth(1).locator(".md.body").inner_text() == "the fuse is lit"
    ask(page, "Again")
    answers_done(page, 4)                                # allowed always: it ran with no question asked
    assert calls == [("explode",), ("explode",)]
    assert page.locator(".msg.tool.error").count() == 2 and page.locator(".msg.tool.pending").count() == 0


@pytest.mark.parametrize("mcp_server", ["nocors"], indirect=True)
def test_an_mcp_server_the_browser_cannot_reach_is_named_with_the_reason(server, mcp_server, page):
    url, calls = mcp_server
    s = server({"turns": [{"text": "No tools here."}]})
    page.goto(f"http://127.0.0.1:{s.port}/")
    page.click("#open-settings")
    page.fill("#mcp-url", url)
    page.click("#mcp-add")
    page.wait_for_function("document.getElementById('mcp-list').textContent.includes('CORS')")
    assert url in page.inner_text("#mcp-list li.error")
    page.click("#settings-cancel")
    ask(page, "hi")                                      # no tools offered: a plain answer
    answers_done(page, 1)
    assert page.inner_text(".msg.assistant .md.body") == "No tools here." and calls == []


def test_always_allow_stops_asking_only_up_to_a_limit(server, mcp_server, page):
    url, calls = mcp_server
    s = server({"turns": [{"text": MCP_CALL}]})            # a model that calls the tool forever
    page.goto(f"http://127.0.0.1:{s.port}/")
    add_mcp_server(page, url)
    ask(page, "Add forever")
    page.click(".msg.tool.pending button[data-act=always]")
    page.wait_for_function("document.querySelectorAll('.msg.tool.done').length === 8 && "
                           "document.querySelectorAll('.msg.tool.pending').length === 1")
    assert len(calls) == 8                               # 8 tool rounds for one question; the 9th waits for the user
    assert page.locator(".msg.tool.pending .approve").count() == 1

