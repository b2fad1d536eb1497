"""`logprobs=K` on the real engine and model (docs/PROTOCOL.md): the reported log-probabilities are the
log-softmax of the model's logits (checked against a double-precision log-softmax of the engine's own float
logits from build/strata-test-probe, within 1e-3, and against llama.cpp's logits for the same tokens within the
quantisation noise the parity tests allow); at temperature 0 the sampled token is the top entry; slot 1 reports
what slot 0 reports."""
import math

import pytest

from conftest import chat
from tests import oracle

STEPS = 6
TOP_K = 5


def _parse(line):
    """`T id lp=v top=i:v,...` (or `BT slot id ...`) -> (id, lp, [(i, v)])."""
    words = line.split()
    words = words[1:] if words[0] == "T" else words[2:]
    kv = dict(w.split("=", 1) for w in words[1:])
    top = [(int(i), float(v)) for i, v in (p.split(":") for p in kv["top"].split(","))] if "top" in kv else []
    return int(words[0]), float(kv["lp"]), top


def _log_softmax(row):
    top = max(row)
    norm = top + math.log(math.fsum(math.exp(v - top) for v in row))
    return [v - norm for v in row]


@pytest.fixture
def slot0(engine, tok):
    ids = chat(tok, "What is the capital of France?")
    g = engine.gen(ids, STEPS, f"logprobs={TOP_K}")
    assert g.finish in ("length", "stop"), g.lines
    return ids, [_parse(line) for line in g.lines if line.startswith("BT 0 ")]


def test_logprobs_are_the_log_softmax_of_the_logits_and_greedy_is_the_top(slot0, model_path, tok):
    ids, rows = slot0
    logits, greedy = oracle.engine_logits(model_path, ids, len(rows), tok.n_vocab, last_only=True)
    assert [r[0] for r in rows] == greedy[:len(rows)]
    for (tid, lp, top), row in zip(rows, logits):
        ref = _log_softmax(row)
        best = sorted(range(len(ref)), key=lambda i: (-ref[i], i))[:TOP_K]
        assert top[0] == (tid, lp)  # temperature 0: the sampled token is the top entry
        assert [i for i, _ in top] == best
        assert abs(lp - ref[tid]) < 1e-3 and all(abs(v - ref[i]) < 1e-3 for i, v in top)
        assert all(a[1] >= b[1] for a, b in zip(top, top[1:]))


def test_logprobs_near_llama_cpp(slot0, model_path):
    """llama.cpp quantises activations to 8 bits (README), so its logits differ from ours by a small share of
    their spread; the sampled tokens' log-probs agree to that noise."""
    ids, rows = slot0
    logits, _ = oracle.oracle_logits(model_path, ids + [r[0] for r in rows[:-1]], 1, last_only=False)
    theirs = logits[len(ids) - 1:]
    worst = max(abs(lp - _log_softmax(row)[tid]) for (tid, lp, _), row in zip(rows, theirs))
    print(f"largest |log-prob difference| to llama.cpp over {len(rows)} steps: {worst:.4f}")
    assert worst < 0.1, worst  # measured: 0.032 over 6 steps


def test_slot_1_reports_what_slot_0_reports(start_engine, tok):
    e = start_engine("--max-context", "2048", "--threads", "2", "--batch", "2")
    ids = chat(tok, "What is the capital of France?")
    g = e.gen(ids, STEPS, f"logprobs={TOP_K}")
    slot0_rows = [_parse(line) for line in g.lines if line.startswith("BT 0 ")]
    e.send(f"BGEN 1 {STEPS} logprobs={TOP_K} {','.join(map(str, ids))}")
    lines = []
    while not lines or not lines[-1].startswith("BDONE"):
        lines.append(e.line())
    same = [_parse(line) for line in lines if line.startswith("BT ")]
    assert [r[0] for r in same] == [r[0] for r in slot0_rows]
    for a, b in zip(same, slot0_rows):
        assert abs(a[1] - b[1]) < 1e-3 and [i for i, _ in a[2]] == [i for i, _ in b[2]]


def test_a_bgen_reuses_the_prefix_of_a_busy_slot(start_engine, tok):
    """Several choices of one prompt (serve/generation/choices.py): once slot 0 has read the prompt and decodes, a BGEN of
    the same prompt into slot 1 takes its prefix from slot 0 and reads one token; both then decode, and at
    temperature 0 they agree (the copy is exact)."""
    e = start_engine("--max-context", "1024", "--threads", "2", "--batch", "2")
    ids = chat(tok, "Tell a long story about a cat.")
    ban = "logit_bias=0:-100,2:-100"
    e.send(f"BGEN 0 12 {ban} {','.join(map(str, ids))}")
    assert e.expect("BACC 0 ") == "BACC 0 0"
    line = e.line()
    while not line.startswith("BT 0 "):
        line = e.line()
    e.send(f"BGEN 1 11 {ban} {','.join(map(str, ids))}")
    tokens, done = {0: [int(line.split()[2])], 1: []}, set()
    line = e.line()
    while not line.startswith("BACC"):
        if line.startswith("BT "):
            tokens[int(line.split()[1])].append(int(line.split()[2]))
        line = e.line()
    assert line == f"BACC 1 {len(ids) - 1}"
    while done != {0, 1}:
        line = e.line()
        w = line.split()
        if w[0] == "BT":
            tokens[int(w[1])].append(int(w[2]))
        elif w[0] == "BDONE":
            done.add(int(w[1]))
            if w[1] == "1":
                assert w[-1] == "1"  # prompt_read: one token
    assert len(tokens[1]) == 11 and tokens[1] == tokens[0][:11]


