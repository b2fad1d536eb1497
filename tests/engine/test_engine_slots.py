"""Batch slots on the real engine (--batch N): BGEN/RESUME/PP/T/DONE/BADM then BT/BDONE, BSTOP, BYIELD/YIELDED
and the resumed read, a solo GEN taking a slot's state back, and 8 concurrent chats whose greedy text equals
each chat run alone."""

import threading

from conftest import chat, parse_done

NO_EOS = "logit_bias=0:-inf,2:-inf"
QUESTIONS = ["What is the capital of France?", "Name a colour.", "What is 2+2?", "Say hi.",
             "Name an animal.", "What day follows Monday?", "Name a fruit.", "What is water made of?"]


def read_admission(e, slot):
    """Lines of one admission up to BADM: (resume, first token or None, done dict, badm flag, yielded)."""
    first, done, resume, yielded = None, None, None, None
    while True:
        line = e.line()
        assert line is not None, e.stderr_text()
        w = line.split()
        if w[0] == "RESUME":
            resume = int(w[1])
        elif w[0] == "T":
            first = int(w[1])
        elif w[0] == "YIELDED":
            yielded = (int(w[1]), int(w[2]))
        elif w[0] == "DONE":
            done = parse_done(line)
        elif w[0] == "BADM":
            assert int(w[1]) == slot
            return resume, first, done, w[2] == "1", yielded
        elif w[0] == "ERR":
            raise AssertionError(line)


def collect_slots(e, tokens, busy):
    """Reads BT/BDONE until every slot in `busy` is done; tokens[slot] gets each BT. Returns {slot: BDONE words}."""
    ends = {}
    while busy - set(ends):
        line = e.line()
        assert line is not None, e.stderr_text()
        w = line.split()
        if w[0] == "BT":
            tokens.setdefault(int(w[1]), []).append(int(w[2]))
        elif w[0] == "BDONE":
            ends[int(w[1])] = w
    return ends


def test_info_and_one_slot(start_engine, tok):
    e = start_engine("--max-context", "1024", "--batch", "2")
    assert e.info["batch_slots"] == "2" and e.info["slot_cache"] == "1" and e.info["batch_groups"] == "1"
    ids = chat(tok, "Name a colour.")
    e.send(f"BGEN 1 6 {NO_EOS} {','.join(map(str, ids))}")
    resume, first, done, cont, _ = read_admission(e, 1)
    assert resume == 0 and first is not None and cont
    assert done["generated"] == "1" and done["finish"] == "length"
    toks = {}
    ends = collect_slots(e, toks, {1})
    assert ends[1][2:4] == ["6", "length"] and len(toks[1]) == 5
    # the same request solo gives the same tokens, and it reuses the slot's state (solo again)
    g = e.gen(ids + [first] + toks[1][:-1], max_new=1, keys=NO_EOS)
    assert g.resume == len(ids) + 5 - 1
    assert g.tokens == toks[1][-1:]
    solo = e.gen(ids, max_new=6, keys=NO_EOS)
    assert solo.tokens == [first] + toks[1]
    # errors: busy/unknown slot
    e.send(f"BGEN 5 4 {','.join(map(str, ids))}")
    assert "no slot" in e.expect("ERR ")


def test_bgen_max_new_1_and_eos(start_engine, tok):
    e = start_engine("--max-context", "1024", "--batch", "2")
    ids = chat(tok, "Hi")
    e.send(f"BGEN 0 1 {','.join(map(str, ids))}")
    _, first, done, cont, _ = read_admission(e, 0)
    assert not cont and done["generated"] == "1"
    eos = int(e.info["eos"].split(",")[0])
    e.send(f"BGEN 0 8 logit_bias={eos}:100 {','.join(map(str, ids))}")
    _, first, done, cont, _ = read_admission(e, 0)
    assert first == eos and done["finish"] == "stop" and not cont


def test_bstop(start_engine, tok):
    e = start_engine("--max-context", "1024", "--batch", "2")
    ids = chat(tok, "Tell a long story.")
    e.send(f"BGEN 0 500 {NO_EOS} {','.join(map(str, ids))}")
    assert read_admission(e, 0)[3]
    seen = 0
    while seen < 3:
        if e.line().startswith("BT 0 "):
            seen += 1
    e.send("BSTOP 0")
    toks = {}
    ends = collect_slots(e, toks, {0})
    assert ends[0][3] == "cancel" and int(ends[0][2]) < 20
    # the slot is free again
    e.send(f"BGEN 0 2 {NO_EOS} {','.join(map(str, ids))}")
    r = read_admission(e, 0)
    assert r[0] > len(ids) - 2  # its conversation was kept
    collect_slots(e, {}, {0})


