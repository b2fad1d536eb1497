"""The batch path on the real engine and model (skips when the engine has no batch slots or no model):
8 concurrent greedy chats give the same tokens as each alone on a one-slot engine; a short question sent while a
4K-token prompt is read gets its first token before that read ends (the engine's steps read it first)."""
import os
import threading
import time

import pytest

from serve.engine_client.engine import StrataEngine
from tests.conftest import ENGINE_EXE, model_path

ENGINE = os.environ.get("STRATA_TEST_ENGINE") or ENGINE_EXE


class _Busy:
    """The most slots decoding at once, from the engine's BT/BDONE lines (StrataEngine's on_line hook)."""

    def __init__(self):
        self.now, self.most = set(), 0
        self.lock = threading.Lock()  # guards now, most (the pump thread writes, the test reads)

    def __call__(self, line):
        with self.lock:
            w = line.split()
            if w[0] == "BT":
                self.now.add(w[1])
                self.most = max(self.most, len(self.now))
            elif w[0] == "BDONE":
                self.now.discard(w[1])


def _engine(slots, ctx=8192, on_line=None):
    model = model_path()
    if model is None or not os.access(ENGINE, os.X_OK):
        pytest.skip("needs build/strata-engine (or STRATA_TEST_ENGINE) and the default model")
    batch = ["--batch", str(slots)] if slots else []
    e = StrataEngine([ENGINE], ["--model", model, *batch, "--max-context", str(ctx)], on_line=on_line)
    e.start()
    if slots and not e.info.get("batch_slots"):
        e.close()
        pytest.skip("this engine build has no batch slots")
    return e


def _prompt(i):  # a chat-like id stream; 1 = <|im_start|>, 2 = <|im_end|> in SmolLM2
    return [1, 9690, 198] + [1000 + 37 * i + k for k in range(40)] + [2, 198, 1, 520, 9531, 198]


def _ids(e, ids, max_new, firsts=None, key=None):
    out = []
    for t in e.generate(ids, max_new):
        if t is None:
            continue
        if firsts is not None and not out:
            firsts[key] = time.monotonic()
        out.append(t)
    return out


def test_eight_concurrent_chats_match_each_alone():
    one_slot = _engine(0)
    try:
        alone = [_ids(one_slot, _prompt(i), 16) for i in range(8)]  # each alone on the default one slot
    finally:
        one_slot.close()
    busy = _Busy()
    e = _engine(8, on_line=busy)
    try:
        got = {}
        ts = [threading.Thread(target=lambda i=i: got.setdefault(i, _ids(e, _prompt(i), 16))) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(240)
        assert [got.get(i) for i in range(8)] == alone
        assert e.batch.stats()["busy"] == 0
        assert busy.most >= 2, "the chats never decoded side by side in slots"
    finally:
        e.close()


def test_short_question_goes_first_while_a_long_prompt_is_read():
    e = _engine(2)
    try:
        long_ids = [1, 9690, 198] + [(500 + 13 * k) % 40000 + 100 for k in range(4000)] + [2, 198, 1, 520, 198]
        firsts = {}
        tl = threading.Thread(target=lambda: _ids(e, long_ids, 4, firsts, "long"))
        tl.start()
        deadline = time.monotonic() + 60
        while e.progress[0] < 600 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert e.progress[0] >= 600, "the long read never started"
        short = _ids(e, _prompt(0), 4, firsts, "short")
        tl.join(300)
        assert short and firsts["short"] < firsts["long"]
    finally:
        e.close()


def test_soak_no_crossed_replies_with_hang_ups_and_engine_kills():
    """STRATA_SOAK_N requests (skipped unless set; the closing figures of issue 17 come from N=1000) from 8
    threads on the real model, greedy: each reply must be a start of its prompt's answer alone (a crossed
    reply would not be), with random hang-ups (the generator closed mid-reply) and the engine killed at
    random moments (those requests fail with EngineDied and the next ones restart it)."""
    import random

    from serve.engine_client.engine import EngineDied
    n = int(os.environ.get("STRATA_SOAK_N", "0") or 0)
    if n <= 0:
        pytest.skip("set STRATA_SOAK_N to run the soak")
    prompts = [_prompt(i) for i in range(16)]
    one_slot = _engine(0)
    try:
        ref = [_ids(one_slot, p, 12) for p in prompts]
    finally:
        one_slot.close()
    e = _engine(8)
    counts = {"ok": 0, "hung_up": 0, "died": 0, "crossed": 0, "kills": 0}
    lock = threading.Lock()  # guards counts and `left`
    left = [n]

    def client(seed):
        rnd = random.Random(seed)
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            i = rnd.randrange(len(prompts))
            stop_at = rnd.choice([None, None, 1, 3, 6])
            got, kind = [], "ok"
            deadline = time.monotonic() + 120  # a client that got a 503 comes back once the engine is up
            while not e.alive() and time.monotonic() < deadline:
                try:
                    e.ensure_running()
                except EngineDied:
                    pass
                time.sleep(0.05)
            try:
                g = e.generate(prompts[i], 12)
                for t in g:
                    if t is not None:
                        got.append(t)
                    if stop_at is not None and len(got) >= stop_at:
                        g.close()
                        kind = "hung_up"
                        break
            except EngineDied:
                kind = "died"
            with lock:
                counts[kind] += 1
                if got != ref[i][:len(got)] or (kind == "ok" and got != ref[i]):
                    counts["crossed"] += 1

    def killer(stop):
        rnd = random.Random(99)
        while not stop.wait(rnd.uniform(5.0, 15.0)):
            proc = e.current()
            if proc is not None and proc.popen.poll() is None:
                proc.popen.kill()
                with lock:
                    counts["kills"] += 1

    stop = threading.Event()
    tk = threading.Thread(target=killer, args=(stop,), daemon=True)
    ts = [threading.Thread(target=client, args=(s,)) for s in range(8)]
    try:
        tk.start()
        for t in ts:
            t.start()
        for t in ts:
            t.join(3600)
    finally:
        stop.set()
        e.close()
    print(f"soak: {n} requests: {counts}")
    assert counts["crossed"] == 0 and sum(counts[k] for k in ("ok", "hung_up", "died")) == n, counts
