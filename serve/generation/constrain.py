"""Constrained output: which grammar (docs/PROTOCOL.md `grammar=`) a request's reply must follow.

Role: turn the schemas a request asks for, and the forced tool calls whose arguments must follow their
schema, into one GBNF grammar (serve/generation/json_schema.py compiles schemas), plus the `grammar=` engine
key. The wire fields that ask (`response_format`, `json_schema`, `grammar`, Responses `text.format`, Ollama
`format`, tools' `strict`) are read by serve/api/fields.py and the translators; they call `schema_ask`.

- Forced tool calls (OpenAI tool_choice required/named, Anthropic any/tool) in the JSON call form: the call's
  opening stops after `"arguments": ` (or after `"name": "` when the tool is not named) and the grammar is
  the arguments per the tool's schema, then `}` and `</tool_call>`; a schema outside the subset is a 400.
  Calls in the XML form (Qwen3.5 / Qwen3-Coder) likewise, XML-wrapped: the opening is forced_opening's
  (`<function=NAME>\n`, then `<parameter=` when the tool has required parameters; `<function=` when the
  tool is not named) and the grammar goes on with one
  `<parameter=P>\nVALUE\n</parameter>\n` per property (required ones first, then the optional ones, each in
  the schema's order; no others), then `</function>\n</tool_call>`. A value whose `type` is text
  (toolcalls.value_is_text) is raw text, as the call parser reads it: its `const`/`enum` strings, its
  `format`, or up to `maxLength` characters other than `<`; any other value is JSON per its schema.

Public surface: `schema_ask(schema, field)`, `forced_call(tool_choice, tools, fmt)`,
`auto_tools_grammar(tools, fmt, parallel)`, `grammar_key(text)`, `GRAMMAR_INFO_KEY`. Knows no HTTP beyond
BadRequest and no engine.
"""
from __future__ import annotations

import json
import urllib.parse

from serve.core.events import BadRequest
from serve.generation.json_schema import FORMATS, SchemaError, gbnf_literal, schema_grammar
from serve.prompt.tool_text import CALL_CLOSE, CALL_OPEN, FUNCTION_CLOSE, PARAM_CLOSE, PARAM_OPEN, forced_opening
from serve.generation.toolcall_parsers import value_is_text

GRAMMAR_INFO_KEY = "grammar"  # INFO grammar=1: the engine applies grammar= (docs/PROTOCOL.md)


def _schema_grammar(schema, field: str) -> str:
    try:
        return schema_grammar(schema)
    except SchemaError as e:
        raise BadRequest(f"{field}: {e}", param=field) from None


def schema_ask(schema, field: str) -> str:
    """The grammar of a JSON Schema a request asks for in `field` (Responses `text.format`, Ollama `format`);
    a 400 naming the field and the keyword outside the subset."""
    return _schema_grammar(schema, field)


def forced_call(tool_choice, tools, fmt: str) -> tuple[str, str] | None:
    """(opening, grammar of the rest of the reply) for a forced call (JSON or XML form), else None."""
    if forced_opening(tool_choice, tools, fmt) is None:
        return None
    name = None
    if isinstance(tool_choice, dict):
        name = tool_choice.get("name")
    elif len(tools) == 1:
        name = tools[0].name
    if fmt == "xml":
        return _forced_xml_call(name, tools, forced_opening(tool_choice, tools, fmt))
    tail = f'"}}" "\\n" {gbnf_literal(CALL_CLOSE)}'
    if name is not None:
        tool = next(t for t in tools if t.name == name)
        head = f'{CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '
        return head, "\n".join([f"root ::= t0-root {tail}"] + _prefixed(_tool_args(tool), "t0-")) + "\n"
    head = f'{CALL_OPEN}\n{{"name": "'
    lines, alts = [], []
    for i, tool in enumerate(tools):
        name_lit = gbnf_literal(json.dumps(tool.name, ensure_ascii=False)[1:] + ', "arguments": ')
        alts.append(f"{name_lit} t{i}-root")
        lines += _prefixed(_tool_args(tool), f"t{i}-")
    return head, "\n".join([f"root ::= ( {' | '.join(alts)} ) {tail}"] + lines) + "\n"


def _forced_xml_call(name, tools, opening: str) -> tuple[str, str]:
    """The opening is forced_opening's (for a named tool with required parameters it ends in `<parameter=`,
    which keeps small models on the format); the grammar goes on from there."""
    tail = gbnf_literal(FUNCTION_CLOSE + "\n" + CALL_CLOSE)
    if name is not None:
        tool = next(t for t in tools if t.name == name)
        params, lines = _xml_params(tool, "t0-", opened=opening.endswith(PARAM_OPEN))
        return opening, "\n".join([f"root ::= {params} {tail}"] + lines) + "\n"
    alts, lines = [], []
    for i, tool in enumerate(tools):
        params, more = _xml_params(tool, f"t{i}-")
        alts.append(f"{gbnf_literal(tool.name + '>' + chr(10))} {params}")
        lines += more
    return opening, "\n".join([f"root ::= ( {' | '.join(alts)} ) {tail}"] + lines) + "\n"


