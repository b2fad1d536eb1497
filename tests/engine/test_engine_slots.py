"""Batch slots on the real engine (--batch N): BGEN accepted at once (BACC), the read in the step loop
(BPP), BT from the first token, BDONE with the request's figures; BSTOP while reading or decoding; a short
prompt admitted during a long read gets its first token before that read ends; slot 0 resumes from the
stream slot 1 holds; 8 concurrent chats whose greedy text equals each chat run alone."""

import json
import threading

from conftest import chat

NO_EOS = "logit_bias=0:-inf,2:-inf"
QUESTIONS = ["What is the capital of France?", "Name a colour.", "What is 2+2?", "Say hi.",
             "Name an animal.", "What day follows Monday?", "Name a fruit.", "What is water made of?"]
BDONE_FIELDS = ("slot", "generated", "finish", "decode_ms", "prompt", "prompt_ms", "reused", "prompt_read")


def until(e, prefix):
    """The next line starting with `prefix` (other slots' lines before it are skipped)."""
    while True:
        line = e.line()
        assert line is not None, e.stderr_text()
        if line.startswith(prefix):
            return line
        assert not line.startswith("ERR "), line


def accept(e, slot, max_new, ids, keys=NO_EOS):
    """BGEN, then its BACC: the reused count."""
    e.send(f"BGEN {slot} {max_new} {keys} {','.join(map(str, ids))}".replace("  ", " "))
    w = until(e, "BACC ").split()
    assert int(w[1]) == slot
    return int(w[2])


def bdone(words):
    return dict(zip(BDONE_FIELDS, words[1:]))


def collect_slots(e, tokens, busy, order=None):
    """Reads BPP/BT/BDONE until every slot in `busy` is done; tokens[slot] gets each BT. Returns {slot: BDONE
    dict}; `order` (a list) gets (kind, slot) of every line."""
    ends = {}
    while busy - set(ends):
        line = e.line()
        assert line is not None, e.stderr_text()
        w = line.split()
        assert w[0] != "ERR", line
        if order is not None and w[0] in ("BPP", "BT", "BDONE"):
            order.append((w[0], int(w[1])))
        if w[0] == "BT":
            tokens.setdefault(int(w[1]), []).append(int(w[2]))
        elif w[0] == "BDONE":
            ends[int(w[1])] = bdone(w)
    return ends


def test_info_and_one_slot(start_engine, tok):
    e = start_engine("--max-context", "1024", "--batch", "2")
    assert e.info["batch_slots"] == "2" and e.info["slot_cache"] == "1" and int(e.info["step_tokens"]) > 8
    ids = chat(tok, "Name a colour.")
    assert accept(e, 1, 6, ids) == 0
    toks = {}
    end = collect_slots(e, toks, {1})[1]
    assert end["generated"] == "6" and end["finish"] == "length" and len(toks[1]) == 6
    assert end["prompt"] == str(len(ids)) and end["prompt_read"] == str(len(ids)) and end["reused"] == "0"
    assert float(end["prompt_ms"]) > 0 and float(end["decode_ms"]) > 0
    # slot 0 resumes from the stream slot 1 holds, and the same request alone gives the same tokens
    g = e.gen(ids + toks[1], max_new=1, keys=NO_EOS)
    assert g.resume == len(ids) + 5  # the slot held prompt + generated minus the last
    again = e.gen(ids, max_new=6, keys=NO_EOS)
    assert again.tokens == toks[1]
    e.send(f"BGEN 5 4 {','.join(map(str, ids))}")
    assert "no slot" in e.expect("ERR ")


def test_busy_slot_refused_at_once(start_engine, tok):
    e = start_engine("--max-context", "1024", "--batch", "2")
    ids = chat(tok, "Tell a long story.")
    accept(e, 0, 300, ids)
    e.send(f"BGEN 0 4 {','.join(map(str, ids))}")
    while not (line := e.line()).startswith("ERR "):
        assert line.startswith(("BPP 0 ", "BT 0 ")), line
    assert "busy" in line
    e.send("BSTOP 0")
    assert collect_slots(e, {}, {0})[0]["finish"] == "cancel"


