"""A protocol-faithful fake of `strata-engine --serve --batch N` (docs/PROTOCOL.md), scripted per test.

Like tests/fake_engine.py (same ByteTokenizer ids: 256 `<|endoftext|>`, 257 `<|im_start|>`, 258 `<|im_end|>`),
plus decode slots: BGEN (and BEMB: embeddings, vectors from tests/fake_engine.fake_vector_line) answered at once (BACC), the reads and decoding in slot steps (decode entries first,
then prompt chunks shortest remaining first under the step budget), BPP/BT/BDONE, BSTOP in either phase,
each idle slot keeping its stream (prefix reuse), BSTOP stamped against request numbers as the real engine
does.

Canary replies: the answer is derived from the prompt, so a reply that crossed into another request is seen.
The *question* is the text after the last `<|im_start|>` up to its first newline (`<|im_start|>q7\\n`); when
that line is `assistant` (a rendered chat) it is the previous turn's text after its first newline, without
`<|im_end|>`. The answer is `<question>` repeated `repeat` times, then 258. Whatever follows the last
question line in the prompt is taken as the answer so far: the fake continues from there, and answers `?`
if that part is not a start of the answer (a crossed stream). A request key `logit_bias=ID:B` with B >= 100
forces ID as every token (as on the real engine), so the golden transcripts replay here too.

Script (JSON; every key optional; `starts` and `state` as in tests/fake_engine.py):
  slots (default 4), ctx (--max-context, else 2048), no_slot_cache
  repeat (answer repetitions, default 1), step_delay_s (per slot step),
  step_tokens (else --step-tokens, else pp_chunk, else 64), pp_delay_s (per prompt chunk), record (file),
  rules: [{match: substring of the question, ...any of repeat/pp_delay_s/step_delay_s}]
  stray: lines written right after READY (e.g. a `BT 3 65` for nobody)
  bstop_lag_steps: steps a decoding slot still makes after its BSTOP (the token of a step under way)
  die_after_steps: exit 3 after that many steps
  freeze_after_steps: SIGSTOP itself after that many steps (a frozen engine, mid-stream)
`PING <n>` is answered `PONG <n>` when the loop takes it (at once when idle, between two steps), and is not
recorded unless the script says record_ping: true.
  hang_after_bstop: after a BSTOP, write nothing more (but `tick_s` WARN lines) for this many seconds
  tick_s: a `WARN tick` line this often while hanging
  hang_steps: while hanging, the other busy slots go on (BT lines only, none for the hanging slot)
  report_affinity: a second INFO line `INFO affinity=<cpus, comma-separated> threads_arg=<--threads or ->`
  raw_bgen: lines written instead of BACC for every BGEN (a malformed engine)
  BERASE <slot> is answered as the engine does (ERASED <slot> <n held>); BSAVE / BRESTORE are unknown here.
  drafts: [accepted, offered] or [accepted, offered, steps] of every request (drafting on): BDONE gets
    `drafts_acc=A drafts_off=O` (and `drafts_n=steps`) (absent: drafting off, no drafts keys)
"""
import os
import queue
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.fake_engine import (CTX_SLACK, EOS_IDS, IM_START, N_VOCAB, emit, fake_embed_ids,  # noqa: E402
                               fake_vector_line, load_script, logprobs_suffix, request_grammar,
                               request_logprobs)

NEWLINE = 10
COMMANDS_PER_STEP = 16   # as the real engine: queued commands taken between two steps


def question_of(ids):
    """(question bytes, index where the answer so far starts)."""
    starts = [i for i, t in enumerate(ids) if t == IM_START]
    if not starts:
        return bytes(t for t in ids if t < 256), len(ids)
    last = starts[-1]
    try:
        nl = ids.index(NEWLINE, last)
    except ValueError:
        return bytes(t for t in ids[last + 1:] if t < 256), len(ids)
    line = bytes(t for t in ids[last + 1:nl] if t < 256)
    if line == b"assistant" and len(starts) >= 2:
        prev = starts[-2]
        turn = ids[prev + 1:last]
        if NEWLINE in turn:
            turn = turn[turn.index(NEWLINE) + 1:]
        line = bytes(t for t in turn if t < 256).rstrip(b"\n")
    return line, nl + 1


