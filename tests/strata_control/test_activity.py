"""strata_control.activity: records of running servers (0600, stale ones cleaned)."""
import json
import os
import stat
import subprocess
import sys

from strata_control import activity


def test_take_read_release(tmp_path):
    path = activity.take(8080, "127.0.0.1", "m", folder=str(tmp_path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    [rec] = activity.running(str(tmp_path))
    assert (rec["pid"], rec["port"], rec["model"], rec["record"]) == (os.getpid(), 8080, "m", path)
    activity.release(path)
    activity.release(path)   # twice is fine (a signal and the finally)
    assert activity.running(str(tmp_path)) == []


def test_stale_records_are_ignored_and_cleaned(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = activity.take(1, "h", "gone", folder=str(tmp_path), pid=child.pid)
    reused = activity.take(2, "h", "reused", folder=str(tmp_path))
    with open(reused) as f:
        rec = json.load(f)
    rec["process_started"] -= 3600   # this pid belonged to another process an hour ago
    with open(reused, "w") as f:
        json.dump(rec, f)
    (tmp_path / "server-junk.json").write_text("{not json")
    (tmp_path / "other.txt").write_text("kept")
    assert activity.running(str(tmp_path)) == []
    assert sorted(os.listdir(tmp_path)) == ["other.txt"] and not os.path.exists(gone)


def test_runtime_dir_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    d = activity.runtime_dir()
    assert d == str(tmp_path / "strata") and stat.S_IMODE(os.stat(d).st_mode) == 0o700


def test_the_lease_token_file_is_private_and_goes_with_the_record(tmp_path):
    path = activity.take(8080, "127.0.0.1", "m", folder=str(tmp_path), lease_token="secret")
    [rec] = activity.running(str(tmp_path))
    token = rec["lease_token_file"]
    assert open(token).read() == "secret" and stat.S_IMODE(os.stat(token).st_mode) == 0o600
    activity.release(path)
    assert os.listdir(tmp_path) == []


def test_a_full_runtime_folder_leaves_no_token_without_its_record(small_disk):
    small_disk.fill()
    try:
        activity.take(8080, "127.0.0.1", "m", folder=small_disk.path, lease_token="t")
    except OSError as e:
        assert "No space left" in str(e)
    else:
        raise AssertionError("a full folder took a record")
    assert sorted(os.listdir(small_disk.path)) == [".filler"]
