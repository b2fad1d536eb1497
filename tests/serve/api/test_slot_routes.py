"""llama-server's saved slots, POST /slots/{id}?action=save|restore|erase (serve/api/slot_routes.py): on the real
engine a conversation saved, erased and restored onto another slot is reused by its next turn (cached tokens)
and continues exactly as it did before; names cannot leave the folder; a busy slot is 409; without
--slot-save-path every action is a 501 that says so; ids run across replicas."""
import os
import stat
import threading
import time

import pytest

from serve.api.slot_routes import check_filename
from tests.conftest import ENGINE_EXE, model_path
from tests.serve.conftest import real_server

MODEL = model_path()
real = pytest.mark.skipif(not (os.path.exists(ENGINE_EXE) and MODEL), reason="needs the engine and the model")


def _turn(run, messages):
    status, body, _ = run.post("/v1/chat/completions", {"messages": messages, "max_tokens": 12,
                                                        "temperature": 0})
    assert status == 200, body
    return body["choices"][0]["message"]["content"], body["usage"]


def _held(run):
    return {s["id"]: s["n_prompt_tokens"] for s in run.request("GET", "/slots")[1]}


@real
def test_save_erase_restore_onto_another_slot_is_reused_and_continues_the_same(tmp_path):
    folder = tmp_path / "slots"
    folder.mkdir(mode=0o700)
    with real_server(ENGINE_EXE, MODEL, tmp_path, 1024, ["--batch", "2"], slot_save_path=str(folder)) as run:
        first = [{"role": "user", "content": "Tell me a short story about a cat."}]
        reply, usage1 = _turn(run, first)
        slot = max(_held(run).items(), key=lambda kv: kv[1] or 0)[0]
        other = 1 - slot
        status, saved, _ = run.post(f"/slots/{slot}?action=save", {"filename": "cat.bin"})
        assert status == 200 and saved["id_slot"] == slot and saved["filename"] == "cat.bin", saved
        assert saved["n_saved"] >= usage1["prompt_tokens"] and saved["timings"]["save_ms"] >= 0
        path = folder / "cat.bin"
        assert saved["n_written"] == path.stat().st_size
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        second = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
        before, usage2 = _turn(run, second)     # the reference: straight on from the slot that held it
        for s in (0, 1):
            status, erased, _ = run.post(f"/slots/{s}?action=erase", {})
            assert status == 200 and erased["id_slot"] == s
        assert set(_held(run).values()) == {0}
        status, restored, _ = run.post(f"/slots/{other}?action=restore", {"filename": "cat.bin"})
        assert status == 200 and restored["n_restored"] == saved["n_saved"], restored
        assert restored["n_read"] == saved["n_written"] and _held(run)[other] == saved["n_saved"]
        after, usage3 = _turn(run, second)
        assert after == before
        cached = usage3["prompt_tokens_details"]["cached_tokens"]
        assert cached >= usage1["prompt_tokens"], (usage3, saved)   # the restored conversation, not a re-read
        assert usage3["prompt_tokens"] == usage2["prompt_tokens"]


def test_names_stay_in_the_folder():
    for ok in ("cat.bin", "a", "chat-1_2.slot", "x" * 128):
        assert check_filename(ok) is None, ok
    for bad in ("", "../x", "..", ".hidden", "a/b", "a\\b", "/etc/passwd", "x" * 129, "a..b", "c.bin.tmp",
                "a b", "é.bin", "nul\0", 7, None):
        assert check_filename(bad), bad


def _busy_script():
    return {"slots": 2, "repeat": 400, "step_delay_s": 0.02}


