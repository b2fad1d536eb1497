"""The engine passes of one reply: thinking budget, answer room, a forced call after thinking, close retry.

Role: decide, token by token, when `Service._generate` ends an engine pass and goes on in a new one whose
prompt is the request's prompt + the reply's ids so far + a text the server writes (UPSTREAM §5.3):
- thinking budget (`reasoning_budget_tokens` of the request, else of the shared Chat settings, else of the
  config; lowered so the answer keeps its reserve) and answer room (no budget and max_new >=
  `ANSWER_ROOM_MIN_CAP`, unless `"answer_room": false`): once the thinking has spent it, at a clean point (the
  parser holds nothing, no UTF-8 character is split), `WRAP_UP_TEXT`;
- `tool_choice` required/named with thinking on: once the model has left its thinking, the call's opening
  (`OutputParser.take_forced_opening()`), also right after a wrap-up or close text;
- opt-in `reasoning_close_retry`: a reply that stopped inside its thinking with no answer, `CLOSE_RETRY_TEXT`
  once.
The written text is fed to the parser as output (so the wrap-up reads as the end of the reasoning and the
opening parses as the start of the call), and its tokens count toward max tokens like generated ones: the
whole reply, over every pass, stays within `max_new`, and each pass's prompt + its max tokens stays within the
prompt + max_new the context check allowed. Knows no HTTP and no pipes; it looks at the events only to know
whether an answer was shown.

Public surface: `ReplyPasses(prep, tokenizer, parser, budget_default)` with `prompt()`, `room()`,
`generated(tid, stop)`, `after_token(was_reasoning)`, `at_end(finish)`, `write(text)`, `follow()`,
`saw(event)`, `n_out`, `inserted`, `reasoning_tokens`, `passes`, `budget`; `encode_written(tokenizer, text)`.
(A reply's engine figures over its passes: serve/core/engine_api.py `EngineFigures.merged` and `timings`.)
Budget: `thinking_budget(budget, max_new, answer_room)`, `ThinkingBudget` (the run loop's counter),
`needs_close_retry(...)`, `answer_reserve(max_new)`, `WRAP_UP_TEXT`, `CLOSE_RETRY_TEXT`, `ANSWER_RESERVE_MIN`,
`ANSWER_ROOM_MIN_CAP`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from serve.core.events import KIND_PING, KIND_REASONING
from serve.core.effort import check_budget
from serve.prompt.tool_text import CALL_OPEN

if TYPE_CHECKING:   # a type in two signatures; the parser module imports nothing of this one
    from serve.generation.output_parser import OutputParser


class _Utf8:
    """Whether the bytes read so far end on a whole UTF-8 character (a budget break waits for one)."""

    def __init__(self):
        self.need = 0   # continuation bytes the current character still needs

    def feed(self, data: bytes) -> None:
        for b in data:
            if 0x80 <= b < 0xC0:
                self.need = max(0, self.need - 1)
            else:
                self.need = 3 if b >= 0xF0 else 2 if b >= 0xE0 else 1 if b >= 0xC0 else 0

    @property
    def clean(self) -> bool:
        return self.need == 0


class ReplyPasses:
    """The pass bookkeeping of one reply (one per `Service.run`; not shared between threads).

    budget_default: the thinking budget when the request names none (shared settings, then config)."""

    def __init__(self, prep, tokenizer, parser, budget_default: int | None = None):
        req = prep.req
        self.base = list(prep.ids)
        self.max_new = prep.max_new
        self.tok = tokenizer
        self.parser = parser
        self.ids: list[int] = []   # the reply so far as the next pass's prompt sees it (stop ids left out)
        self.n_out = 0             # tokens the engine generated, over all passes (stop ids included)
        self.inserted = 0          # tokens the server wrote into the reply
        self.reasoning_tokens = 0  # of both: those written while the reply was in its thinking
        self.passes = 1            # engine passes started (the service counts them)
        self.answered = False      # content or a call was shown
        self.close_retry = bool(getattr(req, "reasoning_close_retry", False))
        self.close_tried = False
        self._utf8 = _Utf8()
        budget = getattr(req, "reasoning_budget_tokens", None)
        if budget is None:
            budget = budget_default
        limit = thinking_budget(budget, self.max_new, getattr(req, "answer_room", True)) \
            if parser is not None else None
        self.budget = ThinkingBudget(limit)

    def prompt(self) -> list[int]:
        return self.base + self.ids

    def room(self) -> int:
        """Max tokens of the next pass: what is left of max_new."""
        return self.max_new - self.n_out - self.inserted

    def generated(self, tid: int, stop: bool) -> None:
        self.n_out += 1
        if not stop:
            self.ids.append(tid)
            self._utf8.feed(self.tok.token_bytes(tid))

    def saw(self, event) -> None:
        if event.kind not in (KIND_REASONING, KIND_PING):
            self.answered = True

    def after_token(self, was_reasoning: bool) -> str | None:
        """After a token's text was fed to the parser: the text to write (the pass ends), or None."""
        if self.parser is None:
            return None
        if was_reasoning:
            self.reasoning_tokens += 1
        if self.budget.count(self.parser, self._utf8.clean):
            return WRAP_UP_TEXT
        return self.follow()

    def at_end(self, finish: str | None) -> str | None:
        """A pass ended by itself (`finish` from the engine): the text to write to go on, or None."""
        if self.parser is None:
            return None
        if needs_close_retry(self.parser, finish, self.answered, self.close_retry, self.close_tried):
            self.close_tried = True
            return CLOSE_RETRY_TEXT
        return self.follow() if finish == "stop" else None

    def follow(self) -> str | None:
        """A forced call's opening, once the reply has left its thinking (None otherwise, and after once)."""
        return self.parser.take_forced_opening() if self.parser is not None else None

    def write(self, text: str) -> bool:
        """Put the server's text into the reply; False (nothing written) when less than 1 token of room
        would remain after it: the reply then ends as `length`."""
        ids = encode_written(self.tok, text)
        if self.room() - len(ids) < 1:
            return False
        if self.parser is not None and self.parser.in_reasoning:
            self.reasoning_tokens += len(ids)
        self.ids += ids
        self.inserted += len(ids)
        self._utf8 = _Utf8()
        return True