def test_bgen_max_new_1_and_eos(start_engine, tok):
    e = start_engine("--max-context", "1024", "--batch", "2")
    ids = chat(tok, "Hi")
    accept(e, 0, 1, ids)
    toks = {}
    assert collect_slots(e, toks, {0})[0]["generated"] == "1" and len(toks[0]) == 1
    eos = int(e.info["eos"].split(",")[0])
    accept(e, 0, 8, ids, keys=f"logit_bias={eos}:100")
    toks = {}
    end = collect_slots(e, toks, {0})[0]
    assert toks[0] == [eos] and end["finish"] == "stop"


def test_bstop_while_decoding(start_engine, tok):
    e = start_engine("--max-context", "1024", "--batch", "2")
    ids = chat(tok, "Tell a long story.")
    accept(e, 0, 500, ids)
    seen = 0
    while seen < 3:
        if e.line().startswith("BT 0 "):
            seen += 1
    e.send("BSTOP 0")
    end = collect_slots(e, {}, {0})[0]
    assert end["finish"] == "cancel" and int(end["generated"]) < 20 and float(end["decode_ms"]) > 0
    # the slot is free again and kept its conversation
    assert accept(e, 0, 2, ids) > len(ids) - 2
    collect_slots(e, {}, {0})


def test_bstop_while_reading(start_engine, tok):
    e = start_engine("--max-context", "2048", "--batch", "2", "--step-tokens", "16")
    ids = chat(tok, " ".join(["A prompt that is read in many steps."] * 12))
    accept(e, 0, 8, ids)
    e.expect("BPP 0 16 ")
    e.send("BSTOP 0")
    toks = {}
    end = collect_slots(e, toks, {0})[0]
    assert end["finish"] == "cancel" and end["generated"] == "0" and 0 not in toks
    k = int(end["prompt_read"])
    assert 16 <= k < len(ids) and float(end["prompt_ms"]) > 0
    # what was read stays in the slot: the same prompt resumes from there and equals a run in slot 0 alone
    assert accept(e, 0, 4, ids) >= k
    toks = {}
    collect_slots(e, toks, {0})
    assert toks[0] == e.gen(ids, max_new=4, keys=NO_EOS).tokens


def test_short_prompt_overtakes_a_long_read(start_engine, tok):
    e = start_engine("--max-context", "4096", "--batch", "2", "--step-tokens", "32")
    long_ids = chat(tok, " ".join(["Reading a long prompt while another request comes in."] * 40))
    short = chat(tok, "Say hi.")
    assert len(long_ids) > 10 * 32
    accept(e, 0, 2, long_ids)
    e.expect("BPP 0 32 ")
    accept(e, 1, 3, short)
    order = []
    collect_slots(e, {}, {0, 1}, order)
    first_short = order.index(("BT", 1))
    assert ("BPP", 0) in order[first_short:], order  # the long read was still going on
    steps_before = [k for k in order[:first_short] if k == ("BPP", 0)]
    assert len(steps_before) <= 2, order  # the short prompt's first token came within a step or two


def test_slots_decode_while_a_long_prompt_is_read(start_engine, tok):
    e = start_engine("--max-context", "2048", "--batch", "2", "--step-tokens", "16")
    short = chat(tok, "Tell a long story.")
    accept(e, 0, 400, short)
    until(e, "BT 0 ")
    long_ids = chat(tok, " ".join(["Reading a long prompt while another slot decodes."] * 10))
    accept(e, 1, 2, long_ids)
    order = []
    while ("BT", 1) not in order:
        w = e.line().split()
        if w[0] in ("BPP", "BT"):
            order.append((w[0], int(w[1])))
    reads = [i for i, k in enumerate(order) if k[0] == "BPP"]
    assert ("BT", 0) in order[reads[0]:reads[-1]], order  # slot 0 produced tokens between the chunks
    e.send("BSTOP 0")
    collect_slots(e, {}, {0, 1})


