"""serve/generation/json_schema.py without a model: keywords outside the subset are refused by name, and the grammar of a
non-recursive schema, inlined into a Python regex, accepts exactly what it should (integer ranges checked
value by value, property order and optionality, item counts, formats, lengths)."""
import json
import os
import re

import pytest

from serve.generation.json_schema import SchemaError, schema_grammar

TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|\{\d+(?:,\d*)?\}|[A-Za-z0-9_-]+|::=|[()|*+?]|\s+')


def gbnf_regex(grammar: str) -> re.Pattern:
    """The grammar as a regex (rules inlined; fails on recursion, which these schemas do not have)."""
    rules = dict(line.split(" ::= ", 1) for line in grammar.splitlines() if line)

    def expr(name, depth=0):
        assert depth < 50, "recursive grammar"
        out = []
        for tok in TOKEN.findall(rules[name]):
            if tok.isspace():
                continue
            if tok.startswith('"'):
                out.append(re.escape(json.loads(tok.replace("\\x", "\\u00"))))
            elif tok.startswith("[") or tok.startswith("{") or tok in "|*+?)":
                out.append(tok)
            elif tok == "(":
                out.append("(?:")
            else:
                out.append(f"(?:{expr(tok, depth + 1)})")
        return "".join(out)
    return re.compile(expr("root"), re.S)


def accepts(schema, text) -> bool:
    return gbnf_regex(schema_grammar(schema)).fullmatch(text) is not None


@pytest.mark.parametrize("lo, hi", [(0, 120), (-3, 7), (-250, -17), (5, None), (None, -5), (1, 1), (99, 1001)])
def test_integer_ranges_are_exact(lo, hi):
    schema = {"type": "integer"}
    if lo is not None:
        schema["minimum"] = lo
    if hi is not None:
        schema["maximum"] = hi
    rx = gbnf_regex(schema_grammar(schema))
    for v in range(-1200, 1200):
        inside = (lo is None or v >= lo) and (hi is None or v <= hi)
        assert (rx.fullmatch(str(v)) is not None) == inside, (v, lo, hi)
    assert not rx.fullmatch("007") and not rx.fullmatch("1.5")


def test_exclusive_bounds_on_integers_and_number_sign():
    assert accepts({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3}, "2")
    assert not accepts({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3}, "3")
    assert accepts({"type": "number", "minimum": 0}, "0.5e3") and not accepts({"type": "number", "minimum": 0}, "-1")


NUMBER_BOUNDS = [
    {"minimum": 0, "maximum": 10}, {"minimum": 0, "maximum": 1}, {"minimum": 0.0, "maximum": 0.5},
    {"minimum": -1.5, "exclusiveMaximum": 0.25}, {"exclusiveMinimum": 0}, {"maximum": -2.75},
    {"minimum": 1.05, "maximum": 1.2}, {"exclusiveMinimum": -3, "exclusiveMaximum": 3},
    {"minimum": 5, "exclusiveMinimum": 5.5}, {"minimum": 99.9}]


