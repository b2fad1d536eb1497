"""Ollama's created models and uploaded blobs, kept in a private folder and served through the Lifecycle.

Role: the store behind serve/api/ollama_models.py. A created model is a record: its name, what it runs on
(`base`: a model the server already has, or `path`: a GGUF file, an uploaded blob included), and the settings
a Modelfile gives it (`parameters`, `system`, `messages`, `license`: strata_control/modelfile.py). Records are
JSON files (0600) in `<folder>/models/`, blobs `<folder>/blobs/sha256-<hex>` (0600, written to a temporary
name, checked against their digest, then renamed); the folder and its subfolders are 0700. At start every
record is registered again (`attach`), so created models survive a restart.

Serving: a record's name becomes an alias of the entry it runs on (`Lifecycle.add_name`); a GGUF no entry
serves gets an entry of its own from `Lifecycle.entry_factory` (named as the created model; removed with its
last name). The settings apply on Ollama's routes (`settings(name)`); other routes run the model as it is.

Locks: `_lock` guards the files (one writer at a time; readers read whole files written by rename).

Public surface: `ModelStore(folder)`, `.attach(lifecycle)`, `.put(record)`, `.drop(name)`, `.get(name)`,
`.names()`, `.settings(name)`, `.blob_path(digest)`, `.has_blob(digest)`, `.write_blob(digest, read_into)`,
`check_digest(digest)`, `is_gguf(path)`, `StoreError`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading

from serve.lifecycle.entries import LifecycleError
from strata_control.files import STORAGE_ERRNOS, StorageFull, write_private_json

_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})\Z")
GGUF_MAGIC = b"GGUF"


class StoreError(ValueError):
    """A blob or record the store refuses; `status` 400 (bad input) or 404 (not there)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status = message, status


def check_digest(digest) -> str:
    """"sha256:<64 hex>" (or sha256-...) -> the hex; StoreError otherwise."""
    m = _DIGEST.match(digest) if isinstance(digest, str) else None
    if not m:
        raise StoreError(f"digest {str(digest)[:80]!r}: sha256:<64 lowercase hex digits>")
    return m.group(1)


def is_gguf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    if os.stat(path).st_uid == os.getuid():
        os.chmod(path, 0o700)


class ModelStore:
    def __init__(self, folder: str):
        self.folder = os.path.abspath(folder)
        self.models_dir = os.path.join(self.folder, "models")
        self.blobs_dir = os.path.join(self.folder, "blobs")
        for d in (self.folder, self.models_dir, self.blobs_dir):
            _private_dir(d)
        self._lock = threading.Lock()
        self._records: dict[str, dict] = {}   # name -> record (guarded by _lock)
        for name in sorted(os.listdir(self.models_dir)):
            if name.endswith(".json"):
                try:
                    with open(os.path.join(self.models_dir, name), encoding="utf-8") as f:
                        record = json.load(f)
                    self._records[record["name"]] = record
                except (OSError, ValueError, KeyError, TypeError) as e:
                    print(f"strata: created model {name} skipped: {e}", file=sys.stderr)
        self.lc = None

    # ---------------------------------------------------------------- blobs
    def blob_path(self, digest: str) -> str:
        return os.path.join(self.blobs_dir, f"sha256-{check_digest(digest)}")

    def has_blob(self, digest: str) -> bool:
        return os.path.isfile(self.blob_path(digest))

    def write_blob(self, digest: str, read_into) -> int:
        """Write the body `read_into(sink)` streams (sink(bytes) per piece) as the blob `digest`, checked
        against it -> its size. A body whose sha256 differs is refused (400) and nothing is kept."""
        want, path = check_digest(digest), self.blob_path(digest)
        tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
        h = hashlib.sha256()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                def sink(piece: bytes) -> None:
                    h.update(piece)
                    f.write(piece)
                size = read_into(sink)
                f.flush()
                os.fsync(f.fileno())
            if h.hexdigest() != want:
                raise StoreError(f"the body's sha256 is {h.hexdigest()}, not the {want} its path names")
            os.replace(tmp, path)
            return size
        except OSError as e:
            if e.errno in STORAGE_ERRNOS:   # a 507 (serve/http/server.py); the partial blob is removed below
                raise StorageFull(path, e) from None
            raise
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    # ---------------------------------------------------------------- records
    def names(self) -> list[str]:
        with self._lock:
            return list(self._records)

    def get(self, name: str | None) -> dict | None:
        if not isinstance(name, str):
            return None
        with self._lock:
            return self._records.get(name[:-len(":latest")] if name.endswith(":latest") else name)

    def settings(self, name: str | None) -> dict | None:
        """What a created model adds on Ollama's routes: {parameters, system, messages}, or None."""
        record = self.get(name)
        return None if record is None else {k: record.get(k) for k in ("parameters", "system", "messages",
                                                                         "license", "from", "name")}

    def _file(self, name: str) -> str:
        return os.path.join(self.models_dir, hashlib.sha256(name.encode()).hexdigest()[:32] + ".json")

    def put(self, record: dict) -> None:
        """Keep `record` (replacing one of the same name) and serve it (`attach`ed Lifecycle)."""
        if self.lc is not None:
            if self.get(record["name"]) is not None:
                self.lc.remove_name(record["name"])   # replaced: it may run on another file now
            self._register(record)
        with self._lock:
            write_private_json(self._file(record["name"]), record)
            self._records[record["name"]] = record

    def drop(self, name: str) -> None:
        """Forget the created model `name` (its blob stays: another model may use it)."""
        with self._lock:
            if name not in self._records:
                raise StoreError(f"model '{name}' not found", 404)
        if self.lc is not None:
            self.lc.remove_name(name)   # 409 (LifecycleError) while its own engine serves requests
        with self._lock:
            self._records.pop(name, None)
            path = self._file(name)
            if os.path.exists(path):
                os.unlink(path)

    # ---------------------------------------------------------------- serving
    def attach(self, lc) -> None:
        """Serve every kept record through `lc` (at start); one that cannot be served now is said and kept."""
        self.lc = lc
        lc.created = self
        for record in list(self._records.values()):
            try:
                self._register(record)
            except (LifecycleError, StoreError) as e:
                print(f"strata: created model {record['name']!r} is not served now: "
                      f"{getattr(e, 'message', e)}", file=sys.stderr)

    def _register(self, record: dict) -> None:
        lc, name = self.lc, record["name"]
        if record.get("path"):
            entry = lc.entry_for_path(record["path"])
            if entry is None:
                if lc.entry_factory is None or not is_gguf(record["path"]):
                    raise StoreError(f"{record['path']}: not a GGUF file this server can serve")
                entry = lc.entry_factory(name, record["path"])
                entry.info.update(added=True, path=record["path"])
                lc.add_entry(entry)
                return
        else:
            entry = lc.resolve(record["base"])
        lc.add_name(name, entry)
