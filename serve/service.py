"""Service: from one internal request (`serve/events.py`) to an event stream, over one StrataEngine.

Role: render the chat template, encode with `PromptEncoder`, apply the context rule (requests are never
truncated), merge sampling, hold the turn (`fifo`: one generation at a time on the solo engine), run the
engine, decode tokens incrementally (UTF-8 split across tokens is held; invalid bytes become U+FFFD), end on
stop tokens, stop strings (text that may still become one is held back until decided) and the repeat guard,
feed the text through `OutputParser`, and keep the figures: per-request history, totals, live status.
It knows no HTTP: the translators call it and turn its events into their wire format.

Public surface (the calling convention of `serve/openai.py` and `serve/anthropic.py`):
- `prep = service.prepare(req)` with a `ChatRequest` or `CompletionRequest`: validates, renders, encodes and
  checks the context *before* anything is sent, so errors are plain 4xx/503 answers. Raises `BadRequest`,
  `EngineDied` (and subclasses). `prep.prompt_tokens` is known from here on.
- `for item in service.run(prep, cancelled)`: yields `Event`s (kind `ping` = nothing to say, send a
  keep-alive; `content`, `reasoning`, tool events) and last a `Done`. `cancelled()` is polled about every
  0.5 s and after each token; closing the generator early also stops the engine (STOP + drain).
- `count_tokens(req)`, `health()`, `status_view()`, `metrics_view()`, `totals`, `close()`.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from serve.engine import CTX_SLACK, EngineDied, EngineNonFinite, EngineStarting
from serve.events import (BadRequest, ChatRequest, CompletionRequest, Done, Event, KIND_CONTENT, KIND_PING)
from serve.template import ChatTemplate

try:
    from serve.reasoning import OutputParser
except ImportError:  # the agents' parser is not there yet: every text is content
    OutputParser = None
try:
    from serve import sampling as sampling_mod
except ImportError:
    sampling_mod = None
from serve.toolcalls import forced_opening

REPEAT_STOP_TOKENS = 256   # the same token this many times in a row is a loop: end the reply as `length`
LOOP_PERIOD_MAX = 16       # a loop of up to this many tokens repeating exactly ...
LOOP_SPAN_TOKENS = 128     # ... over the last this many tokens also ends the reply as `length` (small models
                           # fall into 5-10 token cycles; without this a reply with no max_tokens would run to
                           # the end of the context, minutes on a CPU)
QUEUE_BEAT_S = 10.0        # a request waiting for the turn yields a keep-alive this often
TURN_POLL_S = 0.5          # and checks whether its client left this often
HISTORY_KEEP = 500         # finished requests kept for /metrics
STOP_STRINGS_MAX = 4       # OpenAI allows at most 4 stop strings
TAIL_CHARS = 600           # live status keeps this much of the newest output


@dataclass
class Prepared:
    req: ChatRequest | CompletionRequest
    ids: list[int]
    max_new: int
    keys: str
    thinking: bool = False
    chat: bool = True
    forced_opening: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.ids)


class _StopMatcher:
    """Stop strings over content text: emits what can no longer start a stop string, holds the rest."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.buf = ""
        self.hit: str | None = None

    def feed(self, text: str) -> str:
        if not self.stops:
            return text
        self.buf += text
        first = None
        for s in self.stops:
            i = self.buf.find(s)
            if i >= 0 and (first is None or i < first[0]):
                first = (i, s)
        if first is not None:
            out, self.hit, self.buf = self.buf[:first[0]], first[1], ""
            return out
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.buf)), hold, -1):
                if self.buf.endswith(s[:n]):
                    hold = n
                    break
        out = self.buf[:len(self.buf) - hold]
        self.buf = self.buf[len(self.buf) - hold:]
        return out

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


