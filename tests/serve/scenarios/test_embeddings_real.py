"""Embeddings on the real engine and the default model (skipped when either is absent): the vector equals
llama.cpp's (`--pooling mean`, normalised) within the stated tolerance, has norm 1, repeats exactly for the same
input and differs for another; a batch equals its inputs one by one; a one-slot engine and eight slots
agree; embeddings running beside a greedy generation leave its text unchanged; the official openai and ollama
clients read the answers.

Tolerance against llama.cpp: cosine >= 0.998 and every component within 0.03 (the largest components are
~0.75): llama.cpp quantises activations to 8 bits for its Q4_1 matrix products and Strata does not, the
same cause as the logit differences in tests/engine/test_arch_parity.py (measured: cosine 0.999, max 0.015).
"""
import base64
import contextlib
import math
import os
import struct
import threading

import pytest

from serve.engine_client.engine import StrataEngine
from serve.generation.service import Service
from serve.prompt.chatml import ChatTemplate
from tests import oracle
from tests.conftest import ENGINE_EXE, model_path
from tests.serve.conftest import start_http, stop_http
from tokenizer.bpe import Tokenizer

MODEL = model_path()
pytestmark = pytest.mark.skipif(not (os.access(ENGINE_EXE, os.X_OK) and MODEL), reason="needs the engine and model")
CTX, COSINE_MIN, COMPONENT_TOL = 1024, 0.998, 0.03  # the tolerance: see the module docstring
TEXTS = ["The cat sat on the mat.", "Quantum chromodynamics describes the strong force.",
         "def add(a, b):\n    return a + b\n"]


@contextlib.contextmanager
def _server(tmp, lanes):
    tok = Tokenizer.from_gguf(MODEL, cache_dir=str(tmp))
    args = ["--model", MODEL, "--max-context", str(CTX)] + (["--batch", str(lanes)] if lanes > 1 else [])
    engine = StrataEngine([ENGINE_EXE], args, log_path=str(tmp / f"e{lanes}.log"))
    engine.start()
    started = []
    run = start_http(Service(engine, tok, "smollm2", ChatTemplate.from_text(tok.chat_template), arch="llama"),
                     started)
    try:
        yield run
    finally:
        stop_http(run)
        engine.close()


@pytest.fixture(scope="module")
def slots(tmp_path_factory):
    with _server(tmp_path_factory.mktemp("emb-slots"), 4) as run:
        yield run


def _vectors(run, value, **extra):
    status, out, _ = run.post("/v1/embeddings", {"input": value, **extra}, timeout=300)
    assert status == 200, out
    return [d["embedding"] for d in out["data"]]


def _cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_vectors_match_llama_cpp_mean_pooling(slots):
    oracle.require_oracle()
    id_lists = [slots.svc.tok.encode(t, parse_special=True) for t in TEXTS]
    ours = _vectors(slots, id_lists)
    theirs = oracle.ask({"op": "embed", "model": str(MODEL), "prompts": id_lists})["embeddings"]
    for ids, a, ref in zip(id_lists, ours, theirs):
        norm = math.sqrt(sum(v * v for v in ref))
        ref = [v / norm for v in ref]
        assert len(a) == len(ref) == 576
        worst = max(abs(x - y) for x, y in zip(a, ref))
        assert _cos(a, ref) >= COSINE_MIN and worst <= COMPONENT_TOL, (len(ids), _cos(a, ref), worst)
    # text input tokenizes as those ids (specials parsed, no BOS for this model)
    assert _vectors(slots, TEXTS[0]) == ours[:1]


def test_norm_repeat_differ_and_batch_equals_one_by_one(slots):
    batch = _vectors(slots, TEXTS + [TEXTS[0]])
    for v in batch:
        assert abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-5
    assert batch[0] == batch[3]  # the same input, the same vector, bit for bit
    assert _cos(batch[0], batch[1]) < 0.99 and _cos(batch[1], batch[2]) < 0.99
    singles = [_vectors(slots, t)[0] for t in TEXTS]
    for a, b in zip(batch, singles):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-6


def test_a_one_slot_engine_agrees_with_the_slots(slots, tmp_path):
    with _server(tmp_path, 1) as one_slot:
        ours = _vectors(one_slot, TEXTS[:2])
    for a, b in zip(ours, _vectors(slots, TEXTS[:2])):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-6


def test_embeddings_beside_a_generation_leave_it_unchanged(slots):
    body = {"messages": [{"role": "user", "content": "Name three colours."}], "temperature": 0, "max_tokens": 48}
    alone = slots.post("/v1/chat/completions", body, timeout=300)[1]["choices"][0]["message"]["content"]
    stop, errors = threading.Event(), []

    def embed_loop(k):
        while not stop.is_set():
            status = slots.post("/v1/embeddings", {"input": [TEXTS[k % 3] * 3, TEXTS[(k + 1) % 3]]}, timeout=300)[0]
            if status != 200:
                errors.append(status)
    threads = [threading.Thread(target=embed_loop, args=(k,), daemon=True) for k in range(3)]
    for t in threads:
        t.start()
    try:
        beside = slots.post("/v1/chat/completions", body, timeout=300)[1]["choices"][0]["message"]["content"]
    finally:
        stop.set()
        for t in threads:
            t.join(300)
    assert beside == alone and not errors


def test_openai_and_ollama_clients_read_them(slots):
    openai = pytest.importorskip("openai", reason="the OpenAI SDK is a test-only dependency")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{slots.port}/v1", api_key="unused")
    want = _vectors(slots, TEXTS[:2])
    got = client.embeddings.create(model="smollm2", input=TEXTS[:2])  # the SDK asks for base64 and decodes it
    assert [d.embedding for d in got.data] == want and got.usage.prompt_tokens > 0
    flt = client.embeddings.create(model="smollm2", input=TEXTS[0], encoding_format="float")
    assert flt.data[0].embedding == want[0]
    raw = _vectors(slots, TEXTS[0], encoding_format="base64")[0]
    assert list(struct.unpack("<576f", base64.b64decode(raw))) == want[0]
    ollama = pytest.importorskip("ollama", reason="the ollama client is a test-only dependency")
    out = ollama.Client(host=f"http://127.0.0.1:{slots.port}", timeout=300).embed(model="smollm2", input=TEXTS[:2])
    assert [list(v) for v in out.embeddings] == want and out.prompt_eval_count > 0
