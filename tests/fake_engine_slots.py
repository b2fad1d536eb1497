"""A protocol-faithful fake of `strata-engine --serve --batch N` (docs/PROTOCOL.md), scripted per test.

Like tests/fake_engine.py (same ByteTokenizer ids: 256 `<|endoftext|>`, 257 `<|im_start|>`, 258 `<|im_end|>`),
plus decode slots: BGEN/BADM/BT/BDONE/BSTOP/BYIELD/YIELDED, prompt reads in chunks between decode steps, each
idle slot keeping its stream (prefix reuse; a solo GEN takes an idle slot's state back), STOP/BSTOP/BYIELD
stamped against request numbers as the real engine does.

Canary replies: the answer is derived from the prompt, so a reply that crossed into another request is seen.
The *question* is the text after the last `<|im_start|>` up to its first newline (`<|im_start|>q7\n`); when
that line is `assistant` (a rendered chat) it is the previous turn's text after its first newline, without
`<|im_end|>`. The answer is `<question>` repeated `repeat` times, then 258. Whatever follows the last
question line in the prompt is taken as the answer so far (promotion, solo again): the fake continues from
there, and answers `?` if that part is not a start of the answer (a crossed stream).

Script (JSON; every key optional; `starts` and `state` as in tests/fake_engine.py):
  slots (default 4), groups (1), ctx (--max-context, else 2048), no_slot_cache, no_yield (ignore BYIELD)
  repeat (answer repetitions, default 1), step_delay_s (per decode step of all busy slots),
  token_delay_s (per solo token), pp_chunk (default 64), pp_delay_s (per prompt chunk), record (file),
  rules: [{match: substring of the question, ...any of repeat/pp_delay_s/token_delay_s/step_delay_s}]
  stray: lines written right after READY (e.g. a `BT 3 65` for nobody)
  bstop_lag_steps: decode steps a slot still makes after its BSTOP (the token of a step under way)
  die_after_steps: exit 3 after that many decode steps
  hang_after_bstop: after a BSTOP, write nothing more (but `tick_s` WARN lines) for this many seconds
  hang_on_stop: the same after a STOP;  tick_s: a `WARN tick` line this often while hanging
  hang_steps: while hanging, the other busy slots go on decoding (BT lines only, none on the control lines)
  report_affinity: a second INFO line `INFO affinity=<cpus, comma-separated> threads_arg=<--threads or ->`
"""
import os
import queue
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.fake_engine import CTX_SLACK, EOS_IDS, IM_START, N_VOCAB, emit, load_script  # noqa: E402

NEWLINE = 10


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


