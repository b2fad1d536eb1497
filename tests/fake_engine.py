"""A protocol-faithful fake of `strata-engine --serve` with one decode slot (docs/PROTOCOL.md), scripted per test.

It is a separate process that speaks the same lines as the real engine with `--batch 1` (the server's
`--parallel 1`): `BGEN 0` answered at once with `BACC 0 <reused>`, then `BPP 0`, `BT 0` and `BDONE 0` lines;
`BEMB 0`, `BSTOP 0`, `BCLOSE 0`; so StrataEngine, Service and the HTTP server are tested exactly as they run,
in milliseconds (tests/fake_engine_slots.py is the fake with several slots). Token ids are ByteTokenizer ids: 0-255 are
bytes, then 256 `<|endoftext|>`, 257 `<|im_start|>`, 258 `<|im_end|>` (n_vocab 263).

Usage: `python tests/fake_engine.py [--script FILE.json] --serve [engine flags]`. Engine flags it does not
use are accepted and ignored (`--max-context N` sets the context unless the script does).

Script (JSON object, every key optional):
  ctx            context size (default: --max-context, else 2048)
  ready_delay_s  sleep before READY;  exit_before_ready: exit code to die with before READY
  no_stop        READY without `stop` (the engine then ignores BSTOP)
  info           extra INFO k=v text;  raw_start: lines (latin-1 escapes allowed) written before READY
  stderr_start   lines written to stderr at start (the engine log: what a death note quotes)
  record         file to append every received command to ("<pid> <line>", cut at 200 characters; `PING`s only
                 with record_ping: true, so the heartbeat leaves the other tests' records alone)
  record_gen     file to append every BGEN line to, whole (a test reads each pass's prompt ids back)
  state          directory that counts starts, so `starts` can script each (re)start differently
  starts         list of objects merged over the script for start 0, 1, ... (the last one repeats)
  turns          list of turn objects for BGEN 1, 2, ... of this process (the last one repeats)
A turn: text (answer; its UTF-8 bytes are the token ids) or ids (list); echo (a regular expression: the answer
is its first match in the prompt's bytes, nothing when none, so concurrent requests each get their own marker back);
repeat (times the text is sent);
eos (default true: end with 258); token_delay_s; first_delay_s (after the prompt is read); pp_chunk (default
512) and pp_delay_s (per prompt chunk); die_after (exit 3 after that many tokens); silent_after (then write
nothing and ignore BSTOP); raw (lines written verbatim, latin-1, before the tokens); err (answer ERR with it);
nonfinite (finish nonfinite, no tokens); freeze_after (after that many tokens the fake SIGSTOPs itself: a
frozen engine, which a test ends with SIGKILL or SIGCONT); drafts ([accepted, offered] or [accepted, offered, steps]: DONE's
drafts_acc/drafts_off and `drafts_n=steps` on BDONE, default [0, 0]; null: drafting off, no drafts keys).
`PING <n>` is answered `PONG <n>` when the loop takes it: at once when idle, between two tokens or chunks
otherwise (a fake that sleeps in silent_after or is frozen never answers). `BCLOSE 0` ends the running reply at
its next token with finish `length` (the real engine writes the grammar's shortest completion first).
`logprobs=K` makes every BT line carry `logprobs_suffix` (a fixed pattern a test can predict).
`grammar=` on BGEN (docs/PROTOCOL.md) is decoded as the real engine does: a malformed escape or a text
with no `root ::=` is refused with the real engine's ERR; `record_grammar` (script key) names a file each
request's decoded grammar is appended to (one JSON string per line). The scripted answer is not checked
against it.
"""
import base64
import json
import math
import os
import queue
import re
import signal
import struct
import sys
import threading
import time
import urllib.parse

EOS_IDS = (256, 258)
IM_START = 257
N_VOCAB = 263
CTX_SLACK = 8
DEFAULT_TURN = {"text": "Hello from the fake engine."}

out_lock = threading.Lock()


def emit(line):
    data = line.encode("latin-1") if isinstance(line, str) and any(ord(c) > 127 for c in line) \
        else (line.encode() if isinstance(line, str) else line)
    with out_lock:
        sys.stdout.buffer.write(data + b"\n")
        sys.stdout.buffer.flush()