def _looping(recent: deque) -> bool:
    """The last LOOP_SPAN_TOKENS ids are one cycle of at most LOOP_PERIOD_MAX ids, repeated exactly."""
    if len(recent) < LOOP_SPAN_TOKENS:
        return False
    ids = list(recent)
    for period in range(2, LOOP_PERIOD_MAX + 1):  # period 1 is the run-length guard's
        if all(ids[i] == ids[i - period] for i in range(period, len(ids))):
            return True
    return False


def check_stop(value) -> list[str]:
    """OpenAI `stop`: a string or a list of at most 4 strings; empty strings are dropped."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise BadRequest("stop: a string or a list of strings", param="stop")
    if len(value) > STOP_STRINGS_MAX:
        raise BadRequest(f"stop: at most {STOP_STRINGS_MAX} strings", param="stop")
    return [s for s in value if s]


class Service:
    def __init__(self, engine, tokenizer, model_name: str, template: ChatTemplate | None = None,
                 config: dict | None = None, arch: str | None = None):
        from tools.strata_tokenizer import PromptEncoder
        self.engine = engine
        self.tok = tokenizer
        self.model_name = model_name
        self.template = template or ChatTemplate.from_text(getattr(tokenizer, "chat_template", None))
        self.config = dict(config or {})
        self.arch = arch
        self.encoder = PromptEncoder(tokenizer, keep=4)
        sid = tokenizer.special_ids
        self.stop_ids = {sid[k] for k in ("im_end", "endoftext", "eos", "eot") if k in sid}
        self.repeat_stop = int(self.config.get("repeat_stop_tokens", REPEAT_STOP_TOKENS))
        self.fifo = threading.Lock()        # the turn: one generation at a time on the solo engine
        self._lock = threading.Lock()       # guards status, history, totals, queued, last_timings
        self.queued = 0
        self.status: dict = {"busy": False}
        self.history: deque = deque(maxlen=HISTORY_KEEP)
        self.totals = {"since": time.time(), "requests": 0, "prompt_tokens": 0, "reused": 0,
                       "output_tokens": 0, "prompt_ms": 0.0, "decode_ms": 0.0, "cancelled": 0,
                       "errors": 0}
        self.last_timings: dict = {}
        self.started = time.time()
        self.shutting_down = threading.Event()

    # ---------------------------------------------------------------- preparing
    def _context(self) -> int:
        ctx = self.engine.max_context or self.engine.known_ctx
        if not ctx:
            raise EngineStarting("the engine is starting (a minute or two); try again shortly")
        return ctx

    def encode_chat(self, req: ChatRequest, store: bool = True) -> tuple[list[int], bool]:
        thinking = None
        if req.reasoning_effort is not None:
            thinking = req.reasoning_effort != "none"
        rendered = self.template.render(req.messages, req.tools if req.tool_choice != "none" else [],
                                        thinking=thinking)
        ids = self.encoder.encode(rendered.text, plain=rendered.plain, store=store)
        opening = self.forced_opening(req, rendered.thinking)
        if opening:  # a forced call (tool_choice): the opening ends the prompt (UPSTREAM §5.3)
            ids = ids + self.tok.encode(opening)
        return ids, rendered.thinking

    def forced_opening(self, req: ChatRequest, thinking: bool) -> str | None:
        """The forced call opening for `tool_choice` required/named (thinking off), else None."""
        if thinking:
            return None
        return forced_opening(req.tool_choice, req.tools, getattr(self.template, "tool_format", "xml"))

    def count_tokens(self, req: ChatRequest) -> int:
        return len(self.encode_chat(req, store=False)[0])

    def prepare(self, req) -> Prepared:
        if self.shutting_down.is_set():
            raise EngineDied("the server is shutting down")
        if isinstance(req, CompletionRequest):
            if not isinstance(req.prompt, str) or not req.prompt:
                raise BadRequest("prompt: a non-empty string", param="prompt")
            ids, thinking, chat = self.tok.encode(req.prompt, parse_special=True), False, False
        else:
            (ids, thinking), chat = self.encode_chat(req), True
        if not ids:
            raise BadRequest("the prompt is empty", param="messages" if chat else "prompt")
        ctx = self._context()
        room = ctx - CTX_SLACK - len(ids)
        max_new = req.max_new
        if max_new is None or max_new <= 0:
            if room < 1:
                raise BadRequest(f"request exceeds the context window: prompt ({len(ids)} tokens) leaves no "
                                 f"room to answer in the context ({ctx}); requests are never truncated",
                                 param="messages", code="context_length_exceeded")
            max_new = room
        elif max_new > room:
            if self.config.get("fit_max_tokens") and room >= 1:
                max_new = room
            else:
                raise BadRequest(
                    f"request exceeds the context window: prompt ({len(ids)} tokens) + max tokens ({max_new}) "
                    f"exceeds the context ({ctx}); requests are never truncated. Send a smaller max_tokens "
                    f"(at most {max(room, 0)} here)", param="max_tokens", code="context_length_exceeded")
        keys = self._engine_keys(req, thinking)
        self.ensure_engine()
        return Prepared(req, ids, max_new, keys, thinking=thinking, chat=chat,
                        forced_opening=self.forced_opening(req, thinking) if chat else None)

    def _engine_keys(self, req, thinking) -> str:
        if sampling_mod is None:
            return ""
        card = sampling_mod.card_sampling(self.arch, thinking)
        merged = sampling_mod.merge_sampling(card, self.config.get("sampling"), None, req.sampling)
        return " ".join(sampling_mod.engine_keys(merged))

    def ensure_engine(self) -> None:
        """A dead engine is restarted by the next request (before its answer starts)."""
        if self.engine.alive() or self.engine.starting:
            return
        if not self.fifo.acquire(timeout=TURN_POLL_S):
            return  # a running request holds the turn; the run restarts it when its turn comes
        try:
            if not self.engine.alive():
                self.engine.restart(tries=1)
        finally:
            self.fifo.release()

    # ---------------------------------------------------------------- running
    def _take_turn(self, cancelled):
        """Wait for the fifo, yielding pings; returns True when held, False when the client left."""
        with self._lock:
            self.queued += 1
        try:
            last = time.monotonic()
            while not self.fifo.acquire(timeout=TURN_POLL_S):
                if (cancelled is not None and cancelled()) or self.shutting_down.is_set():
                    return False
                if time.monotonic() - last >= QUEUE_BEAT_S:
                    last = time.monotonic()
                    yield Event(KIND_PING)
            return True
        finally:
            with self._lock:
                self.queued -= 1

    def run(self, prep: Prepared, cancelled=None):
        t0 = time.monotonic()
        # with decode slots requests run concurrently; their order is the engine's (serve/batch.py)
        batched = bool(getattr(self.engine, "batched", lambda: False)())
        held = True if batched else (yield from self._take_turn(cancelled))
        if not held:
            yield Done("cancel", prep.prompt_tokens, 0)
            return
        record = {"time": time.time(), "prompt_tokens": prep.prompt_tokens, "api": getattr(prep.req, "api", "")}
        try:
            if not self.engine.alive() and not batched:
                self.engine.restart(tries=1)
            with self._lock:
                self.status = {"busy": True, "phase": "reading the prompt", "prompt_tokens": prep.prompt_tokens,
                               "generated": 0, "started": time.time(), "first_token": None, "tail": "",
                               "max_tokens": prep.max_new}
            done = yield from self._generate(prep, cancelled, record, t0)
        except GeneratorExit:
            record.setdefault("finish", "cancel")  # the consumer left (the engine was stopped and drained)
            raise
        except BaseException as e:
            record["finish"] = "error"
            record["error"] = str(e)[:300]
            raise
        finally:
            self._finish(record, t0)
            if not batched:
                self.fifo.release()
        yield done  # after the turn is given back: a consumer that stops at Done holds nothing

    def _generate(self, prep: Prepared, cancelled, record, t0):
        stop = _StopMatcher(list(prep.req.stop or []))
        parser = None
        if prep.chat and OutputParser is not None:
            parser = OutputParser(prep.req.tools, prep.thinking, prep.forced_opening,
                                  parallel=prep.req.parallel_tool_calls, api=prep.req.api)
        decoder = self.tok.stream_decoder()
        result: dict = {}
        n_out, last_id, run_len, finish = 0, None, 0, None
        first_at = None
        recent: deque = deque(maxlen=LOOP_SPAN_TOKENS)
        is_cancelled = (lambda: self.shutting_down.is_set() or (cancelled is not None and cancelled()))
        retried = False
        while True:
            gen = self.engine.generate(prep.ids, prep.max_new, prep.keys, is_cancelled, result)
            try:
                for tid in gen:
                    if tid is None:
                        yield Event(KIND_PING)
                        continue
                    n_out += 1
                    if first_at is None:
                        first_at = time.monotonic()
                        with self._lock:
                            self.status.update(first_token=time.time(), phase="answering")
                    if tid in self.stop_ids:
                        continue  # the engine ends the turn on it itself; never shown
                    run_len = run_len + 1 if tid == last_id else 1
                    last_id = tid
                    recent.append(tid)
                    if self.repeat_stop and (run_len >= self.repeat_stop or _looping(recent)):
                        finish = "length"
                        break
                    for ev in self._events(decoder.feed(tid), parser, stop):
                        yield ev
                    if stop.hit is not None or (parser is not None and parser.done):
                        finish = "stop"  # a stop string, or the one call parallel_tool_calls=false allows
                        break
                    record["output_tokens"] = n_out
                    with self._lock:
                        self.status["generated"] = n_out
            except EngineNonFinite:
                if n_out == 0 and not retried:
                    retried = True
                    result = {}
                    continue
                if n_out == 0:
                    raise
                finish = "length"
            finally:
                gen.close()  # an early end: STOP + drain while we still hold the turn
            break
        if stop.hit is None:
            for ev in self._events(decoder.flush(), parser, stop, final=True):
                yield ev
        finish = finish or result.get("finish") or "stop"
        if finish == "cancel" and self.shutting_down.is_set():
            finish = "shutdown"
        if stop.hit is not None:
            finish = "stop"
        record.update(finish=finish, figures=dict(result), output_tokens=n_out,
                      first_token_s=(first_at - t0) if first_at else None)
        timings = self._timings(result, prep.prompt_tokens, n_out)
        record["timings"] = timings
        return Done(finish if finish != "shutdown" else "cancel", prep.prompt_tokens, n_out,
                    cached_tokens=result.get("reused"), stop_sequence=stop.hit, timings=timings)

    def _events(self, text, parser, stop, final=False):
        events = parser.feed(text) if parser is not None else ([Event(KIND_CONTENT, text)] if text else [])
        if final and parser is not None:
            events += parser.finish()
        for ev in events:
            if ev.kind == KIND_CONTENT:
                shown = stop.feed(ev.text)
                if shown:
                    self._tail(shown)
                    yield Event(KIND_CONTENT, shown)
                if stop.hit is not None:
                    return
            else:
                held = stop.flush()  # a stop string never spans reasoning or a tool call
                if held:
                    yield Event(KIND_CONTENT, held)
                yield ev
        if final:
            held = stop.flush()
            if held:
                yield Event(KIND_CONTENT, held)

    def _tail(self, text):
        with self._lock:
            self.status["tail"] = (self.status.get("tail", "") + text)[-TAIL_CHARS:]

    @staticmethod
    def _timings(r: dict, prompt_tokens: int, n_out: int) -> dict:
        reused = r.get("reused") or 0
        prompt_n = max(0, prompt_tokens - reused)
        pm, dm = r.get("prompt_ms"), r.get("decode_ms")
        t = {"cache_n": reused, "prompt_n": prompt_n}
        if pm is not None:
            t.update(prompt_ms=pm, prompt_per_token_ms=pm / prompt_n if prompt_n else 0.0,
                     prompt_per_second=1e3 * prompt_n / pm if pm else 0.0)
        t["predicted_n"] = n_out
        if dm is not None:
            t.update(predicted_ms=dm, predicted_per_token_ms=dm / n_out if n_out else 0.0,
                     predicted_per_second=1e3 * n_out / dm if dm else 0.0)
        if r.get("drafts_off"):
            t.update(draft_n=r["drafts_off"], draft_n_accepted=r.get("drafts_acc") or 0)
        return t

    def _finish(self, record: dict, t0: float) -> None:
        record["duration_s"] = time.monotonic() - t0
        fig = record.get("figures", {})
        with self._lock:
            self.status = {"busy": False}
            self.history.append(record)
            tot = self.totals
            tot["requests"] += 1
            tot["prompt_tokens"] += record["prompt_tokens"]
            tot["reused"] += fig.get("reused") or 0
            tot["output_tokens"] += record.get("output_tokens", 0)
            tot["prompt_ms"] += fig.get("prompt_ms") or 0.0
            tot["decode_ms"] += fig.get("decode_ms") or 0.0
            if record.get("finish") == "cancel":
                tot["cancelled"] += 1
            if record.get("finish") == "error":
                tot["errors"] += 1
            if record.get("timings"):
                self.last_timings = record["timings"]

    # ---------------------------------------------------------------- views
    def health(self) -> tuple[int, dict]:
        e = self.engine
        loaded = e.alive()
        body = {"status": "ok" if loaded else ("loading" if e.starting else "unavailable"),
                "max_context": e.max_context or e.known_ctx, "model": self.model_name, "loaded": loaded,
                "service": "strata"}
        return (200 if loaded else 503), body

    def status_view(self) -> dict:
        with self._lock:
            st = dict(self.status, queued=self.queued)
        if st.get("busy") and st.get("started"):
            st["elapsed_s"] = round(time.time() - st["started"], 3)
            if st.get("first_token") and st.get("generated"):
                span = time.time() - st["first_token"]
                st["tokens_per_s"] = round(st["generated"] / span, 2) if span > 0 else None
        return st

    def metrics_view(self, all_requests: bool = False) -> dict:
        e = self.engine
        st = self.status_view()
        with self._lock:
            hist = list(self.history)
            totals = dict(self.totals)
        state = "unloaded" if not e.alive() else ("idle" if not st.get("busy") else
                                                  ("generating" if st.get("first_token") else "reading"))
        live = {"state": state, "queued": st.get("queued", 0), "phase": st.get("phase"),
                "prompt_tokens": st.get("prompt_tokens"), "generated": st.get("generated"),
                "max_tokens": st.get("max_tokens"), "elapsed_s": st.get("elapsed_s"),
                "tok_s": st.get("tokens_per_s"), "prefill_tok_s_mean": e.prefill_tok_s,
                "prompt_read": e.progress[0] if st.get("busy") else None}
        if getattr(e, "batch", None) is not None:  # decode slots (serve/batch.py): per-slot view, counters
            live["slots"], live["batch"] = e.batch.slot_view(), e.batch.stats()
        if hasattr(e, "live"):  # ReplicaEngine
            live["replicas"] = e.live()
        records = hist[::-1] if all_requests else hist[::-1][:12]
        return {"engine": {"model": self.model_name, "max_context": e.max_context or e.known_ctx,
                           **{k: v for k, v in e.info.items() if not isinstance(v, dict)}},
                "live": live, "requests": records, "requests_kept": len(hist), "totals": totals,
                "time": time.time()}

    def close(self) -> None:
        self.shutting_down.set()
