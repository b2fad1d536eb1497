"""Embeddings on the fake engines (serve/api/embeddings.py): the four dialects' shapes, inputs, refusals in each
dialect's error shape, and that the vector the engine wrote is what the client reads (float and base64), on
the one-slot fake and the several-slot fake (both `BEMB`)."""
import base64
import json
import math
import os
import struct
import sys

import pytest

from serve.engine_client.engine import StrataEngine
from serve.generation.service import Service
from tests.fake_engine import fake_vector_line
from tests.serve.conftest import start_http, stop_http
from tests.serve.conftest import FAKE_SLOTS
from tokenizer.bpe import ByteTokenizer


def expected(ids):
    n, _, b64 = fake_vector_line(ids).partition(" ")
    return list(struct.unpack(f"<{int(n)}f", base64.b64decode(b64))), b64


def ids_of(text):
    return ByteTokenizer().encode(text, parse_special=True)


@pytest.fixture
def slots_server(tmp_path):
    started = []

    def start(ctx=2048):
        script = tmp_path / "slots.json"
        script.write_text(json.dumps({"record": str(tmp_path / "rec.txt"), "ctx": ctx}))
        engine = StrataEngine([sys.executable, FAKE_SLOTS, "--script", str(script)], ["--max-context", str(ctx)])
        engine.start()
        run = start_http(Service(engine, ByteTokenizer(), "fake-model"), started)
        run.record = tmp_path / "rec.txt"  # every line the fake engine read
        return run

    yield start
    for run in started:
        stop_http(run)
        run.svc.engine.close()


