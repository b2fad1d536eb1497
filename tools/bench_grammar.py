"""Decode speed with and without a JSON Schema grammar on the same prompt (goal: constrained >= 90 %).

Role: a benchmark, run by hand (`python3 tools/bench_grammar.py [--model M] [--threads T] [--runs R]`). One
engine (`build/strata-engine`, driven through its line protocol as tools/bench_engine.py does); one chat
prompt asking for a long JSON list; DECODE_TOKENS tokens generated unconstrained (end-of-turn banned so both
runs are the same length) and under the grammar of SCHEMA (serve/generation/json_schema.py; its minItems keeps it from
ending first). Decode tok/s from the BDONE line (decode_ms covers the tokens after the first). The first
constrained run meets every grammar state for the first time (each mask is one walk of the token trie);
later runs with the same grammar text reuse the engine's cached masks. Runs alternate (the machine is
shared) and the best of --runs is kept. Prints one small table.

Public surface: main(argv).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from serve.generation.constrain import grammar_key  # noqa: E402
from serve.generation.json_schema import schema_grammar  # noqa: E402
from serve.prompt.chatml import ChatTemplate  # noqa: E402
from serve.core.events import Message  # noqa: E402
from tools.bench_engine import BAN_EOS_BIAS, Engine, engine_bench_args  # noqa: E402
from tokenizer.bpe import Tokenizer  # noqa: E402

DECODE_TOKENS = 256
QUESTION = "Write a JSON list of 40 fictional people, each with a name, a city and an age."
SCHEMA = {"type": "array", "minItems": 40, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                     "city": {"type": "string", "maxLength": 40},
                                     "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "city", "age"]}}


def tok_s(generated, decode_ms):
    return (generated - 1) / (decode_ms / 1000.0) if generated > 1 and decode_ms > 0 else 0.0


def main(argv=None):
    args = engine_bench_args(__doc__, argv)
    tok = Tokenizer.from_gguf(args.model)
    rendered = ChatTemplate.from_text(tok.chat_template).render([Message(role="user", content=QUESTION)])
    ids = tok.encode(rendered.text, parse_special=True)
    grammar = grammar_key(schema_grammar(SCHEMA))
    eng = Engine(args.engine, args.model, args.threads)
    try:
        eng.gen(1, ids)  # warm the mapping; the prompt stays in the session for every run below
        free, constrained, cold = [], [], None
        for _ in range(args.runs):
            g, _, _, ms = eng.gen(DECODE_TOKENS, ids, "logit_bias=" + BAN_EOS_BIAS)
            free.append(tok_s(g, ms))
            g, _, _, ms = eng.gen(DECODE_TOKENS, ids, grammar)
            if cold is None:
                cold = tok_s(g, ms)
            constrained.append(tok_s(g, ms))
    finally:
        eng.close()
    best_free, best_con = max(free), max(constrained)
    print(f"decode {DECODE_TOKENS} tokens, {args.threads} threads, best of {args.runs}")
    print("| run | tok/s | vs unconstrained |")
    print("|---|---|---|")
    print(f"| unconstrained | {best_free:.1f} | 100 % |")
    print(f"| JSON Schema, first request (masks computed) | {cold:.1f} | {100 * cold / best_free:.0f} % |")
    print(f"| JSON Schema, same grammar again (masks cached) | {best_con:.1f} | {100 * best_con / best_free:.0f} % |")


if __name__ == "__main__":
    main()
