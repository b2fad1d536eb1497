"""Service: from one internal request (`serve/core/events.py`) to an event stream, over one StrataEngine.

Role: prepare a request (render the chat template, encode with `PromptEncoder`, apply the context rule,
merge sampling: `Preparation`, serve/generation/prepare.py), run the engine (a request waits for a free
slot; an engine with several slots runs them concurrently), decode tokens incrementally (UTF-8
split across tokens is held; invalid bytes become U+FFFD), end on stop tokens, stop strings (text that may
still become one is held back until decided) and the repeat guard,
feed the text through `OutputParser`, and keep the figures: per-request history, totals, live status.
A reply may take several engine passes (thinking budget and answer room, a forced call after the thinking,
`reasoning_close_retry`): `serve/generation/passes.py` says when a pass ends and what the server writes before
the next; the events go on as one stream. Effort and sampling defaults come from the shared Chat settings
(`set_settings`) and the run config for what a request omits.
It knows no HTTP: the translators call it and turn its events into their wire format.

Public surface (the calling convention of `serve/api/openai.py` and `serve/api/anthropic.py`):
- `prep = service.prepare(req)` with a `ChatRequest` or `CompletionRequest`: validates, renders, encodes and
  checks the context *before* anything is sent, so errors are plain 4xx/503 answers. Raises `BadRequest`,
  `ServiceError` (serve/core/errors.py). `prep.prompt_tokens` is known from here on.
- `for item in service.run(prep, cancelled, on_wait)`: yields `Event`s (kind `ping` = nothing to say, send a
  keep-alive; `content`, `reasoning`, tool events) and last a `Done`. `cancelled()` is polled about every
  0.5 s and after each token; `on_wait()` (optional) is called on this thread right before each wait for the
  engine (a stream writes its held frames then: serve/http/pacing.py); closing the generator early also
  stops the engine (STOP + drain).
- `count_tokens(req)`, `health()`, `status_view()`, `metrics_view()`, `totals`, `close()`.
- `start_engine()` (first start, then the Supervisor restarts an engine that dies while idle),
  `stop_engine()` (shutdown), `kill_engine()`, `death_note()`.
- Errors at this boundary, once: every engine exception becomes a `ServiceError` (`service_error(e)`:
  503 down/starting/stuck with the death note, 502 a broken engine line) or a `BadRequest` (an engine ERR);
  the HTTP layer never sees an engine exception.
- `settings_view()` / `set_settings(defaults)`: the shared Chat settings (GET / POST `/settings`).
- `slot_file(action, slot_id, path)`: llama-server's saved slots (serve/engine_client/slot_files.py).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from serve.engine_client.protocol import (
    CTX_SLACK, EngineBadLine, EngineDied, EngineNonFinite, EngineRefused, EngineStarting, EngineStuck)
from serve.core.engine_api import EngineClient, EngineFigures
from serve.core.errors import EngineFault, ServiceError, ServiceUnavailable
from serve.engine_client.supervisor import Supervisor
from serve.ops.live_figures import LiveFigures
from serve.core.events import FINISH_LOOP, BadRequest, ChatRequest, Done, Event, KIND_CONTENT, KIND_PING
from serve.prompt.chatml import ChatTemplate
from serve.generation.passes import ReplyPasses

from serve.generation.output_parser import OutputParser
from serve.generation.call_syntax import CallSyntaxParser
from serve.core.effort import resolve_effort
from serve.core import sampling as sampling_mod
from serve.generation.logprobs import Trail
from serve.generation.guards import REPEAT_STOP_TOKENS, LoopGuard, StopMatcher
from serve.generation.figures import ServiceFigures
from serve.generation.prepare import Preparation, Prepared

HISTORY_KEEP = 500         # finished requests kept for /metrics
TAIL_CHARS = 600           # live status keeps this much of the newest output


def _progress(result: dict, total: int, t_read: float) -> dict | None:
    """The prompt read so far, from the figures the slot path left in `result` (BACC's reused count and each
    BPP line's position), in llama-server's prompt_progress names; None before any."""
    if "prompt_reached" not in result:
        return None
    cache = result.get("reused") or 0
    return {"total": total, "cache": cache, "processed": max(cache, result["prompt_reached"]),
            "time_ms": int((time.monotonic() - t_read) * 1000)}


@dataclass
class _Run:
    """The state of one reply while it runs (one thread; nothing here is shared)."""
    stop: StopMatcher
    parser: object
    passes: ReplyPasses
    decoder: object
    guard: LoopGuard
    is_cancelled: object
    on_wait: object = None  # the caller's hook before each wait for the engine (RequestContext.on_wait)
    first_at: float | None = None
    pass_out: int = 0   # tokens of the current pass
    tracker: object = None  # LiveFigures.Tracker: per-token latency and decode-share figures
    ids: list = field(default_factory=list)       # every token id the engine sent (llama.cpp's `tokens`)
    unshown: list = field(default_factory=list)   # ids whose text no content event has carried yet
    trail: Trail | None = None  # the tokens' log-probabilities, when the request asked (serve/generation/logprobs.py)

    def took(self, tid) -> None:
        """A shown token: its id (and log-probabilities) wait for the content event its text goes into."""
        self.ids.append(int(tid))
        self.unshown.append(int(tid))
        if self.trail is not None:
            self.trail.add(tid)

    def events(self, events):
        """Events as they go out: a content event takes the ids (and log-probabilities) of the tokens since
        the last one."""
        for ev in events:
            if ev.kind == KIND_CONTENT:
                ev.ids, self.unshown = self.unshown, []
            if self.trail is not None:
                self.trail.attach(ev)
            yield ev


class Service(Preparation, ServiceFigures):
    def __init__(self, engine: EngineClient, tokenizer, model_name: str, template: ChatTemplate | None = None,
                 config: dict | None = None, arch: str | None = None):
        from tokenizer.prompt_encoder import PromptEncoder
        self.engine = engine
        self.supervisor: Supervisor | None = None
        self.tok = tokenizer
        self._breaker_cache: dict[tuple[str, ...], tuple[int, ...]] = {}  # DRY breaker strings -> token ids
        self.model_name = model_name
        self.template = template or ChatTemplate.from_text(getattr(tokenizer, "chat_template", None))
        self.config = dict(config or {})
        self.arch = arch
        self.encoder = PromptEncoder(tokenizer, keep=4)
        sid = tokenizer.special_ids
        self.stop_ids = {sid[k] for k in ("im_end", "endoftext", "eos", "eot", "return", "call") if k in sid}
        self.repeat_stop = int(self.config.get("repeat_stop_tokens", REPEAT_STOP_TOKENS))
        self._lock = threading.Lock()       # guards status, history, totals, last_timings, settings
        self.settings: dict = {}            # the shared Chat settings' defaults (POST /settings), checked
        self.settings_path: str | None = None  # where POST /settings saves them (bootstrap: beside the config)
        self.model_path: str | None = None     # the served GGUF file, when there is one (bootstrap sets it)
        self.status: dict = {"busy": False}
        self.history: deque = deque(maxlen=HISTORY_KEEP)
        self.totals = {"since": time.time(), "requests": 0, "prompt_tokens": 0, "reused": 0,
                       "output_tokens": 0, "prompt_ms": 0.0, "decode_ms": 0.0, "cancelled": 0,
                       "errors": 0, "drafts_offered": 0, "drafts_accepted": 0, "draft_steps": 0}
        self.last_timings: dict = {}
        self.started = time.time()
        self.shutting_down = threading.Event()
        self.live = LiveFigures()           # running now, latency histograms, rejections (own lock)
        self.sampler = None                 # telemetry.Sampler, started by serve/ops/metrics_views.py on first use

    # ---------------------------------------------------------------- shared Chat settings
    def settings_view(self) -> dict:
        """GET /settings: `{shared, defaults}`."""
        with self._lock:
            return {"shared": bool(self.settings), "defaults": dict(self.settings)}

    def set_settings(self, defaults) -> dict:
        """POST /settings `defaults` (an object, or None to clear): checked whole first (a 400 names the
        field), then applied to every later request for the fields it omits."""
        checked = sampling_mod.check_shared_settings(defaults)
        with self._lock:
            self.settings = checked
        return self.settings_view()

    def _settings(self) -> dict:
        with self._lock:
            return dict(self.settings)

    def _budget_default(self):
        """The thinking budget of a request that names none: the shared settings', else the config's."""
        value = self._settings().get("reasoning_budget_tokens")
        return value if value is not None else self.config.get("reasoning_budget_tokens")

    def effort(self, req: ChatRequest) -> str | None:
        """The request's effort, else the shared settings', else the config's (UPSTREAM §7)."""
        return resolve_effort(req.reasoning_effort, self._settings().get("reasoning_effort"),
                              self.config.get("reasoning_effort"))

    # ---------------------------------------------------------------- the queue
    @property
    def queued(self) -> int:
        """Requests waiting for the engine (for a free slot)."""
        e = self.engine
        waiting = getattr(getattr(e, "batch", None), "waiting", None)
        return int(getattr(e, "queued", 0) or 0) + (len(waiting) if waiting else 0)

    # ---------------------------------------------------------------- the engine, at this boundary
    def death_note(self) -> str:
        return self.engine.death_note()

    def service_error(self, e: BaseException) -> Exception:
        """An engine exception as the HTTP layer may see it (the one conversion); others unchanged."""
        if isinstance(e, (ServiceError, BadRequest)):
            return e
        if isinstance(e, EngineBadLine):
            return EngineFault(f"{e}; the engine was restarted for the next request")
        if isinstance(e, EngineStarting):
            return ServiceUnavailable(str(e) or "the engine is starting; try again shortly")
        if isinstance(e, EngineDied):
            text = str(e) or type(e).__name__
            note = self.engine.death_note()
            if note and note not in text and note != "the engine is running":
                text += "; " + note
            return ServiceUnavailable(text + "; the next request restarts it")
        if isinstance(e, EngineStuck):
            return ServiceUnavailable(str(e))
        if isinstance(e, EngineNonFinite):
            return ServiceUnavailable(f"{e}; the request was not answered")
        if isinstance(e, EngineRefused):
            return BadRequest(f"the engine refused the request: {e}")
        return e

    def start_engine(self) -> None:
        """The first start (ServiceUnavailable when the model cannot be loaded); then a Supervisor restarts
        the engine whenever it dies while idle."""
        try:
            if not self.engine.alive():
                self.engine.start()
        except (EngineDied, EngineStuck) as e:
            raise self.service_error(e) from None
        if self.supervisor is None and not self.shutting_down.is_set():
            self.supervisor = Supervisor(self.engine)
            self.supervisor.start()

    def stop_engine(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
        try:
            self.engine.close()
        except EngineStuck as e:
            raise self.service_error(e) from None

    def kill_engine(self) -> None:
        self.engine.kill_now()

    def ensure_engine(self) -> None:
        """A dead engine is restarted by the next request (before its answer starts)."""
        self.engine.ensure_running()

    # ---------------------------------------------------------------- embeddings (serve/api/embeddings.py)
    def embed_room(self) -> int:
        """The most tokens one embedding input may have (the engine keeps CTX_SLACK of the context free)."""
        return self._context() - CTX_SLACK

    def embed(self, ids: list[int], cancelled=None) -> str:
        """One input's vector as the engine wrote it: `<n_embd> <base64 of float32 LE>` (docs/PROTOCOL.md
        "Embeddings"); engine failures come out as service errors, a client that left as a 503."""
        result: dict = {}
        try:
            self.engine.ensure_running()
            for _ in self.engine.generate(ids, 0, "", cancelled, result, embed=True):
                pass
        except Exception as e:
            raise self.service_error(e) from None
        if not isinstance(result.get("embedding"), str):
            raise ServiceUnavailable(f"the embedding was not computed (finish {result.get('finish')})")
        return result["embedding"]

    # ---------------------------------------------------------------- running
    def run(self, prep: Prepared, cancelled=None, on_wait=None):
        """The events of one reply; engine failures come out as service errors (see service_error)."""
        try:
            yield from self._run(prep, cancelled, on_wait)
        except GeneratorExit:
            raise
        except Exception as e:
            raise self.service_error(e) from None

    def _run(self, prep: Prepared, cancelled=None, on_wait=None):
        t0 = time.monotonic()
        record = {"time": time.time(), "prompt_tokens": prep.prompt_tokens, "api": getattr(prep.req, "api", "")}
        tracker = self.live.begin(t0)
        if getattr(prep.req, "notes", None):
            record["notes"] = list(prep.req.notes)  # e.g. an unknown tool_choice taken as auto
        try:
            self.engine.ensure_running()
            with self._lock:
                self.status = {"busy": True, "phase": "reading the prompt", "prompt_tokens": prep.prompt_tokens,
                               "generated": 0, "started": time.time(), "first_token": None, "tail": "",
                               "max_tokens": prep.max_new}
            done = yield from self._generate(prep, cancelled, record, t0, tracker, on_wait)
        except GeneratorExit:
            record.setdefault("finish", "cancel")  # the consumer left (the engine was stopped and drained)
            raise
        except BaseException as e:
            record["finish"] = "error"
            record["error"] = str(e)[:300]
            raise
        finally:
            self._finish(record, t0)
            tracker.end(record)
        yield done

    def _generate(self, prep: Prepared, cancelled, record, t0, tracker=None, on_wait=None):
        parser = None
        if prep.chat:
            syntax = getattr(self.template, "call_syntax", None)   # serve/generation/call_syntax.py
            parser = (CallSyntaxParser(syntax, prep.req.tools, prep.thinking, prep.forced_opening,
                                       parallel=prep.req.parallel_tool_calls, api=prep.req.api) if syntax else
                      OutputParser(prep.req.tools, prep.thinking, prep.forced_opening,
                                   parallel=prep.req.parallel_tool_calls, api=prep.req.api))
        # budget, answer room, forced call after thinking, close retry: when a pass ends (serve/generation/passes.py)
        run = _Run(StopMatcher(list(prep.req.stop or [])), parser, ReplyPasses(
            prep, self.tok, parser, self._budget_default()), self.tok.stream_decoder(), LoopGuard(self.repeat_stop),
            lambda: self.shutting_down.is_set() or (cancelled is not None and cancelled()), on_wait, tracker=tracker,
            trail=Trail.of(self.tok, prep.req))
        passes, stop = run.passes, run.stop
        figures = EngineFigures()   # the reply's, over its passes
        finish, retried = None, False
        with self._lock:
            self.status["thinking_budget"] = passes.budget.budget
        while True:
            result: dict = {}
            try:
                finish, write = yield from self._pass(run, prep.keys, result, record)
            except GeneratorExit:  # the client left: the pass was stopped and drained; its figures stay
                record.update(figures=figures.merged(EngineFigures.of(result)), output_tokens=passes.n_out)
                raise
            except EngineNonFinite:
                if run.pass_out == 0 and not retried:
                    retried = True  # nothing came yet: the pass is sent once more, silently
                    continue
                if passes.n_out == 0:
                    raise
                finish, write = "length", None
            figures = figures.merged(EngineFigures.of(result))
            if finish is None and write is None:
                write = passes.at_end(result.get("finish"))
            if finish is not None or write is None:
                break
            finish = yield from self._write(run, write)
            if finish is None and run.is_cancelled():
                finish = "cancel"
            if finish is not None:
                break
            passes.passes += 1
        if stop.hit is None:
            for ev in run.events(self._events(run.decoder.flush(), parser, stop, final=True)):
                yield ev
        finish = finish or figures.finish or "stop"
        if finish == "cancel" and self.shutting_down.is_set():
            finish = "shutdown"
        if stop.hit is not None:
            finish = "stop"
        record.update(finish=finish, figures=figures, output_tokens=passes.n_out, passes=passes.passes,
                      written_tokens=passes.inserted, reasoning_tokens=passes.reasoning_tokens,
                      first_token_s=(run.first_at - t0) if run.first_at else None)
        timings = figures.timings(prep.prompt_tokens, passes.n_out)
        record["timings"] = timings
        return Done(finish if finish != "shutdown" else "cancel", prep.prompt_tokens,
                    passes.n_out + passes.inserted, cached_tokens=figures.reused,
                    reasoning_tokens=passes.reasoning_tokens, stop_sequence=stop.hit, timings=timings, ids=run.ids)

    def _pass(self, run: "_Run", keys: str, result: dict, record: dict):
        """One engine pass; returns (finish, None) when the reply ends here, (None, text) when the pass ends
        for the server to write `text` and go on, (None, None) when the engine ended the pass."""
        passes, parser, stop = run.passes, run.parser, run.stop
        run.pass_out = 0
        prompt = passes.prompt()
        # a constrained reply that loops is closed, not cut: the engine writes its grammar's shortest completion
        closing = [False]
        constrained = " grammar=" in f" {keys}"
        gen = self.engine.generate(prompt, passes.room(), keys, run.is_cancelled, result, on_wait=run.on_wait,
                                   **({"closing": lambda: closing[0]} if constrained else {}))
        t_read = time.monotonic()
        try:
            for tid in gen:
                if tid is None:
                    yield Event(KIND_PING, progress=_progress(result, len(prompt), t_read)
                                if passes.passes == 1 else None)
                    continue
                run.pass_out += 1
                if run.tracker is not None:
                    run.tracker.token()
                if run.first_at is None:
                    run.first_at = time.monotonic()
                    with self._lock:
                        self.status.update(first_token=time.time(), phase="answering")
                passes.generated(tid, tid in self.stop_ids)
                if tid in self.stop_ids:
                    continue  # the engine ends the turn on it itself; never shown
                if not closing[0] and run.guard.looping(tid):
                    if not constrained:
                        return FINISH_LOOP, None
                    closing[0] = True  # this token and the completion still come, and are shown
                was_reasoning = parser is not None and parser.in_reasoning
                run.took(tid)
                for ev in run.events(self._events(run.decoder.feed(tid), parser, stop)):
                    passes.saw(ev)
                    yield ev
                if stop.hit is not None or (parser is not None and parser.done):
                    return "stop", None  # a stop string, or the one call parallel_tool_calls=false allows
                record["output_tokens"] = passes.n_out
                with self._lock:
                    self.status.update(generated=passes.n_out, phase="thinking" if was_reasoning else "answering")
                write = passes.after_token(was_reasoning)
                if write is not None:
                    return None, write  # the budget is spent, or a forced call opens: the pass ends here
            return (FINISH_LOOP, None) if closing[0] else (None, None)
        finally:
            gen.close()  # an early end: STOP + drain while we still hold the turn

    def _write(self, run: "_Run", text: str):
        """Between passes: the server's text (and a forced call opening after it) goes into the reply as
        output. Returns None to go on, or the finish ("length": no room left; "stop": a stop string)."""
        held = run.decoder.flush()  # a character split at the pass's end is not continued by the written text
        for ev in run.events(self._events(held, run.parser, run.stop)) if held else ():
            yield ev
        while text is not None:
            if not run.passes.write(text):
                return "length"
            for ev in run.events(self._events(text, run.parser, run.stop)):
                run.passes.saw(ev)
                yield ev
            if run.stop.hit is not None:
                return "stop"
            text = run.passes.follow()
        return None

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

    def slot_file(self, action: str, slot_id: int, path: str | None = None) -> dict:
        """Saved slots: save / restore `path`, or erase, on a decode slot (serve/engine_client/slot_files.py)."""
        from serve.engine_client.slot_files import slot_file
        try:
            return slot_file(self.engine, action, slot_id, path)
        except Exception as e:
            raise self.service_error(e) from None

    def close(self) -> None:
        self.shutting_down.set()
        if self.supervisor is not None:
            self.supervisor.stop()