class Engine:
    def __init__(self, s):
        self.s = s
        self.n = int(s.get("slots", 4))
        self.commands = queue.Queue()
        self.reqno = 0          # request numbers seen by the reader (GEN/BGEN lines)
        self.stop_at = -1       # STOP stamped with the request number current when it arrived
        self.yield_at = (-1, -1)
        self.bstop_at = [-1] * self.n
        self.lock = threading.Lock()  # guards the stamps above
        self.live = []          # solo session stream
        self.slots = [{"busy": False, "held": [], "seq": 0} for _ in range(self.n)]
        self.steps = 0

    def log(self, line):
        if self.s.get("record"):
            with open(self.s["record"], "a", encoding="utf-8") as f:
                f.write(f"{os.getpid()} {line[:100000]}\n")

    def reader(self):
        for raw in sys.stdin.buffer:
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.log(line)
            w = line.split()
            with self.lock:
                if line == "STOP":
                    self.stop_at = self.reqno
                    continue
                if w and w[0] in ("BSTOP", "BYIELD") and len(w) == 2 and w[1].isdigit() and int(w[1]) < self.n:
                    if w[0] == "BSTOP":
                        self.bstop_at[int(w[1])] = self.reqno
                    elif not self.s.get("no_yield"):
                        self.yield_at = (self.reqno, int(w[1]))
                    continue
                if w and w[0] in ("GEN", "BGEN"):
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

    def hang(self, seconds, skip=None):
        end = time.monotonic() + seconds
        tick = self.s.get("tick_s")
        while time.monotonic() < end:
            if self.s.get("hang_steps") and any(sl["busy"] for b, sl in enumerate(self.slots) if b != skip):
                self.step(skip)  # the other slots decode; the hanging one writes nothing
                continue
            time.sleep(min(tick or 0.05, max(0.0, end - time.monotonic())))
            if tick:
                emit("WARN tick")

    def run(self):
        s = self.s
        emit(f"INFO engine=fake-slots-1 arch=fake n_vocab={N_VOCAB} n_ctx_train=8192 context={s['ctx']} "
             f"batch_slots={self.n} batch_groups={s.get('groups', 1)} "
             f"slot_cache={0 if s.get('no_slot_cache') else 1} conversation_cache_slots=0 im_start={IM_START} "
             f"eos=256,258 threads=1 backend=cpu")
        if s.get("report_affinity"):
            emit(f"INFO affinity={','.join(map(str, sorted(os.sched_getaffinity(0))))} "
                 f"threads_arg={s.get('threads_arg', '-')}")
        emit(f"READY {s['ctx']} stop")
        for line in s.get("stray", []):
            emit(line)
        threading.Thread(target=self.reader, daemon=True).start()
        while True:
            if any(sl["busy"] for sl in self.slots):
                try:
                    seq, line = self.commands.get_nowait()
                except queue.Empty:
                    self.step()
                    continue
            else:
                seq, line = self.commands.get()
            word = line.split(" ", 1)[0]
            if word == "QUIT":
                sys.exit(0)
            elif word in ("GEN", "BGEN"):
                self.request(seq, line)
            elif word == "VRAM":
                emit("VRAM ram_used_mib=10 ram_total_mib=100")
            else:
                emit(f"ERR unknown command {word[:40]}")

    # ------------------------------------------------------------------ decoding slots
    def step(self, skip=None):
        busy = [b for b, sl in enumerate(self.slots) if sl["busy"] and b != skip]
        delay = max(self.knob("step_delay_s", self.slots[b]["q"], 0.002) for b in busy)
        time.sleep(delay)
        self.steps += 1
        if "die_after_steps" in self.s and self.steps > self.s["die_after_steps"]:
            sys.stderr.write("fake engine: dying as scripted\n")
            sys.stderr.flush()
            os._exit(3)
        for b in busy:
            sl = self.slots[b]
            if not sl["busy"]:
                continue  # it finished during another slot's hang_steps
            with self.lock:
                stopped = self.bstop_at[b] >= sl["seq"]
            if stopped and sl.setdefault("lag", int(self.s.get("bstop_lag_steps", 0))) > 0:
                sl["lag"] -= 1   # a BSTOP that came during a step: that step's token is still written
                stopped = False
            if stopped:
                if self.s.get("hang_after_bstop"):
                    self.hang(self.s["hang_after_bstop"], skip=b)
                self.finish(b, "cancel")
                continue
            sl["held"].append(sl["pending"])
            tok = sl["answer"].pop(0) if sl["answer"] else 63
            emit(f"BT {b} {tok}")
            sl["generated"] += 1
            if tok in EOS_IDS:
                self.finish(b, "stop")
            elif sl["generated"] >= sl["max_new"] or not sl["answer"]:
                self.finish(b, "length")
            else:
                sl["pending"] = tok

    def finish(self, b, why):
        sl = self.slots[b]
        emit(f"BDONE {b} {sl['generated']} {why} {(time.monotonic() - sl['t0']) * 1000:.1f}")
        sl["busy"] = False

    # ------------------------------------------------------------------ GEN / BGEN
    def stopped(self, seq):
        with self.lock:
            return self.stop_at >= seq

    def yielded(self, seq):
        with self.lock:
            at, b = self.yield_at
            if at >= seq:
                self.yield_at = (-1, -1)
                return b
        return -1

    def request(self, seq, line):
        t0 = time.monotonic()
        w = line.split()
        bgen = w[0] == "BGEN"
        try:
            slot = int(w[1]) if bgen else -1
            max_new = int(w[2] if bgen else w[1])
            ids = [int(x) for x in w[-1].split(",")]
        except (ValueError, IndexError):
            emit("ERR malformed request")
            return
        if bgen and not 0 <= slot < self.n:
            emit(f"ERR BGEN: no slot {slot}")
            return
        if bgen and self.slots[slot]["busy"]:
            emit(f"ERR BGEN: slot {slot} is busy")
            return
        if not ids or any(i < 0 or i >= N_VOCAB for i in ids) or len(ids) + max_new + CTX_SLACK > self.s["ctx"]:
            emit("ERR refused: empty, out of vocabulary or over the context")
            return
        q, at = question_of(ids)
        full = list(f"<{q.decode('latin-1')}>".encode("latin-1")) * int(self.knob("repeat", q, 1)) + [258]
        so_far = ids[at:]
        answer = full[len(so_far):] if full[:len(so_far)] == so_far else [63, 63, 63, 258]
        sources = [self.live] + [sl["held"] for sl in self.slots if not sl["busy"]]
        reused = 0
        for src in sources:
            k = 0
            while k < min(len(src), len(ids) - 1) and src[k] == ids[k]:
                k += 1
            reused = max(reused, k)
        emit(f"RESUME {reused}")
        chunk, reached = int(self.s.get("pp_chunk", 64)), reused
        target = self.slots[slot]["held"] if bgen else self.live
        target[:] = ids[:reused]
        end = "read"
        while reached < len(ids):
            time.sleep(float(self.knob("pp_delay_s", q, 0.0)))
            nxt = min(len(ids), reached + chunk)
            target.extend(ids[reached:nxt])
            reached = nxt
            ms = (time.monotonic() - t0) * 1000
            emit(f"PP {reached} {len(ids)} {ms:.1f} {max(1.0, (reached - reused) / max(ms, 1e-3) * 1000):.1f}")
            if reached >= len(ids):
                break
            if self.stopped(seq):
                if self.s.get("hang_on_stop"):
                    self.hang(self.s["hang_on_stop"])
                end = "cancel"
                break
            y = self.yielded(seq)
            if y >= 0 and (bgen or not self.slots[y]["busy"]):
                if not bgen:
                    self.slots[y]["held"] = list(target)
                    y_slot = y
                else:
                    y_slot = slot
                emit(f"YIELDED {y_slot} {len(target)}")
                end = "cancel"
                break
            if any(sl["busy"] for sl in self.slots):
                self.step()
        prompt_ms = (time.monotonic() - t0) * 1000
        read = reached - reused
        if end == "cancel":
            emit(f"DONE 0 {len(ids)} {prompt_ms:.1f} 0.0 cancel - - {reused} - - - - - {read} - chunk={chunk}")
            if bgen:
                emit(f"BADM {slot} 0")
            return
        if bgen:
            self.admit(seq, slot, ids, q, answer, max_new, prompt_ms, reused, read, chunk)
            return
        self.solo(seq, ids, q, answer, max_new, t0, prompt_ms, reused, read, chunk)

    def admit(self, seq, slot, ids, q, answer, max_new, prompt_ms, reused, read, chunk):
        first = answer.pop(0)
        emit(f"T {first}")
        stopped = self.stopped(seq)
        fin = "stop" if first in EOS_IDS else ("cancel" if stopped else "length")
        emit(f"DONE 1 {len(ids)} {prompt_ms:.1f} 0.0 {fin} - - {reused} - - - - - {read} - chunk={chunk}")
        cont = first not in EOS_IDS and not stopped and max_new > 1 and bool(answer)
        if cont:
            self.slots[slot].pop("lag", None)
            self.slots[slot].update(busy=True, seq=seq, pending=first, generated=1, max_new=max_new,
                                    answer=answer, q=q, t0=time.monotonic())
        emit(f"BADM {slot} {1 if cont else 0}")

    def solo(self, seq, ids, q, answer, max_new, t0, prompt_ms, reused, read, chunk):
        out, fin = [], "length"
        for tok in answer:
            if self.stopped(seq):
                if self.s.get("hang_on_stop"):
                    self.hang(self.s["hang_on_stop"])
                fin = "cancel"
                break
            if len(out) >= max_new:
                break
            time.sleep(float(self.knob("token_delay_s", q, 0.0)))
            emit(f"T {tok}")
            out.append(tok)
            if tok in EOS_IDS:
                fin = "stop"
                break
            if any(sl["busy"] for sl in self.slots):
                self.step()
        self.live[:] = ids + out[:-1]
        decode_ms = (time.monotonic() - t0) * 1000 - prompt_ms
        emit(f"DONE {len(out)} {len(ids)} {prompt_ms:.1f} {decode_ms:.1f} {fin} - - {reused} - - - - - {read} - "
             f"chunk={chunk}")


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--serve" not in argv:
        sys.stderr.write("usage: fake_engine_slots.py [--script FILE] --serve [flags]\n")
        sys.exit(2)
    script = load_script(argv)
    if "--threads" in argv[:-1]:
        script["threads_arg"] = argv[argv.index("--threads") + 1]
    Engine(script).run()
