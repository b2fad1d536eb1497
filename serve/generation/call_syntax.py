"""Tool-call syntaxes of other families, read as the `<tool_call>` form the output parser knows.

Role: serve/generation/output_parser.py reads calls in the `<tool_call>` forms (Hermes JSON, Qwen3-Coder XML).
Models rendered with their own template (serve/prompt/jinja_chat.py, `call_syntax`) may write calls otherwise;
a rewrite here turns their text, as it streams, into `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
per call, so the calls are read, announced and streamed exactly as Hermes calls; every other character passes
through unchanged.
- "mistral": after the `[TOOL_CALLS]` control token, v3 (Mistral 7B v0.3, Nemo) writes a JSON array
  `[{"name": "f", "arguments": {...}}, ...]` (each object is wrapped whole, its keys as written), v11 and
  later (Mistral Small 3.x, Ministral, Magistral) `f[ARGS]{...}` per call, with an optional `[CALL_ID]id`
  before `[ARGS]`. A `[TOOL_CALLS]` that does not open a call (a name longer than NAME_MAX_CHARS, a line
  break in it) is passed through as written.
- "llama3_json" (Llama 3.1 / 3.2 / 3.3 with their own template): a reply that starts (after whitespace, or
  after `<|python_tag|>`) with a JSON object whose first key is "name" or "type" is a call
  `{"name": "f", "parameters": {...}}` (the JSON body parser takes "parameters" for "arguments"); anything
  else is content.
- "harmony" (gpt-oss): the reply is messages `<|channel|>NAME<|message|>BODY<|end|>`, the later ones after
  `<|start|>assistant`; the first `analysis` message is the reasoning (`<think>BODY</think>`), a message whose
  header names `to=functions.NAME` is a call with its JSON body as the arguments (ended by `<|call|>`), and the
  `final` (or any other) message's body is the answer; headers and the end marks are dropped.
`CallSyntaxParser(syntax, ...)` is an OutputParser fed through the rewrite (the same surface: feed, finish,
in_reasoning, holding, holding_call, done, ...).

Public surface: `SYNTAXES`, `CALLS_OPEN`, `PYTHON_TAG`, `MistralCallText`, `Llama3JsonCallText`, `HarmonyText`,
`CallSyntaxParser`, `MistralOutputParser`. Knows no HTTP, tokens or engine.
"""
from __future__ import annotations

import json
import re

from serve.generation.output_parser import OutputParser
from serve.prompt.tool_text import CALL_CLOSE, CALL_OPEN

CALLS_OPEN = "[TOOL_CALLS]"
ARGS_OPEN = "[ARGS]"
CALL_ID_OPEN = "[CALL_ID]"
PYTHON_TAG = "<|python_tag|>"   # Llama 3.x opens a call (or code) with it
THINK_OPEN_TAG, THINK_CLOSE_TAG = "<think>", "</think>"   # the output parser's reasoning marks
NAME_MAX_CHARS = 256   # a tool name longer than this is not a name: the text is content


