"""The web app in a real browser: Debian's headless Chromium driven over the DevTools protocol by playwright
(never `playwright install`: the system browser is given by its path). Over the fake engine (fast and
deterministic) unless the test says otherwise; one happy path runs on the real model.

A failing test leaves a screenshot of its page under .pytest_cache/d/strata-web-shots/ (not committed).
"""
import json
import os
import threading
import time

import pytest

from serve.http import routes as routes_mod
from tests.conftest import ENGINE_EXE, model_path
from tests.serve.conftest import chat, real_server
from tests.serve.scenarios.conftest import WAIT_MS, answers_done, ask

pytest.importorskip("playwright.sync_api", reason="playwright (requirements-test.txt) drives the browser; "
                    "./strata test installs it")
HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>[x](javascript:window.__pwned=3)'
MARKDOWN_ANSWER = ("Here is **bold** text.\n\n- one\n- two\n\n```python\nprint('hi')\n```\n\n| a | b |\n|---|---|\n"
                   "| 1 | 2 |\n\n" + HOSTILE + "\n")



def test_question_streams_and_renders_markdown_safely(server, page):
    s = server({"turns": [{"text": MARKDOWN_ANSWER, "token_delay_s": 0.01}]})
    page.goto(f"http://127.0.0.1:{s.port}/")
    # every length the answer's text had on screen, recorded as the page changes (no timing involved)
    page.evaluate("""() => { window.__lengths = [];
        new MutationObserver(() => { const b = document.querySelector('.msg.assistant .md.body');
            if (b) window.__lengths.push(b.textContent.length); })
        .observe(document.getElementById('log'), {childList: true, subtree: true, characterData: true}); }""")
    ask(page, "Show me markdown " + HOSTILE)
    page.wait_for_selector("#stop:visible")           # streaming: Stop is shown in place of Send
    answers_done(page, 1)
    lengths = page.evaluate("window.__lengths")
    final = len(page.text_content(".msg.assistant .md.body"))
    assert len({n for n in lengths if 0 < n < final}) >= 2, lengths   # it was drawn piece by piece
    assert page.inner_text(".msg.assistant .md.body strong") == "bold"
    assert page.locator(".msg.assistant li").count() == 2
    assert page.inner_text(".msg.assistant .code .lang") == "python"
    assert page.inner_text(".msg.assistant pre code") == "print('hi')"
    assert page.locator(".msg.assistant table th").count() == 2
    assert "tokens" in page.inner_text(".msg.assistant .figures") and "tok/s" in page.inner_text(".figures")
    # the hostile strings (in the question and in the answer) are text, never elements or links
    assert page.locator("#log img, #log script, #log a[href^='javascript']").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert "<img src=x" in page.inner_text(".msg.user") and "<img src=x" in page.inner_text(".msg.assistant")
    assert page.is_visible("#send") and not page.is_visible("#stop")


def test_stop_mid_answer_and_the_view_follows_unless_scrolled_up(server, page):
    story = "\n".join(f"line {i}" for i in range(1500))   # no repeats: the loop guard must not end it first
    s = server({"turns": [{"text": story, "token_delay_s": 0.004}, {"text": "Short."}]})
    page.goto(f"http://127.0.0.1:{s.port}/")
    ask(page, "Tell me a long story")
    page.wait_for_function("document.querySelector('.msg.assistant .md.body').textContent.length > 400")
    gap = "(() => { const l = document.getElementById('log'); return l.scrollHeight - l.scrollTop - l.clientHeight; })()"
    page.wait_for_timeout(100)
    assert page.evaluate(gap) < 48                              # pinned to the bottom while it streams
    page.evaluate("document.getElementById('log').scrollTop = 0")
    height = page.evaluate("document.getElementById('log').scrollHeight")
    page.wait_for_function(f"document.getElementById('log').scrollHeight > {height} + 100")
    assert page.evaluate("document.getElementById('log').scrollTop") < 48   # the reader scrolled up: left there
    assert page.is_visible("#stop")                               # Stop stays in reach (the composer is fixed)
    page.click("#stop")
    page.wait_for_selector(".msg.assistant .note")
    assert page.inner_text(".msg.assistant .note") == "stopped"
    deadline = time.monotonic() + 10
    while not s.svc.history and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s.svc.history[-1]["finish"] == "cancel"      # the server stopped the engine
    assert s.svc.history[-1]["output_tokens"] < len(story)
    ask(page, "And now?")
    answers_done(page, 2)
    assert page.locator(".msg.assistant").nth(1).locator(".md.body").inner_text() == "Short."


