"""Stored Responses (OpenAI's `store` and `previous_response_id`): a bounded store of finished responses.

Role: what serve/api/responses.py keeps of a response whose request had `store` (default true, as OpenAI's):
the response object and the request's own input items, and the id it continued. `conversation(id)` gives the
input items of a whole chain (every earlier turn's input, then its output as input items), so a request with
`previous_response_id` continues it (the prompt it renders starts with the one the engine read last turn, so
the engine reuses its cache); `item(id)` gives one kept item, which an `item_reference` input item names.
Bounded in count, bytes (each record's JSON size) and age; the oldest go first.
Kept in memory, and also in `folder` (0700; one JSON file 0600 per response, written whole) when one is
configured, read back at start: only then does it survive a restart. Nothing here knows HTTP.

Locks: `_lock` guards `_records` and the folder's files.

Public surface: `ResponseStore(folder=None, max_count, max_bytes, max_age_s, clock)`, `.put(response,
input_items, previous_id)`, `.get(id)`, `.delete(id)`, `.input_items(id)`, `.conversation(id)`, `.view()`,
`.item(id)`, `output_as_input(items)`, `input_item_id(rid, index, item)`, `continued(body, ctx)` (a request's
body with its `previous_response_id` chain before its own input, its `item_reference` items looked up),
`MAX_COUNT`, `MAX_MIB`, `MAX_AGE_S`.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections import OrderedDict

from serve.core.events import BadRequest
from strata_control.files import write_private_json

MAX_COUNT = 1000                  # responses kept; a chat client makes one per turn
MAX_MIB = 64                      # their JSON together (a long tool-using conversation is a few MiB)
MAX_AGE_S = 30 * 24 * 3600.0      # OpenAI keeps stored responses 30 days
CHAIN_MAX = 10000                 # a previous_response_id chain longer than this is refused (a loop guard)
_ID = re.compile(r"resp_[0-9a-f]{8,64}\Z")


def output_as_input(items: list) -> list[dict]:
    """A response's output items as the input items of the next turn (messages, function calls, reasoning);
    items the model left unfinished are not carried."""
    out = []
    for it in items or []:
        kind = it.get("type")
        if kind == "message":
            text = "".join(p.get("text", "") for p in it.get("content") or [])
            out.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
        elif kind == "function_call":
            out.append({"type": "function_call", "call_id": it.get("call_id"), "name": it.get("name"),
                        "arguments": it.get("arguments", "")})
        elif kind == "reasoning":
            out.append({"type": "reasoning", "content": it.get("content") or [], "summary": it.get("summary") or []})
    return out


def input_item_id(rid: str, index: int, item: dict) -> str:
    """The id of a kept request's input item: its own, else one made of the response's id and its place (the
    id GET /v1/responses/{id}/input_items lists and an `item_reference` may name)."""
    return item.get("id") or f"item_{rid[5:]}_{index}"


def _own_items(raw) -> list:
    """The request's `input` as a list of items (a string is one user message)."""
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": raw}]}] \
        if isinstance(raw, str) else \
        list(raw) if isinstance(raw, list) else []


def _referenced(items: list, store) -> list:
    """`item_reference` items -> the kept items they name (OpenAI's: an output item of a kept response, or an
    input item of its request); one not kept is a 400 naming it."""
    out = []
    for i, it in enumerate(items):
        if not isinstance(it, dict) or it.get("type") != "item_reference":
            out.append(it)
            continue
        ref = it.get("id")
        found = store.item(ref) if store is not None and isinstance(ref, str) else None
        if found is None:
            raise BadRequest(f"input[{i}]: item {str(ref)[:80]!r} not found: it is not an item of a stored "
                             "response (store: false, deleted, or past the server's stored-response bounds); "
                             "send the item itself", param="input")
        out.append(found)
    return out


def continued(body: dict, ctx) -> tuple[dict, str | None, list]:
    """`previous_response_id` -> (the body with the kept chain's items before its `input`, that id, the
    request's own input items, `item_reference` items replaced by the items they name)."""
    store = getattr(ctx, "responses", None)
    prev, own = body.get("previous_response_id"), _own_items(body.get("input"))
    if any(isinstance(it, dict) and it.get("type") == "item_reference" for it in own):
        own = _referenced(own, store)
        body = {**body, "input": own}
    if prev is None:
        return body, None, own
    if not isinstance(prev, str):
        raise BadRequest("previous_response_id: a response id (resp_...)", param="previous_response_id")
    items = store.conversation(prev) if store is not None else None
    if items is None:
        raise BadRequest(f"previous response {prev[:80]!r} not found: it was not stored (store: false), was "
                         "deleted, or is past the server's stored-response bounds; send the whole conversation "
                         "in `input`", param="previous_response_id", code="previous_response_not_found")
    return {**body, "input": items + own}, prev, own


