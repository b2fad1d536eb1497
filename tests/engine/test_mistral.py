"""Mistral-family files load through the llama path: a Mistral-Nemo-shaped random-weight file against llama.cpp.

Mistral 7B, Mistral Nemo, Mistral Small 3.x and Ministral GGUFs say `general.architecture = llama`; what sets
them apart is their shape and their text side. The file written here carries both: query heads wider than the
model (head_dim 96 from `attention.key_length`, 4 x 96 = 384 > n_embd 256, as Nemo's 32 x 128 > 5120), GQA 4:1,
an untied output head, the `tekken` pre-tokenizer and a Mistral v7/tekken chat template. Checked: the engine's
logits and greedy tokens against llama.cpp (tolerance and near-tie rule of tests/engine/conftest.py), the
tokenizer's ids against llama.cpp's on the same file, `strata models`' description, the prompt the server
renders with the file's own template (BOS from the vocabulary, client text plain), and `strata serve`'s
composition root over the real engine answering a chat with it.
"""

import pathlib

from tests import gguf_writer, oracle
from tests.engine.conftest import LOGIT_TOL_FLOAT, check_logits

TEMPLATE = (pathlib.Path(__file__).resolve().parents[1] / "data" / "chat_templates" / "mistral_v7_tekken.jinja")
NEMO_SHAPE = {"n_head": 4, "n_head_kv": 1, "head_dim": 96}


def nemo_like(tmp_path, vocab_meta):
    meta = dict(vocab_meta, **{"tokenizer.ggml.pre": "tekken",
                               "tokenizer.chat_template": TEMPLATE.read_text(encoding="utf-8")})
    meta.pop("tokenizer.ggml.add_bos_token", None)   # as tekken files often are: llama.cpp then adds BOS
    return gguf_writer.random_model(tmp_path / "mistral-nemo-like.gguf", "llama", meta, wtype="F16", seed=23,
                                    tied=False, shapes=NEMO_SHAPE,
                                    arch_kv={"attention.key_length": 96, "attention.value_length": 96})


def test_mistral_nemo_shape_matches_llama_cpp(vocab_meta, prompt_ids, tmp_path):
    check_logits(nemo_like(tmp_path, vocab_meta), prompt_ids, LOGIT_TOL_FLOAT)


def test_tekken_ids_template_and_listing(vocab_meta, tmp_path):
    from serve.bootstrap import chat_template
    from serve.core.events import Message
    from strata_control.models import describe
    from tokenizer.bpe import Tokenizer
    import types
    oracle.require_oracle()
    path = nemo_like(tmp_path, vocab_meta)
    tok = Tokenizer.from_gguf(str(path))
    assert tok.pre == "tekken" and tok.add_bos   # tekken wants BOS when the file does not say
    texts = ["HelloWorld, getHTTPResponse at path/to/x 12345", "Ministral: ÉCOLE école [INST] hi"]
    want = oracle.ask({"op": "tokenize", "model": str(path), "texts": texts, "add_special": True,
                       "parse_special": True})["ids"]
    assert [[tok.special_ids["bos"]] + tok.encode(t, parse_special=True) for t in texts] == want
    info = describe(str(path))
    assert (info.architecture, info.template, info.problem, info.head_dim) == ("llama", "mistral", None, 96)
    ns = types.SimpleNamespace(system_prompt=None, chat_template=None)
    template = chat_template(tok, ns, {})
    assert (template.renderer, template.family) == ("jinja", "mistral")
    r = template.render([Message("system", "Be brief."), Message("user", "Say [INST] twice")])
    bos = tok.id_to_token(tok.special_ids["bos"])
    assert r.text == f"{bos}[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Say [INST] twice[/INST]"
    ids = tok.encode(r.text, parse_special=True, plain=r.plain)
    assert ids[0] == tok.special_ids["bos"] and ids.count(ids[0]) == 1


def test_strata_serve_answers_it_with_its_own_template(vocab_meta, tmp_path, serve_gguf):
    # the composition root picks the file's own template (a Mistral family: no native renderer) and the real
    # engine answers a chat over HTTP
    svc, post = serve_gguf(nemo_like(tmp_path, vocab_meta))
    assert (svc.template.renderer, svc.template.family) == ("jinja", "mistral")
    status, answer = post({"messages": [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Say [INST]"}], "max_tokens": 8, "temperature": 0})
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] >= 1