def _written(k: int, scale: int) -> list[str]:
    """k / scale written as JSON numbers with 0..3 fraction digits (and trailing zeros)."""
    out = [str(k // scale)] if k % scale == 0 else []
    sign, m = ("-" if k < 0 else ""), abs(k)
    for digits in (1, 2, 3):
        step = scale // 10 ** digits
        if step and m % step == 0:
            out.append(f"{sign}{m // scale}.{str(m % scale // step).zfill(digits)}")
    return out


@pytest.mark.parametrize("bounds", NUMBER_BOUNDS)
def test_number_ranges_are_exact_to_the_written_digits(bounds):
    # every number from -12 to 112 in steps of 0.001, written with 0..3 fraction digits, is accepted exactly
    # when it is inside the bounds (the grammar writes a bounded number without an exponent)
    from fractions import Fraction
    rx = gbnf_regex(schema_grammar({"type": "number", **bounds}))
    lo = bounds.get("minimum", bounds.get("exclusiveMinimum"))
    hi = bounds.get("maximum", bounds.get("exclusiveMaximum"))

    def inside(x):
        ok = True
        for key, v in bounds.items():
            v = Fraction(repr(v)) if isinstance(v, float) else Fraction(v)
            ok &= {"minimum": x >= v, "maximum": x <= v, "exclusiveMinimum": x > v, "exclusiveMaximum": x < v}[key]
        return ok
    for k in range(-12000, 112000, 7 if lo is None or hi is None else 1):
        x = Fraction(k, 1000)
        for text in _written(k, 1000):
            assert (rx.fullmatch(text) is not None) == inside(x), (text, bounds)
    assert not rx.fullmatch("1e2") and not rx.fullmatch("-0") and not rx.fullmatch("01.5")


def test_multiple_of():
    rx = gbnf_regex(schema_grammar({"type": "integer", "multipleOf": 5, "minimum": -12, "maximum": 30}))
    assert [v for v in range(-40, 40) if rx.fullmatch(str(v))] == list(range(-10, 31, 5))
    rx = gbnf_regex(schema_grammar({"type": "integer", "multipleOf": 100}))
    assert [v for v in range(-1000, 1001) if rx.fullmatch(str(v))] == list(range(-1000, 1001, 100))
    assert accepts({"type": "number", "multipleOf": 2, "minimum": 0, "maximum": 4}, "4")
    assert not accepts({"type": "number", "multipleOf": 2, "minimum": 0, "maximum": 4}, "2.0")


DECIMAL_STEPS = [(0.5, {}), (0.25, {}), (0.2, {}), (0.125, {}), (0.1, {}), (0.05, {}), (0.01, {}),
                 (0.01, {"minimum": -1.5, "maximum": 2}), (0.1, {"exclusiveMinimum": 0, "exclusiveMaximum": 1}),
                 (0.25, {"minimum": -1, "maximum": 1}), (2.5, {"minimum": 0, "exclusiveMaximum": 10}),
                 (0.3, {"minimum": -1, "maximum": 3}), (0.05, {"minimum": 0.1, "maximum": 0.35}),
                 (0.5, {"minimum": 0}), (0.25, {"exclusiveMinimum": -2.5}), (0.2, {"maximum": 1.3}),
                 (0.125, {"minimum": -3000, "exclusiveMaximum": 2.875}), (0.5, {"exclusiveMinimum": -1.5,
                                                                                 "exclusiveMaximum": 2000}),
                 (0.25, {"minimum": -2.3, "maximum": -0.6}), (0.5, {"exclusiveMaximum": 0})]


@pytest.mark.parametrize("step, bounds", DECIMAL_STEPS)
def test_decimal_multiple_of_is_exact_to_the_written_digits(step, bounds):
    # every number from -3 to 3 in steps of 0.001, written with 0..3 fraction digits: what the grammar accepts
    # is a multiple (as exact decimals, JSON Schema's meaning) inside the bounds, and every such multiple is
    # accepted written in its shortest form
    from fractions import Fraction
    rx = gbnf_regex(schema_grammar({"type": "number", "multipleOf": step, **bounds}))
    q = Fraction(repr(step))
    limits = {k: Fraction(repr(v)) for k, v in bounds.items()}

    def fits(x):
        return x % q == 0 and all({"minimum": x >= v, "maximum": x <= v, "exclusiveMinimum": x > v,
                                   "exclusiveMaximum": x < v}[k] for k, v in limits.items())
    n_fit = 0
    for k in range(-3000, 3001):
        x = Fraction(k, 1000)
        texts = _written(k, 1000)
        for text in texts:
            assert rx.fullmatch(text) is None or fits(x), (text, step, bounds)
        if fits(x):
            n_fit += 1
            shortest = min(texts, key=len) if k % 1000 else str(k // 1000)
            assert rx.fullmatch(shortest), (shortest, step, bounds)
    assert n_fit >= 2 and not rx.fullmatch("1e0")


def test_objects_keep_order_required_and_no_extras():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"},
                                               "c": {"type": "null"}}, "required": ["b"]}
    for text, ok in (('{"b":true}', True), ('{"a":1,"b":false}', True), ('{ "a": 1 ,"b":true,"c":null }', True),
                     ('{"a":1}', False), ('{"b":true,"a":1}', False), ('{"b":true,"d":1}', False),
                     ('{"b":true,}', False), ('{,"b":true}', False)):
        assert accepts(schema, text) == ok, text


def test_arrays_counts_prefix_items_and_formats():
    arr = {"type": "array", "items": {"enum": ["x", 1]}, "minItems": 1, "maxItems": 3}
    assert [accepts(arr, t) for t in ("[]", '["x"]', '["x",1,1]', '["x",1,1,1]', '[2]')] == \
        [False, True, True, False, False]
    pre = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False}
    assert [accepts(pre, t) for t in ("[]", "[1]", '[1,"a"]', '[1,"a",2]', '["a"]')] == \
        [True, True, True, False, False]
    # draft 4's tuple form (llama.cpp's suite sends {"items": [{"type": "integer"}]}): those elements, no more
    tup = {"items": [{"type": "integer"}]}
    assert [accepts(tup, t) for t in ("[]", "[-3000]", "[1,2]", '["a"]')] == [True, True, False, False]
    assert accepts({"type": "string", "format": "date"}, '"2024-02-28"')
    assert not accepts({"type": "string", "format": "date"}, '"2024-13-01"')
    assert accepts({"type": "string", "format": "uuid"}, '"123e4567-e89b-12d3-a456-426614174000"')
    assert accepts({"type": "string", "format": "date-time"}, '"2024-01-02T03:04:05Z"')
    s = {"type": "string", "minLength": 2, "maxLength": 3}
    assert [accepts(s, t) for t in ('"a"', '"ab"', '"a\\nc"', '"abcd"')] == [False, True, True, False]