def test_openai_single_string_is_the_engine_vector_with_usage(server):
    s = server()
    status, out, _ = s.post("/v1/embeddings", {"model": "fake-model", "input": "hello"})
    assert status == 200 and out["object"] == "list" and out["model"] == "fake-model"
    assert out["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    (item,) = out["data"]
    assert item["object"] == "embedding" and item["index"] == 0
    want, _ = expected(ids_of("hello"))
    assert item["embedding"] == want
    assert abs(math.sqrt(sum(v * v for v in item["embedding"])) - 1.0) < 1e-6


@pytest.mark.parametrize("value,lists", [
    (["ab", "cde"], [ids_of("ab"), ids_of("cde")]),
    ([97, 98], [[97, 98]]),
    ([[97, 98], [99]], [[97, 98], [99]]),
])
def test_openai_input_forms(server, value, lists):
    status, out, _ = server().post("/v1/embeddings", {"input": value})
    assert status == 200
    assert [d["index"] for d in out["data"]] == list(range(len(lists)))
    assert [d["embedding"] for d in out["data"]] == [expected(ids)[0] for ids in lists]
    assert out["usage"]["prompt_tokens"] == sum(map(len, lists))


def test_openai_base64_is_the_float32_bytes(server):
    s = server()
    out = s.post("/v1/embeddings", {"input": ["same", "same", "other"], "encoding_format": "base64"})[1]
    b64 = [d["embedding"] for d in out["data"]]
    assert b64[0] == b64[1] != b64[2] and b64[0] == expected(ids_of("same"))[1]
    floats = s.post("/v1/embeddings", {"input": "same"})[1]["data"][0]["embedding"]
    assert list(struct.unpack(f"<{len(floats)}f", base64.b64decode(b64[0]))) == floats


@pytest.mark.parametrize("body,param", [
    ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": ["a", ""]}, "input[1]"),
    ({"input": [[]]}, "input[0]"), ({}, "input"), ({"input": 5}, "input"), ({"input": [1.5]}, "input[0]"),
    ({"input": [99999]}, "input"), ({"input": "a", "dimensions": 4}, "dimensions"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"), ({"input": ["a"] * 257}, "input"),
    ({"input": "a", "model": 3}, "model"),
])
def test_openai_refusals_name_the_field(server, body, param):
    status, err, _ = server().post("/v1/embeddings", body)
    assert status == 400 and err["error"]["type"] == "invalid_request_error" and err["error"]["param"] == param


def test_over_the_context_is_a_400_never_truncated(server):
    s = server(ctx=64)
    status, err, _ = s.post("/v1/embeddings", {"input": ["ok", "x" * 57]})
    assert status == 400 and err["error"]["code"] == "context_length_exceeded" and "input[1]" in err["error"]["message"]
    assert s.post("/v1/embeddings", {"input": "x" * 56})[0] == 200  # 56 + 8 = 64 fits
    status, err, _ = s.post("/api/embed", {"model": "m", "input": "x" * 57, "truncate": True})
    assert status == 400 and "never truncated" in err["error"]


def test_llama_cpp_shapes(server):
    s = server()
    for path in ("/embedding", "/embeddings"):
        status, out, _ = s.post(path, {"content": ["ab", [97, "c"]]})
        assert status == 200 and out == [{"index": 0, "embedding": [expected(ids_of("ab"))[0]]},
                                         {"index": 1, "embedding": [expected([97, 99])[0]]}]
    # llama-server answers `content` on its OpenAI route in its own shape too
    assert s.post("/v1/embeddings", {"content": "ab"})[1] == [{"index": 0, "embedding": [expected(ids_of("ab"))[0]]}]
    status, err, _ = s.post("/embedding", {"content": ""})
    assert status == 400 and err["error"]["code"] == 400 and isinstance(err["error"]["message"], str)
    assert s.post("/embedding", {"content": "a", "embd_normalize": 1})[0] == 400


def test_ollama_shapes_and_errors(server):
    s = server()
    status, out, _ = s.post("/api/embed", {"model": "fake-model", "input": ["ab", "c"]})
    assert status == 200 and out["model"] == "fake-model" and out["prompt_eval_count"] == 3
    assert out["embeddings"] == [expected(ids_of("ab"))[0], expected(ids_of("c"))[0]]
    assert isinstance(out["total_duration"], int) and out["load_duration"] == 0
    status, out, _ = s.post("/api/embeddings", {"model": "fake-model", "prompt": "ab"})
    assert status == 200 and out == {"embedding": expected(ids_of("ab"))[0]}
    for path, body in (("/api/embed", {"model": "m", "input": ""}), ("/api/embed", {"input": "a"}),
                       ("/api/embed", {"model": "m", "input": [1, 2]}), ("/api/embeddings", {"model": "m"}),
                       ("/api/embed", {"model": "m", "input": "a", "truncate": "yes"})):
        status, err, _ = s.post(path, body)
        assert status == 400 and isinstance(err["error"], str), (path, body, err)


def test_slot_engine_uses_bemb_and_gives_the_same_vectors(slots_server, server):
    s = slots_server()
    texts = ["one", "two", "three"]
    batch = s.post("/v1/embeddings", {"input": texts})[1]["data"]
    single = [s.post("/v1/embeddings", {"input": t})[1]["data"][0]["embedding"] for t in texts]
    assert [d["embedding"] for d in batch] == single == [expected(ids_of(t))[0] for t in texts]
    assert server().post("/v1/embeddings", {"input": texts})[1]["data"] == batch  # the one-slot fake agrees
    lines = s.record.read_text().splitlines()
    assert sum(" BEMB " in ln for ln in lines) == 6 and not any(" BGEN " in ln for ln in lines), lines


def test_a_refused_embedding_leaves_the_slot_usable(slots_server):
    s = slots_server(ctx=64)
    assert s.post("/v1/embeddings", {"input": "x" * 60})[0] == 400  # refused before the engine
    status, out, _ = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                     "max_tokens": 5})
    assert status == 200


def test_the_body_model_picks_the_model_as_on_the_other_routes(lifecycle_server):
    run = lifecycle_server()
    status, out, _ = run.post("/v1/embeddings", {"model": "beta-alias", "input": "hi"})
    assert status == 200 and out["model"] == "beta"  # as the chat routes name it
    assert "EMB " in open(run.rec("beta")).read() and not os.path.exists(run.rec("alpha"))
    status, err, _ = run.post("/v1/embeddings", {"model": "nope", "input": "hi"})
    assert status == 404 and err["error"]["param"] == "model"
    status, err, _ = run.post("/api/embed", {"model": "nope", "input": "hi"})
    assert status == 404 and isinstance(err["error"], str)
