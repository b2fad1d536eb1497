"""Several choices of one prompt (`n` > 1): n independent replies, their events merged into one stream.

Role: between a translator (serve/api/openai.py, serve/api/llama_routes.py) and Service. It prepares the request once
(template, encoding, context check) and runs n replies of it:
- Seeds: choice i samples with the request's seed + i (mod 2^63) when the merged sampling has a seed (so a
  seeded request is reproducible as a whole and its choices still differ); without one each choice gets the
  engine's own random seed.
- Read once: on an engine with decode slots, choice 0 runs first; the others are admitted once its first
  event (its first token) arrives, i.e. once its prompt is read, and reuse that prefix from choice 0's slot
  (the engine's prefix reuse takes it from a busy slot too, docs/PROTOCOL.md), so they read one token each.
  They then decode side by side. With one slot (--parallel 1) the choices run one after another and each
  reuses the prompt the slot holds.
- `n` is at most CHOICES_MAX; choices beyond the free lanes wait for one like any request.
It knows no wire format: `run_choices` yields (index, Event | Done) pairs; `merge_done` sums the usage.

The wire fields `n` / `best_of` are read by serve/api/fields.py into the request's `n`.

Public surface: `CHOICES_MAX`, `prepare_choices(service, req, n)`, `run_choices(service, preps, cancelled, on_wait)`, `collect_text(service, preps, cancelled)`,
`merge_done(dones)`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import queue
import re
import threading

from serve.core.events import KIND_CONTENT, KIND_PING, Done

CHOICES_MAX = 8      # the engine's most decode lanes (--parallel 1..8): one request's choices may fill every
                     # lane, never more, so n choices never wait behind themselves for a lane
POLL_S = 0.5         # how often the merge loop looks at `cancelled` while no choice has anything new
JOIN_S = 30.0        # how long a closed merge waits for each choice's thread (its STOP and drain)
_SEED = re.compile(r"(?<!\S)seed=(\d+)")
_END = object()


def _seed_plus(keys: str, i: int) -> str:
    return _SEED.sub(lambda m: f"seed={(int(m.group(1)) + i) % (1 << 63)}", keys)


def prepare_choices(service, req, n: int) -> list:
    """One Prepared per choice: the request prepared once, choice i with the seed + i."""
    prep = service.prepare(req)
    return [prep] + [dataclasses.replace(prep, ids=list(prep.ids), keys=_seed_plus(prep.keys, i))
                     for i in range(1, n)]


def merge_done(dones: list[Done]) -> Done:
    """The request's end: the first choice's figures; completion tokens summed (the prompt counted once)."""
    first = dones[0]
    return dataclasses.replace(first, completion_tokens=sum(d.completion_tokens for d in dones),
                               reasoning_tokens=sum(d.reasoning_tokens for d in dones))


def collect_text(service, preps: list, cancelled=None) -> tuple[list[str], list[list], list[Done]]:
    """Every choice run to its end for a plain-text answer: (content text, log-probability entries, Done) per
    choice, in index order."""
    texts, entries, dones = [[] for _ in preps], [[] for _ in preps], [None] * len(preps)
    with contextlib.closing(run_choices(service, preps, cancelled)) as items:
        for i, ev in items:
            if isinstance(ev, Done):
                dones[i] = ev
            elif ev.kind == KIND_CONTENT:
                texts[i].append(ev.text)
                entries[i].extend(ev.logprobs or ())
    return ["".join(t) for t in texts], entries, dones


def run_choices(service, preps: list, cancelled=None, on_wait=None):
    """(index, Event | Done) for every choice, in the order they happen; each choice ends with its Done. A
    failing choice ends them all (its error is raised); closing the generator stops every choice. `on_wait()`
    is called on the caller's thread right before it waits (Service.run's)."""
    if len(preps) == 1 or _lanes(service.engine) < 2:
        for i, prep in enumerate(preps):
            with contextlib.closing(service.run(prep, cancelled, on_wait)) as events:
                for item in events:
                    yield i, item
        return
    yield from _Merge(service, preps, cancelled, on_wait).run()


def _lanes(engine) -> int:
    """How many replies the engine decodes side by side: its slots, times its replicas (0: no slot engine). With
    one lane the choices must run in turn: started together they would race for the slot in no set order."""
    if not engine.batched():
        return 0
    info = engine.info
    return max(1, int(info.get("batch_slots") or 1)) * max(1, int(info.get("replicas") or 1))


class _Merge:
    """The choices of a slot engine, one thread each; the caller's thread reads their items from `q`."""

    def __init__(self, service, preps, cancelled, on_wait=None):
        self.service, self.preps, self.cancelled = service, preps, cancelled
        self.on_wait = on_wait or (lambda: None)   # the caller's thread only: the choices' threads get none
        self.q: queue.Queue = queue.Queue()   # (index, item | exception | _END) from the choices' threads
        self.stop = threading.Event()         # the merge is over: every choice stops
        self.threads: list[threading.Thread] = []

    def _is_cancelled(self) -> bool:
        return self.stop.is_set() or (self.cancelled is not None and self.cancelled())

    def _choice(self, i: int) -> None:
        try:
            with contextlib.closing(self.service.run(self.preps[i], self._is_cancelled)) as events:
                for item in events:
                    self.q.put((i, item))
        except BaseException as e:  # noqa: BLE001 (handed to the caller's thread, raised there)
            self.q.put((i, e))
        finally:
            self.q.put((i, _END))

    def _start(self, i: int) -> None:
        t = threading.Thread(target=self._choice, args=(i,), daemon=True, name=f"choice-{i}")
        self.threads.append(t)
        t.start()

    def run(self):
        self._start(0)
        ended = 0
        try:
            while ended < len(self.preps):
                if self.q.empty():
                    self.on_wait()
                try:
                    i, item = self.q.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if isinstance(item, BaseException):
                    raise item
                if len(self.threads) == 1 and (item is _END or getattr(item, "kind", None) != KIND_PING):
                    for k in range(1, len(self.preps)):  # choice 0's prompt is read: its prefix is there
                        self._start(k)
                if item is _END:
                    ended += 1
                else:
                    yield i, item
        finally:
            self.stop.set()
            for t in self.threads:
                t.join(JOIN_S)
