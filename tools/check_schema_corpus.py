"""Constrained replies over the schema corpus always parse: N replies over random schemas, seeds and budgets.

    python3 tools/check_schema_corpus.py                 # 200 replies, the real engine and the default model
    python3 tools/check_schema_corpus.py --replies 40 --seed 7

The corpus is tests/data/schema_corpus.json (schemas in the shapes of public structured-output and MCP tool
examples, written here). Each reply is a /v1/chat/completions call with `response_format: json_schema`, a random
schema of the corpus, a random sampling seed at temperature 1 and a random `max_tokens` between BUDGET_MIN and
BUDGET_MAX: it must be a 200 whose content parses as JSON and validates against the schema (jsonschema, the
independent oracle, a test-only dependency, with `multipleOf` read as exact decimals), whether it finished
`stop` or `length` — or, where the budget is below the tokens the schema's shortest document takes (a 16-token
budget for a schema with a uuid and two dates), a 400 that says so (finish `refused` in the summary): no budget
cuts a reply into invalid JSON.
Prints one line per failure and a summary (replies, finish reasons, seconds); exit status 0 when none failed.
tests/serve/scenarios/test_schema_corpus_real.py runs a smaller sample of the same draw in `./strata test`.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import time
from fractions import Fraction

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "data", "schema_corpus.json")
BUDGET_MIN, BUDGET_MAX = 16, 128  # the "budgets from 16 tokens up"; 128 lets most replies finish
REPLIES = 200


def load_corpus() -> dict:
    with open(CORPUS, encoding="utf-8") as f:
        return json.load(f)


def draw(cases: list, n: int, seed: int) -> list:
    """n (case, sampling seed, max_tokens) triples, the same for the same `seed`."""
    rng = random.Random(seed)
    return [(rng.choice(cases), rng.randrange(1 << 20), rng.randint(BUDGET_MIN, BUDGET_MAX)) for _ in range(n)]


def request_body(case: dict, seed: int, budget: int) -> dict:
    return {"messages": [{"role": "user", "content": case["prompt"] + " Answer as JSON."}],
            "temperature": 1, "seed": seed, "max_tokens": budget,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": case["name"], "schema": case["schema"]}}}


def exact_validator(schema: dict):
    """jsonschema's Draft 2020-12 validator with `multipleOf` read as exact decimals, as JSON Schema defines it
    and the grammar compiles it (its own check divides floats: 0.07 / 0.01 is 7.000000000000001 there, so it
    would call 0.07 no multiple of 0.01). A float's repr is the decimal it was written as."""
    import jsonschema

    def multiple_of(validator, step, instance, _schema):
        if validator.is_type(instance, "number") and Fraction(repr(instance)) % Fraction(repr(step)):
            yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {step!r}")
    return jsonschema.validators.extend(jsonschema.Draft202012Validator, {"multipleOf": multiple_of})(schema)


def check_reply(case: dict, status: int, reply) -> tuple[str | None, str]:
    """(the problem or None, the finish reason) of one reply."""
    if status == 400 and "shortest reply takes" in json.dumps(reply):
        return None, "refused"  # the budget is below the schema's shortest document: a 400 that says so
    if status != 200:
        return f"status {status}: {reply}", "-"
    choice = reply["choices"][0]
    text = choice["message"]["content"]
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as e:
        return f"does not parse ({e}): {text!r}", choice["finish_reason"]
    problem = next(iter(exact_validator(case["schema"]).iter_errors(value)), None)
    return (None if problem is None else f"invalid ({problem.message}): {text!r}"), choice["finish_reason"]


def run(post, n: int, seed: int) -> tuple[list, collections.Counter]:
    """Send n drawn replies through `post(path, body) -> (status, reply)`: (failures, finish reasons)."""
    failures, finishes = [], collections.Counter()
    for case, s, budget in draw(load_corpus()["compiles"], n, seed):
        status, reply = post("/v1/chat/completions", request_body(case, s, budget))
        problem, finish = check_reply(case, status, reply)
        finishes[finish] += 1
        if problem:
            failures.append(f"{case['name']} seed={s} max_tokens={budget}: {problem}")
    return failures, finishes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replies", type=int, default=REPLIES)
    ap.add_argument("--seed", type=int, default=29, help="the draw's seed (schemas, sampling seeds, budgets)")
    ap.add_argument("--parallel", type=int, default=2, help="engine decode slots (strata serve --parallel)")
    a = ap.parse_args()
    sys.path.insert(0, ROOT)
    import http.client
    from tools.bench_server import start_server, stop_server

    proc, port = start_server(["--parallel", str(a.parallel)], ready_s=300)

    def post(path, body):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        c.close()
        return r.status, json.loads(raw)
    t0 = time.monotonic()
    try:
        failures, finishes = run(post, a.replies, a.seed)
    finally:
        stop_server(proc)
    for line in failures:
        print("FAIL", line)
    print(f"{a.replies} replies, {len(failures)} failed, finish {dict(finishes)}, {time.monotonic() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
