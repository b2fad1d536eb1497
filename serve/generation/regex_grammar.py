"""A regular expression (the usual subset) -> a GBNF expression, for vLLM's `guided_regex` and JSON Schema's
`pattern`.

Role: the grammar accepts exactly the strings the pattern matches whole (`re.fullmatch`); a `^` at the start
and a `$` at the end are the same anchors. In a JSON string (`json_string=True`) the grammar writes the
string's contents as JSON text: a `"` or `\\` the pattern allows is written escaped, `.` and negated classes
leave out `"`, `\\` and control characters (a valid subset; a literal control character is refused). JSON
Schema's `pattern` matches anywhere in the string; a string that matches whole matches anywhere, so the
grammar is a valid subset there too.

The subset: literals, escapes (`\\d \\w \\s \\D \\W \\S` as ASCII classes, as `re.ASCII` reads them;
`\\t \\n \\r \\f \\v`, `\\xHH`, `\\uHHHH`, an escaped punctuation character), `.` (not a newline), classes
`[...]` with ranges, negation and those escapes, groups `( )`, `(?: )`, named `(?P<n> )` / `(?<n> )`,
alternation `|`, and the quantifiers `* + ? {m} {m,} {m,n}` (lazy `?` after one is the same language).
Refused by name (`RegexError`): back references, lookaround, word boundaries, inline flags, anchors
elsewhere, possessive quantifiers, counts over REPEAT_MAX.

Public surface: `regex_grammar(pattern, json_string=False) -> str`, `gbnf_literal(text)`, `RegexError`. Knows no
HTTP, no engine.
"""
from __future__ import annotations

REPEAT_MAX = 1000      # the largest {m,n} count: a bigger one is a grammar too large to be useful
PATTERN_MAX_CHARS = 4096

_CLASS_ESCAPES = {"d": [("0", "9")], "w": [("a", "z"), ("A", "Z"), ("0", "9"), ("_", "_")],
                  "s": [(" ", " "), ("\t", "\r")]}   # \t \n \v \f \r are 9..13
_CHAR_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "a": "\a", "e": "\x1b"}
_JSON_BAN = [('"', '"'), ("\\", "\\"), ("\x00", "\x1f")]   # never written raw inside a JSON string


class RegexError(ValueError):
    """The pattern is outside the subset (or malformed); the message names what."""


def _cls_char(c: str) -> str:
    if c in "\\]-^[":
        return "\\" + c
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02x}"
    return c