class ResponseStore:
    def __init__(self, folder: str | None = None, max_count: int = MAX_COUNT, max_bytes: int = MAX_MIB << 20,
                 max_age_s: float = MAX_AGE_S, clock=time.time):
        self.folder = os.path.abspath(folder) if folder else None
        self.max_count, self.max_bytes, self.max_age_s = int(max_count), int(max_bytes), float(max_age_s)
        self.clock = clock
        self._lock = threading.Lock()
        self._records: OrderedDict[str, dict] = OrderedDict()   # id -> record, oldest first (guarded by _lock)
        self._bytes = 0                                          # their sizes together (guarded by _lock)
        if self.folder:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            if os.stat(self.folder).st_uid == os.getuid():
                os.chmod(self.folder, 0o700)
            self._load()

    def _load(self) -> None:
        found = []
        for name in os.listdir(self.folder):
            if not (name.endswith(".json") and _ID.match(name[:-5])):
                continue
            try:
                with open(os.path.join(self.folder, name), encoding="utf-8") as f:
                    found.append(json.load(f))
            except (OSError, ValueError) as e:
                print(f"strata: stored response {name} skipped: {e}", file=sys.stderr)
        with self._lock:
            for record in sorted(found, key=lambda r: r.get("stored_at", 0)):
                self._add(record)
            self._trim()

    def _path(self, rid: str) -> str:
        return os.path.join(self.folder, rid + ".json")

    def _add(self, record: dict) -> None:
        record["size"] = len(json.dumps(record, ensure_ascii=False).encode())
        self._records[record["id"]] = record
        self._bytes += record["size"]

    def _drop(self, rid: str) -> None:
        record = self._records.pop(rid, None)
        if record is None:
            return
        self._bytes -= record["size"]
        if self.folder and os.path.exists(self._path(rid)):
            os.unlink(self._path(rid))

    def _trim(self) -> None:
        """(under _lock) The oldest go until the count, bytes and age hold."""
        now = self.clock()
        while self._records:
            rid, oldest = next(iter(self._records.items()))
            if len(self._records) <= self.max_count and self._bytes <= self.max_bytes and \
                    now - oldest["stored_at"] <= self.max_age_s:
                break
            self._drop(rid)

    def put(self, response: dict, input_items: list, previous_id: str | None) -> None:
        """Keep a finished response, the request's own input items and the id it continued."""
        rid = response["id"]
        record = {"id": rid, "stored_at": self.clock(), "previous_response_id": previous_id,
                  "input_items": input_items, "response": response}
        with self._lock:
            self._drop(rid)
            self._add(record)
            if self.folder:
                write_private_json(self._path(rid), {k: v for k, v in record.items() if k != "size"})
            self._trim()

    def _get(self, rid) -> dict | None:
        """(under _lock) The record `rid`, unless it is past its age."""
        record = self._records.get(rid) if isinstance(rid, str) else None
        if record is not None and self.clock() - record["stored_at"] > self.max_age_s:
            self._drop(rid)
            return None
        return record

    def get(self, rid) -> dict | None:
        with self._lock:
            record = self._get(rid)
            return None if record is None else record["response"]

    def delete(self, rid) -> bool:
        with self._lock:
            if self._get(rid) is None:
                return False
            self._drop(rid)
            return True

    def input_items(self, rid) -> list | None:
        with self._lock:
            record = self._get(rid)
            return None if record is None else list(record["input_items"])

    def item(self, item_id: str) -> dict | None:
        """The kept item `item_id` as an input item: an output item of a kept response (`msg_`, `fc_`, `rs_`
        ids; one the model left unfinished is none) or an input item of its request; None when none is kept.
        A scan: the store holds at most `max_count` responses."""
        with self._lock:
            for rid in list(self._records):
                record = self._get(rid)
                if record is None:
                    continue
                for it in record["response"].get("output") or []:
                    if it.get("id") == item_id:
                        carried = output_as_input([it])
                        return {**carried[0], "id": item_id} if carried else None
                for i, it in enumerate(record["input_items"]):
                    if isinstance(it, dict) and input_item_id(rid, i, it) == item_id:
                        return {"id": item_id, **it}
        return None

    def conversation(self, rid) -> list | None:
        """The input items that continue the chain ending at `rid`: each turn's input, then its output;
        None when `rid` (or a response it continued) is not kept."""
        chain = []
        with self._lock:
            while rid is not None:
                record = self._get(rid)
                if record is None or len(chain) >= CHAIN_MAX:
                    return None
                chain.append(record)
                rid = record["previous_response_id"]
        items = []
        for record in reversed(chain):
            items += record["input_items"] + output_as_input(record["response"].get("output"))
        return items

    def view(self) -> dict:
        with self._lock:
            return {"responses": len(self._records), "bytes": self._bytes, "persisted": bool(self.folder)}