def test_reload_finds_the_conversation_and_the_list_switches(server, page):
    s = server({"turns": [{"text": "First answer."}, {"text": "Second answer."}]})
    page.goto(f"http://127.0.0.1:{s.port}/")
    ask(page, "Remember me")
    answers_done(page, 1)
    page.reload()
    page.wait_for_selector(".msg.assistant")
    assert page.inner_text(".msg.user .text") == "Remember me"
    assert page.inner_text(".msg.assistant .md.body") == "First answer."
    assert page.inner_text("#chats li.on .name") == "Remember me"
    page.click("#new")
    ask(page, "Another chat")
    answers_done(page, 1)
    assert page.locator("#chats li").count() == 2
    page.locator("#chats li .name", has_text="Remember me").click()
    page.wait_for_function("document.querySelector('.msg.user .text').textContent === 'Remember me'")
    saved = json.loads(page.evaluate("localStorage.getItem('strata.chats.v1')"))
    assert sorted(c["title"] for c in saved["chats"].values()) == ["Another chat", "Remember me"]


def test_settings_reach_the_server_and_the_system_prompt_the_engine(server, page, tmp_path):
    gens = tmp_path / "gens.txt"
    s = server({"record_gen": str(gens), "turns": [{"text": "ok"}]})
    page.goto(f"http://127.0.0.1:{s.port}/")
    page.click("#open-settings")
    page.wait_for_selector("#settings[open]")
    page.fill("input[name=top_k]", "999")                      # out of range: the server's 400 is shown
    page.click("#settings-save")
    page.wait_for_function("document.getElementById('settings-error').textContent.includes('top_k')")
    assert page.is_visible("#settings")
    page.fill("input[name=top_k]", "")
    page.fill("input[name=temperature]", "0.3")
    page.fill("input[name=seed]", "7")
    page.fill("textarea[name=system]", "You are a pirate.")
    page.click("#settings-save")
    page.wait_for_selector("#settings", state="hidden")
    assert s.svc.settings_view()["defaults"] == {"temperature": 0.3, "seed": 7}
    ask(page, "Hello")
    answers_done(page, 1)
    ids = [int(x) for x in gens.read_text().splitlines()[-1].split()[-1].split(",")]
    assert "You are a pirate." in bytes(i for i in ids if i < 256).decode("utf-8", "replace")
    page.reload()
    page.click("#open-settings")
    page.wait_for_selector("#settings[open]")
    assert page.input_value("input[name=temperature]") == "0.3"
    assert page.input_value("textarea[name=system]") == "You are a pirate."


def test_context_error_then_a_normal_question_works(server, page, tmp_path):
    gens = tmp_path / "gens.txt"
    s = server({"record_gen": str(gens), "turns": [{"text": "Fine."}]}, ctx=256)
    page.goto(f"http://127.0.0.1:{s.port}/")
    ask(page, "x" * 2000)
    page.wait_for_selector(".msg.assistant .error")
    assert "context" in page.inner_text(".msg.assistant .error")
    assert page.locator(".msg.failed").count() == 2           # the question and its error, marked
    ask(page, "hi")
    answers_done(page, 2)
    assert page.locator(".msg.assistant").nth(1).locator(".md.body").inner_text() == "Fine."
    assert page.locator(".msg.assistant").nth(1).locator(".error").count() == 0
    sent = bytes(i for i in map(int, gens.read_text().splitlines()[-1].split()[-1].split(",")) if i < 256)
    assert b"xxxx" not in sent                                 # the failed turn left the history