def test_bad_requests_are_refused_in_llama_servers_shape(slot_server, tmp_path):
    folder = tmp_path / "saved"
    run = slot_server(_busy_script(), slot_save_path=str(folder))
    cases = [("/slots/0?action=save", {"filename": "../escape.bin"}, 400, "filename"),
             ("/slots/0?action=save", {}, 400, "filename"),
             ("/slots/0?action=restore", {"filename": "missing.bin"}, 404, "missing.bin"),
             ("/slots/0?action=load", {"filename": "a.bin"}, 400, "action"),
             ("/slots/0", {"filename": "a.bin"}, 400, "action"),
             ("/slots/x?action=erase", {}, 400, "slot id"),
             ("/slots/9?action=erase", {}, 400, "slots 0..1")]
    for path, body, want, says in cases:
        status, err, _ = run.post(path, body)
        assert status == want and says in err["error"]["message"], (path, err)
        assert err["error"]["code"] == want
    assert not (tmp_path / "escape.bin").exists()


def test_a_busy_slot_is_409_and_the_request_goes_on(slot_server, tmp_path):
    run = slot_server(_busy_script(), slot_save_path=str(tmp_path))
    out = {}
    t = threading.Thread(target=lambda: out.update(r=run.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "q1"}], "max_tokens": 200}, timeout=60)))
    t.start()
    deadline = time.monotonic() + 20
    busy = []
    while not busy and time.monotonic() < deadline:
        busy = [s["id"] for s in run.request("GET", "/slots")[1] if s["is_processing"]]
        time.sleep(0.02)
    assert busy
    for action, body in (("save", {"filename": "a.bin"}), ("erase", {})):
        status, err, _ = run.post(f"/slots/{busy[0]}?action={action}", body)
        assert status == 409 and "processing" in err["error"]["message"], err
    t.join(60)
    assert out["r"][0] == 200 and out["r"][1]["choices"][0]["message"]["content"].startswith("<q1><q1>")


def test_without_a_slot_save_path_every_action_says_how_to_turn_it_on(slot_server):
    run = slot_server(_busy_script())
    for action in ("save", "restore", "erase"):
        status, err, _ = run.post(f"/slots/0?action={action}", {"filename": "a.bin"})
        assert status == 501 and "--slot-save-path" in err["error"]["message"], err


def test_ids_run_across_replicas(slot_server, tmp_path):
    """Replica 0's slots are 0..1, replica 1's 2..3 (as GET /slots lists them): an id reaches its own engine's
    slot (the fake engine refuses a BERASE for a slot it does not have)."""
    run = slot_server(_busy_script(), replicas=2, slot_save_path=str(tmp_path))
    assert [s["id"] for s in run.request("GET", "/slots")[1]] == [0, 1, 2, 3]
    for slot in (0, 1, 2, 3):
        status, erased, _ = run.post(f"/slots/{slot}?action=erase", {})
        assert status == 200 and erased == {"id_slot": slot, "n_erased": 0}, erased
    status, err, _ = run.post("/slots/4?action=erase", {})
    assert status == 400 and err["error"]["message"].endswith("slots 0..3"), err


@real
def test_a_save_onto_a_full_disk_is_507_and_keeps_the_saved_file(tmp_path, small_disk):
    with real_server(ENGINE_EXE, MODEL, tmp_path, 1024, ["--batch", "2"], slot_save_path=small_disk.path) as run:
        _turn(run, [{"role": "user", "content": "Hi"}])
        slot = max(_held(run).items(), key=lambda kv: kv[1] or 0)[0]
        status, saved, _ = run.post(f"/slots/{slot}?action=save", {"filename": "a.bin"})
        assert status == 200, saved
        path = os.path.join(small_disk.path, "a.bin")
        before = open(path, "rb").read()
        small_disk.fill()
        status, out, _ = run.post(f"/slots/{slot}?action=save", {"filename": "a.bin"})
        assert status == 507 and "No space left on device" in out["error"]["message"], out
        assert small_disk.path not in out["error"]["message"]   # the server's folders stay in its log
        assert open(path, "rb").read() == before
        assert sorted(os.listdir(small_disk.path)) == [".filler", "a.bin"]   # no half-written temporary file
        small_disk.free()
        os.unlink(path)   # the disk holds one saved slot, not two (the old file and the temporary beside it)
        assert run.post(f"/slots/{slot}?action=save", {"filename": "a.bin"})[0] == 200
