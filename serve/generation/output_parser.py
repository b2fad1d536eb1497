"""The incremental output parser.

Role: turn the model's decoded text into the one event stream of `serve/core/events.py` (reasoning, content,
tool_start, tool_args, tool_call). It knows no HTTP, no pipes and no token ids: the service feeds it text, in
pieces of any size. (Effort levels: serve/core/effort.py; the thinking budget: serve/generation/passes.py;
the dialects' effort fields: serve/api/wire.py and serve/api/anthropic.py.)

Public surface:
- `OutputParser(tools, thinking, forced_opening=None)`: `feed(text) -> list[Event]`, `finish() -> list[Event]`.
  The same text gives the same events however it is split (never a partial tag, never a verdict taken
  before the text that decides it has arrived). `in_reasoning` tells the run loop where the model is.
- `THINK_OPEN`, `THINK_CLOSE`: the thinking tags.
"""
from __future__ import annotations

from serve.core.events import Event, KIND_CONTENT, KIND_REASONING, KIND_TOOL_CALL, ToolSpec
from serve.prompt.tool_text import CALL_CLOSE, CALL_OPEN, new_call_id
from serve.generation.toolcall_parsers import body_parser_for

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# ------------------------------------------------------------------------------------------ parser

REASONING_CALL_HOLD_MAX_CHARS = 32 * 1024   # a call written inside the thinking is held this far, no further