def test_a_server_with_an_api_key_works_once_the_page_has_it(server, page):
    s = server({"turns": [{"text": "Keyed."}]}, api_keys=["sesame"])
    page.goto(f"http://127.0.0.1:{s.port}/")
    ask(page, "hello")
    page.wait_for_selector(".msg.assistant .error")
    assert "API key" in page.inner_text(".msg.assistant .error")
    page.click("#open-settings")
    page.wait_for_selector("#settings[open]")
    page.fill("input[name=api_key]", "sesame")
    page.click("#settings-save")
    page.wait_for_selector("#settings", state="hidden")
    ask(page, "hello again")
    answers_done(page, 2)
    assert page.locator(".msg.assistant").nth(1).locator(".md.body").inner_text() == "Keyed."
    page.goto(f"http://127.0.0.1:{s.port}/about")
    page.wait_for_selector("#routes tr")


def test_edit_resend_regenerate_and_copy(server, page):
    s = server({"turns": [{"text": "One."}, {"text": "Two."}, {"text": "Three."}]})
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto(f"http://127.0.0.1:{s.port}/")
    ask(page, "First question")
    answers_done(page, 1)
    page.locator(".msg.assistant button[data-act=regen]").click()
    page.wait_for_function("document.querySelector('.msg.assistant .md.body').textContent === 'Two.'")
    answers_done(page, 1)
    page.locator(".msg.user button[data-act=edit]").click()
    page.fill(".msg.user textarea.edit", "Edited question")
    page.locator(".msg.user button", has_text="Send").click()
    page.wait_for_function("document.querySelector('.msg.assistant .md.body').textContent === 'Three.'")
    assert page.locator(".msg").count() == 2 and page.inner_text(".msg.user .text") == "Edited question"
    answers_done(page, 1)
    page.locator(".msg.assistant button[data-act=copy]").click()
    page.wait_for_function("document.querySelector('.msg.assistant button[data-act=copy]').textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == "Three."


def test_conversations_rename_delete_export(server, page):
    s = server({"turns": [{"text": "Answer."}]})
    page.goto(f"http://127.0.0.1:{s.port}/")
    ask(page, "Keep this one")
    answers_done(page, 1)
    page.click("#new")
    ask(page, "Drop this one")
    answers_done(page, 1)
    page.once("dialog", lambda d: d.accept("Renamed chat"))
    page.locator("#chats li", has_text="Keep this one").locator("button[data-act=rename]").click()
    page.wait_for_selector("#chats li .name:text-is('Renamed chat')")
    with page.expect_download() as dl:
        page.locator("#chats li", has_text="Renamed chat").locator("button[data-act=export]").click()
    exported = json.loads(open(dl.value.path(), encoding="utf-8").read())
    assert exported["title"] == "Renamed chat"
    assert [m["content"] for m in exported["messages"]] == ["Keep this one", "Answer."]
    page.once("dialog", lambda d: d.accept())
    page.locator("#chats li", has_text="Drop this one").locator("button[data-act=delete]").click()
    page.wait_for_function("document.querySelectorAll('#chats li').length === 1")
    page.reload()
    assert page.locator("#chats li .name").all_inner_texts() == ["Renamed chat"]
    assert page.inner_text(".msg.user .text") == "Keep this one"


def test_reasoning_collapses_and_tool_calls_render_as_blocks(server, page):
    s = server()
    frames = [{"reasoning_content": "Weighing **options**", "reasoning": "Weighing **options**"},
              {"content": "Calling a tool."},
              {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}]
    body = "".join(f"data: {json.dumps({'choices': [{'index': 0, 'delta': d}]})}\n\n" for d in frames)
    body += "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}}) + "\n\n"
    body += "data: [DONE]\n\n"
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"}, body=body))
    page.goto(f"http://127.0.0.1:{s.port}/")
    ask(page, "Weather?")
    answers_done(page, 1)
    details = page.locator(".msg.assistant details.reasoning")
    assert details.locator("strong").text_content() == "options"
    assert not details.evaluate("d => d.open")                   # collapsed once the answer came
    details.locator("summary").click()
    assert details.evaluate("d => d.open")
    page.evaluate("renderChat()")                                # a redraw keeps the reader's choice
    assert page.locator(".msg.assistant details.reasoning").evaluate("d => d.open")
    assert page.inner_text(".msg.assistant .tool .tool-name") == "tool call: get_weather"
    assert json.loads(page.inner_text(".msg.assistant .tool pre")) == {"city": "Paris"}
    assert "9 tokens" in page.inner_text(".msg.assistant .figures")


def test_theme_switch_and_phone_width(server, page):
    s = server({"turns": [{"text": "A reply with a long code line:\n\n```\n" + "x" * 300 + "\n```"}]})
    page.set_viewport_size({"width": 390, "height": 760})
    page.goto(f"http://127.0.0.1:{s.port}/")
    first = page.evaluate("document.documentElement.dataset.theme")
    page.click("#theme")
    other = "dark" if first == "light" else "light"
    assert page.evaluate("document.documentElement.dataset.theme") == other
    ask(page, "hi")
    answers_done(page, 1)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390   # nothing pushes the page sideways
    assert page.is_hidden("#sidebar") or page.evaluate(
        "document.getElementById('sidebar').getBoundingClientRect().right") <= 0
    page.click("#toggle-list")
    page.wait_for_function("document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    page.reload()
    assert page.evaluate("document.documentElement.dataset.theme") == other
    for path in ("/monitor", "/about"):
        page.goto(f"http://127.0.0.1:{s.port}{path}")
        page.wait_for_timeout(300)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390, path


def test_monitor_charts_move_under_load(server, page):
    s = server({"turns": [{"text": " ".join(f"b{i}" for i in range(300)), "token_delay_s": 0.002}]}, ctx=512)
    assert s.post("/v1/chat/completions", chat("x" * 2000))[0] == 400    # a rejected one for the table
    page.goto(f"http://127.0.0.1:{s.port}/monitor")
    page.wait_for_selector("#chart-tok svg polyline", state="attached")
    before = page.get_attribute("#chart-tok", "data-points")
    stop = threading.Event()

    def load():
        while not stop.is_set():
            s.post("/v1/chat/completions", chat("go"), timeout=30)
    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        page.wait_for_function("""() => { const v = document.querySelector('#chart-tok .value').textContent;
            return parseFloat(v.split('/')[0].replace(/,/g, '')) > 0; }""")
        page.wait_for_function(f"document.querySelector('#chart-tok').dataset.points !== '{before}'")
        page.wait_for_function("document.querySelectorAll('#rows tr:not(.rejected)').length > 0")
        assert "rejected 400" in page.inner_text("#rows tr.rejected")
    finally:
        stop.set()
        t.join(30)
    assert page.locator("#chart-cpu polyline").count() >= 1
    assert page.is_hidden("#chart-gpu")                        # no GPU on this machine: its charts are hidden


def test_about_lists_every_route(server, page):
    s = server()
    page.goto(f"http://127.0.0.1:{s.port}/about")
    page.wait_for_selector("#routes tr")
    shown = set(page.locator("#routes td:nth-child(2)").all_inner_texts())
    assert set(routes_mod.GET_ROUTES) | set(routes_mod.POST_ROUTES) <= shown
    assert "fake-model" in page.inner_text("#model-card")


ENGINE = os.environ.get("STRATA_TEST_ENGINE", ENGINE_EXE)
MODEL = model_path()


@pytest.mark.skipif(not (os.access(ENGINE, os.X_OK) and MODEL), reason="needs the built engine and the model")
def test_real_model_answers_in_the_page(page, tmp_path):
    with real_server(ENGINE, MODEL, tmp_path, 1024) as s:
        assert s.post("/settings", {"defaults": {"temperature": 0}},
                      headers={"Content-Type": "application/json"})[0] == 200   # greedy: one answer
        page.set_default_timeout(4 * WAIT_MS)   # the real model on a shared 2-core machine
        page.goto(f"http://127.0.0.1:{s.port}/")
        ask(page, "What is the capital of France?")
        answers_done(page, 1)
        assert "Paris" in page.inner_text(".msg.assistant .md.body")
        assert "tok/s" in page.inner_text(".msg.assistant .figures")
        page.goto(f"http://127.0.0.1:{s.port}/about")            # the model card from INFO and the GGUF
        page.wait_for_selector("#routes tr")
        card = page.inner_text("#model-card")
        assert "Q4_1" in card and "llama" in card and "MiB" in card
