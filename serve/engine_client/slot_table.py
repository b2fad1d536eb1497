"""The slot table of one batch engine process and the choice of a slot for a prompt (UPSTREAM 4.4).

Role: pure bookkeeping for serve/engine_client/batch.py and the pump (serve/engine_client/protocol.py): which slot is free, which conversation each slot's session
holds, whose lines are routed, and `pick_slot`, the free slot whose held stream is the longest start of a prompt. No threads, no
waits, no pipes: the caller holds the engine's slot_cv around every read and write of a `SlotTable`.

Public surface: `SlotTable(n, groups)`, `pick_slot(slots, prompt, im_start)`, `SLOT_PREFIX_MIN`.
"""
from __future__ import annotations

import queue

SLOT_PREFIX_MIN = 512         # with several groups, a shorter held prefix does not pick a slot


class SlotTable:
    """The slot table of one engine process. Every field is guarded by the engine's slot_cv."""

    def __init__(self, n: int, groups: int):
        self.n = n
        self.q = [queue.SimpleQueue() for _ in range(n)]  # BT/BDONE lines of the slot's claimant (C queue)
        self.owner = [None] * n                      # the claimant (request or quarantine); None = free
        self.open = [False] * n                      # the owner's BACC was seen: its slot lines are routed
        self.held = [[] for _ in range(n)]           # the token stream the slot's session holds
        self.used = [0.0] * n                        # when it was last freed (least recently used first)
        self.live = [None] * n                       # /metrics view while busy
        self.stale_frames = 0                        # slot lines nobody owns (or before the BACC), dropped
        g = groups if groups > 0 and n % groups == 0 else 1
        gs = n // g
        self.order = [grp * gs + k for k in range(gs) for grp in range(g)]  # spread over groups first
        self.group = [b // gs for b in range(n)]
        self.gs = gs if g > 1 else 0
        self.groups = g

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
    """The free slot for `prompt` (caller holds cv), or None. Never a busy slot. With pipelined groups a
    free slot below a busy one of its group first; then the slot whose stream is the longest start of the
    prompt (a length every held conversation shares names no owner); then fewest busy in its group, empty
    before holding, least recently used."""
    free = [b for b in slots.order if slots.owner[b] is None]
    if not free:
        return None
    if slots.gs:
        for b in free:
            top = (slots.group[b] + 1) * slots.gs
            if any(slots.owner[c] is not None for c in range(b + 1, top)):
                return b
    streams = [h for h in slots.held if h]
    shared = 0
    if len(streams) >= 2:
        shared = min(_prefix_len(streams[0], s) for s in streams[1:])
    need = max(1, shared + 1, SLOT_PREFIX_MIN if slots.groups > 1 else 1)
    scored = [(_owned_len(slots.held[b], prompt, im_start), b) for b in free]
    best, b_best = max(scored, key=lambda sb: (sb[0], -free.index(sb[1])))
    if best >= need:
        return b_best

    def rank(b):
        g = slots.group[b]
        in_group = sum(slots.owner[c] is not None for c in range(slots.n) if slots.group[c] == g)
        return (in_group if slots.groups > 1 else 0, bool(slots.held[b]), slots.used[b], slots.order.index(b))
    return min(free, key=rank)
