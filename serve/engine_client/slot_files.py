"""Saved slots: an idle decode slot's conversation (tokens + KV) to a file, back into a slot, or forgotten.

Role: the engine side of llama-server's `/slots/{id}?action=save|restore|erase` (serve/api/slot_routes.py).
A slot is claimed for the file command as a request claims it (its owner is `SLOT_FILE` while the command
runs, under the engine's slot_cv), so no request is admitted to it meanwhile, and a busy slot is refused
(`SlotBusy`) rather than waited for. The command itself is a control command (`StrataEngine.control`:
`BSAVE` / `BRESTORE` / `BERASE`, docs/PROTOCOL.md). After a restore the slot table's held stream is the
file's tokens (read from its header), so the next turn of that conversation is admitted to that slot and its
prompt reused; under replicas the routing learns them too. It knows nothing of HTTP or of file names' rules
(the caller checks the path).

Slot ids are global across replicas, in the order of `GET /slots`: replica 0's slots first, then replica 1's.

Errors are the request's own (serve/core/events.py `BadRequest` with its status): `SlotBusy` 409, `NoSlots`
400 / 501 / 503, an engine's refusal 400 with its reason.

Public surface: `locate(engine, slot_id) -> (StrataEngine, slot, replica index | None)`,
`slot_file(engine, action, slot_id, path=None) -> dict`, `read_tokens(path)`, `SlotBusy`, `NoSlots`,
`SLOT_FILE`.
"""
from __future__ import annotations

import struct

from serve.core.errors import public_text
from serve.core.events import BadRequest
from serve.engine_client.protocol import EngineRefused

SLOT_FILE = "slot-file"        # a slot's owner while a file command runs on it
SESSION_HEADER_BYTES = 48      # engine/session.cpp session_header: magic[8], 4 u32, u64 row_bytes, 4 u32
N_TOKENS_OFFSET = 32           # its n_tokens (u32, little-endian); the tokens (i32 each) follow the header
FILE_WAIT_S = 600.0            # a file command's silence allowance: a long conversation's KV is written whole


class SlotBusy(BadRequest):
    """409: the slot runs a request (or another file command) now."""

    def __init__(self, message: str):
        super().__init__(message, status=409)


class NoSlots(BadRequest):
    """The slot id names no decode slot (400), the engine has none (501) or is not running (503); the message
    says which ids exist or what to change."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message, status=status)


def locate(engine, slot_id: int):
    """The engine process and its own slot number for a global slot id -> (StrataEngine, slot, replica or
    None). NoSlots when the engines have no decode slots or the id is past the last one."""
    base, engines = 0, engine.engines()
    for i, e in enumerate(engines):
        proc = e.current() if e.alive() else None
        if proc is None:
            raise NoSlots("the engine is not running (it starts with the next request)", 503)
        n = proc.slots.n if proc.slots is not None else 0
        if n == 0:
            raise NoSlots("saved slots need an engine with decode slots; start the server with --parallel 2 "
                          "or more", 501)
        if slot_id < base + n:
            return e, slot_id - base, (i if len(engines) > 1 else None)
        base += n
    raise NoSlots(f"no slot {slot_id}: this server has slots 0..{base - 1}")


def read_tokens(path: str) -> list[int]:
    """The token ids a session file holds (its header's count, then one i32 each)."""
    with open(path, "rb") as f:
        head = f.read(SESSION_HEADER_BYTES)
        if len(head) < SESSION_HEADER_BYTES:
            raise ValueError(f"{path}: not a session file (shorter than its header)")
        (n,) = struct.unpack_from("<I", head, N_TOKENS_OFFSET)
        raw = f.read(4 * n)
    if len(raw) != 4 * n:
        raise ValueError(f"{path}: cut short (its header says {n} tokens)")
    return list(struct.unpack(f"<{n}i", raw))


def _claim(e, slot: int):
    """Own the idle `slot` of e's current process for a file command -> its process; SlotBusy if taken."""
    with e.slot_cv:
        proc = e.current()
        slots = proc.slots if proc is not None else None
        if slots is None or proc.ended:
            raise NoSlots("the engine is not running; try again once it is", 503)
        if slots.owner[slot] is not None:
            raise SlotBusy(f"slot {slot} is processing a request; try again when it is idle")
        slots.owner[slot], slots.open[slot] = SLOT_FILE, False
        return proc


def _release(e, proc, slot: int, held) -> None:
    with e.slot_cv:
        if held is not None:
            proc.slots.held[slot] = held
        proc.slots.owner[slot] = None
        e.slot_cv.notify_all()   # a request waiting for a free slot may take it now


def _accept(answer: str):
    def accept(line):
        words = line.split()
        if words and words[0] == "SERR":
            raise EngineRefused(" ".join(words[1:]))
        if words and words[0] == answer:
            return [float(w) if "." in w else int(w) for w in words[1:]]
        return None
    return accept


def slot_file(engine, action: str, slot_id: int, path: str | None = None) -> dict:
    """`save` / `restore` `path`, or `erase`, on the global slot `slot_id` -> the figures
    ({n_tokens, bytes, ms} or {n_tokens}). SlotBusy, NoSlots; a BadRequest saying why when the engine refuses
    (a file that is not a session of this model, a full disk); EngineDied as any control command."""
    if action not in ("save", "restore", "erase") or (path is None) != (action == "erase") or \
            (path is not None and any(c in path for c in "\r\n\0")):
        raise ValueError("a slot file action is save or restore with a plain path, or erase")
    e, slot, replica = locate(engine, slot_id)
    proc = _claim(e, slot)
    held = None   # what the slot then holds: None = unchanged
    try:
        if action == "erase":
            try:
                words = e.control(f"BERASE {slot}", _accept("ERASED"), FILE_WAIT_S)
            except EngineRefused as err:
                raise BadRequest(f"the engine refused to erase slot {slot_id}: {err}") from None
            held = []
            return {"n_tokens": int(words[1])}
        verb, answer = ("BSAVE", "SAVED") if action == "save" else ("BRESTORE", "RESTORED")
        try:
            n, size, ms = e.control(f"{verb} {slot} {path}", _accept(answer), FILE_WAIT_S)
        except EngineRefused as err:
            if action == "restore":
                held = []   # a refused restore may have read part of the file: the slot's tokens are unknown
            full = str(err).split()[:1] == ["storage"]   # SERR storage: ENOSPC/EDQUOT, the old file intact
            raise BadRequest(f"the engine refused to {action} slot {slot_id}: {public_text(str(err))}",
                             status=507 if full else 400,
                             code="insufficient_storage" if full else None) from None
        if action == "restore":
            held = read_tokens(path)[:n]
            if replica is not None:
                engine.remember(replica, held)
        return {"n_tokens": n, "bytes": size, "ms": ms}
    finally:
        _release(e, proc, slot, held)