def forced_id(words):
    """The id a `logit_bias=ID:B` key with B >= 100 forces, else None."""
    for w in words:
        if w.startswith("logit_bias="):
            for pair in w[len("logit_bias="):].split(","):
                tid, _, bias = pair.partition(":")
                try:
                    if float(bias) >= 100:
                        return int(tid)
                except ValueError:
                    pass
    return None


class Engine:
    def __init__(self, s):
        self.s = s
        self.n = int(s.get("slots", 4))
        self.eos = tuple(s.get("eos_ids", EOS_IDS))
        self.commands = queue.Queue()
        self.reqno = 0          # request numbers seen by the reader (BGEN/BEMB lines)
        self.bstop_at = [-1] * self.n
        self.lock = threading.Lock()  # guards the stamps above
        self.slots = [{"phase": None, "held": [], "seq": 0} for _ in range(self.n)]
        self.steps = 0
        self.step_tokens = int(s.get("step_tokens", s.get("pp_chunk", 64)))

    def log(self, line):
        if self.s.get("record") and (not line.startswith("PING ") or self.s.get("record_ping")):
            with open(self.s["record"], "a", encoding="utf-8") as f:
                f.write(f"{os.getpid()} {line[:100000]}\n")

    def reader(self):
        for raw in sys.stdin.buffer:
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.log(line)
            w = line.split()
            with self.lock:
                if w and w[0] == "BSTOP" and len(w) == 2 and w[1].isdigit() and int(w[1]) < self.n:
                    self.bstop_at[int(w[1])] = self.reqno
                    continue
                if w and w[0] in ("BGEN", "BEMB"):
                    self.reqno += 1
                    self.commands.put((self.reqno, line))
                    continue
            self.commands.put((0, line))
        self.commands.put((0, "QUIT"))

    def knob(self, name, q, default=0.0):
        for rule in self.s.get("rules", []):
            if rule.get("match", "\0") in q.decode("latin-1") and name in rule:
                return rule[name]
        return self.s.get(name, default)

    def busy(self):
        return any(sl["phase"] for sl in self.slots)

    def hang(self, seconds, skip=None):
        end = time.monotonic() + seconds
        tick = self.s.get("tick_s")
        while time.monotonic() < end:
            if self.s.get("hang_steps") and any(sl["phase"] for b, sl in enumerate(self.slots) if b != skip):
                self.step(skip)  # the other slots go on; the hanging one writes nothing
                continue
            time.sleep(min(tick or 0.05, max(0.0, end - time.monotonic())))
            if tick:
                emit("WARN tick")

    def run(self):
        s = self.s
        emit(f"INFO engine=fake-slots-2 arch=fake n_vocab={N_VOCAB} n_ctx_train=8192 context={s['ctx']} "
             f"batch_slots={self.n} slot_cache={0 if s.get('no_slot_cache') else 1} conversation_cache_slots=0 "
             f"im_start={IM_START} "
             f"eos={','.join(map(str, self.eos))} threads=1 backend=cpu step_tokens={self.step_tokens} grammar=1")
        if s.get("report_affinity"):
            emit(f"INFO affinity={','.join(map(str, sorted(os.sched_getaffinity(0))))} "
                 f"threads_arg={s.get('threads_arg', '-')}")
        emit(f"READY {s['ctx']} stop")
        for line in s.get("stray", []):
            emit(line)
        threading.Thread(target=self.reader, daemon=True).start()
        while True:
            if self.busy():
                for _ in range(COMMANDS_PER_STEP):
                    try:
                        seq, line = self.commands.get_nowait()
                    except queue.Empty:
                        break
                    self.command(seq, line)
                self.step()
            else:
                self.command(*self.commands.get())

    def command(self, seq, line):
        word = line.split(" ", 1)[0]
        if word == "QUIT":
            sys.stdout.flush()
            os._exit(0)  # not sys.exit: the reader thread may sit in stdin's buffered read
        elif word == "BGEN":
            self.admit(seq, line)
        elif word == "BEMB":
            self.admit_embed(seq, line)
        elif word == "BSTOP":
            emit(f"ERR BSTOP: no slot {line[6:40]}")
        elif word == "BERASE":
            self.erase(line)
        elif word == "VRAM":
            emit("VRAM ram_used_mib=10 ram_total_mib=100")
        elif word == "PING" and line[5:].isdigit():
            emit(f"PONG {line[5:]}")
        elif word:
            emit(f"ERR unknown command {word[:40]!r}")

    def erase(self, line):
        """BERASE <slot>: an idle slot forgets its stream (ERASED <slot> <n>); a busy or unknown one is ERR."""
        word = line[7:].strip()
        slot = int(word) if word.isdigit() else -1
        if not 0 <= slot < self.n or self.slots[slot]["phase"]:
            emit(f"ERR BERASE: slot {word[:20]} is busy or unknown (batch slots: {self.n})")
            return
        n, self.slots[slot]["held"] = len(self.slots[slot]["held"]), []
        emit(f"ERASED {slot} {n}")

    # ------------------------------------------------------------------ requests
    def parse(self, line, bgen):
        w = line.split()
        try:
            slot = int(w[1]) if bgen else -1
            max_new = int(w[2] if bgen else w[1])
            ids = [int(x) for x in w[-1].split(",")]
        except (ValueError, IndexError):
            return "malformed request"
        try:
            request_grammar(w, self.s)  # as tests/fake_engine.py: decoded, recorded, not applied
            n_logprobs = request_logprobs(w)
        except ValueError as e:
            return str(e)
        if bgen and not 0 <= slot < self.n:
            return f"BGEN: no slot {slot}"
        if bgen and self.slots[slot]["phase"]:
            return f"BGEN: slot {slot} is busy"
        if not ids or any(i < 0 or i >= N_VOCAB for i in ids) or len(ids) + max_new + CTX_SLACK > self.s["ctx"]:
            return "refused: empty, out of vocabulary or over the context"
        q, at = question_of(ids)
        forced = forced_id(w[3 if bgen else 2:-1])
        if forced is not None:
            answer = [forced] * max_new
        else:
            full = list(f"<{q.decode('latin-1')}>".encode("latin-1")) * int(self.knob("repeat", q, 1)) + [258]
            so_far = ids[at:]
            answer = full[len(so_far):] if full[:len(so_far)] == so_far else [63, 63, 63, 258]
        return slot, max_new, ids, q, answer, n_logprobs

    def reuse(self, ids, target):
        sources = [target] + [sl["held"] for sl in self.slots]  # busy slots too, as the real engine
        best = 0
        for src in sources:
            k = 0
            while k < min(len(src), len(ids) - 1) and src[k] == ids[k]:
                k += 1
            best = max(best, k)
        return best

    def admit(self, seq, line):
        if self.s.get("raw_bgen"):
            for raw in self.s["raw_bgen"]:
                emit(raw)
            return
        parsed = self.parse(line, True)
        if isinstance(parsed, str):
            emit(f"ERR {parsed}")
            return
        slot, max_new, ids, q, answer, n_logprobs = parsed
        sl = self.slots[slot]
        reused = self.reuse(ids, sl["held"])
        sl["held"] = ids[:reused]
        sl.pop("lag", None)
        sl.update(phase="read", seq=seq, ids=ids, q=q, answer=answer, max_new=max_new, reused=reused,
                  read=0, generated=0, t_acc=time.monotonic(), prompt_ms=0.0, embed=False, logprobs=n_logprobs)
        emit(f"BACC {slot} {reused}")

    def admit_embed(self, seq, line):
        """BEMB: read in the steps like a prompt (no reuse), then BVEC and BDONE ... 0 stop."""
        w = line.split()
        slot = int(w[1]) if len(w) > 1 and w[1].isdigit() else -1
        ids = fake_embed_ids(line, 1, self.s["ctx"])
        if not 0 <= slot < self.n or self.slots[slot]["phase"]:
            ids = f"BEMB: no slot {slot}" if not 0 <= slot < self.n else f"BEMB: slot {slot} is busy"
        if isinstance(ids, str):
            emit(f"ERR {ids}")
            return
        sl = self.slots[slot]
        sl["held"] = []
        sl.pop("lag", None)
        sl.update(phase="read", seq=seq, ids=ids, q=b"", answer=[], max_new=0, reused=0, read=0, generated=0,
                  t_acc=time.monotonic(), prompt_ms=0.0, embed=True)
        emit(f"BACC {slot} 0")

    def step(self, skip=None):
        busy = [b for b, sl in enumerate(self.slots) if sl["phase"] and b != skip]
        if not busy:
            return
        time.sleep(max(self.knob("step_delay_s", self.slots[b]["q"], 0.002) for b in busy))
        self.steps += 1
        if "die_after_steps" in self.s and self.steps > self.s["die_after_steps"]:
            sys.stderr.write("fake engine: dying as scripted\n")
            sys.stderr.flush()
            os._exit(3)
        if "freeze_after_steps" in self.s and self.steps > self.s["freeze_after_steps"]:
            os.kill(os.getpid(), signal.SIGSTOP)
        for b in busy:
            if self.slots[b]["phase"] and self.bstopped(b):
                continue
        decoding = [b for b in busy if self.slots[b]["phase"] == "decode"]
        for b in decoding:
            self.decode_one(b)
        reading = sorted((b for b in busy if self.slots[b]["phase"] == "read"),
                         key=lambda b: (len(self.slots[b]["ids"]) - len(self.slots[b]["held"]), b))
        budget = max(1, self.step_tokens - len(decoding))
        for b in reading:
            if budget <= 0:
                break
            budget -= self.read_chunk(b, budget)

    def bstopped(self, b):
        """Acts on a BSTOP for slot b; True when the slot ended."""
        sl = self.slots[b]
        with self.lock:
            stopped = self.bstop_at[b] >= sl["seq"]
        if not stopped:
            return False
        if sl["phase"] == "decode" and sl.setdefault("lag", int(self.s.get("bstop_lag_steps", 0))) > 0:
            sl["lag"] -= 1   # a BSTOP that came during a step: that step's token is still written
            return False
        if self.s.get("hang_after_bstop"):
            self.hang(self.s["hang_after_bstop"], skip=b)
        self.finish(b, "cancel")
        return True

    def read_chunk(self, b, budget):
        sl = self.slots[b]
        time.sleep(float(self.knob("pp_delay_s", sl["q"], 0.0)))
        ids, reached = sl["ids"], len(sl["held"])
        nxt = min(len(ids), reached + budget)
        sl["held"].extend(ids[reached:nxt])
        sl["read"] += nxt - reached
        ms = (time.monotonic() - sl["t_acc"]) * 1000
        emit(f"BPP {b} {nxt} {len(ids)} {ms:.1f} {max(1.0, sl['read'] / max(ms, 1e-3) * 1000):.1f}")
        if nxt == len(ids) and sl.get("embed"):
            emit(f"BVEC {b} {fake_vector_line(ids)}")
            self.finish(b, "stop")
        elif nxt == len(ids):
            sl["prompt_ms"] = ms
            sl["t0"] = time.monotonic()
            sl["phase"] = "decode"
            self.emit_token(b, sl["answer"].pop(0) if sl["answer"] else 63)
        return nxt - reached

    def decode_one(self, b):
        sl = self.slots[b]
        sl["held"].append(sl["pending"])
        self.emit_token(b, sl["answer"].pop(0) if sl["answer"] else 63)

    def emit_token(self, b, tok):
        sl = self.slots[b]
        emit(f"BT {b} {tok}{logprobs_suffix(tok, sl.get('logprobs'))}")
        sl["generated"] += 1
        if tok in self.eos:
            self.finish(b, "stop")
        elif sl["generated"] >= sl["max_new"] or not sl["answer"]:
            self.finish(b, "length")
        else:
            sl["pending"] = tok

    def finish(self, b, why):
        sl = self.slots[b]
        if sl["phase"] == "read":
            sl["prompt_ms"] = (time.monotonic() - sl["t_acc"]) * 1000
            decode_ms = 0.0
        else:
            decode_ms = (time.monotonic() - sl["t0"]) * 1000
        drafts = self.s.get("drafts")
        emit(f"BDONE {b} {sl['generated']} {why} {decode_ms:.1f} {len(sl['ids'])} {sl['prompt_ms']:.1f} "
             f"{sl['reused']} {sl['read']}" + (f" drafts_acc={drafts[0]} drafts_off={drafts[1]}" if drafts else "")
             + (f" drafts_n={drafts[2]}" if drafts and len(drafts) > 2 else ""))
        sl["phase"] = None
        sl["embed"] = False


def flag(argv, name):
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--serve" not in argv:
        sys.stderr.write("usage: fake_engine_slots.py [--script FILE] --serve [flags]\n")
        sys.exit(2)
    script = load_script(argv)
    for name, key in (("--threads", "threads_arg"), ("--step-tokens", "step_tokens"), ("--chunk", "pp_chunk")):
        value = flag(argv, name)
        if value is not None:
            script.setdefault(key, value if key == "threads_arg" else int(value))
    if flag(argv, "--eos-ids"):
        script.setdefault("eos_ids", [int(x) for x in flag(argv, "--eos-ids").split(",")])
    Engine(script).run()
