"""serve/prompt/llama3_gemma.py: Llama 3 and Gemma rendered natively, detection, and the no-template 400.

Parity: on a corpus of conversations (system first, system only, multi-turn, whitespace to trim, text that
looks like tags), the rendering without the BOS text equals llama.cpp's built-in rendering of the family
(`llama_chat_apply_template` with "llama3" / "gemma", through tests/llama_oracle.py; skipped with the reason
when the peer interpreter is absent). ChatML (serve/prompt/chatml.py) is compared on the conversations whose
system turn, if any, comes first (a later system turn is rendered as a user turn on purpose there).
"""

import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from serve.core.events import BadRequest, Message, ToolSpec  # noqa: E402
from serve.prompt.chatml import ChatTemplate  # noqa: E402
from serve.prompt.llama3_gemma import FamilyTemplate, NoTemplate
from strata_control.families import detect_family  # noqa: E402
from tests import oracle  # noqa: E402

CORPUS = [
    [("user", "Hi")],
    [("system", "You are terse."), ("user", "What is 2+2?")],
    [("system", "  Be kind.\n"), ("user", "\tHello there  \n"), ("assistant", " Hi! \n"), ("user", "Again?")],
    [("user", "one"), ("assistant", "two"), ("user", "three"), ("assistant", "four"), ("user", "five")],
    [("system", "Rules:\n1. a\n2. b"), ("user", "Write <|eot_id|> and <end_of_turn> literally")],
    [("user", "日本語で答えて 🙂"), ("assistant", "はい"), ("user", "ありがとう")],
    [("system", "only a system turn")],
    [("system", "s1"), ("user", "u1"), ("system", "s2"), ("user", "u2")],
]


def msgs(conv):
    return [Message(role=r, content=c) for r, c in conv]


def test_detect_family():
    assert detect_family("{{ '<|start_header_id|>' + role + '<|end_header_id|>' }}") == "llama3"
    assert detect_family("{{ '<start_of_turn>' + role }}") == "gemma"
    assert detect_family("{{ '<|im_start|>' + role }}") == "chatml"
    assert detect_family(None) is None and detect_family("{{ messages }}") is None
    assert isinstance(ChatTemplate.from_text("x<start_of_turn>y"), FamilyTemplate)


def test_gemma_merges_system_and_marks_client_text_plain():
    r = FamilyTemplate("gemma").render(msgs([("system", "Sys"), ("user", "<bos>hi")]))
    assert r.text == "<bos><start_of_turn>user\nSys\n\n<bos>hi<end_of_turn>\n<start_of_turn>model\n"
    spans = [r.text[a:b] for a, b in r.plain]
    assert "<bos>hi" in spans and "Sys" in spans  # typed tags stay text


def test_tools_and_no_template_are_400():
    with pytest.raises(BadRequest, match="tools"):
        FamilyTemplate("llama3").render(msgs([("user", "x")]), tools=[ToolSpec(name="f", description="", parameters={})])
    with pytest.raises(BadRequest, match="no chat template"):
        NoTemplate().render(msgs([("user", "x")]))


@pytest.mark.parametrize("family", ["llama3", "gemma", "chatml"])
def test_rendering_equals_llama_cpp(family):
    oracle.require_oracle()
    corpus = CORPUS
    if family == "chatml":
        corpus = [c for c in CORPUS if all(r != "system" for r, _ in c[1:])]
    chats = [[{"role": r, "content": c} for r, c in conv] for conv in corpus]
    theirs = oracle.ask({"op": "template", "name": family, "chats": chats, "add_ass": True})["texts"]
    for conv, want in zip(corpus, theirs):
        if family == "chatml":
            ours = ChatTemplate().render(msgs(conv)).text
        else:
            ours = FamilyTemplate(family).render(msgs(conv), bos=False).text
        assert ours == want, (conv, ours, want)