def test_eight_concurrent_chats_equal_each_alone(start_engine, tok):
    n_new = 12
    prompts = [chat(tok, q) for q in QUESTIONS]
    e = start_engine("--max-context", "1024", "--batch", "8", "--conversation-cache-slots", "0")
    alone = [e.gen(p, max_new=n_new, keys=NO_EOS).tokens for p in prompts]
    e.close()
    e = start_engine("--max-context", "1024", "--batch", "8", "--conversation-cache-slots", "0",
                     "--step-tokens", "48")
    for s, p in enumerate(prompts):  # all admitted at once: reads share steps, earlier slots decode meanwhile
        e.send(f"BGEN {s} {n_new} {NO_EOS} {','.join(map(str, p))}")
    got = {}
    ends = collect_slots(e, got, set(range(8)))
    for s in range(8):
        assert ends[s]["finish"] == "length"
        assert got[s] == alone[s], (s, tok.decode(got[s]), tok.decode(alone[s]))
    assert "Paris" in tok.decode(got[0])


def test_bstop_stamps_are_per_request(start_engine, tok):
    """A BSTOP written before a BGEN is stale for it; one written right after it (before the loop took it)
    stops it."""
    e = start_engine("--max-context", "1024", "--batch", "2")
    ids = chat(tok, "Name a fruit.")
    e.send("BSTOP 1")
    accept(e, 1, 4, ids)
    assert collect_slots(e, {}, {1})[1]["finish"] == "length"
    lines = [f"BGEN 1 50 {NO_EOS} {','.join(map(str, ids))}", "BSTOP 1"]
    threading.Thread(target=lambda: [e.send(x) for x in lines]).start()
    e.expect("BACC 1 ")
    assert collect_slots(e, {}, {1})[1]["finish"] == "cancel"


