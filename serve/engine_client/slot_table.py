"""The slot table of one batch engine process and the choice of a slot for a prompt (UPSTREAM 4.4).

Role: pure bookkeeping for serve/engine_client/batch.py and the pump (serve/engine_client/protocol.py): which slot is free, which conversation each slot's session
holds, whose lines are routed, and `pick_slot`, the free slot whose held stream is the longest start of a prompt. No threads, no
waits, no pipes: the caller holds the engine's slot_cv around every read and write of a `SlotTable`.

Public surface: `SlotTable(n)`, `pick_slot(slots, prompt, im_start)`.
"""
from __future__ import annotations

import queue


class SlotTable:
    """The slot table of one engine process. Every field is guarded by the engine's slot_cv."""

    def __init__(self, n: int):
        self.n = n
        self.q = [queue.SimpleQueue() for _ in range(n)]  # BT/BDONE lines of the slot's claimant (C queue)
        self.owner = [None] * n                      # the claimant (request or quarantine); None = free
        self.open = [False] * n                      # the owner's BACC was seen: its slot lines are routed
        self.held = [[] for _ in range(n)]           # the token stream the slot's session holds
        self.used = [0.0] * n                        # when it was last freed (least recently used first)
        self.live = [None] * n                       # /metrics view while busy
        self.stale_frames = 0                        # slot lines nobody owns (or before the BACC), dropped

    def busy(self) -> int:
        return sum(o is not None for o in self.owner)


def _prefix_len(held, prompt) -> int:
    n = min(len(held), len(prompt))
    i = 0
    while i < n and held[i] == prompt[i]:
        i += 1
    return i


def _owned_len(held, prompt, im_start) -> int:
    """How much of `prompt` this slot's stream reaches: all of it when it is a proper start of the prompt,
    else its turn checkpoint (through the last `im_start`) when that is."""
    if not held:
        return 0
    if len(held) < len(prompt) and _prefix_len(held, prompt) == len(held):
        return len(held)
    if im_start is not None:
        for i in range(len(held) - 1, -1, -1):
            if held[i] == im_start:
                cp = i + 1
                return cp if cp < len(prompt) and _prefix_len(held[:cp], prompt) == cp else 0
    return 0


def pick_slot(slots: SlotTable, prompt, im_start=None):
    """The free slot for `prompt` (caller holds cv), or None. Never a busy slot. The slot whose stream is the
    longest start of the prompt (a length every held conversation shares names no owner); else empty before
    holding, least recently used, lowest number."""
    free = [b for b in range(slots.n) if slots.owner[b] is None]
    if not free:
        return None
    streams = [h for h in slots.held if h]
    shared = 0
    if len(streams) >= 2:
        shared = min(_prefix_len(streams[0], s) for s in streams[1:])
    need = shared + 1
    scored = [(_owned_len(slots.held[b], prompt, im_start), b) for b in free]
    best, b_best = max(scored, key=lambda sb: (sb[0], -sb[1]))
    if best >= need:
        return b_best
    return min(free, key=lambda b: (bool(slots.held[b]), slots.used[b], b))
