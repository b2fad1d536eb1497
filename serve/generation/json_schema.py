"""JSON Schema -> a GBNF grammar the engine applies as a token mask (docs/PROTOCOL.md, `grammar=`).

Role: one compiler for every API that asks for JSON (OpenAI `response_format`, strict or forced tool calls,
Anthropic forced tool use, llama.cpp's `json_schema`). The grammar's sentences are JSON texts that validate
against the schema: where the schema allows more than the grammar can say exactly, the grammar allows a
subset of the valid documents (never a superset), and a keyword outside the subset is a `SchemaError`
naming it (the translators turn it into a 400) — never a silently unconstrained answer.

The subset: `type` (a name or a list), `properties`, `required`, `additionalProperties` (absent or false: only
the listed properties, in their listed order; true or a schema on an object without `properties`: any keys),
`enum`, `const`, `items` (a schema or false), `prefixItems`, `minItems`/`maxItems`, `anyOf`/`oneOf` (oneOf as
anyOf: its branches should not overlap), local `$ref` into `$defs`/`definitions` (recursion allowed),
`minLength`/`maxLength`, `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum` on integers (exact ranges)
and on numbers (exact for decimals of up to FRAC_DIGITS_MAX fraction digits; a bounded number is written
without an exponent), `pattern` on strings (serve/generation/regex_grammar.py's subset; matched whole, a valid subset of JSON
Schema's match-anywhere), `multipleOf` (serve/generation/json_numbers.py: exact decimal multiples; on integers a
power of ten, or at most MULTIPLES_MAX multiples between both bounds, and a whole multipleOf on a number makes
it an integer; on numbers 0.1 / 0.01 (at most that many fraction digits), 1/n such as 0.5, or at most
MULTIPLES_MAX multiples between both bounds), `format` date, date-time, time and uuid
(date days 01-28: a valid subset).
Annotations (`title`, `description`, `default`, `examples`, `$schema`, `$id`, `$comment`, `deprecated`,
`readOnly`, `writeOnly`, `nullable`-free) are ignored. Whitespace between tokens is at most `WS_MAX` characters
so a model cannot pad forever; numbers have bounded digits.

Public surface: `schema_grammar(schema) -> str`, `ANY_OBJECT_GRAMMAR` (`json_object`), `SchemaError`,
`gbnf_literal(text)`. Knows no HTTP and no engine.
"""
from __future__ import annotations

import json
import math
import re
from fractions import Fraction

from serve.generation.json_numbers import (
    FRAC_DIGITS_MAX, INT_DIGITS_MAX, MULTIPLES_MAX, decimal_multiples, exact, int_bounds, integer_multiples,
    integer_range, number_range, real_bounds)
from serve.generation.regex_grammar import RegexError, gbnf_literal, regex_grammar

WS_MAX = 20          # spaces/newlines between two tokens: room for pretty-printing a few levels deep
GRAMMAR_MAX_BYTES = 1 << 20  # a bigger grammar (a huge enum) is refused, not sent
REF_DEPTH_MAX = 64

ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
               "readOnly", "writeOnly", "$defs", "definitions"}