def _flushed_reads(engine_path, model_path, ids, flush_ms, n_new=96):
    """One BGEN on an engine started with --token-flush-ms `flush_ms`, stdout read raw: (BT token ids in order,
    [(arrival time, BT lines in that read)] for every read that carried one)."""
    import os
    import subprocess
    import time
    p = subprocess.Popen([str(engine_path), "--serve", "--model", str(model_path), "--max-context", "1024",
                          "--batch", "2", "--token-flush-ms", str(flush_ms)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
    buf, tokens, reads, sent, head = b"", [], [], False, []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            chunk = os.read(p.stdout.fileno(), 1 << 16)
            assert chunk, "the engine ended early"
            now, buf = time.monotonic(), buf + chunk
            *lines, buf = buf.split(b"\n")
            bt = [ln for ln in lines if ln.startswith(b"BT ")]
            if bt:
                reads.append((now, len(bt)))
                tokens += [int(ln.split()[2]) for ln in bt]
            head += [] if sent else lines
            if not sent and any(ln.startswith(b"READY") for ln in lines):
                assert f" token_flush_ms={flush_ms} ".encode() in b" ".join(head)
                p.stdin.write(f"BGEN 0 {n_new} {NO_EOS} {','.join(map(str, ids))}\n".encode())
                sent = True
            if any(ln.startswith(b"BDONE ") for ln in lines):
                return tokens, reads
        raise AssertionError("no BDONE")
    finally:
        p.kill()
        p.wait()


def test_token_flush_holds_token_lines(engine_path, model_path, tok):
    """--token-flush-ms N: a slot's first BT goes out at once, the later ones at most every N ms, several to a
    write; the lines are those of an engine that writes each at once (same tokens, same order)."""
    ids = chat(tok, "Tell a long story.")
    each, each_reads = _flushed_reads(engine_path, model_path, ids, 0)
    held, held_reads = _flushed_reads(engine_path, model_path, ids, 80)
    assert held == each and len(held) == 96
    assert held_reads[0][1] == 1  # the first token is not held
    span = held_reads[-1][0] - held_reads[1][0]
    # the later reads are at least ~80 ms apart, so they are few (some slack for the last, BDONE-flushed one)
    assert len(held_reads) - 1 <= span / 0.08 + 2, (len(held_reads), span)
    assert max(n for _, n in held_reads) > 1
    assert len(each_reads) > len(held_reads)


def test_ping_is_answered_idle_and_between_steps(start_engine, tok):
    # liveness: PING <n> proves the loop itself turns (not only that the process exists): PONG at once when
    # idle, between two decode steps while a slot decodes, and a malformed PING is an ERR that keeps it running
    e = start_engine("--max-context", "1024", "--batch", "2")
    e.send("PING 1")
    assert until(e, "PONG ") == "PONG 1"
    accept(e, 0, 400, chat(tok, "Tell a long story."))
    seen = 0
    while seen < 3:
        if e.line().startswith("BT 0 "):
            seen += 1
    e.send("PING 2")
    tokens_before_pong = 0
    while True:
        line = e.line()
        assert line is not None, e.stderr_text()
        if line.startswith("PONG "):
            break
        assert not line.startswith("BDONE"), "the request ended before the PONG: it came after the whole reply"
        tokens_before_pong += line.startswith("BT 0 ")
    assert line == "PONG 2" and tokens_before_pong < 50
    e.send("PING x")
    assert until(e, "ERR ").startswith("ERR PING")
    e.send("BSTOP 0")
    collect_slots(e, {}, {0})


def test_slot_save_erase_restore_onto_another_slot(start_engine, tok, tmp_path):
    # llama-server's /slots/{id}?action=save|erase|restore on the engine: a slot's tokens and KV to a file,
    # erased, restored onto another idle slot; the restored cache serves the next turn (reused, not re-read)
    # and its greedy continuation equals the one an uninterrupted run gives
    e = start_engine("--max-context", "1024", "--batch", "2")
    ids = chat(tok, "Tell a long story about a cat.")
    tokens = {}
    assert accept(e, 0, 16, ids) == 0
    collect_slots(e, tokens, {0})
    first = tokens[0]
    path = tmp_path / "slot0.bin"
    e.send(f"BSAVE 0 {path}")
    saved = until(e, "SAVED ").split()
    assert int(saved[1]) >= len(ids) + len(first) - 1 and path.stat().st_size == int(saved[2])
    e.send("BERASE 0")
    assert until(e, "ERASED ").split()[1:3] == ["0", saved[1]]
    e.send(f"BRESTORE 1 {path}")
    assert until(e, "RESTORED ").split()[1] == saved[1]
    tokens = {}
    reused = accept(e, 1, 16, ids + first)
    assert reused >= len(ids) + len(first) - 2      # the restored cache, not a re-read
    collect_slots(e, tokens, {1})
    e.send(f"BRESTORE 1 {tmp_path / 'missing.bin'}")
    assert until(e, "SERR ")
    e.send("BERASE 7")
    assert until(e, "ERR ").startswith("ERR BERASE")
    # the uninterrupted run: the same prompt for 32 tokens on a fresh engine
    e2 = start_engine("--max-context", "1024", "--batch", "2")
    accept(e2, 0, 32, ids)
    ref = {}
    collect_slots(e2, ref, {0})
    assert first == ref[0][:16] and tokens[1] == ref[0][16:32]


def _gbnf_key(text):
    """grammar=<GBNF> as the protocol carries it: every byte outside '!'..'~', and '%' and '=', as %XX."""
    return "grammar=" + "".join(c if "!" <= c <= "~" and c not in "%=" else f"%{ord(c):02X}" for c in text)


def test_bclose_ends_a_constrained_slot_with_its_shortest_completion(start_engine, tok):
    # the server's loop guard stops a constrained reply with BCLOSE so that what was written still parses: the
    # engine writes the grammar's shortest completion and ends `length`; without a grammar, BCLOSE is an ERR
    e = start_engine("--max-context", "1024", "--batch", "2")
    grammar = _gbnf_key('root ::= "[" "1" ( "," "1" )* "]"')
    accept(e, 0, 200, chat(tok, "Count ones."), keys=f"{NO_EOS} {grammar}")
    e.send("BCLOSE 0")
    tokens = {}
    end = collect_slots(e, tokens, {0})[0]
    assert tok.decode(tokens[0]) == "[1]" and end["finish"] == "length", (tok.decode(tokens[0]), end)
    accept(e, 1, 400, chat(tok, "Count ones."), keys=f"{NO_EOS} {grammar}")
    tokens = {1: []}
    while len(tokens[1]) < 6:
        tokens[1].append(int(until(e, "BT 1 ").split()[2]))
    e.send("BCLOSE 1")
    end = collect_slots(e, tokens, {1})[1]
    text = tok.decode(tokens[1])
    assert end["finish"] == "length" and json.loads(text) == [1] * text.count("1"), (text, end)
    accept(e, 0, 50, chat(tok, "Say hi."))
    e.send("BCLOSE 0")
    assert until(e, "ERR ").startswith("ERR BCLOSE")
    e.send("BSTOP 0")
    collect_slots(e, {}, {0})


def test_one_slot_reads_in_chunks_and_is_timed(start_engine, tok):
    # --batch 1 (the server's --parallel 1): nothing is admitted beside a read, so the prompt is read in
    # --chunk pieces (multiples of the chunk from position 0), and the request's read and decode are timed
    env = {"STRATA_PF_TIMING": "1", "STRATA_STEP_TIMING": "1"}
    e = start_engine("--max-context", "1024", "--batch", "1", "--chunk", "8", "--step-tokens", "64", env=env)
    ids = chat(tok, "Name three colours of the rainbow, then three animals that live in the sea, please.")
    assert len(ids) > 16
    accept(e, 0, 5, ids)
    order, toks = [], {}
    end = collect_slots(e, toks, {0}, order)[0]
    assert end["generated"] == "5" and end["prompt_read"] == str(len(ids))
    e.close()
    n_bpp = sum(1 for kind, _ in order if kind == "BPP")
    assert n_bpp == (len(ids) + 7) // 8   # 8-token chunks, not one 64-token step
    err = e.stderr_lines
    pf = [ln for ln in err if ln.startswith("pf timing: ")]
    assert len(pf) == 1, err
    fields = dict(w.split("=") for w in pf[0].split()[2:])
    assert int(fields["tokens"]) == len(ids) and float(fields["read"]) > 0
    assert 2 <= int(fields["records"]) <= 2 * n_bpp + 2
    assert [ln.split()[2] for ln in err if ln.startswith("prefill timing: ")] == [f"steps={len(ids)}"]
    assert [ln.split()[2] for ln in err if ln.startswith("step timing: ")] == ["steps=4"]


def test_a_second_admission_ends_the_timing(start_engine, tok):
    # with more slots a lone request is timed; one admitted beside it would mix its figures in: no lines
    e = start_engine("--max-context", "1024", "--batch", "2", env={"STRATA_STEP_TIMING": "1"})
    ids = chat(tok, "Tell a long story.")
    accept(e, 0, 40, ids)
    until(e, "BT 0 ")
    accept(e, 1, 3, chat(tok, "Name a colour."))
    collect_slots(e, {}, {0, 1})
    accept(e, 1, 3, chat(tok, "Name a fruit."))   # alone again: timed
    collect_slots(e, {}, {1})
    e.close()
    steps = [ln.split()[2] for ln in e.stderr_lines if ln.startswith("step timing: ")]
    assert steps == ["steps=2"], e.stderr_lines
