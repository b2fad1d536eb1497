"""Fuzzed protocol lines never crash or hang the real engine: hypothesis writes lines built from the
protocol's words (commands, keys, id lists, junk bytes); after each line a PING must still be answered.
Bounded: a few hundred lines in one engine process."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import Engine

VERBS = ["GEN", "BGEN", "STOP", "BSTOP", "BYIELD", "BACC", "VRAM", "SAVE", "RESTORE", "BSAVE", "BRESTORE", "EMB",
         "BEMB", "BCLOSE", "BERASE", "PING", "GENI", "BGENI", "QUIT_NOT", "gen", ""]
KEYS = ["temperature", "top_p", "top_k", "min_p", "penalty_repeat", "penalty_freq", "penalty_present",
        "penalty_last_n", "seed", "logit_bias", "ckpt", "pin", "x"]
NUMS = ["0", "1", "-1", "2", "7", "99999999999", "0.5", "nan", "inf", "-inf", "1e40", "", "abc", "3:4", "5:-inf"]

word = st.one_of(
    st.sampled_from(NUMS),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS), st.sampled_from(NUMS)),
    st.lists(st.integers(min_value=-2, max_value=60000), min_size=0, max_size=6).map(
        lambda xs: ",".join(map(str, xs))),
    st.text(alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=12),
)
line = st.builds(lambda v, ws: " ".join([v] + ws), st.sampled_from(VERBS), st.lists(word, max_size=6))


@pytest.fixture(scope="module")
def fuzz_engine(engine_path, model_path, tmp_path_factory):
    # BSAVE/BRESTORE paths the fuzzer may form are relative: run in a scratch directory
    import os
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("fuzz"))
    e = Engine(engine_path, model_path, "--max-context", "256", "--batch", "2", "--threads", "1", "--chunk", "4")
    yield e
    e.close()
    os.chdir(cwd)


_PINGS = iter(range(1, 1 << 30))


def drain_until_alive(e):
    """Sends a PING and reads until its PONG: the loop took every line before it (a slot the fuzz line started
    may still write after it; the caller stops the slots and drains again)."""
    n = next(_PINGS)
    e.send(f"PING {n}")
    for _ in range(10000):
        l = e.line(timeout=30)
        assert l is not None, f"engine died; stderr:\n{e.stderr_text()}"
        if l == f"PONG {n}":
            return
    raise AssertionError(f"no PONG {n}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=line)
def test_fuzzed_lines_never_crash(fuzz_engine, text):
    e = fuzz_engine
    text = text.replace("\n", " ").replace("\r", " ")
    if text.split()[:1] == ["QUIT"]:
        return
    # slot decodes the fuzzer starts must not keep running into the next example
    e.send(text.encode("utf-8", "replace").decode("utf-8"))
    drain_until_alive(e)
    e.send("BSTOP 0")
    e.send("BSTOP 1")
    drain_until_alive(e)
    assert e.proc.poll() is None


# Whole command sequences written at once, so that BSTOP lands while reads and slots run (BYIELD, GEN and STOP are
# retired: ERR).
step = st.sampled_from([
    "BGEN 0 20 logit_bias=0:-inf,2:-inf 1,4093,198,72,2,100",
    "BGEN 1 5 1,4093,198,50",
    "BGEN 1 5 1,4093,198,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64,65,66,67,68",
    "STOP", "BSTOP 0", "BSTOP 1", "BYIELD 0", "BYIELD 1", "VRAM", "GEN 1 1,99999", "BGEN 0 4",
    "BEMB 1 1,4093,198", "BCLOSE 0", "PING 7",
])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=10))
def test_fuzzed_interleavings_never_crash(fuzz_engine, steps):
    e = fuzz_engine
    e.send("\n".join(steps))
    drain_until_alive(e)
    e.send("BSTOP 0")
    e.send("BSTOP 1")
    drain_until_alive(e)
    assert e.proc.poll() is None