def request_grammar(words, script):
    """The decoded grammar= of a BGEN line's words, or None; the real engine's ERR text as ValueError."""
    for w in words[1:-1]:
        if not w.startswith("grammar="):
            continue
        raw = w[len("grammar="):]
        try:
            if not raw or re.search(r"%(?![0-9A-Fa-f]{2})", raw):
                raise ValueError
            text = urllib.parse.unquote_to_bytes(raw).decode("utf-8")
        except ValueError:
            raise ValueError("malformed value for grammar (GBNF, %XX-escaped)") from None
        if not re.search(r"(^|\n)\s*root\s*::=", text):
            raise ValueError("grammar: no 'root' rule")
        if script.get("record_grammar"):
            with open(script["record_grammar"], "a", encoding="utf-8") as f:
                f.write(json.dumps(text) + "\n")
        return text
    return None


FAKE_EMBD = 8  # the fakes' embedding width


def fake_vector_line(ids, dim=FAKE_EMBD) -> str:
    """`<dim> <base64>` of a deterministic, L2-normalised vector: the mean over the tokens of a per-(id,
    position-free) pattern, so equal prompts give equal vectors and different ones (almost surely) differ."""
    sums = [sum(math.sin(0.37 * (t + 1) * (j + 1)) for t in ids) / len(ids) for j in range(dim)]
    norm = math.sqrt(sum(v * v for v in sums)) or 1.0
    raw = struct.pack(f"<{dim}f", *(v / norm for v in sums))
    return f"{dim} {base64.b64encode(raw).decode('ascii')}"


def fake_embed_ids(line, n_slot_words, ctx):
    """The ids of a BEMB line (n_slot_words 1), or an ERR reason (str) as the real engine's."""
    w = line.split()
    if len(w) != 2 + n_slot_words:
        return "empty prompt" if len(w) < 2 + n_slot_words else f"{w[0]}: ids only"
    try:
        ids = [int(x) for x in w[-1].split(",")]
    except ValueError:
        return "malformed id list"
    if not ids or any(i < 0 or i >= N_VOCAB for i in ids) or len(ids) + CTX_SLACK > ctx:
        return f"context: {len(ids)} prompt + 0 max_new + {CTX_SLACK} > {ctx}"
    return ids


def request_logprobs(words):
    """`logprobs=K` of a BGEN line's words (docs/PROTOCOL.md), or None when absent; a value outside
    0..20 is the real engine's ERR text as ValueError."""
    for w in words[1:-1]:
        if w.startswith("logprobs="):
            value = w[len("logprobs="):]
            if not value.isdigit() or int(value) > 20:
                raise ValueError(f"malformed value for logprobs: '{value}'")
            return int(value)
    return None


def logprobs_suffix(tok, k):
    """What the fakes' BT lines carry for `logprobs=K`: the sampled token at -0.5 and first of the top, then
    ids tok+1, tok+2, ... (mod 256) at -1.5, -2.5, ...; "" when the request did not ask."""
    if k is None:
        return ""
    top = [(tok, -0.5)] + [((tok + j) % 256, -0.5 - j) for j in range(1, k)]
    return " lp=-0.500000" + (" top=" + ",".join(f"{i}:{v:.6f}" for i, v in top[:k]) if k else "")


def load_script(argv):
    script, ctx_flag = {}, None
    i = 0
    while i < len(argv):
        if argv[i] == "--script":
            with open(argv[i + 1], encoding="utf-8") as f:
                script = json.load(f)
            i += 2
            continue
        if argv[i] == "--max-context" and i + 1 < len(argv):
            ctx_flag = int(argv[i + 1])
        i += 1
    if "state" in script:
        os.makedirs(script["state"], exist_ok=True)
        path = os.path.join(script["state"], "starts")
        n = int(open(path).read()) if os.path.exists(path) else 0
        with open(path, "w") as f:
            f.write(str(n + 1))
        starts = script.get("starts") or [{}]
        script = {**script, **starts[min(n, len(starts) - 1)]}
    script.setdefault("ctx", ctx_flag or 2048)
    return script