def encode_written(tokenizer, text: str) -> list[int]:
    """Ids of a text the server writes into a reply: its markers (`</think>`, the `<tool_call>` that opens a
    forced call) as the model's own tokens; in an opening, everything after `<tool_call>` (the tool's name is
    client text) as plain text, never a control token."""
    at = text.find(CALL_OPEN)
    plain = [(at + len(CALL_OPEN), len(text))] if at >= 0 else None
    return tokenizer.encode(text, parse_special=True, plain=plain)


# The text a run appends when the thinking budget is spent: the model reads it as its own decision to answer.
WRAP_UP_TEXT = "\n\nI have thought about this long enough; time to give my answer.\n</think>\n\n"


# Opt-in `reasoning_close_retry`: appended once to a reply that stopped inside its thinking with no answer.
CLOSE_RETRY_TEXT = "\n</think>\n\n"


# A thinking budget never leaves the answer less than this many tokens (or a quarter of max_new, or half).
ANSWER_RESERVE_MIN = 512


# From this cap on, thinking without a budget is closed early enough to leave the answer its reserve: below
# it, the reserve would be most of the cap and a thinking model would hardly think at all.
ANSWER_ROOM_MIN_CAP = 2048


def answer_reserve(max_new: int) -> int:
    """Tokens kept for the answer out of `max_new`: min(max(512, max_new // 4), max_new // 2)."""
    return min(max(ANSWER_RESERVE_MIN, max_new // 4), max_new // 2)


def thinking_budget(budget: int | None, max_new: int, answer_room: bool = True) -> int | None:
    """The number of thinking tokens after which the run writes `WRAP_UP_TEXT`, or None (no limit).

    A request's budget (0 or None = none) is lowered so the answer keeps its reserve. Without a budget, a
    cap of at least `ANSWER_ROOM_MIN_CAP` still gets one (the answer's room), unless `answer_room` is off.
    """
    budget = check_budget(budget)
    reserve = answer_reserve(max_new)
    if budget:
        return budget if budget <= max_new - reserve else max(1, max_new - reserve)
    if answer_room and max_new >= ANSWER_ROOM_MIN_CAP:
        return max_new - reserve
    return None


class ThinkingBudget:
    """The run loop's thinking counter: `count(parser)` after each token's text was fed returns True once,
    when the budget is spent at a clean point (the parser holds nothing): the loop then stops the engine,
    appends `WRAP_UP_TEXT` to the prompt (and feeds it to the parser) and goes on in a new pass.

    budget: `thinking_budget(...)`'s answer (None = never)."""

    def __init__(self, budget: int | None):
        self.budget = budget
        self.used = 0
        self.spent = False

    def count(self, parser: "OutputParser", clean: bool = True) -> bool:
        """clean: the token ended on a whole character (no UTF-8 sequence split across tokens)."""
        if self.budget is None or self.spent or not parser.in_reasoning:
            return False
        self.used += 1
        if self.used >= self.budget and clean and not parser.holding:
            self.spent = True
            return True
        return False


def needs_close_retry(parser: "OutputParser", finish: str, answered: bool, enabled: bool, tried: bool) -> bool:
    """Opt-in `reasoning_close_retry`: a reply that stopped inside its thinking with no answer gets
    `CLOSE_RETRY_TEXT` appended once and goes on. A call held in the thinking is an answer (the end of
    the output delivers it)."""
    return (enabled and not tried and finish == "stop" and parser.in_reasoning and not answered
            and not parser.holding_call)