def _held_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags` (0 if none)."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


class _Quotes:
    """Code-span state of the text read so far: inside a ``` fence (a run of 3+ backticks at a line's
    start) or an inline `code` span (closed by the same run, or by the line's end), `<tool_call>` is quoted
    text, not a call. A backtick run still arriving is decided by the next character."""

    def __init__(self):
        self.fence = False
        self.inline = 0          # length of the run that opened the inline span (0 = none)
        self.line_start = True   # only spaces or tabs since the last newline
        self.run = 0             # backticks in the run being read
        self.run_at_start = False

    def scan(self, text: str) -> None:
        if "`" not in text and not self.run:
            nl = text.rfind("\n")
            if nl >= 0:
                self.inline = 0
                self.line_start = not text[nl + 1:].strip(" \t")
            elif text.strip(" \t"):
                self.line_start = False
            return
        for ch in text:
            if ch == "`":
                if not self.run:
                    self.run_at_start = self.line_start
                self.run += 1
                continue
            if self.run:
                self._close_run()
            if ch == "\n":
                self.line_start, self.inline = True, 0
            elif ch not in " \t":
                self.line_start = False

    def _close_run(self) -> None:
        n, self.run = self.run, 0
        if self.run_at_start and n >= 3 and not self.inline:
            self.fence = not self.fence
        elif not self.fence:
            self.inline = 0 if self.inline == n else self.inline or n
        self.line_start = False

    def quoted(self) -> bool:
        if self.run:
            self._close_run()
        return self.fence or bool(self.inline)


class OutputParser:
    """Incremental split of model output into reasoning, content and tool-call events.

    thinking: the generation prompt ended with `<think>\\n`, so the output starts in reasoning.
    forced_opening: with thinking off, text the run put at the end of the prompt (a forced call opening),
    parsed as if the model had written it. With thinking on, the run loop asks `take_forced_opening()` once
    the model has left its thinking, appends that text to the prompt and feeds it here.
    parallel: parallel_tool_calls; when false, everything after the first complete call is dropped and
    `done` turns true (the run may stop the engine).
    new_id: call-id factory (tests pass a deterministic one); default `call_<24 hex>` / `toolu_<24 hex>`.

    Rules (UPSTREAM §7): reasoning ends at `</think>`, newlines right after it and newlines right before
    it are dropped; content text up to an unquoted `<tool_call>` is content, newlines before a call are
    dropped, so are newlines right after one; a body that is not a call (never announced) is content again;
    an announced call that breaks stays unfinished (no `tool_call` event) and the text up to its
    `</tool_call>` is dropped; a `<tool_call>` inside the thinking is held and becomes a call only when the
    thinking ends (or the output ends) with nothing but whitespace after it.
    """

    def __init__(self, tools: list[ToolSpec], thinking: bool, forced_opening: str | None = None, *,
                 parallel: bool = True, new_id=None, api: str = "openai"):
        self.tools = {t.name: t for t in tools}
        self.state = "reasoning" if thinking else "content"   # + "call", "skip" (a broken call), "done"
        self.parallel = parallel
        self._new_id = new_id or (lambda: new_call_id(api))
        self._buf = ""             # text not yet turned into events
        self._start = True         # output start: a leading `<think>` opens thinking
        self._drop_nl = True       # leading newlines here are dropped
        self._quotes = _Quotes()
        self._body = None          # the call being read (state "call")
        self._call_nl = ""         # newlines before the current call's `<tool_call>`
        self._held: str | None = None   # reasoning: raw text from an unquoted `<tool_call>` on
        self._held_nl = ""
        self._pending = "" if thinking else (forced_opening or "")
        self._opening = forced_opening if thinking else None
        self.n_calls = 0           # calls announced so far: the next call's index
        self.calls_from_reasoning = 0
        self.done = False
        self.forced = forced_opening is not None  # a forced call: the turn ends once the call(s) close

    @property
    def in_reasoning(self) -> bool:
        return self.state == "reasoning"

    @property
    def holding(self) -> bool:
        """Text is held undecided (a possible tag, held newlines, a call in the thinking)."""
        return bool(self._buf) or self._held is not None

    @property
    def holding_call(self) -> bool:
        """A `<tool_call>` written inside the thinking is held (it becomes a call if the thinking ends)."""
        return self._held is not None

    def take_forced_opening(self) -> str | None:
        """Thinking on and a call forced: once the model has left its thinking, the text to append (once)."""
        if self._opening is None or self.state == "reasoning" or self.done:
            return None
        text, self._opening = "\n\n" + self._opening, None
        return text

    def feed(self, text: str) -> list[Event]:
        if self._pending:
            text, self._pending = self._pending + text, ""
        self._buf += text
        out: list[Event] = []
        self._run(out, final=False)
        return out

    def finish(self) -> list[Event]:
        out = self.feed("")
        self._run(out, final=True)
        return out

    def _run(self, out: list[Event], final: bool) -> None:
        steps = {"reasoning": self._reasoning, "content": self._content, "call": self._call,
                 "skip": self._skip}
        while True:
            if self.state == "done":
                self._buf = ""
                return
            if not steps[self.state](out, final):
                return

    @staticmethod
    def _emit(out: list[Event], kind: str, text: str) -> None:
        if not text:
            return
        if out and out[-1].kind == kind and kind in (KIND_CONTENT, KIND_REASONING):
            out[-1].text += text
        else:
            out.append(Event(kind, text=text))

    def _strip_lead(self) -> bool:
        """Drop leading newlines where they are dropped; False when nothing else is buffered."""
        if self._drop_nl:
            stripped = self._buf.lstrip("\n")
            self._buf = stripped
            if not stripped:
                return False
            self._drop_nl = False
        return bool(self._buf)

    def _pass_text(self, out: list[Event], kind: str, final: bool, tags: tuple[str, ...]) -> None:
        """Emit the buffer except a possible tag start and the newlines before it (kept for the verdict)."""
        buf = self._buf
        if final:
            keep = 0
        else:
            keep = _held_suffix(buf, tags)
            body = buf[:len(buf) - keep]
            keep += len(body) - len(body.rstrip("\n"))
        text = buf[:len(buf) - keep]
        self._quotes.scan(text)
        self._emit(out, kind, text)
        self._buf = buf[len(buf) - keep:]

    # -------------------------------------------------------------------- reasoning

    def _reasoning(self, out: list[Event], final: bool) -> bool:
        if self._held is not None:
            return self._reasoning_held(out, final)
        if not self._strip_lead():
            return False
        buf = self._buf
        close = buf.find(THINK_CLOSE)
        call = buf.find(CALL_OPEN, 0, close if close >= 0 else len(buf))
        if call >= 0:
            pre = buf[:call]
            self._quotes.scan(pre)
            if self._quotes.quoted():
                self._quotes.scan(CALL_OPEN)
                self._emit(out, KIND_REASONING, pre + CALL_OPEN)
                self._buf = buf[call + len(CALL_OPEN):]
                return True
            text = pre.rstrip("\n")
            self._emit(out, KIND_REASONING, text)
            self._held_nl, self._held, self._buf = pre[len(text):], buf[call:], ""
            return True
        if close >= 0:
            self._emit(out, KIND_REASONING, buf[:close].rstrip("\n"))
            self._leave_reasoning(buf[close + len(THINK_CLOSE):])
            return True
        self._pass_text(out, KIND_REASONING, final, (THINK_CLOSE, CALL_OPEN))
        return False

    def _leave_reasoning(self, rest: str) -> None:
        self.state, self._buf, self._drop_nl = "content", rest, True
        self._start = False
        self._quotes = _Quotes()

    def _reasoning_held(self, out: list[Event], final: bool) -> bool:
        held = self._held = self._held + self._buf
        self._buf = ""
        think = held.find(THINK_CLOSE)
        scope = think if think >= 0 else len(held)
        last = held.rfind(CALL_CLOSE, 0, scope)
        after = held[last + len(CALL_CLOSE):scope].lstrip() if last >= 0 else None
        if think >= 0 or final:
            if after == "":
                self._deliver(out, held[:last + len(CALL_CLOSE)])
                if think >= 0:
                    self._leave_reasoning(held[think + len(THINK_CLOSE):])
                return think >= 0 and self.state != "done"
            return self._release(out)
        if len(held) > REASONING_CALL_HOLD_MAX_CHARS:
            return self._release(out)
        if after and not (after.startswith(CALL_OPEN) or CALL_OPEN.startswith(after) or
                          THINK_CLOSE.startswith(after)):
            return self._release(out)
        return False

    def _release(self, out: list[Event]) -> bool:
        """The held `<tool_call>` was thinking text after all: it is reasoning, the rest is read again."""
        text = self._held_nl + CALL_OPEN
        self._quotes.scan(text)
        self._emit(out, KIND_REASONING, text)
        self._buf, self._held, self._held_nl = self._held[len(CALL_OPEN):], None, ""
        return True

    def _deliver(self, out: list[Event], text: str) -> None:
        """Calls written inside the thinking, parsed as content would be; any text between them stays
        reasoning."""
        sub = OutputParser(list(self.tools.values()), thinking=False, parallel=self.parallel,
                           new_id=self._new_id)
        sub._start = False
        sub.n_calls = self.n_calls
        for event in sub.feed(text) + sub.finish():
            if event.kind == KIND_CONTENT:
                self._emit(out, KIND_REASONING, event.text)
            else:
                out.append(event)
                if event.kind == KIND_TOOL_CALL:
                    self.calls_from_reasoning += 1
        self.n_calls = sub.n_calls
        self._held, self._held_nl = None, ""
        if sub.done:
            self.state, self.done = "done", True

    # -------------------------------------------------------------------- content and calls

    def _content(self, out: list[Event], final: bool) -> bool:
        if self.forced and self.n_calls and not self._another_call(final):
            return False
        if not self._strip_lead():
            return False
        buf = self._buf
        if self._start:
            if buf.startswith(THINK_OPEN):   # a model that opens its own thinking
                self._buf, self.state, self._drop_nl = buf[len(THINK_OPEN):], "reasoning", True
                self._start = False
                return True
            if THINK_OPEN.startswith(buf) and not final:
                return False
            self._start = False
        at = buf.find(CALL_OPEN)
        if at < 0:
            self._pass_text(out, KIND_CONTENT, final, (CALL_OPEN,))
            return False
        pre = buf[:at]
        self._quotes.scan(pre)
        quoted = self._quotes.quoted()
        self._quotes.scan(CALL_OPEN)
        self._buf = buf[at + len(CALL_OPEN):]
        if quoted:
            self._emit(out, KIND_CONTENT, pre + CALL_OPEN)
            return True
        text = pre.rstrip("\n")
        self._emit(out, KIND_CONTENT, text)
        self._call_nl, self.state, self._body = pre[len(text):], "call", None
        return True

    def _another_call(self, final: bool) -> bool:
        """After a forced call: only another call may follow (parallel_tool_calls); any other text ends the
        turn unseen (tool_choice required / a named tool means a call, not a call and a commentary)."""
        buf = self._buf.lstrip()
        if buf.startswith(CALL_OPEN) or (not final and CALL_OPEN.startswith(buf)):
            self._buf = buf
            return bool(buf)
        self.state, self.done, self._buf = "done", True, ""
        return False

    def _call(self, out: list[Event], final: bool) -> bool:
        body = self._body
        if body is None:
            kind = body_parser_for(self._buf)
            if kind == "" and not final:
                return False
            if not kind:
                return self._revert(out, self._buf)
            body = self._body = kind(self.tools, self.n_calls, self._new_id())
        body.feed(self._buf)
        self._buf = ""
        if final:
            body.finish()
        out += body.take_events()
        if body.status == "complete":
            self.n_calls += 1
            self._body, self.state, self._buf, self._drop_nl = None, "content", body.raw[body.end:], True
            if not self.parallel:
                self.state, self.done = "done", True
            return True
        if body.status == "failed" or (final and not body.announced):
            if not body.announced:
                return self._revert(out, body.raw)
            self.n_calls += 1      # the index was used: a later call gets the next one
            rest = body.raw[body.pos:]
            self._body, self.state, self._buf = None, "skip", rest
            return True
        return False

    def _revert(self, out: list[Event], raw: str) -> bool:
        """Not a call: the `<tool_call>` and what followed are content, read again after the tag."""
        self._emit(out, KIND_CONTENT, self._call_nl + CALL_OPEN)
        self._call_nl, self._body, self.state, self._buf = "", None, "content", raw
        return True

    def _skip(self, out: list[Event], final: bool) -> bool:
        at = self._buf.find(CALL_CLOSE)
        if at >= 0:
            self.state, self._buf, self._drop_nl = "content", self._buf[at + len(CALL_CLOSE):], True
            return True
        keep = 0 if final else _held_suffix(self._buf, (CALL_CLOSE,))
        self._buf = self._buf[len(self._buf) - keep:]
        return False