def _held_prefix(text: str, tag: str) -> int:
    """Characters at the end of `text` that may start `tag` (kept until the next piece decides)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class JsonObjectCopy:
    """Copies one JSON object from text pieces: its braces counted outside strings (escapes skipped)."""

    def __init__(self):
        self.depth, self.in_string, self.escaped = 0, False, False

    def take(self, text: str, out: list[str]) -> tuple[bool, str]:
        """Appends to `out` what belongs to the object; (closed, the text after it)."""
        for i, c in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c == "{":
                self.depth += 1
            elif c == "}":
                self.depth -= 1
                if self.depth == 0:
                    out.append(text[:i + 1])
                    return True, text[i + 1:]
        out.append(text)
        return False, ""


class MistralCallText:
    """Incremental rewrite of Mistral's calls (see the module docstring): `feed(text) -> str`, `finish() -> str`."""

    def __init__(self):
        self.state = "text"     # text | head | array | object | name | args
        self.buf = ""           # text not yet decided
        self.copier = JsonObjectCopy()   # the object being copied (object, args)
        self.name = ""

    def feed(self, text: str) -> str:
        self.buf += text
        out: list[str] = []
        while self.buf and self._step(out):
            pass
        return "".join(out)

    def finish(self) -> str:
        out = self.buf if self.state in ("text", "object", "args") else (
            CALLS_OPEN + self.name + self.buf if self.state == "name" else "")
        self.buf = ""
        return out

    def _step(self, out: list[str]) -> bool:
        return getattr(self, "_" + self.state)(out)

    def _text(self, out: list[str]) -> bool:
        at = self.buf.find(CALLS_OPEN)
        if at < 0:
            keep = _held_prefix(self.buf, CALLS_OPEN)
            out.append(self.buf[:len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            return False
        out.append(self.buf[:at])
        self.buf, self.state = self.buf[at + len(CALLS_OPEN):], "head"
        return True

    def _head(self, out: list[str]) -> bool:
        rest = self.buf.lstrip(" ")
        if not rest:
            self.buf = ""
            return False
        if rest[0] == "[":
            self.buf, self.state = rest[1:], "array"
        elif rest[0] == "{":
            self.buf, self.state = rest, "array"      # one object without its array
        else:
            self.buf, self.state, self.name = rest, "name", ""
        return True

    def _array(self, out: list[str]) -> bool:
        rest = self.buf.lstrip(" \n\t,")
        if not rest:
            self.buf = ""
            return False
        if rest[0] == "]":
            self.buf, self.state = rest[1:], "text"
            return True
        if rest[0] != "{":      # not a call array after all: the rest is text
            self.buf, self.state = rest, "text"
            return True
        out.append(CALL_OPEN)
        self.buf, self.state, self.copier = rest, "object", JsonObjectCopy()
        return True

    def _copy_json(self, out: list[str]) -> bool:
        """Copies one JSON object; True once it closed (the rest stays in buf)."""
        done, self.buf = self.copier.take(self.buf, out)
        return done

    def _object(self, out: list[str]) -> bool:
        if not self._copy_json(out):
            return False
        out.append(CALL_CLOSE)
        self.state = "array"
        return True

    def _name(self, out: list[str]) -> bool:
        self.name += self.buf
        self.buf = ""
        at = self.name.find(ARGS_OPEN)
        name = self.name[:at] if at >= 0 else self.name
        head = name.split(CALL_ID_OPEN)[0]
        if len(head) > NAME_MAX_CHARS or "\n" in head:   # no call: what was read is text
            self.buf, self.state, self.name = CALLS_OPEN + self.name, "plain", ""
            return self._plain(out)
        if at < 0:
            return False
        out.append(CALL_OPEN + '{"name": ' + json.dumps(head.strip(), ensure_ascii=False) + ', "arguments": ')
        self.buf, self.state, self.name = self.name[at + len(ARGS_OPEN):].lstrip(" "), "args", ""
        self.copier = JsonObjectCopy()
        return True

    def _plain(self, out: list[str]) -> bool:
        out.append(self.buf)
        self.buf, self.state = "", "text"
        return False

    def _args(self, out: list[str]) -> bool:
        if not self._copy_json(out):
            return False
        out.append("}" + CALL_CLOSE)
        self.state = "text"
        return True


class Llama3JsonCallText:
    """Incremental rewrite of a Llama 3.x call (see the module docstring): `feed(text) -> str`, `finish() -> str`."""

    def __init__(self):
        self.state = "start"    # start | object | text
        self.buf = ""
        self.copier = JsonObjectCopy()

    def feed(self, text: str) -> str:
        self.buf += text
        out: list[str] = []
        if self.state == "start":
            self._start(out, final=False)
        if self.state == "object" and self.buf:
            done, self.buf = self.copier.take(self.buf, out)
            if done:
                out.append(CALL_CLOSE)
                self.state = "text"
        if self.state == "text":
            out.append(self.buf)
            self.buf = ""
        return "".join(out)

    def finish(self) -> str:
        out: list[str] = []
        if self.state == "start":
            self._start(out, final=True)
        out.append(self.buf)
        self.buf = ""
        return "".join(out)

    def _start(self, out: list[str], final: bool) -> None:
        """Decides, once enough has come, whether the reply opens with a call; leading text is held until then."""
        rest = self.buf.lstrip()
        if rest.startswith(PYTHON_TAG):
            rest = rest[len(PYTHON_TAG):].lstrip()
        elif PYTHON_TAG.startswith(rest) and rest and not final:
            return
        m = _CALL_HEAD.match(rest)
        if m:
            out.append(CALL_OPEN)
            self.buf, self.state = rest, "object"
            return
        if not final and rest and _could_open(rest):
            return
        if not final and not rest:
            return
        self.state = "text"


_CALL_HEAD = re.compile(r'\{\s*"(?:name|type)"')


HARMONY_TAGS = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|call|>", "<|return|>", "<|constrain|>")
_HARMONY_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")


class HarmonyText:
    """Incremental rewrite of gpt-oss's harmony messages (see the module docstring): the first `analysis`
    message as `<think>...</think>`, a message to `functions.NAME` as a `<tool_call>` with its JSON body as the
    arguments, `final` and other messages' bodies as text; the headers and end marks themselves are dropped."""

    def __init__(self):
        self.state = "header"   # header | body
        self.buf = ""
        self.kind = ""          # the body being read: think | call | text
        self.first = True       # the first message of the reply (only it may open the thinking)

    def feed(self, text: str) -> str:
        self.buf += text
        out: list[str] = []
        while self.buf and (self._header(out) if self.state == "header" else self._body(out)):
            pass
        return "".join(out)

    def finish(self) -> str:
        out: list[str] = []
        if self.state == "body":
            out.append(self.buf)
            out.append({"think": THINK_CLOSE_TAG, "call": "}" + CALL_CLOSE}.get(self.kind, ""))
        self.buf, self.state = "", "header"
        return "".join(out)

    def _header(self, out: list[str]) -> bool:
        at = self.buf.find("<|message|>")
        if at < 0:
            return False    # the header is held whole (it is short): role, channel, recipient, constraint
        head, self.buf = self.buf[:at], self.buf[at + len("<|message|>"):]
        to, channel = _RECIPIENT.search(head), _CHANNEL.search(head)
        if to:
            self.kind = "call"
            out.append(CALL_OPEN + '{"name": ' + json.dumps(to.group(1), ensure_ascii=False) + ', "arguments": ')
        elif channel and channel.group(1) == "analysis" and self.first:
            self.kind = "think"
            out.append(THINK_OPEN_TAG)
        else:
            self.kind = "text"
        self.state, self.first = "body", False
        return True

    def _body(self, out: list[str]) -> bool:
        hits = [(self.buf.find(t), t) for t in _HARMONY_ENDS if t in self.buf]
        if not hits:
            keep = max((_held_prefix(self.buf, t) for t in _HARMONY_ENDS), default=0)
            out.append(self.buf[:len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            return False
        at, tag = min(hits)
        out.append(self.buf[:at])
        out.append({"think": THINK_CLOSE_TAG, "call": "}" + CALL_CLOSE}.get(self.kind, ""))
        self.buf = self.buf[at + (0 if tag == "<|start|>" else len(tag)):]
        if self.buf.startswith("<|start|>"):
            self.buf = self.buf[len("<|start|>"):]
        self.state = "header"
        return True


def _could_open(text: str) -> bool:
    """True while `text` may still become a call's opening `{"name"` / `{"type"`."""
    compact = re.sub(r"\s+", "", text)
    return any(head.startswith(compact) for head in ('{"name"', '{"type"'))


SYNTAXES = {"mistral": MistralCallText, "llama3_json": Llama3JsonCallText, "harmony": HarmonyText}


class CallSyntaxParser:
    """An OutputParser (serve/generation/output_parser.py) over the rewrite of a call syntax (SYNTAXES)."""

    def __init__(self, syntax: str, *args, **kwargs):
        self.inner = OutputParser(*args, **kwargs)
        self.rewrite = SYNTAXES[syntax]()

    def feed(self, text: str):
        return self.inner.feed(self.rewrite.feed(text))

    def finish(self):
        rest = self.rewrite.finish()
        return (self.inner.feed(rest) if rest else []) + self.inner.finish()

    @property
    def holding(self) -> bool:
        return bool(self.rewrite.buf) or self.rewrite.state not in ("text", "start", "header") or \
            self.inner.holding

    def __getattr__(self, name):   # in_reasoning, holding_call, done, take_forced_opening, n_calls, ...
        return getattr(self.inner, name)


def MistralOutputParser(*args, **kwargs) -> CallSyntaxParser:
    """The Mistral rewrite's parser (CallSyntaxParser("mistral", ...))."""
    return CallSyntaxParser("mistral", *args, **kwargs)
