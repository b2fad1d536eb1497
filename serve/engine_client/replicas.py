"""ReplicaEngine: several engines behind one StrataEngine-shaped object (UPSTREAM 4.7), opt-in.

Role: route each request to the replica that already holds most of its prompt, counting the requests
running there; heal replicas that died. Each replica is a StrataEngine (one decode slot or more). It knows
nothing of HTTP; Service uses it exactly like a StrataEngine (`generate`, `alive`, `max_context`, ...).

Routing: chained hashes of 64-token blocks (`BLOCK_TOKENS`) of the prompts and answers a replica served, kept
per replica in an LRU of `BLOCKS_MAX` entries, give the prefix length it holds; cost = prompt tokens not held
+ `LOAD_TOKENS` x requests running there; ties go to fewer running, then fewer routed. A restart (or a
nonfinite answer) forgets that replica's blocks.

Rules: a replica with one slot runs one request at a time (its slot path waits for the free slot and drains a
request that leaves, BSTOP to BDONE, before the next one is admitted); the child generator is closed (its
BSTOP + drain done) before the replica's figures are taken; every caller gets its own copy of the figures (`result`); a dead replica is restarted in the
background at most every `HEAL_EVERY_S` (`heal()`). Not offered: session files, VRAM resize.

Cores: with N >= 2 replicas and at least N cores (the server's own affinity set), each replica gets its own
equal share, `core_shares()`: C // N contiguous cores (the C % N left over stay with the server's threads),
and `--threads` at most its share. The thread that starts (or restarts, or heals) a replica runs on that
share meanwhile, so the child and every thread it makes inherit it; the thread's own set is restored
after. With fewer cores than replicas there is no fair share and nothing is pinned. `start()` says which.

Public surface: `ReplicaEngine(engines, load_tokens=LOAD_TOKENS, pin=True, cores=None)` (`cores`: the set
to share, default the server's affinity), `core_shares(n, cores)`, `.pin_note`, `.start()`, `.generate(ids,
max_new, keys, cancelled, result, replica=None)` (`replica` forces one, for tests and benchmarks), `.pick(ids)`,
`.remember(index, ids)` (a replica holds these now: a slot restored from a file),
`.heal()`, `.ensure_running()`, `.alive()`, `.batched()`, `.batch_size()`, `.max_context`, `.known_ctx`, `.info`, `.live()` (with
each replica's `cores`), `.restart(tries)`, `.close()`, `.kill_now()`, `.death_note()`.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import time
from collections import OrderedDict

from serve.engine_client.protocol import EngineDied, EngineNonFinite

BLOCK_TOKENS = 64         # routing granularity: a shared prefix counts in whole blocks
BLOCKS_MAX = 262144       # block hashes remembered per replica (LRU)
LOAD_TOKENS = 3000        # one running request costs as much as this many uncached prompt tokens
HEAL_EVERY_S = 60.0       # a dead replica is restarted at most this often


def core_shares(n: int, cores) -> list[list[int]] | None:
    """One equal, contiguous share of `cores` per replica, or None when there is nothing to share fairly
    (fewer than 2 replicas, or fewer cores than replicas)."""
    cores = sorted(cores)
    if n < 2 or len(cores) < n:
        return None
    k = len(cores) // n
    return [cores[i * k:(i + 1) * k] for i in range(n)]


def _cpu_list(cores) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs, out = [], []
    for c in sorted(cores):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    for a, b in runs:
        out.append(str(a) if a == b else f"{a}-{b}")
    return ",".join(out)


def _cap_threads(args: list, n: int) -> None:
    """At most `n` engine threads: a larger `--threads` value is lowered, a missing one added."""
    found = False
    for i, a in enumerate(args[:-1]):
        if a == "--threads":
            found = True
            if not str(args[i + 1]).isdigit() or int(args[i + 1]) > n:
                args[i + 1] = str(n)
    if not found:
        args += ["--threads", str(n)]


@contextlib.contextmanager
def _pinned(cores):
    """The calling thread runs on `cores` meanwhile (Linux: affinity is per thread, and a child or thread
    made now inherits it); its own set is restored after. No cores: nothing changes."""
    old = None
    if cores:
        try:
            old = os.sched_getaffinity(0)
            os.sched_setaffinity(0, cores)
        except OSError as e:  # a core went offline since the plan was made: start unpinned
            print(f"strata: replicas: could not pin to cores {_cpu_list(cores)} ({e})", file=sys.stderr)
            old = None
    try:
        yield
    finally:
        if old is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, old)


def block_hashes(ids) -> list[bytes]:
    """Chained hashes of the whole 64-token blocks of `ids` (block i's hash covers blocks 0..i)."""
    out, h = [], b""
    for i in range(0, len(ids) - len(ids) % BLOCK_TOKENS, BLOCK_TOKENS):
        h = hashlib.blake2b(h + ",".join(map(str, ids[i:i + BLOCK_TOKENS])).encode(), digest_size=12).digest()
        out.append(h)
    return out


class _Replica:
    def __init__(self, index, engine):
        self.index = index
        self.engine = engine
        self.blocks: OrderedDict = OrderedDict()   # guarded by ReplicaEngine._state
        self.running = 0                   # guarded by ReplicaEngine._state
        self.routed = 0                    # guarded by ReplicaEngine._state
        self.healing = False               # guarded by ReplicaEngine._state
        self.last_heal = 0.0
        self.cores = None                  # its share of the cores (set once, before start), or None

    def held(self, hashes) -> int:
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            n += 1
        return n * BLOCK_TOKENS


class ReplicaEngine:
    """Several StrataEngines; requests routed by cached prefix and load."""

    def __init__(self, engines, load_tokens: int = LOAD_TOKENS, pin: bool = True, cores=None):
        if not engines:
            raise ValueError("replicas: at least one engine")
        self.replicas = [_Replica(i, e) for i, e in enumerate(engines)]
        self.load_tokens = int(load_tokens)
        self._state = threading.Lock()     # guards every _Replica's blocks/running/routed/healing
        self.argv = list(engines[0].argv)
        self.can_stop = True
        self.pin_note = self._plan_cores(pin, cores)

    def _plan_cores(self, pin, cores) -> str:
        n = len(self.replicas)
        can = hasattr(os, "sched_setaffinity")
        if cores is None:
            cores = os.sched_getaffinity(0) if can else range(os.cpu_count() or 1)
        cores = sorted(cores)
        head = f"replicas: {n} engines on {len(cores)} cores"
        shares = core_shares(n, cores) if pin and can else None
        if shares is None:
            why = ("pinning is off" if not pin else "this OS cannot pin threads" if not can
                   else "one engine" if n < 2 else "fewer cores than engines")
            return f"{head}: not pinned ({why})"
        for r, share in zip(self.replicas, shares):
            r.cores = share
            _cap_threads(r.engine.args, len(share))
        left = sorted(set(cores) - {c for s in shares for c in s})
        cpus = lambda cs: ("cores " if len(cs) > 1 else "core ") + _cpu_list(cs)
        parts = ", ".join(f"replica {r.index} on {cpus(r.cores)}" for r in self.replicas)
        return (f"{head}: {parts} (--threads at most {len(shares[0])})"
                + (f"; {cpus(left)} left to the server" if left else ""))

    # ------------------------------------------------------------------ StrataEngine-shaped views
    @property
    def starting(self) -> bool:
        return any(r.engine.starting for r in self.replicas)

    @property
    def max_context(self) -> int:
        ctx = [r.engine.max_context for r in self.replicas if r.engine.alive()]
        return min(ctx) if ctx else 0

    @property
    def known_ctx(self) -> int:
        ctx = [r.engine.known_ctx for r in self.replicas if r.engine.known_ctx]
        return min(ctx) if ctx else 0

    @property
    def info(self) -> dict:
        merged = dict(self.replicas[0].engine.info)
        merged["replicas"] = len(self.replicas)
        merged["batch"] = self.batch_size()
        return merged

    @property
    def progress(self):
        return max((r.engine.progress for r in self.replicas), default=(0, 0))

    @property
    def log_path(self) -> str | None:
        return self.replicas[0].engine.log_path

    def engines(self) -> list:
        """The single engines behind this client, in replica order."""
        return [r.engine for r in self.replicas]

    @property
    def prefill_tok_s(self):
        rates = [r.engine.prefill_tok_s for r in self.replicas if r.engine.prefill_tok_s]
        return sum(rates) / len(rates) if rates else None

    def alive(self) -> bool:
        return any(r.engine.alive() for r in self.replicas)

    def batched(self) -> bool:
        return True  # requests run concurrently across replicas; ordering is per replica

    def batch_size(self) -> int:
        return sum(max(1, int(r.engine.info.get("batch_slots") or 0)) for r in self.replicas)

    def live(self) -> list[dict]:
        with self._state:
            return [{"replica": r.index, "alive": r.engine.alive(), "running": r.running, "routed": r.routed,
                     "batch": max(1, int(r.engine.info.get("batch_slots") or 0)),
                     "cores": _cpu_list(r.cores) if r.cores else None} for r in self.replicas]

    def death_note(self) -> str:
        return "; ".join(f"replica {r.index}: {r.engine.death_note()}" for r in self.replicas
                         if not r.engine.alive()) or "every replica is running"

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        print(f"strata: {self.pin_note}", file=sys.stderr, flush=True)
        errors = []

        def one(r):
            try:
                with _pinned(r.cores):
                    r.engine.start()
            except EngineDied as e:
                errors.append(f"replica {r.index}: {e}")
        ts = [threading.Thread(target=one, args=(r,), daemon=True) for r in self.replicas]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if len(errors) == len(self.replicas):
            raise EngineDied("; ".join(errors))

    def restart(self, tries: int = 3) -> None:
        """Restart every dead replica now (the Service calls this for a dead engine)."""
        for r in self.replicas:
            if not r.engine.alive():
                self._forget(r)
                r.last_heal = time.monotonic()
                with _pinned(r.cores):
                    r.engine.restart(tries=tries)

    def ensure_running(self) -> None:
        """Every replica dead: restart them now (the Service calls this before a request); else heal the
        dead ones in the background."""
        if not self.alive() and not self.starting:
            self.restart(tries=1)
        else:
            self.heal()

    def heal(self) -> None:
        """Restart dead replicas in the background, each at most every HEAL_EVERY_S."""
        now = time.monotonic()
        for r in self.replicas:
            with self._state:
                if r.engine.alive() or r.engine.starting or r.healing or now - r.last_heal < HEAL_EVERY_S:
                    continue
                r.healing, r.last_heal = True, now
            threading.Thread(target=self._heal_one, args=(r,), daemon=True, name=f"replica-heal-{r.index}").start()

    def _heal_one(self, r):
        try:
            self._forget(r)
            with _pinned(r.cores):
                r.engine.restart(tries=1)
        except EngineDied:
            pass
        finally:
            with self._state:
                r.healing = False

    @property
    def closed(self) -> bool:
        """Every replica was closed on purpose (the supervisor leaves them alone)."""
        return all(getattr(r.engine, "closed", False) for r in self.replicas)

    def close(self) -> None:
        for r in self.replicas:
            r.engine.close()

    def kill_now(self) -> None:
        for r in self.replicas:
            r.engine.kill_now()

    def _forget(self, r) -> None:
        with self._state:
            r.blocks.clear()

    # ------------------------------------------------------------------ routing
    def pick(self, ids) -> _Replica:
        hashes = block_hashes(ids)
        with self._state:
            alive = [r for r in self.replicas if r.engine.alive()]
            if not alive:
                raise EngineDied("no replica is running; the next request restarts them")
            return min(alive, key=lambda r: (len(ids) - r.held(hashes) + self.load_tokens * r.running,
                                             r.running, r.routed, r.index))

    def remember(self, index: int, ids) -> None:
        """Replica `index` holds `ids` now (a slot restored from a file): the routing sends their sequel there."""
        self._remember(self.replicas[index], list(ids))

    def _remember(self, r, ids) -> None:
        with self._state:
            for h in block_hashes(ids):
                r.blocks[h] = True
                r.blocks.move_to_end(h)
            while len(r.blocks) > BLOCKS_MAX:
                r.blocks.popitem(last=False)

    def generate(self, ids, max_new, keys="", cancelled=None, result=None, replica=None, embed=False,
                 on_wait=None, closing=None):
        """Yields token ids (None = heartbeat); `result` (the caller's own dict) gets that request's figures."""
        self.heal()
        r = self.replicas[replica] if replica is not None else self.pick(ids)
        with self._state:
            r.running += 1
            r.routed += 1
        figures: dict = {}
        out: list[int] = []
        try:
            child = r.engine.generate(ids, max_new, keys, cancelled, figures, embed=embed, on_wait=on_wait,
                                      closing=closing)
            try:
                for t in child:
                    if t is not None:
                        out.append(t)
                    yield t
            finally:
                child.close()  # STOP + drain happen here (StrataEngine holds its ctl until then)
            self._remember(r, list(ids) + out)
        except EngineNonFinite:
            self._forget(r)
            raise
        finally:
            with self._state:
                r.running -= 1
            if result is not None:
                result.update(dict(figures, replica=r.index))  # a copy per caller, never shared