def _xml_params(tool, prefix: str, opened: bool = False) -> tuple[str, list[str]]:
    """(the parameters' sequence, its rules) of one tool's call body in the XML form; `opened`: the opening
    already wrote the first (required) parameter's `<parameter=`."""
    params = tool.parameters if isinstance(tool.parameters, dict) else {}
    _tool_args(tool)  # the whole schema inside the subset, or a 400 naming the keyword
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = [k for k in props if k in (params.get("required") or [])]
    if opened and not required:
        raise BadRequest(f"tools[{tool.name}].parameters: `required` names no parameter of `properties`",
                         param="tools")
    seq, lines = [], []
    for k, key in enumerate(required + [k for k in props if k not in required]):
        field = f"tools[{tool.name}].parameters.properties.{key}"
        sub = props[key] if isinstance(props[key], dict) else {}
        value = _raw_text_grammar(sub, field) if value_is_text(sub.get("type")) else _schema_grammar(sub, field)
        lines += _prefixed(value, f"{prefix}p{k}-")
        tag = ("" if opened and k == 0 else PARAM_OPEN) + key + ">\n"
        item = f"{gbnf_literal(tag)} {prefix}p{k}-root {gbnf_literal(chr(10) + PARAM_CLOSE + chr(10))}"
        seq.append(item if key in required else f"( {item} )?")
    return " ".join(seq) or '""', lines


def _raw_text_grammar(prop: dict, field: str) -> str:
    """A text value as raw text (no quotes, no escapes): its const / enum strings, its format, or up to maxLength
    characters other than `<` (so a value never runs into its closing tag)."""
    _schema_grammar(prop, field)  # inside the subset, or a 400
    if "pattern" in prop:  # raw text up to `\n</parameter>`: a pattern could run into the closing tag
        raise BadRequest(f"{field}.pattern: not supported on a text parameter in the XML call form", param="tools")
    if "const" in prop or "enum" in prop:
        values = [prop["const"]] if "const" in prop else list(prop["enum"])
        texts = [v if isinstance(v, str) else json.dumps(v) for v in values]
        return f"root ::= {' | '.join(gbnf_literal(t) for t in texts)}\n"
    fmt = prop.get("format")
    if fmt in FORMATS:  # the format's own rules, without the quotes around them
        rules = schema_grammar({"type": "string", "format": fmt}).splitlines()[1:]
        return "\n".join([f"root ::= {fmt}"] + rules) + "\n"
    lo, hi = prop.get("minLength", 0), prop.get("maxLength")
    return f"root ::= [^<]{{{lo},{'' if hi is None else hi}}}\n"


def _tool_args(tool) -> str:
    params = tool.parameters if isinstance(tool.parameters, dict) and tool.parameters else {"type": "object"}
    return _schema_grammar(params, f"tools[{tool.name}].parameters")


def _prefixed(grammar: str, prefix: str) -> list[str]:
    """The grammar's rules with every rule name prefixed (so several grammars share one text)."""
    names = [line.split(" ::= ", 1)[0] for line in grammar.splitlines() if " ::= " in line]
    out = []
    for line in grammar.splitlines():
        if " ::= " not in line:
            continue
        head, body = line.split(" ::= ", 1)
        out.append(f"{prefix}{head} ::= {_rename(body, set(names), prefix)}")
    return out


def _rename(body: str, names: set[str], prefix: str) -> str:
    """Prefixes the rule references in a GBNF body (outside literals and classes)."""
    out, i, n = [], 0, len(body)
    while i < n:
        c = body[i]
        if c in "\"[":
            close = '"' if c == '"' else "]"
            j = i + 1
            while j < n and body[j] != close:
                j += 2 if body[j] == "\\" else 1
            out.append(body[i:j + 1])
            i = j + 1
        elif c.isalnum() or c in "-_":
            j = i
            while j < n and (body[j].isalnum() or body[j] in "-_"):
                j += 1
            word = body[i:j]
            out.append(prefix + word if word in names else word)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _text_without(literal: str, prefix: str) -> list[str]:
    """Rules `{prefix}0` .. : any text in which `literal` never occurs (its first character occurs only at its
    start): state k has matched literal[:k]; each state may end the text."""
    def cls(*chars):
        return "[^" + "".join("\\" + c if c in "]^-\\" else c for c in dict.fromkeys(chars)) + "]"
    first, n = literal[0], len(literal)
    rules = [f'{prefix}0 ::= {cls(first)} {prefix}0 | {gbnf_literal(first)} {prefix}1 | ']
    for k in range(1, n):
        nxt = f"{gbnf_literal(literal[k])} {prefix}{k + 1} | " if k + 1 < n else ""
        rules.append(f"{prefix}{k} ::= {nxt}{gbnf_literal(first)} {prefix}1 | {cls(first, literal[k])} {prefix}0 | ")
    return rules


def auto_tools_grammar(tools, fmt: str, parallel: bool) -> str:
    """tool_choice auto with strict tools: free text that never opens a call, then (optionally) calls whose
    arguments follow their tool's schema. A 400 for the XML call form (not constrained)."""
    if fmt != "json":
        raise BadRequest("tools: strict tools are supported with the JSON call form only; this model writes "
                         "calls in the XML form", param="tools")
    lines, alts = [], []
    for i, tool in enumerate(tools):
        alts.append(gbnf_literal(json.dumps(tool.name, ensure_ascii=False) + ', "arguments": ') + f" t{i}-root")
        lines += _prefixed(_tool_args(tool), f"t{i}-")
    call = (f'call ::= {gbnf_literal(CALL_OPEN + chr(10) + "{" + chr(34) + "name" + chr(34) + ": ")} '
            f'( {" | ".join(alts)} ) "}}" "\\n" {gbnf_literal(CALL_CLOSE)}')
    more = ' ( "\\n" call ){0,7}' if parallel else ""
    root = f"root ::= text0 ( call{more} )?"
    return "\n".join([root, call] + _text_without(CALL_OPEN, "text") + lines) + "\n"


def grammar_key(text: str) -> str:
    """The engine key for a grammar: `grammar=` + the text with every byte outside `!`..`~`, `%` and `=`
    written %XX (docs/PROTOCOL.md)."""
    return "grammar=" + urllib.parse.quote(text, safe="!\"#$&'()*+,-./:;<>?@[\\]^_`{|}~")
