"""The protocol of the real engine on its default one slot: handshake, BGEN/BACC/BPP/BT/BDONE, every ERR case
(each followed by a working request), the over-long line, QUIT/EOF exit codes, bad flags and bad model files."""

import os
import subprocess

import pytest

from conftest import BDONE_FIELDS, Engine, chat

FRANCE = "What is the capital of France?"


def test_handshake_info_keys(engine):
    for key in ("engine", "arch", "n_vocab", "n_ctx_train", "context", "batch_slots", "slot_cache",
                "conversation_cache_slots", "im_start", "eos", "threads", "backend", "kernels"):
        assert key in engine.info, key
    assert engine.info["arch"] == "llama"
    assert engine.info["backend"] == "cpu"
    assert engine.info["context"] == "2048"
    assert engine.ready_line == "READY 2048 stop"
    assert engine.info["batch_slots"] == "1" and engine.info["slot_cache"] == "1"   # one slot by default
    assert int(engine.info["im_start"]) >= 0
    assert all(int(x) >= 0 for x in engine.info["eos"].split(","))


def test_france_paris_and_done_fields(engine, tok):
    ids = chat(tok, FRANCE)
    g = engine.gen(ids, max_new=16)
    assert g.err is None
    text = tok.decode(g.tokens)
    assert "Paris" in text, text
    d = g.done
    assert all(k in d for k in BDONE_FIELDS) and d["slot"] == "0"
    assert int(d["generated"]) == len(g.tokens)
    assert int(d["prompt"]) == len(ids)
    assert d["finish"] in ("stop", "length")
    if d["finish"] == "stop":
        assert g.tokens[-1] in [int(x) for x in engine.info["eos"].split(",")]
    assert d["drafts_acc"] == d["drafts_off"] == "-" and d["extra"] == {}   # it did not draft
    assert "." in d["prompt_ms"] and len(d["prompt_ms"].split(".")[1]) == 1
    assert int(d["reused"]) == g.resume == 0
    assert int(d["prompt_read"]) == len(ids)
    assert g.pp and g.pp[-1][0] == len(ids) and g.pp[-1][1] == len(ids)


def test_pp_per_chunk(start_engine, tok):
    e = start_engine("--max-context", "1024", "--chunk", "8")
    ids = chat(tok, "Name three colours of the rainbow, please.")
    g = e.gen(ids, max_new=1)
    reached = [int(p[0]) for p in g.pp]
    assert reached == sorted(reached) and reached[-1] == len(ids)
    assert len(g.pp) == (len(ids) + 7) // 8
    assert all(r % 8 == 0 for r in reached[:-1])


@pytest.mark.parametrize("line, reason", [
    ("BGEN 0 8 1,2,999999", "out of range"),
    ("BGEN 0 8 ", "empty prompt"),
    ("BGEN 0 8 temperature=0.5", "empty prompt"),
    ("BGEN 0 8 temperature=abc 1,2", "temperature"),
    ("BGEN 0 8 top_k=-3 1,2", "top_k"),
    ("BGEN 0 8 logit_bias=5 1,2", "logit_bias"),
    ("BGEN 0 8 stray 1,2", "malformed key"),
    ("BGEN 0 0 1,2", "max_new"),
    ("BGEN 0 x 1,2", "max_new"),
    ("BGEN 0 8 1,,2", "malformed id list"),
    ("BGEN 0 8 1,2,", "malformed id list"),
    ("BGEN 0 3000 1,2", "context"),
    ("FROB 1 2", "unknown command"),
    ("BGEN 1 4 1,2", "no slot 1"),
    ("BSTOP 3", "no slot"),
])
def test_err_then_working_gen(engine, tok, line, reason):
    engine.send(line)
    err = engine.expect("ERR ")
    assert reason in err, err
    g = engine.gen(chat(tok, "Hi"), max_new=2)
    assert g.err is None and g.done is not None and len(g.tokens) >= 1


def test_context_limit_is_n_plus_max_new_plus_8(engine):
    n = 100
    ids = [198] * n
    engine.send(f"BGEN 0 {2048 - n - 8 + 1} {','.join(map(str, ids))}")
    assert "context" in engine.expect("ERR ")
    g = engine.gen(ids, max_new=2048 - n - 8)  # exactly at the limit: accepted (then stopped early)
    assert g.err is None
    # (the engine stops at max_new or EOS; we only need acceptance here)


def test_unknown_keys_are_skipped(engine, tok):
    g = engine.gen(chat(tok, "Hi"), max_new=2, keys="future_key=7 pin=3")
    assert g.err is None and len(g.tokens) >= 1


def test_overlong_line_is_refused_and_engine_lives(engine, tok):
    big = "BGEN 0 4 " + ",".join(["198"] * (1_500_000))  # ~6 MiB
    assert len(big) > 4 * 1024 * 1024
    engine.send(big)
    err = engine.expect("ERR ")
    assert "MiB" in err
    g = engine.gen(chat(tok, "Hi"), max_new=2)
    assert g.err is None and g.done is not None


def test_quit_exits_zero(engine):
    engine.send("QUIT")
    assert engine.proc.wait(timeout=20) == 0


def test_eof_exits_zero(engine):
    engine.proc.stdin.close()
    assert engine.proc.wait(timeout=20) == 0


def test_unknown_flag_exit_2(engine_path, model_path):
    r = subprocess.run([str(engine_path), "--serve", "--model", str(model_path), "--frobnicate", "1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "usage" in r.stderr and r.stdout == ""


def test_the_retired_batch_groups_flag_is_refused_by_name(engine_path, model_path, engine):
    """--batch-groups was parsed and reported but never read by the slot loop: it is refused, not ignored,
    and INFO no longer reports batch_groups=."""
    r = subprocess.run([str(engine_path), "--serve", "--model", str(model_path), "--batch", "2", "--batch-groups",
                        "2"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stdout == ""
    assert "unknown flag --batch-groups: retired" in r.stderr.splitlines()[0]
    assert "batch_groups" not in engine.info and "--batch-groups" not in r.stderr.split("\n", 1)[1]


def test_bad_model_file_exit_1(engine_path, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    r = subprocess.run([str(engine_path), "--serve", "--model", str(bad)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert r.stdout == ""
    assert str(bad) in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run([str(engine_path), "--serve", "--model", str(tmp_path / "missing.gguf")], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 1 and r.stdout == ""


def test_cuda_backend_is_a_clear_error(engine_path, model_path):
    r = subprocess.run([str(engine_path), "--serve", "--model", str(model_path), "--backend", "cuda"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "CUDA" in r.stderr


def test_vram_answers_ram_figures(engine):
    engine.send("VRAM")
    line = engine.expect("VRAM ")
    assert "ram_free_mib=" in line and "backend=cpu" in line