CODE = "".join(f"def area_{i}(w, h):\n    return w * h + {i}\n\n" for i in range(8))
N_DRAFTED = 32


def _slot_rows(e, slot, n, keys, ids):
    """BGEN into `slot`, read to its BDONE: ([(id, lp, top)], the BDONE words)."""
    e.send(f"BGEN {slot} {n} {keys} {','.join(map(str, ids))}")
    lines = [e.line()]
    while not lines[-1].startswith("BDONE"):
        lines.append(e.line())
    return [_parse(line) for line in lines if line.startswith("BT ")], lines[-1].split()


def _same_rows(a, b):
    """Same tokens, same top ids, log-probs within 1e-3 (the rows of a multi-token verification step are the
    same computation as one-token steps; the bound allows the summation order of a batched evaluation)."""
    assert [r[0] for r in a] == [r[0] for r in b]
    worst = 0.0
    for (_, lp_a, top_a), (_, lp_b, top_b) in zip(a, b):
        assert [i for i, _ in top_a] == [i for i, _ in top_b]
        worst = max([worst, abs(lp_a - lp_b)] + [abs(x[1] - y[1]) for x, y in zip(top_a, top_b)])
    assert worst < 1e-3, worst
    return worst


def test_logprobs_with_drafting_equal_those_without(start_engine, tok):
    """Drafting verifies several tokens in one step (engine/drafting.h): each token's log-probs must come from
    the verification row that produced it, not from the step's last (or first) row. A prompt the reply copies,
    greedy, so prompt-lookup drafts are accepted; in slot 0 alone and in slot 1 beside it."""
    ids = chat(tok, f"Copy this code exactly, then stop:\n\n{CODE}")
    keys = f"logprobs={TOP_K} logit_bias=0:-inf,2:-inf"
    runs = {}
    for mode in ("off", "lookup"):
        e = start_engine("--max-context", "2048", "--threads", "2", "--batch", "2", "--drafting", mode)
        g = e.gen(ids, N_DRAFTED, keys)
        assert g.finish == "length", g.lines[-2:]
        slot, bdone = _slot_rows(e, 1, N_DRAFTED, keys, ids)
        runs[mode] = ([_parse(line) for line in g.lines if line.startswith("BT 0 ")], g.done, slot, bdone)
        e.close()
    (slot0_off, _, slot_off, _), (slot0_on, done_on, slot_on, bdone_on) = runs["off"], runs["lookup"]
    assert int(done_on["drafts_acc"]) >= 10, done_on  # drafts were accepted: several tokens per step
    assert int(dict(w.split("=") for w in bdone_on if "=" in w)["drafts_acc"]) >= 10, bdone_on
    print(f"slot 0: drafts {done_on['drafts_acc']}/{done_on['drafts_off']}, worst |d lp| "
          f"{_same_rows(slot0_on, slot0_off):.2e}; slot 1: {bdone_on[-2:]}, worst {_same_rows(slot_on, slot_off):.2e}")
    assert all(top[0] == (tid, lp) for tid, lp, top in slot0_on + slot_on)  # greedy: the top entry


def test_post_sampling_probs_are_the_draws_distribution(engine, tok):
    """lp_post=1 (llama-server's post_sampling_probs): with nothing truncating (temperature 1, no top_k / top_p /
    min_p) the draw's distribution is the model's own, so the values equal logprobs=K's; with top_k 3 only
    three tokens are listed and their probabilities sum to 1; greedy puts all the mass on the token."""
    ids = chat(tok, "Write two sentences about a cat.")
    free = "temperature=1 top_k=0 top_p=1 min_p=0 seed=5"
    pre = [_parse(line) for line in engine.gen(ids, 4, f"logprobs={TOP_K} {free}").lines if line.startswith("BT 0 ")]
    post = [_parse(line) for line in engine.gen(ids, 4, f"logprobs={TOP_K} lp_post=1 {free}").lines
            if line.startswith("BT 0 ")]
    _same_rows(post, pre)
    cut = [_parse(line) for line in engine.gen(ids, 4, f"logprobs={TOP_K} lp_post=1 temperature=1 top_k=3 seed=5")
           .lines if line.startswith("BT 0 ")]
    for tid, lp, top in cut:
        assert len(top) == 3 and abs(sum(math.exp(v) for _, v in top) - 1.0) < 1e-4, top
        assert (tid, lp) in top
    greedy = [_parse(line) for line in engine.gen(ids, 2, "logprobs=2 lp_post=1").lines if line.startswith("BT 0 ")]
    assert all(lp == 0.0 and top == [(tid, 0.0)] for tid, lp, top in greedy), greedy
