"""Drafting on the real engine and model (--drafting, --draft-model; engine/drafting.h): greedy ids identical
with drafting off, lookup and a draft model over several prompts, on one slot and in slots beside slots that do not
draft; seeded sampled runs identical to drafting off and reproducible; the conversation cache and prefix
reuse after rejected drafts; a grammar request drafts under its mask; BDONE carries the drafts; a draft
model of another vocabulary is refused by name. Outputs are short: the file runs in about a minute."""

import pytest

from conftest import chat

from tests import gguf_writer
from tokenizer import gguf_meta

NO_EOS = "logit_bias=0:-inf,2:-inf"
N_NEW = 32
CODE = "".join(f"def area_{i}(w, h):\n    return w * h + {i}\n\n" for i in range(12))
PROMPTS = [
    ("rewrite", f"Copy this code exactly, then stop:\n\n{CODE}"),
    ("fact", "What is the capital of France?"),
    ("story", "Write two sentences about a cat."),
    ("list", "List the numbers one to ten in words, comma separated."),
    # past 512 positions, where a verify step's tile is cut in two for the threads (engine/model.cpp,
    # attention tiles): the cut is held to drafting off's tokens too
    ("long", "Copy this code exactly, then stop:\n\n"
             + "".join(f"def area_{i}(w, h):\n    return w * h + {i}\n\n" for i in range(40))),
]
SEEDS = (1, 2)


def _engine(start_engine, mode, model_path, *extra):
    args = ["--max-context", "2048", "--threads", "2", "--drafting", mode, *extra]
    if mode == "model":
        args += ["--draft-model", str(model_path)]
    return start_engine(*args)


@pytest.fixture(scope="module")
def prompts(request):
    tok = request.getfixturevalue("tok")
    return [chat(tok, text) for _, text in PROMPTS]


def _run_all(e, prompts, keys=""):
    out = []
    for p in prompts:
        g = e.gen(p, max_new=N_NEW, keys=keys)
        assert g.err is None and g.done, g.lines[-3:]
        out.append(g)
    return out


def test_greedy_identical_off_lookup_model(start_engine, model_path, prompts):
    off = _run_all(_engine(start_engine, "off", model_path), prompts)
    assert all(g.done["drafts_off"] == "-" for g in off)
    for mode in ("lookup", "model"):
        e = _engine(start_engine, mode, model_path)
        assert e.info["drafting"] == mode and e.info["draft_model"] == ("1" if mode == "model" else "0")
        got = _run_all(e, prompts)
        e.close()
        for (name, _), a, b in zip(PROMPTS, off, got):
            assert b.tokens == a.tokens, (mode, name)
            assert b.done["finish"] == a.done["finish"]
        acc = sum(int(g.done["drafts_acc"]) for g in got)
        offered = sum(int(g.done["drafts_off"]) for g in got)
        assert 0 < acc <= offered, (mode, acc, offered)
        if mode == "model":  # the model drafting for itself: every draft before an end is accepted
            assert acc >= 0.8 * offered, (acc, offered)
        if mode == "lookup":  # the copied code repeats the prompt
            assert int(got[0].done["drafts_acc"]) >= 10, got[0].done


def test_seeded_sampling_identical_and_reproducible(start_engine, model_path, prompts):
    picks = [prompts[0]]
    keys = [f"temperature=0.9 top_k=0 top_p=0.95 penalty_repeat=1.1 seed={s}" for s in SEEDS]
    off = _engine(start_engine, "off", model_path)
    ref = [[off.gen(p, max_new=24, keys=k).tokens for k in keys] for p in picks]
    off.close()
    for mode in ("lookup", "model"):
        e = _engine(start_engine, mode, model_path)
        for i, p in enumerate(picks):
            for j, k in enumerate(keys):
                first = e.gen(p, max_new=24, keys=k)
                again = e.gen(p, max_new=24, keys=k)
                assert first.tokens == ref[i][j] == again.tokens, (mode, i, j)
        e.close()