def gbnf_literal(text: str) -> str:
    """A GBNF "literal" matching text exactly (json_schema.py and the translators use it too)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


class _Parser:
    def __init__(self, pattern: str, json_string: bool):
        self.p, self.i, self.json = pattern, 0, json_string

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def take(self) -> str:
        if self.i >= len(self.p):
            raise RegexError("the pattern ends too early")
        c = self.p[self.i]
        self.i += 1
        return c

    # ------------------------------------------------------------ structure
    def alternation(self, depth: int = 0) -> str:
        alts = [self.sequence(depth)]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.sequence(depth))
        return " | ".join(a or '""' for a in alts)

    def sequence(self, depth: int) -> str:
        items = []
        while self.peek() is not None and self.peek() not in "|)":
            if self.peek() == "^" and self.i == 0:
                self.i += 1
                continue
            if self.peek() == "$" and self.i == len(self.p) - 1 and depth == 0:
                self.i += 1
                continue
            atom = self.atom(depth)
            items.append(self.quantified(atom))
        return " ".join(items)

    def quantified(self, atom: str) -> str:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            suffix = c
        elif c == "{" and self._counted():
            lo, hi = self._counts()
            suffix = f"{{{lo}}}" if lo == hi else f"{{{lo},{'' if hi is None else hi}}}"
        else:
            return atom
        if self.peek() == "?":
            self.i += 1          # lazy: the same language
        elif self.peek() == "+":
            raise RegexError("possessive quantifiers are not supported")
        return f"( {atom} ){suffix}"

    def _counted(self) -> bool:
        j = self.p.find("}", self.i)
        body = self.p[self.i + 1:j] if j > 0 else ""
        return bool(body) and all(part.isdigit() for part in body.split(",", 1) if part) and body[0].isdigit()

    def _counts(self) -> tuple[int, int | None]:
        j = self.p.index("}", self.i)
        body, self.i = self.p[self.i + 1:j], j + 1
        lo_text, _, hi_text = body.partition(",")
        lo = int(lo_text)
        hi = lo if "," not in body else (int(hi_text) if hi_text else None)
        if lo > REPEAT_MAX or (hi is not None and (hi > REPEAT_MAX or hi < lo)):
            raise RegexError(f"{{{body}}}: counts from 0 to {REPEAT_MAX}, the second not below the first")
        return lo, hi

    def atom(self, depth: int) -> str:
        c = self.take()
        if c == "(":
            if self.peek() == "?":
                self._group_head()
            inner = self.alternation(depth + 1)
            if self.peek() != ")":
                raise RegexError("a group is not closed")
            self.i += 1
            return f"( {inner} )"
        if c == "[":
            return self.char_class()
        if c == ".":
            return self._class([("\n", "\n")], negated=True)
        if c == "\\":
            return self.escape()
        if c in "*+?{":
            raise RegexError(f"{c!r} at {self.i - 1} has nothing to repeat")
        if c in "^$":
            raise RegexError(f"the anchor {c!r} is supported only at the pattern's start / end")
        if c == ")":
            raise RegexError("an unmatched ')'")
        return self._char(c)

    def _group_head(self) -> None:
        rest = self.p[self.i:]
        if rest.startswith("?:"):
            self.i += 2
        elif rest.startswith("?P<") or (rest.startswith("?<") and rest[2:3] not in ("=", "!")):
            self.i = self.p.index(">", self.i) + 1
        else:
            raise RegexError(f"the group '({rest[:3]}' is not supported (lookaround, flags, back references)")

    # ------------------------------------------------------------ characters
    def _char(self, c: str) -> str:
        if not self.json:
            return gbnf_literal(c)
        if c in '"\\':
            return gbnf_literal("\\" + c)
        if ord(c) < 0x20:
            raise RegexError(f"a control character ({ord(c):#04x}) cannot be written raw in a JSON string")
        return gbnf_literal(c)

    def escape(self) -> str:
        c = self.take()
        if c in _CLASS_ESCAPES:
            return self._class(_CLASS_ESCAPES[c], negated=False)
        if c.lower() in _CLASS_ESCAPES:
            return self._class(_CLASS_ESCAPES[c.lower()], negated=True)
        return self._char(self._escaped_char(c))

    def _escaped_char(self, c: str) -> str:
        if c in _CHAR_ESCAPES and not (c == "0" and (self.peek() or "").isdigit()):
            return _CHAR_ESCAPES[c]
        if c in ("x", "u"):
            n = 2 if c == "x" else 4
            digits = self.p[self.i:self.i + n]
            if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise RegexError(f"\\{c} needs {n} hex digits")
            self.i += n
            return chr(int(digits, 16))
        if c.isalnum():
            raise RegexError(f"the escape \\{c} is not supported (back references, \\b, ...)")
        return c

    def char_class(self) -> str:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[str, str]] = []
        first = True
        while True:
            c = self.take()
            if c == "]" and not first:
                break
            first = False
            if c == "\\":
                e = self.take()
                if e in _CLASS_ESCAPES:
                    ranges += _CLASS_ESCAPES[e]
                    continue
                if e.lower() in _CLASS_ESCAPES:
                    raise RegexError(f"\\{e} inside a class is not supported")
                c = self._escaped_char(e)
            if self.peek() == "-" and self.p[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self.take()
                if hi == "\\":
                    hi = self._escaped_char(self.take())
                if hi < c:
                    raise RegexError(f"the class range {c}-{hi} is reversed")
                ranges.append((c, hi))
            else:
                ranges.append((c, c))
        return self._class(ranges, negated)

    def _class(self, ranges: list[tuple[str, str]], negated: bool) -> str:
        if not self.json:
            body = "".join(_cls_char(a) if a == b else f"{_cls_char(a)}-{_cls_char(b)}" for a, b in ranges)
            return f"[{'^' if negated else ''}{body}]"
        if negated:  # leave out what a JSON string cannot hold raw
            return self._class_text(ranges + _JSON_BAN, True)
        alts = []
        for ch, text in (('"', '\\"'), ("\\", "\\\\")):
            if any(a <= ch <= b for a, b in ranges):
                alts.append(gbnf_literal(text))
        kept = _subtract(ranges, _JSON_BAN)
        if kept:
            alts.insert(0, self._class_text(kept, False))
        if not alts:
            raise RegexError("a class of control characters only cannot be written raw in a JSON string")
        return alts[0] if len(alts) == 1 else "( " + " | ".join(alts) + " )"

    @staticmethod
    def _class_text(ranges, negated: bool) -> str:
        body = "".join(_cls_char(a) if a == b else f"{_cls_char(a)}-{_cls_char(b)}" for a, b in ranges)
        return f"[{'^' if negated else ''}{body}]"


def _subtract(ranges, ban) -> list[tuple[str, str]]:
    """The ranges with every banned range cut out."""
    out = list(ranges)
    for lo, hi in ban:
        nxt = []
        for a, b in out:
            if b < lo or a > hi:
                nxt.append((a, b))
                continue
            if a < lo:
                nxt.append((a, chr(ord(lo) - 1)))
            if b > hi:
                nxt.append((chr(ord(hi) + 1), b))
        out = nxt
    return out


def regex_grammar(pattern, json_string: bool = False) -> str:
    """The GBNF expression of the strings `pattern` matches whole (see the module docstring)."""
    if not isinstance(pattern, str):
        raise RegexError("a pattern is a string")
    if len(pattern) > PATTERN_MAX_CHARS:
        raise RegexError(f"the pattern is over {PATTERN_MAX_CHARS} characters")
    parser = _Parser(pattern, json_string)
    expr = parser.alternation()
    if parser.i != len(pattern):
        raise RegexError("an unmatched ')'")
    return expr or '""'
