"""The batch path on the real engine and model (skips when the engine has no batch slots or no model):
8 concurrent greedy chats give the same tokens as each alone on a solo engine; a short question sent while a
4K-token prompt is read gets its first token before that read ends (the engine's steps read it first)."""
import os
import threading
import time

import pytest

from serve.engine import StrataEngine
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
    solo = _engine(0)
    try:
        alone = [_ids(solo, _prompt(i), 16) for i in range(8)]  # each alone: a solo GEN
    finally:
        solo.close()
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