def test_next_turn_after_rejected_drafts_reuses_the_same(start_engine, model_path, tok):
    """Drafts rejected past the accepted prefix leave nothing behind: the next turn's reuse (prefix, turn
    checkpoint) and its tokens equal drafting off's; a parked conversation comes back the same too."""
    turns = ["Write a short poem about rain.", "Now one about snow."]
    other = chat(tok, "What is 2+2?")
    results = {}
    for mode in ("off", "lookup"):
        e = _engine(start_engine, mode, model_path)
        first = chat(tok, turns[0])
        a = e.gen(first, max_new=30, keys="temperature=1.2 top_k=0 seed=5")
        second = chat(tok, turns[0], tok.decode(a.tokens), turns[1])
        b = e.gen(second, max_new=20)
        e.gen(other, max_new=6)  # parks the poem conversation
        c = e.gen(second + b.tokens[:-1], max_new=10)
        results[mode] = [(g.resume, g.tokens) for g in (a, b, c)]
        e.close()
    assert results["lookup"] == results["off"]
    assert results["off"][1][0] > len(chat(tok, turns[0])) - 2  # the next turn did reuse the first


def test_slots_with_and_without_drafting_equal_one_slot(start_engine, model_path, prompts):
    prompts = prompts[:4]  # one a slot
    ref = [g.tokens for g in _run_all(_engine(start_engine, "off", model_path), prompts, keys=NO_EOS)]
    e = _engine(start_engine, "lookup", model_path, "--batch", "4", "--step-tokens", "64")
    for s, p in enumerate(prompts):  # slots 1 and 3 do not draft
        draft = "" if s % 2 == 0 else " draft=0"
        e.send(f"BGEN {s} {N_NEW} {NO_EOS}{draft} {','.join(map(str, p))}")
    got, ends = {}, {}
    while len(ends) < len(prompts):
        w = e.line().split()
        assert w[0] != "ERR", w
        if w[0] == "BT":
            got.setdefault(int(w[1]), []).append(int(w[2]))
        elif w[0] == "BDONE":
            ends[int(w[1])] = dict(x.split("=", 1) for x in w[2:] if "=" in x)
    for s in range(len(prompts)):
        assert got[s] == ref[s], s
    assert "drafts_acc" not in ends[1] and "drafts_acc" not in ends[3]
    assert int(ends[0]["drafts_acc"]) >= 10 and int(ends[0]["drafts_off"]) >= int(ends[0]["drafts_acc"])


def test_grammar_request_drafts_under_its_mask(start_engine, model_path, tok):
    grammar = "root%20::=%20%22def%20area_%22%20[0-9]+%20%22(w,%20h):%22"
    p = chat(tok, f"Copy the first line of this code:\n\n{CODE}")
    got = {}
    for mode in ("off", "lookup"):
        e = _engine(start_engine, mode, model_path)
        g = e.gen(p, max_new=20, keys=f"grammar={grammar}")
        assert g.err is None, g.err
        got[mode] = g.tokens
        e.close()
    assert got["lookup"] == got["off"]
    assert tok.decode(got["off"]).startswith("def area_")


def test_draft_model_of_another_vocabulary_is_refused(engine_path, model_path, tmp_path):
    import subprocess
    meta = gguf_meta.read_metadata(str(model_path))
    vocab = {k: v for k, v in meta.items() if k.startswith("tokenizer.") and k != "tokenizer.chat_template"}
    tokens = list(vocab["tokenizer.ggml.tokens"])
    tokens[100] = "not-the-same"
    other = gguf_writer.random_model(tmp_path / "other.gguf", "llama", dict(vocab, **{"tokenizer.ggml.tokens": tokens}))
    r = subprocess.run([str(engine_path), "--serve", "--model", str(model_path), "--draft-model", str(other)],
                       input="QUIT\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "not the model's vocabulary: token 100 is 'not-the-same'" in r.stderr
    r = subprocess.run([str(engine_path), "--serve", "--model", str(model_path), "--drafting", "model"],
                       input="QUIT\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--drafting model needs --draft-model" in r.stderr


def test_random_draft_model_with_the_same_vocabulary(start_engine, model_path, prompts):
    """A draft model that is wrong most of the time: its drafts are rejected, the output is unchanged."""
    meta = gguf_meta.read_metadata(str(model_path))
    vocab = {k: v for k, v in meta.items() if k.startswith("tokenizer.") and k != "tokenizer.chat_template"}
    import tempfile
    import pathlib
    with tempfile.TemporaryDirectory() as d:
        draft = gguf_writer.random_model(pathlib.Path(d) / "draft.gguf", "llama", vocab, seed=3)
        ref = _run_all(_engine(start_engine, "off", model_path), prompts[:2], keys=NO_EOS)
        e = start_engine("--max-context", "2048", "--threads", "2", "--drafting", "model", "--draft-model", str(draft))
        got = _run_all(e, prompts[:2], keys=NO_EOS)
        e.close()
    assert [g.tokens for g in got] == [g.tokens for g in ref]
    assert sum(int(g.done["drafts_off"]) for g in got) > 0
