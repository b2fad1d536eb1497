"""Private files written whole or not at all: every settings, run-config, activity-record and transcript write.

Role: one helper writes a file so that a reader sees the old bytes or the new ones, never half of either:
the text goes to a temporary file beside the target (same folder, so the rename cannot cross a filesystem),
created 0600, flushed and fsynced, then renamed over the target; on any failure the temporary file is
removed and the target is untouched. A folder the helper has to create is made 0700. A full disk or quota
(ENOSPC, EDQUOT) or a file-size limit (EFBIG: `ulimit -f`) is `StorageFull`, an OSError whose message says
which file and what to free; the HTTP shell answers it with 507 Insufficient Storage, the CLI with one line.
Nothing here talks HTTP.

Public surface: `StorageFull`, `write_private(path, data, keep_backup=False)`,
`write_private_json(path, value, keep_backup=False)`, `STORAGE_ERRNOS`.
"""
from __future__ import annotations

import errno
import json
import os

from serve.core.errors import StrataError

# the errors that mean "no room": a full filesystem, a user's quota, a per-process file-size limit
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class StorageFull(StrataError, OSError):
    """A private write found no room; the previous file (if any) is intact. `path`: the file not written. To a
    client of the server: 507, its message cut to what a client may see (serve/core/errors.py `public_text`)."""
    status = 507
    err_type = "insufficient_storage"
    public = True

    def __init__(self, path: str, cause: OSError):
        why = os.strerror(cause.errno) if cause.errno else str(cause)
        OSError.__init__(self, cause.errno, f"cannot save {path}: {why}; free space on its filesystem (the previous "
                                            "file is unchanged)")
        self.path = path
        self.message = self.strerror
        self.param, self.code, self.extra = None, None, {}


def _fsync_dir(folder: str) -> None:
    """Make the rename itself durable (best effort: some filesystems refuse a directory fsync)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _keep_backup(path: str) -> None:
    """`path.bak` becomes a second name of the current file (a hard link: no data written, and `path` itself
    stays until the rename replaces it); a copy through a rename where links are refused."""
    bak = path + ".bak"
    try:
        os.unlink(bak)
    except FileNotFoundError:
        pass
    try:
        os.link(path, bak)
    except OSError as e:
        if e.errno in STORAGE_ERRNOS:
            raise
        os.replace(path, bak)   # a filesystem without hard links: the old name is gone until the rename


def write_private(path: str, data: str | bytes, keep_backup: bool = False) -> None:
    """Write `data` (text is UTF-8) to `path` atomically, 0600; with `keep_backup` the file it replaces is
    kept as `path.bak`. Raises StorageFull when there is no room, other OSErrors as they come."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)   # whatever the umask or a stale temporary file's mode
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        if keep_backup and os.path.exists(path):
            _keep_backup(path)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            raise StorageFull(path, e) from None
        raise
    _fsync_dir(folder)


def write_private_json(path: str, value, keep_backup: bool = False) -> None:
    """`value` as indented JSON (non-ASCII kept) through `write_private`."""
    write_private(path, json.dumps(value, indent=1, ensure_ascii=False) + "\n", keep_backup)
