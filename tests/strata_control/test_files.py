"""strata_control.files: private files written whole or not at all, on a real full filesystem (a tmpfs) and
under a real file-size limit (RLIMIT_FSIZE, as `ulimit -f` sets it)."""
import errno
import json
import os
import stat
import subprocess
import sys

import pytest

from strata_control.files import StorageFull, write_private, write_private_json
from tests.conftest import ROOT


def _leftovers(folder):
    return sorted(n for n in os.listdir(folder) if ".tmp" in n)


def test_a_private_file_is_0600_in_a_0700_folder(tmp_path):
    path = tmp_path / "new" / "settings.json"
    os.umask(0o022)
    write_private_json(str(path), {"a": "é"})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": "é"}
    write_private(str(path), "second", keep_backup=True)
    assert path.read_text() == "second" and (tmp_path / "new" / "settings.json.bak").read_text().startswith("{")
    assert _leftovers(path.parent) == []


def test_a_full_disk_is_storage_full_and_the_old_file_stays(small_disk):
    path = os.path.join(small_disk.path, "strata-m.json")
    write_private_json(path, {"threads": 2})
    before = open(path, "rb").read()
    small_disk.fill()
    for keep_backup in (False, True):
        with pytest.raises(StorageFull) as caught:
            write_private_json(path, {"threads": 4, "pad": "x" * 20000}, keep_backup=keep_backup)
        assert caught.value.errno == errno.ENOSPC and isinstance(caught.value, OSError)
        assert "strata-m.json" in str(caught.value) and "free space" in str(caught.value)
        assert open(path, "rb").read() == before          # the previous file, byte for byte
        assert _leftovers(small_disk.path) == []          # no half-written temporary file left behind
    small_disk.free()
    write_private_json(path, {"threads": 4})            # room again: the same call succeeds
    assert json.loads(open(path).read()) == {"threads": 4}


def test_a_file_size_limit_is_storage_full_too(tmp_path):
    """`ulimit -f 4` (4 KiB): the kernel answers EFBIG (Python ignores SIGXFSZ); no root needed."""
    path = tmp_path / "run.json"
    path.write_text("old")
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "from strata_control.files import StorageFull, write_private\n"
            "try:\n"
            f"    write_private({str(path)!r}, 'x' * 10000)\n"
            "except StorageFull as e:\n"
            "    print('full', e.errno)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["full", str(errno.EFBIG)], done.stderr
    assert path.read_text() == "old" and _leftovers(tmp_path) == []
