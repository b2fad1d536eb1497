"""llama-server's saved slots: POST /slots/{id}?action=save|restore|erase.

Role: the HTTP view over serve/engine_client/slot_files.py, in llama-server's shapes and error bodies. `save`
writes the idle slot's conversation (tokens + KV) to `{"filename": NAME}` in the server's `--slot-save-path`
folder (0700; the engine writes each file 0600, whole or not at all); `restore` reads one back into an idle
slot, whichever slot it came from, so the next turn of that conversation reuses it; `erase` makes the slot
forget. A name is one plain file name (letters, digits, `.`, `_`, `-`; no folders, no leading dot): it can
never reach outside the folder. Slot ids are those of `GET /slots` (global across `--replicas`).

Answers: save `{id_slot, filename, n_saved, n_written, timings: {save_ms}}`, restore `{id_slot, filename,
n_restored, n_read, timings: {restore_ms}}`, erase `{id_slot, n_erased}`. Errors: 501 without
`--slot-save-path` (saying so), 409 while the slot runs a request, 404 for a file that is not there, 400 for a
bad id, action or name (naming what to change).

Public surface: `slot_action(service, body, ctx)`, `check_filename(name)`, `FILENAME_MAX_CHARS`.
"""
from __future__ import annotations

import os
import re

from serve.api.llama_routes import error_body
from serve.api.replies import JsonReply

FILENAME_MAX_CHARS = 128   # a file name, not a path: room for a conversation id and a suffix
_FILENAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*\Z")
ACTIONS = ("save", "restore", "erase")


def _error(status: int, message: str) -> JsonReply:
    return JsonReply(status, error_body(status, "invalid_request_error", message))


def check_filename(name) -> str | None:
    """None when `name` is a plain file name for the slot folder, else what is wrong with it."""
    if not isinstance(name, str) or not name:
        return "filename: a file name (a string), e.g. \"chat-1.bin\""
    if len(name) > FILENAME_MAX_CHARS:
        return f"filename: at most {FILENAME_MAX_CHARS} characters"
    if not _FILENAME.match(name) or ".." in name or name.endswith(".tmp") or ".tmp." in name:
        return ("filename: one plain file name of letters, digits, '.', '_' and '-' (no folders, no leading "
                "dot, no '..')")
    return None


def _slot_id(ctx):
    word = ctx.path.rsplit("/", 1)[-1]
    return int(word) if word.isdigit() and len(word) < 6 else None


def slot_action(service, body, ctx) -> JsonReply:
    folder = getattr(ctx, "slot_save_path", None)
    if not folder:
        return _error(501, "saved slots are off: start the server with --slot-save-path FOLDER")
    slot, action = _slot_id(ctx), ctx.query.get("action")
    if slot is None:
        return _error(400, f"{ctx.path}: the slot id is a number (GET /slots lists them)")
    if action not in ACTIONS:
        return _error(400, f"action: one of {', '.join(ACTIONS)} (as ?action=...), not {action!r}")
    path = name = None
    if action != "erase":
        name = body.get("filename")
        problem = check_filename(name)
        if problem:
            return _error(400, problem)
        path = os.path.join(folder, name)
        if action == "restore" and not os.path.isfile(path):
            return _error(404, f"no saved slot named {name!r} in the slot folder")
    figures = service.slot_file(action, slot, path)   # its errors: BadRequest with their status (409, 501...)
    if action == "erase":
        return JsonReply(200, {"id_slot": slot, "n_erased": figures["n_tokens"]})
    done, moved, ms = ("n_saved", "n_written", "save_ms") if action == "save" else \
        ("n_restored", "n_read", "restore_ms")
    return JsonReply(200, {"id_slot": slot, "filename": name, done: figures["n_tokens"], moved: figures["bytes"],
                           "timings": {ms: figures["ms"]}})