HANDLED = {"type", "properties", "required", "additionalProperties", "enum", "const", "items", "prefixItems",
           "minItems", "maxItems", "anyOf", "oneOf", "$ref", "minLength", "maxLength", "minimum", "maximum",
           "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "format", "pattern"}
TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")
FORMATS = ("date", "date-time", "time", "uuid")

_BASE_RULES = {
    "ws": f"[ \\t\\n]{{0,{WS_MAX}}}",
    "char": '[^"\\\\\\x00-\\x1f] | "\\\\" ( ["\\\\/bfnrt] | "u" [0-9a-fA-F]{4} )',
    "string": '"\\"" char* "\\""',
    "int": f'"-"? ( "0" | [1-9] [0-9]{{0,{INT_DIGITS_MAX - 1}}} )',
    "frac": f'"." [0-9]{{1,{FRAC_DIGITS_MAX}}}',
    "exp": '[eE] [-+]? [0-9]{1,3}',
    "number": "int frac? exp?",
    "boolean": '"true" | "false"',
    "null": '"null"',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"',
    "array": '"[" ws ( value ws ( "," ws value ws )* )? "]"',
    "date": '[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] )',
    "time": '( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? '
            '( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )',
    "date-time": 'date "T" time',
    "uuid": '[0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12}',
}
# what each base rule needs besides itself
_BASE_DEPS = {"string": ["char"], "number": ["int", "frac", "exp"], "value": ["object", "array", "string",
              "number", "boolean", "null"], "object": ["ws", "string", "value"], "array": ["ws", "value"],
              "date-time": ["date", "time"]}


class SchemaError(ValueError):
    """The schema uses something outside the subset (or is malformed); `path` names where."""

    def __init__(self, message: str, path: str = ""):
        super().__init__(f"{message} (at {path or 'the schema root'})")
        self.path = path


def _json_literal(value) -> str:
    return gbnf_literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


class _Compiler:
    def __init__(self, root: dict):
        self.root = root
        self.rules: dict[str, str] = {}
        self.base: set[str] = set()
        self.refs: dict[str, str] = {}
        self.n = 0

    def use(self, name: str) -> str:
        if name not in self.base:
            self.base.add(name)
            for dep in _BASE_DEPS.get(name, []):
                self.use(dep)
        return name

    def new_rule(self, body: str, hint: str = "r") -> str:
        self.n += 1
        name = f"{re.sub(r'[^a-zA-Z0-9]', '-', hint)[:24] or 'r'}-{self.n}"
        self.rules[name] = body
        return name

    def ref(self, ref: str, path: str) -> str:
        if ref in self.refs:
            return self.refs[ref]
        m = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", ref) if isinstance(ref, str) else None
        if ref == "#":
            target = self.root
        elif m and isinstance(self.root.get(m.group(1)), dict) and m.group(2) in self.root[m.group(1)]:
            target = self.root[m.group(1)][m.group(2)]
        else:
            raise SchemaError(f"$ref {str(ref)[:80]!r}: only local refs into $defs/definitions are supported",
                              path)
        name = self.new_rule("", "ref-" + ref.rsplit("/", 1)[-1])
        self.refs[ref] = name
        self.rules[name] = self.schema(target, f"{path}/$ref")
        return name

    def schema(self, s, path: str) -> str:
        """The GBNF expression (alternatives) of one schema."""
        if s is True or s == {}:
            return self.use("value")
        if s is False:
            raise SchemaError("a false schema allows nothing", path)
        if not isinstance(s, dict):
            raise SchemaError("a schema is an object", path)
        for key in s:
            if key not in HANDLED and key not in ANNOTATIONS:
                raise SchemaError(f"keyword {key!r} is not supported", f"{path}/{key}")
        if "$ref" in s:
            others = set(s) - ANNOTATIONS - {"$ref"}
            if others:
                raise SchemaError(f"$ref beside {sorted(others)[0]!r} is not supported", path)
            return self.ref(s["$ref"], path)
        if "const" in s:
            return _json_literal(s["const"])
        if "enum" in s:
            if not isinstance(s["enum"], list) or not s["enum"]:
                raise SchemaError("enum: a non-empty list", f"{path}/enum")
            return " | ".join(_json_literal(v) for v in s["enum"])
        for key in ("anyOf", "oneOf"):
            if key in s:
                branches = s[key]
                if not isinstance(branches, list) or not branches:
                    raise SchemaError(f"{key}: a non-empty list of schemas", f"{path}/{key}")
                rest = {k: v for k, v in s.items() if k != key}
                if set(rest) - ANNOTATIONS:
                    raise SchemaError(f"{key} beside {sorted(set(rest) - ANNOTATIONS)[0]!r} is not supported",
                                      path)
                return " | ".join(self.new_rule(self.schema(b, f"{path}/{key}/{i}"), key)
                                  for i, b in enumerate(branches))
        types = s.get("type", list(TYPES) if set(s) <= ANNOTATIONS else None)
        if types is None:  # no type: infer it from the keywords
            types = [t for t, keys in (("object", ("properties", "additionalProperties")),
                                       ("array", ("items", "prefixItems", "minItems", "maxItems")),
                                       ("string", ("minLength", "maxLength", "format", "pattern")),
                                       ("number", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                                   "multipleOf")))
                     if any(k in s for k in keys)]
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or not types or any(t not in TYPES for t in types):
            raise SchemaError(f"type: one of {', '.join(TYPES)} or a list of them", f"{path}/type")
        alts = [self.typed(t, s, path) for t in dict.fromkeys(types)]
        return alts[0] if len(alts) == 1 else " | ".join(self.new_rule(a, "alt") for a in alts)

    def typed(self, t: str, s: dict, path: str) -> str:
        if t == "string":
            return self.string(s, path)
        if t in ("integer", "number"):
            return self.number(t, s, path)
        if t == "object":
            return self.object(s, path)
        if t == "array":
            return self.array(s, path)
        return self.use(t)

    def string(self, s: dict, path: str) -> str:
        if "pattern" in s:
            if set(s) & {"format", "minLength", "maxLength"}:
                raise SchemaError("pattern beside format/minLength/maxLength is not supported", path)
            try:
                return f'"\\"" ( {regex_grammar(s["pattern"], json_string=True)} ) "\\""'
            except RegexError as e:
                raise SchemaError(f"pattern: {e}", f"{path}/pattern") from None
        fmt = s.get("format")
        if fmt is not None:
            if fmt not in FORMATS:
                raise SchemaError(f"format {str(fmt)[:40]!r} is not supported (supported: {', '.join(FORMATS)})",
                                  f"{path}/format")
            if "minLength" in s or "maxLength" in s:
                raise SchemaError("minLength/maxLength beside format is not supported", path)
            return f'"\\"" {self.use(fmt)} "\\""'
        lo, hi = s.get("minLength", 0), s.get("maxLength")
        for key, v in (("minLength", lo), ("maxLength", hi)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > 4096):
                raise SchemaError(f"{key}: an integer from 0 to 4096", f"{path}/{key}")
        if hi is not None and hi < lo:
            raise SchemaError("maxLength below minLength", path)
        if lo == 0 and hi is None:
            return self.use("string")
        self.use("char")
        return f'"\\"" char{{{lo},{"" if hi is None else hi}}} "\\""'

    def number(self, t: str, s: dict, path: str) -> str:
        bounds = {k: s[k] for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in s}
        for k, v in bounds.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise SchemaError(f"{k}: a number", f"{path}/{k}")
        step = s.get("multipleOf")
        if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float)) or not step > 0
                                 or not math.isfinite(step)):
            raise SchemaError("multipleOf: a number above 0", f"{path}/multipleOf")
        step = None if step is None else exact(step)
        if t == "integer" or (step is not None and step.denominator == 1):
            lo, hi = int_bounds(bounds)
            if lo is not None and hi is not None and lo > hi:
                raise SchemaError("minimum above maximum: no integer fits", path)
            # an integer multiple of p/q (lowest terms) is a multiple of p
            if step is not None and step.numerator != 1:
                return self.multiples(integer_multiples(step.numerator, lo, hi), step, path)
            return self.use("int") if lo is None and hi is None else integer_range(lo, hi)
        if not bounds and step is None:
            return self.use("number")
        if bounds in ({"minimum": 0}, {"minimum": 0.0}) and step is None:  # x >= 0: no sign (an exponent allowed)
            self.use("frac"), self.use("exp")
            return f'( "0" | [1-9] [0-9]{{0,{INT_DIGITS_MAX - 1}}} ) frac? exp?'
        lo, lo_open, hi, hi_open = real_bounds(bounds)
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_open or hi_open))):
            raise SchemaError("minimum above maximum: no number fits", path)
        if step is not None:
            return self.multiples(decimal_multiples(step, lo, lo_open, hi, hi_open), step, path)
        return number_range(lo, lo_open, hi, hi_open)

    @staticmethod
    def multiples(grammar: str | None, step: Fraction, path: str) -> str:
        """A multipleOf's grammar (serve/generation/json_numbers.py), or the SchemaError that names it."""
        if grammar:
            return grammar
        raise SchemaError(f"multipleOf {float(step):g}: supported as a power of ten (10, 0.01), as 1/n (0.5, 0.25), "
                          f"or with minimum and maximum around at most {MULTIPLES_MAX} multiples (none between "
                          "them is refused too)", f"{path}/multipleOf")

    def object(self, s: dict, path: str) -> str:
        props = s.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError("properties: an object", f"{path}/properties")
        required = s.get("required", [])
        if not isinstance(required, list) or any(r not in props for r in required):
            missing = [r for r in required if r not in props] if isinstance(required, list) else []
            raise SchemaError("required names a property not in properties: " + (str(missing[0])[:40]
                              if missing else "a list of names"), f"{path}/required")
        extra = s.get("additionalProperties", False if props else True)
        self.use("ws")
        if not props:  # a map: any keys, values per additionalProperties
            if extra is False:
                return '"{" ws "}"'
            value = self.schema(extra, f"{path}/additionalProperties")
            v = self.new_rule(value, "val")
            self.use("string")
            kv = self.new_rule(f'string ws ":" ws {v} ws', "kv")
            return f'"{{" ws ( {kv} ( "," ws {kv} )* )? "}}"'
        if extra not in (True, False) and not isinstance(extra, dict):
            raise SchemaError("additionalProperties: a boolean or a schema", f"{path}/additionalProperties")
        names = list(props)
        kvs = [self.new_rule(f'{gbnf_literal(json.dumps(n, ensure_ascii=False))} ws ":" ws '
                             f'{self.new_rule(self.schema(props[n], f"{path}/properties/{n}"), "p-" + n)} ws',
                             "kv-" + n) for n in names]
        # after_i: the properties from i on, one at least already written (each starts with a comma);
        # first_i: the same with nothing written yet
        after, first = "", ""
        for i in reversed(range(len(names))):
            opt = names[i] not in required
            a = f'"," ws {kvs[i]} {after}'.strip()
            after_rule = self.new_rule(a + (" | " + after if opt and after else " | " if opt else ""), "after")
            f = f"{kvs[i]} {after}".strip()
            first_rule = self.new_rule(f + (" | " + first if opt and first else " | " if opt else ""), "first")
            after, first = after_rule, first_rule
        return f'"{{" ws {first} "}}"'

    def array(self, s: dict, path: str) -> str:
        if isinstance(s.get("items"), list) and "prefixItems" not in s:
            # draft 4's tuple form `items: [schemas]`: those elements and no more (as llama.cpp reads it)
            s = {**{k: v for k, v in s.items() if k != "items"}, "prefixItems": s["items"], "items": False}
        prefix = s.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise SchemaError("prefixItems: a list of schemas", f"{path}/prefixItems")
        items = s.get("items", True)
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        for key, v in (("minItems", lo), ("maxItems", hi)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > 256):
                raise SchemaError(f"{key}: an integer from 0 to 256", f"{path}/{key}")
        if items is False:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        if hi is not None and hi < lo:
            raise SchemaError("maxItems below minItems (or more items required than prefixItems allows)", path)
        self.use("ws")
        elems = [self.new_rule(self.schema(p, f"{path}/prefixItems/{i}"), "item") for i, p in enumerate(prefix)]
        tail = None if items is False else self.new_rule(self.schema(items, f"{path}/items"), "item")
        # element k (0-based) is elems[k] for k < len(prefix), else tail; their count is in [lo, hi]
        def more_from(k: int) -> str:  # the tail elements from k on, each after its comma
            if tail is None or (hi is not None and hi <= k):
                return ""
            return f'( "," ws {tail} ws )' + ("*" if hi is None else f"{{0,{hi - k}}}")

        fixed = max(len(prefix), lo)
        if fixed == 0:
            expr = self.new_rule(f"{tail} ws {more_from(1)} | ", "items") if tail is not None and hi != 0 else ""
        else:
            expr = more_from(fixed)
        for k in reversed(range(fixed)):
            if hi is not None and k >= hi:
                expr = ""
                continue
            sep = "" if k == 0 else '"," ws '
            body = f"{sep}{elems[k] if k < len(prefix) else tail} ws {expr}".strip()
            expr = self.new_rule(body + (" | " if k >= lo else ""), "items")
        return f'"[" ws {expr} "]"'


def schema_grammar(schema) -> str:
    """GBNF whose sentences are JSON texts valid against schema; SchemaError outside the subset."""
    if not isinstance(schema, (dict, bool)):
        raise SchemaError("a JSON Schema is an object")
    c = _Compiler(schema if isinstance(schema, dict) else {})
    body = c.schema(schema, "")
    lines = [f"root ::= {body}"] + [f"{n} ::= {b}" for n, b in c.rules.items()]
    lines += [f"{n} ::= {_BASE_RULES[n]}" for n in sorted(c.base)]
    text = "\n".join(lines) + "\n"
    if len(text.encode()) > GRAMMAR_MAX_BYTES:
        raise SchemaError(f"the schema's grammar is over {GRAMMAR_MAX_BYTES >> 20} MiB (a huge enum?)")
    return text


ANY_OBJECT_GRAMMAR = schema_grammar({"type": "object", "additionalProperties": True})