class Engine:
    """One slot, run on the main thread; the reader thread acts on BSTOP itself and queues the rest, which the
    main loop takes between requests, and between two tokens or chunks of one (PING, BCLOSE, a BGEN for the
    busy slot)."""

    def __init__(self, script):
        self.s = script
        self.stop = threading.Event()
        self.commands = queue.Queue()
        self.later = []          # commands taken during a request that wait for its end
        self.session = []
        self.n_gen = 0
        self.close_now = False   # BCLOSE: the running reply ends at its next token
        self.record = script.get("record")

    def log(self, line):
        if self.record and (not line.startswith("PING ") or self.s.get("record_ping")):
            with open(self.record, "a", encoding="utf-8") as f:
                f.write(f"{os.getpid()} {line[:200]}\n")

    def reader(self):
        for raw in sys.stdin.buffer:
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.log(line)
            if line == "BSTOP 0":
                self.stop.set()
            else:
                self.commands.put(line)
        self.commands.put("QUIT")

    def run(self):
        s = self.s
        for line in s.get("raw_start", []):
            emit(line)
        for line in s.get("stderr_start", []):
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        if s.get("ready_delay_s"):
            time.sleep(s["ready_delay_s"])
        if "exit_before_ready" in s:
            sys.stderr.write("fake engine: dying before READY as scripted\n")
            sys.exit(int(s["exit_before_ready"]))
        emit(f"INFO engine=fake-1 arch=fake n_vocab={N_VOCAB} n_ctx_train=8192 context={s['ctx']} "
             f"batch_slots=1 slot_cache=1 conversation_cache_slots=0 im_start={IM_START} "
             f"eos=256,258 threads=1 backend=cpu grammar=1 {s.get('info', '')}".rstrip())
        emit(f"READY {s['ctx']}" + ("" if s.get("no_stop") else " stop"))
        threading.Thread(target=self.reader, daemon=True).start()
        while True:
            line = self.later.pop(0) if self.later else self.commands.get()
            word = line.split(" ", 1)[0]
            if word == "QUIT":
                sys.exit(0)
            elif word == "BGEN":
                self.gen(line)
            elif word == "BEMB":
                self.embed(line)
            elif word == "VRAM":
                emit("VRAM ram_used_mib=10 ram_total_mib=100")
            elif word == "PING" and line[5:].isdigit():
                emit(f"PONG {line[5:]}")
            elif word in ("BSAVE", "BRESTORE") and line.split()[1:2] == ["0"]:
                emit(f"{'SAVED' if word == 'BSAVE' else 'RESTORED'} {len(self.session)} 100 1.0")
            elif word == "BERASE" and line.split()[1:2] == ["0"]:
                emit(f"ERASED 0 {len(self.session)}")
                self.session = []
            elif word == "BCLOSE":
                emit("ERR BCLOSE: slot 0 is idle")
            elif word == "BSTOP":
                emit(f"ERR BSTOP: no slot {line[6:][:20]} (batch slots: 1)")
            else:
                emit(f"ERR unknown command {word[:40]}")

    def between(self):
        """The loop between two steps of a request: PING answered, BCLOSE noted, a BGEN or BEMB for the busy
        slot refused; anything else waits for the request's end."""
        while True:
            try:
                line = self.commands.get_nowait()
            except queue.Empty:
                return
            word = line.split(" ", 1)[0]
            if word == "PING" and line[5:].isdigit():
                emit(f"PONG {line[5:]}")
            elif word == "BCLOSE":
                self.close_now = True
            elif word in ("BGEN", "BEMB") and line.split()[1:2] == ["0"]:
                emit(f"ERR {word}: slot 0 is busy")
            else:
                self.later.append(line)

    def slot_of(self, words):
        """The slot word of a BGEN/BEMB line: 0, or None after writing the real engine's ERR."""
        if len(words) < 2 or words[1] != "0":
            emit(f"ERR {words[0]}: no slot {(words[1:2] or ['?'])[0][:20]} (batch slots: 1)")
            return None
        return 0

    def embed(self, line):
        if self.slot_of(line.split()) is None:
            return
        ids = fake_embed_ids(line, 1, self.s["ctx"])
        if isinstance(ids, str):
            emit(f"ERR {ids}")
            return
        self.stop.clear()
        emit("BACC 0 0")
        if self.s.get("embed_delay_s"):
            time.sleep(self.s["embed_delay_s"])
        emit(f"BPP 0 {len(ids)} {len(ids)} 1.0 1000.0")
        emit(f"BVEC 0 {fake_vector_line(ids)}")
        self.session = list(ids)
        emit(f"BDONE 0 0 stop 0.0 {len(ids)} 1.0 0 {len(ids)}")

    def turn(self):
        turns = self.s.get("turns") or [DEFAULT_TURN]
        t = turns[min(self.n_gen, len(turns) - 1)]
        self.n_gen += 1
        return t

    def admit(self, line):
        """A BGEN's checks, as the real engine's -> (max_new, ids, logprobs K, turn), or None after ERR."""
        words = line.split()
        if self.slot_of(words) is None:
            return None
        try:
            max_new = int(words[2])
            ids = [int(x) for x in words[-1].split(",")] if len(words) > 3 else []
            request_grammar(words[1:], self.s)
            n_logprobs = request_logprobs(words[1:])
        except ValueError as e:
            emit(f"ERR {e}" if str(e).startswith(("malformed", "grammar")) else "ERR malformed BGEN line")
            return None
        t = self.turn()
        if not ids or any(i < 0 or i >= N_VOCAB for i in ids):
            emit("ERR empty prompt or id outside the vocabulary")
            return None
        if len(ids) + max_new + CTX_SLACK > self.s["ctx"]:
            emit(f"ERR prompt {len(ids)} + max_new {max_new} exceeds the context {self.s['ctx']}")
            return None
        if "err" in t:
            emit(f"ERR {t['err']}")
            return None
        return max_new, ids, n_logprobs, t

    def gen(self, line):
        if self.s.get("record_gen"):
            with open(self.s["record_gen"], "a", encoding="utf-8") as f:
                f.write(line + "\n")
        admitted = self.admit(line)
        if admitted is None:
            return
        max_new, ids, n_logprobs, t = admitted
        t0 = time.monotonic()
        self.stop.clear()  # a BSTOP between requests is stale
        self.close_now = False
        reused = 0
        while reused < min(len(ids) - 1, len(self.session)) and self.session[reused] == ids[reused]:
            reused += 1
        emit(f"BACC 0 {reused}")
        reached = self.read(ids, reused, t, t0)
        prompt_ms = (time.monotonic() - t0) * 1000
        out, finish = self.decode(ids, max_new, n_logprobs, t, reached == len(ids))
        read = reached - reused
        self.session = (ids[:reached] + out[:-1]) if out else ids[:reached]
        decode_ms = (time.monotonic() - t0) * 1000 - prompt_ms if out else 0.0
        drafts = t.get("drafts", [0, 0])
        keys = "" if drafts is None else f" drafts_acc={drafts[0]} drafts_off={drafts[1]}" + (
            f" drafts_n={drafts[2]}" if len(drafts) > 2 else "")
        emit(f"BDONE 0 {len(out)} {finish} {decode_ms:.1f} {len(ids)} {prompt_ms:.1f} {reused} {read}{keys}")

    def read(self, ids, reused, t, t0):
        """The prompt read in pp_chunk pieces, one BPP each; -> the position reached (short of the prompt when
        a BSTOP came)."""
        chunk = int(t.get("pp_chunk", 512))
        reached = reused
        while reached < len(ids):
            self.between()
            if self.stop.is_set() and not self.s.get("no_stop"):
                break
            self.stop.wait(float(t.get("pp_delay_s", 0)))
            reached = min(len(ids), reached + chunk)
            ms = (time.monotonic() - t0) * 1000
            emit(f"BPP 0 {reached} {len(ids)} {ms:.1f} {max(1.0, (reached - reused) / max(ms, 1e-3) * 1000):.1f}")
        return reached

    def answer(self, ids, t):
        answer = list(t["ids"]) if "ids" in t else list(t.get("text", "").encode("utf-8"))
        if "echo" in t:
            found = re.search(t["echo"].encode("utf-8"), bytes(i for i in ids if i < 256))
            answer = list(found.group(0)) if found else []
        answer = answer * int(t.get("repeat", 1))
        if t.get("eos", True):
            answer.append(258)
        return answer

    def decode(self, ids, max_new, n_logprobs, t, read_whole):
        """The scripted reply's BT lines -> (tokens sent, finish)."""
        if not read_whole:
            return [], "cancel"
        for line_out in t.get("raw", []):
            emit(line_out)
        if t.get("first_delay_s"):
            self.stop.wait(t["first_delay_s"])
        answer, out, finish = self.answer(ids, t), [], "length"
        if t.get("nonfinite"):
            answer, finish = [], "nonfinite"
        for tok in answer:
            self.between()
            if self.stop.is_set() and not self.s.get("no_stop"):
                finish = "cancel"
                break
            if len(out) >= max_new or self.close_now:
                break
            if "die_after" in t and len(out) >= t["die_after"]:
                sys.stderr.write("fake engine: dying mid-stream as scripted\n")
                sys.stderr.flush()
                os._exit(3)
            if "freeze_after" in t and len(out) >= t["freeze_after"]:
                os.kill(os.getpid(), signal.SIGSTOP)
            if "silent_after" in t and len(out) >= t["silent_after"]:
                while True:
                    time.sleep(3600)
            if t.get("token_delay_s"):
                self.stop.wait(t["token_delay_s"])
            emit(f"BT 0 {tok}{logprobs_suffix(tok, n_logprobs)}")
            out.append(tok)
            if tok in EOS_IDS:
                finish = "stop"
                break
        if self.stop.is_set() and finish == "length" and len(out) < max_new and out and out[-1] not in EOS_IDS \
                and not self.close_now:
            finish = "cancel"
        return out, finish


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--serve" not in argv:
        sys.stderr.write("usage: fake_engine.py [--script FILE] --serve [flags]\n")
        sys.exit(2)
    Engine(load_script(argv)).run()
