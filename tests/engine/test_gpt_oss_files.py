"""A gpt-oss file as users bring it: the `gpt-4o` (o200k) pre-tokenizer, `strata models`, and `strata serve` with
the file's own harmony template.

The file is a random-weight gpt-oss (tests/gguf_writer.py; 16 experts, 4 used, MXFP4 experts) carrying SmolLM2's
vocabulary and merges under `tokenizer.ggml.pre = "gpt-4o"` and a harmony-shaped chat template
(tests/data/chat_templates/gpt_oss.jinja): with the same merges on both sides, equal ids mean the pre-tokenizer's
pieces are llama.cpp's. Checked: the ids of texts that reach every branch of the o200k regex (cased runs with
contractions, digit runs of up to three, symbol runs with slashes and newlines, whitespace runs, non-Latin
letters and marks) equal llama.cpp's; `strata models` lists the file as usable with its experts and the harmony
family; the composition root picks the Jinja renderer with the harmony call syntax, and the real engine answers a
chat over HTTP whose prompt is the template's rendering.
"""

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import gguf_writer, oracle  # noqa: E402

TEMPLATE = REPO / "tests" / "data" / "chat_templates" / "gpt_oss.jinja"
TEXTS = ["HelloWorld, getHTTPResponse at path/to/x 1234567 and 12 qwertz", "it's what you'll say: They're 456456",
         "DON'T you'll I'M they'Re We'VE it's\n\n  tabs\t\there  ",
         "École ÉCOLE naïve Ωmega日本語テキスト 😀!! --> a/b//\n\r\nend",
         "  leading spaces, trailing  \n   x = f(y) + 3.14159;   // comment\n"]


# Tokens SmolLM2's vocabulary lacks, appended with merges (lowest rank) where the o200k pieces differ from the
# other families' (digit runs of up to three, contractions kept with their word), and one without merges: a piece
# that is itself a token is merged from bytes here, not taken whole (llama.cpp sets ignore_merges for llama3 only).
EXTRA_MERGES = ["1 2", "12 3", "4 5", "45 6", "Ġit 's", "Ġyou 'll", "ĠThey 're"]
EXTRA_TOKENS = ["Ġqwertz"]
# harmony's control tokens; the file names <|end|> its end of turn and <|return|> its end of text (both as some
# converted files do): <|return|> and <|call|> must end a reply, <|end|> (which ends an analysis message) not
HARMONY = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"]


def gpt_oss_file(tmp_path, vocab_meta):
    tokens = list(vocab_meta["tokenizer.ggml.tokens"])
    new = [m.replace(" ", "") for m in EXTRA_MERGES] + EXTRA_TOKENS
    types = list(vocab_meta["tokenizer.ggml.token_type"]) + [1] * len(new) + [3] * len(HARMONY)
    tokens += new + HARMONY
    meta = dict(vocab_meta, **{"tokenizer.ggml.pre": "gpt-4o",
                               "tokenizer.ggml.tokens": tokens,
                               "tokenizer.ggml.token_type": types,
                               "tokenizer.ggml.eot_token_id": tokens.index("<|end|>"),
                               "tokenizer.ggml.eos_token_id": tokens.index("<|return|>"),
                               "tokenizer.ggml.merges": list(vocab_meta["tokenizer.ggml.merges"]) + EXTRA_MERGES,
                               "tokenizer.chat_template": TEMPLATE.read_text(encoding="utf-8")})
    return gguf_writer.random_model(tmp_path / "gpt-oss-like.gguf", "gpt-oss", meta, wtype="Q8_0", exp_type="MXFP4",
                                    seed=3, tied=False, shapes={"n_ctx": 1024})


def test_gpt4o_ids_equal_llama_cpp(vocab_meta, tmp_path):
    from tokenizer.bpe import Tokenizer
    oracle.require_oracle()
    path = gpt_oss_file(tmp_path, vocab_meta)
    tok = Tokenizer.from_gguf(str(path))
    assert tok.pre == "gpt-4o"
    want = oracle.ask({"op": "tokenize", "model": str(path), "texts": TEXTS, "add_special": False,
                       "parse_special": False})["ids"]
    for text, ids in zip(TEXTS, want, strict=True):
        assert tok.encode(text) == ids, text


def test_return_and_call_end_a_reply_and_end_does_not(vocab_meta, tmp_path, engine_path):
    from tests.engine.conftest import Engine
    from tokenizer.bpe import Tokenizer
    path = gpt_oss_file(tmp_path, vocab_meta)
    tok = Tokenizer.from_gguf(str(path))
    ids = {t: tok.token_to_id(t) for t in ("<|end|>", "<|return|>", "<|call|>")}
    sid = tok.special_ids
    assert (sid["eos"], sid["return"], sid["call"]) == (ids["<|return|>"], ids["<|return|>"], ids["<|call|>"])
    assert "eot" not in sid
    e = Engine(engine_path, path, "--max-context", "256")
    try:
        ends = {int(x) for x in e.info["eos"].split(",")}
    finally:
        e.close()
    assert {ids["<|return|>"], ids["<|call|>"]} <= ends and ids["<|end|>"] not in ends


def test_listing_and_template(vocab_meta, tmp_path):
    import types
    from serve.bootstrap import chat_template
    from serve.core.events import Message
    from strata_control.models import describe
    from tokenizer.bpe import Tokenizer
    path = gpt_oss_file(tmp_path, vocab_meta)
    row = describe(str(path)).row()
    assert (row["architecture"], row["status"], row["template"]) == ("gpt-oss", "ok", "harmony"), row["problem"]
    assert row["experts"] == {"total": 16, "active": 4}
    template = chat_template(Tokenizer.from_gguf(str(path)), types.SimpleNamespace(system_prompt=None,
                                                                                   chat_template=None), {})
    assert (template.renderer, template.family, template.call_syntax) == ("jinja", "harmony", "harmony")
    text = template.render([Message("user", "Hi")]).text
    assert "<|start|>user<|message|>Hi<|end|>" in text and text.endswith("<|start|>assistant")


def test_strata_serve_answers_it_with_its_own_template(vocab_meta, tmp_path, serve_gguf):
    from serve.core.events import Message
    svc, post = serve_gguf(gpt_oss_file(tmp_path, vocab_meta))
    assert (svc.template.renderer, svc.template.family) == ("jinja", "harmony")
    rendered = svc.template.render([Message("user", "Say hi")])
    n_prompt = len(svc.tok.encode(rendered.text, parse_special=True, plain=rendered.plain))
    status, answer = post({"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0})
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] >= 1
    assert answer["usage"]["prompt_tokens"] == n_prompt
