"""serve/generation/regex_grammar.py: the grammar of a pattern accepts exactly what Python's `re.fullmatch`
accepts (strings drawn from the pattern by hypothesis, and random strings over the pattern's alphabet); in a
JSON string the contents are valid JSON string text whose decoded value matches; the rest is refused by name."""
import json
import random
import re

import pytest
from hypothesis import given, settings, strategies as st

from serve.generation.regex_grammar import RegexError, regex_grammar

TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|\{\d+(?:,\d*)?\}|[()|*+?]|\s+')


def as_python(expr: str) -> re.Pattern:
    """The GBNF expression (literals, classes, groups, alternation, quantifiers) as a Python regex."""
    out = []
    for tok in TOKEN.findall(expr):
        if tok.isspace():
            continue
        if tok.startswith('"'):
            out.append(re.escape(json.loads(tok.replace("\\x", "\\u00"))))
        else:
            out.append("(?:" if tok == "(" else tok)
    return re.compile("".join(out), re.S)


PATTERNS = [r"\d{3}-\d{4}", r"[A-Z][a-z]+( [A-Z][a-z]+)*", r"(yes|no|maybe)", r"^[a-f0-9]{8}$", r"a.c",
            r"[^abc]+x?", r"(?:ab|cd){1,3}e*", r"\w+@\w+\.(com|org)", r"[-+]?\d+(\.\d{1,2})?", r"\s*\S+\s*",
            r"(?P<year>\d{4})-(?P<m>\d\d)", r"[\]\-\\]{2}", r"\x41\u00e9+", r"a{2,}b{0,1}", r"(a|)b", r"[.]\.",
            r'say "hi"\\', r"\t\D\W"]
ALPHABET = "abcxyzABZ019-+._@ \t\n\"\\]éé"


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_grammar_accepts_what_fullmatch_accepts(pattern):
    ours = as_python(regex_grammar(pattern))
    ref = re.compile(pattern, re.ASCII)   # \d \w \s are ASCII classes, as re.ASCII reads them

    @settings(max_examples=60, deadline=None, database=None)
    @given(st.from_regex(ref, fullmatch=True))
    def drawn(text):
        assert ours.fullmatch(text), (pattern, text)
    drawn()
    rnd = random.Random(pattern)
    for _ in range(3000):
        text = "".join(rnd.choice(ALPHABET) for _ in range(rnd.randrange(0, 9)))
        assert bool(ours.fullmatch(text)) == bool(ref.fullmatch(text)), (pattern, text)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_in_a_json_string_the_contents_are_json_text_that_matches(pattern):
    if "\\t" in pattern:
        pytest.skip("a raw control character cannot be written in a JSON string")
    ours = as_python(regex_grammar(pattern, json_string=True))
    ref = re.compile(pattern, re.ASCII)
    rnd = random.Random(pattern + "json")
    for _ in range(3000):
        value = "".join(rnd.choice(ALPHABET) for _ in range(rnd.randrange(0, 9)))
        text = json.dumps(value, ensure_ascii=False)[1:-1]
        if ours.fullmatch(text):   # a subset: whatever it writes decodes to a match
            assert ref.fullmatch(value), (pattern, value)
        elif ref.fullmatch(value):   # left out: only what a negated class or `.` may not write raw
            assert any(ord(c) < 0x20 or c in '"\\' for c in value), (pattern, value)


@pytest.mark.parametrize("pattern, word", [
    (r"(a)\1", r"\1"), (r"a(?=b)", "lookaround"), (r"\bword", r"\b"), (r"a++", "possessive"), (r"a{5,2}", "counts"),
    (r"a^b", "anchor"), (r"(ab", "not closed"), (r"ab)", "unmatched"), (r"*a", "nothing to repeat"),
    (r"(?i)abc", "not supported"), (r"a{1001}", "counts"),
])
def test_outside_the_subset_is_refused_by_name(pattern, word):
    with pytest.raises(RegexError) as e:
        regex_grammar(pattern)
    assert word in str(e.value)
