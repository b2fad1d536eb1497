"""Replays the golden protocol transcripts (tests/data/protocol_*.txt) against the real engine, and the batch
transcript against tests/fake_engine_slots.py too (the fake the server's slot tests run on). The format is
described at the top of each file; `load_transcript` and `match_line` are the reference reading of it."""

import pathlib
import re
import sys

import pytest

from conftest import Engine

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"
TRANSCRIPTS = sorted(DATA.glob("protocol_*.txt"))
WORD_PATTERNS = {
    "{int}": re.compile(r"-?\d+$"),
    "{id}": re.compile(r"\d+$"),
    "{num}": re.compile(r"-?\d+(\.\d+)?$"),
    "{*}": re.compile(r"\S+$"),
    "{lp}": re.compile(r"lp=(-?\d+\.\d+|-inf)$"),
    "{top}": re.compile(r"top=\d+:(-?\d+\.\d+|-inf)(,\d+:(-?\d+\.\d+|-inf))*$"),
}


def load_transcript(path):
    """-> (engine args, [(kind, text)]) with kind '>' (send), '<' (one line), '<*' (zero or more), '<+'."""
    args, items = [], []
    for raw in path.read_text().splitlines():
        if raw.startswith("#! args:"):
            args = raw.split(":", 1)[1].split()
        elif raw.startswith("#") or not raw.strip():
            continue
        else:
            kind, _, text = raw.partition(" ")
            assert kind in (">", "<", "<*", "<+"), raw
            items.append((kind, text))
    return args, items


def match_line(pattern, line, names):
    """Whether `line` matches `pattern`; binds {int=NAME} into `names` (only on a full match)."""
    pw, lw = pattern.split(" "), line.split(" ")
    bound = {}
    for i, p in enumerate(pw):
        if p == "{...}" and i == len(pw) - 1:
            break
        if i >= len(lw):
            return False
        w = lw[i]
        if p in WORD_PATTERNS:
            if not WORD_PATTERNS[p].match(w):
                return False
        elif p.startswith("{int=") and p.endswith("}"):
            if not WORD_PATTERNS["{int}"].match(w):
                return False
            bound[p[5:-1]] = w
        elif p.startswith("{=") and p.endswith("}"):
            if names.get(p[2:-1]) != w:
                return False
        elif p != w:
            return False
    else:
        if len(lw) != len(pw):
            return False
    names.update(bound)
    return True


def replay(engine, items):
    names, pending = {}, None  # pending: a line read ahead while matching a '<*'/'<+' run
    for n, (kind, text) in enumerate(items):
        if kind == ">":
            assert pending is None, f"unexpected line {pending!r} before sending {text!r}"
            engine.send(text)
            continue
        count = 0
        while True:
            line = pending if pending is not None else engine.line()
            pending = None
            assert line is not None, f"engine ended; expected {text!r}"
            if match_line(text, line, names):
                count += 1
                if kind == "<":
                    break
                continue
            assert kind != "<" and (kind == "<*" or count > 0), f"item {n}: expected {text!r}, got {line!r}"
            pending = line
            break
    assert pending is None, f"unexpected trailing line {pending!r}"


def test_match_line_rules():
    names = {}
    assert match_line("DONE {int} {num} - {...}", "DONE 3 1.5 - a b c", names)
    assert not match_line("T {id}", "T -1", names)
    assert not match_line("T 5", "T 5 6", names)
    assert match_line("T 5 {lp} {top}", "T 5 lp=-0.25 top=5:-0.25,9:-inf", names)
    assert not match_line("T 5 {lp}", "T 5 lp=0.5x", names) and not match_line("T 5 {lp} {top}", "T 5 lp=-1 top=", names)
    assert match_line("SAVED {int=b}", "SAVED 40", names) and names["b"] == "40"
    assert match_line("RESTORED {=b}", "RESTORED 40", names)
    assert not match_line("RESTORED {=b}", "RESTORED 41", names)


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[p.stem for p in TRANSCRIPTS])
def test_transcript_on_real_engine(engine_path, model_path, tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)  # relative SAVE/RESTORE paths land here
    args, items = load_transcript(path)
    e = Engine(engine_path, model_path, *args)
    try:
        # the Engine constructor consumed the handshake (INFO lines, READY): check READY against its item
        info_items = [it for it in items if it[0] != ">" and (it[1].startswith("INFO") or it[1].startswith("READY"))]
        assert info_items and match_line(info_items[-1][1], e.ready_line, {})
        assert e.info, "no INFO line before READY"
        body = [it for it in items if it not in info_items]
        replay(e, body)
        if items[-1] == (">", "QUIT"):
            assert e.proc.wait(timeout=20) == 0
        if path.stem == "protocol_session":
            assert (tmp_path / "golden.session").stat().st_mode & 0o777 == 0o600
    finally:
        e.close()


@pytest.mark.parametrize("name", ["protocol_batch", "protocol_embed", "protocol_logprobs"])
def test_batch_transcript_on_the_fake_engine(tmp_path, name):
    """The fake that the server's slot tests use speaks the same batch protocol (BEMB, logprobs=) as the real
    engine."""
    args, items = load_transcript(DATA / f"{name}.txt")
    fake = pathlib.Path(__file__).resolve().parents[1] / "fake_engine_slots.py"
    e = Engine(None, None, argv=[sys.executable, str(fake), "--serve", *args])
    try:
        info_items = [it for it in items if it[0] != ">" and (it[1].startswith("INFO") or it[1].startswith("READY"))]
        assert match_line(info_items[-1][1], e.ready_line, {})
        replay(e, [it for it in items if it not in info_items])
        assert e.proc.wait(timeout=20) == 0
    finally:
        e.close()