def test_type_lists_anyof_const_and_local_refs():
    assert accepts({"type": ["string", "null"]}, "null") and accepts({"type": ["string", "null"]}, '"x"')
    assert accepts({"anyOf": [{"const": "a"}, {"type": "integer"}]}, "12")
    ref = {"$defs": {"p": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
           "type": "array", "items": {"$ref": "#/$defs/p"}, "maxItems": 2}
    assert accepts(ref, '[{"n":1},{"n":2}]') and not accepts(ref, '[{"m":1}]')


def test_string_patterns_match_whole_in_json_text():
    code = {"type": "string", "pattern": r"^[A-Z]{2}-\d+$"}
    assert [accepts(code, t) for t in ('"AB-12"', '"AB-"', '"ab-1"', '"AB-1x"')] == [True, False, False, False]
    quoted = {"type": "string", "pattern": 'say "hi"'}   # a quote the pattern allows is written escaped
    assert accepts(quoted, '"say \\"hi\\""') and not accepts(quoted, '"say "hi""')
    anything = {"type": "string", "pattern": "a.c"}    # `.` never writes a raw quote or backslash
    assert accepts(anything, '"abc"') and not accepts(anything, '"a"c"')


def test_whitespace_is_bounded():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert accepts(schema, "{" + " " * 20 + "}") and not accepts(schema, "{" + " " * 21 + "}")


@pytest.mark.parametrize("schema, word", [
    ({"type": "string", "pattern": r"(a)\1"}, "pattern"),
    ({"type": "string", "pattern": "a", "maxLength": 3}, "pattern beside"),
    ({"allOf": [{"type": "string"}]}, "'allOf'"),
    ({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}, "'uniqueItems'"),
    ({"type": "number", "multipleOf": 0.3}, "multipleOf 0.3"),
    ({"type": "number", "multipleOf": 2.5, "minimum": 0}, "multipleOf 2.5"),
    ({"type": "number", "multipleOf": 0.5, "minimum": 0.1, "maximum": 0.4}, "none between"),
    ({"type": "integer", "multipleOf": 7}, "multipleOf 7"),
    ({"type": "number", "minimum": 2, "exclusiveMaximum": 2}, "no number fits"),
    ({"type": "string", "format": "email"}, "'email'"),
    ({"$ref": "https://example.com/s.json"}, "local refs"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "required"),
    ({"type": "integer", "minimum": 5, "maximum": 2}, "no integer fits"),
    ({"type": "thing"}, "type"),
])
def test_outside_the_subset_is_refused_by_name(schema, word):
    with pytest.raises(SchemaError) as e:
        schema_grammar(schema)
    assert word in str(e.value)


CORPUS = json.load(open(os.path.join(os.path.dirname(__file__), "..", "..", "data", "schema_corpus.json")))


@pytest.mark.parametrize("case", CORPUS["compiles"], ids=lambda c: c["name"])
def test_corpus_schema_compiles(case):
    # a corpus schema is a valid JSON Schema (checked by the independent oracle) and compiles to a grammar
    jsonschema = pytest.importorskip("jsonschema", reason="the independent validator (requirements-test.txt)")
    jsonschema.Draft202012Validator.check_schema(case["schema"])
    assert "root ::= " in schema_grammar(case["schema"])


@pytest.mark.parametrize("case", CORPUS["refused"], ids=lambda c: c["name"])
def test_corpus_schema_is_refused_by_name(case):
    with pytest.raises(SchemaError) as e:
        schema_grammar(case["schema"])
    assert case["names"] in str(e.value)