def test_byield_and_resume(start_engine, tok):
    e = start_engine("--max-context", "2048", "--batch", "2", "--chunk", "16")
    ids = chat(tok, " ".join(["The quick brown fox jumps over the lazy dog."] * 12))
    assert len(ids) > 64
    e.send("BYIELD 1")  # stale: written before the request, ignored by it
    e.send(f"GEN 4 {NO_EOS} {','.join(map(str, ids))}")
    e.expect("RESUME 0")
    e.expect("PP 16 ")
    e.send("BYIELD 1")
    lines = []
    while True:
        line = e.line()
        lines.append(line)
        if line.startswith("DONE "):
            break
    yielded = [l for l in lines if l.startswith("YIELDED ")]
    assert len(yielded) == 1, lines
    k = int(yielded[0].split()[2])
    assert 16 <= k < len(ids) and k % 16 == 0
    assert parse_done(lines[-1])["finish"] == "cancel"
    # re-sent as an admission into slot 1, it resumes from the k tokens held there
    e.send(f"BGEN 1 4 {NO_EOS} {','.join(map(str, ids))}")
    resume, first, done, cont, _ = read_admission(e, 1)
    assert resume >= k and cont
    toks = {}
    collect_slots(e, toks, {1})
    solo = e.gen(ids, max_new=4, keys=NO_EOS)
    assert [first] + toks[1] == solo.tokens


def test_admission_yields_in_its_slot(start_engine, tok):
    e = start_engine("--max-context", "2048", "--batch", "2", "--chunk", "16")
    ids = chat(tok, " ".join(["A long prompt about nothing in particular."] * 12))
    e.send(f"BGEN 0 4 {NO_EOS} {','.join(map(str, ids))}")
    e.expect("RESUME 0")
    e.expect("PP 16 ")
    e.send("BYIELD 0")
    resume, first, done, cont, yielded = read_admission(e, 0)
    assert yielded and yielded[0] == 0 and not cont and done["finish"] == "cancel" and first is None
    e.send(f"BGEN 0 4 {NO_EOS} {','.join(map(str, ids))}")
    resume, first, done, cont, _ = read_admission(e, 0)
    assert resume == yielded[1] and cont
    collect_slots(e, {}, {0})


def test_eight_concurrent_chats_equal_solo(start_engine, tok):
    n_new = 12
    prompts = [chat(tok, q) for q in QUESTIONS]
    e = start_engine("--max-context", "1024", "--batch", "8", "--conversation-cache-slots", "0")
    alone = [e.gen(p, max_new=n_new, keys=NO_EOS).tokens for p in prompts]
    e.close()
    e = start_engine("--max-context", "1024", "--batch", "8", "--conversation-cache-slots", "0")
    got, early = {}, {}
    for s, p in enumerate(prompts):  # admissions one at a time, the earlier slots decode meanwhile
        e.send(f"BGEN {s} {n_new} {NO_EOS} {','.join(map(str, p))}")
        while True:
            line = e.line()
            w = line.split()
            if w[0] == "T":
                got.setdefault(s, []).append(int(w[1]))  # the admission's first token comes before its BTs
            elif w[0] == "BT":
                got.setdefault(int(w[1]), []).append(int(w[2]))
            elif w[0] == "BADM":
                assert w[2] == "1"
                break
            elif w[0] == "BDONE":  # an earlier slot may finish while later prompts are read
                early[int(w[1])] = w
    toks = {}
    ends = {**early, **collect_slots(e, toks, set(range(8)) - set(early))}
    for s in range(8):
        got[s] = got.get(s, []) + toks.get(s, [])
    for s in range(8):
        assert ends[s][3] == "length"
        assert got[s] == alone[s], (s, tok.decode(got[s]), tok.decode(alone[s]))
    assert "Paris" in tok.decode(got[0])


def test_slots_decode_while_a_long_prompt_is_read(start_engine, tok):
    e = start_engine("--max-context", "2048", "--batch", "2", "--chunk", "16")
    short = chat(tok, "Tell a long story.")
    e.send(f"BGEN 0 400 {NO_EOS} {','.join(map(str, short))}")
    assert read_admission(e, 0)[3]
    long_ids = chat(tok, " ".join(["Reading a long prompt while another slot decodes."] * 10))
    e.send(f"BGEN 1 2 {NO_EOS} {','.join(map(str, long_ids))}")
    order = []
    while True:
        line = e.line()
        w = line.split()
        if w[0] in ("PP", "BT") or w[0] == "BADM":
            order.append(w[0])
        if w[0] == "BADM":
            break
    first_pp, last_pp = order.index("PP"), len(order) - 1 - order[::-1].index("PP")
    assert "BT" in order[first_pp:last_pp], order  # slot 0 produced tokens between the admission's chunks
    e.send("BSTOP 0")
    collect_slots(e, {}, {0, 1})


def test_stop_during_admission(start_engine, tok):
    e = start_engine("--max-context", "2048", "--batch", "2", "--chunk", "16")
    ids = chat(tok, " ".join(["A prompt that is read in many chunks."] * 12))
    e.send(f"BGEN 0 8 {NO_EOS} {','.join(map(str, ids))}")
    e.expect("RESUME 0")
    e.expect("PP 16 ")
    e.send("STOP")
    resume, first, done, cont, _ = read_admission(e, 0)
    assert done["finish"] == "cancel" and not cont and int(done["prompt_read"]) < len(ids)
