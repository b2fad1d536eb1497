"""StrataEngine on the fake engine (one slot, as `--parallel 1`): handshake, a request, BSTOP/drain, restart,
faults."""
import os
import time

import pytest

from serve.engine_client.engine import (
    EngineDied, EngineNonFinite, EngineRefused, EngineSilent, StrataEngine)


def started(argv, tmp_path, **kw):
    e = StrataEngine(argv, ["--max-context", "512"], log_path=str(tmp_path / "engine.log"), **kw)
    e.start()
    return e


def test_handshake_and_generate(fake, tmp_path):
    e = started(fake({"turns": [{"text": "hi"}]}), tmp_path)
    try:
        assert e.alive() and e.max_context == 512 and e.can_stop
        assert e.info["engine"] == "fake-1" and e.info["im_start"] == 257
        res = {}
        ids = [t for t in e.generate([257, 65, 66], 16, result=res) if t is not None]
        assert ids == [104, 105, 258]
        assert res["finish"] == "stop" and res["generated"] == 3 and res["prompt"] == 3
        assert res["drafts_acc"] == 0 and res["prompt_read"] == 3
        res2 = {}
        list(e.generate([257, 65, 66, 104, 105, 67], 16, result=res2))
        assert res2["reused"] == 5
    finally:
        e.close()
    assert not e.alive()


def test_err_is_refused_and_engine_keeps_running(fake, tmp_path):
    e = started(fake(), tmp_path)
    try:
        with pytest.raises(EngineRefused, match="exceeds the context"):
            list(e.generate([65] * 10, 600))
        assert e.alive()
        assert [t for t in e.generate([65], 2) if t is not None] == [72, 101]
    finally:
        e.close()


def test_early_close_sends_stop_and_drains(fake, tmp_path):
    rec = tmp_path / "rec.txt"
    e = started(fake({"record": str(rec), "turns": [{"text": "x", "repeat": 100000, "token_delay_s": 0.0005}]}),
                tmp_path)
    try:
        res = {}
        g = e.generate([65], 400, result=res)
        for i, t in zip(range(5), g):
            pass
        g.close()
        assert res["finish"] == "cancel"
        assert "BSTOP 0" in rec.read_text()
        assert e.alive() and not e.ctl.locked()
        assert [t for t in e.generate([66], 2) if t is not None] == [120, 120]   # the slot is free again
    finally:
        e.close()


def test_cancelled_callable_stops_within_a_poll(fake, tmp_path):
    e = started(fake({"turns": [{"text": "x", "first_delay_s": 30}]}), tmp_path)
    try:
        res, t0 = {}, time.monotonic()
        list(e.generate([65], 10, cancelled=lambda: time.monotonic() - t0 > 0.2, result=res))
        assert res["finish"] == "cancel" and time.monotonic() - t0 < 1.5
    finally:
        e.close()


def test_death_mid_stream_then_restart(fake, tmp_path):
    script = {"state": str(tmp_path / "st"), "starts": [{"turns": [{"text": "abcdef", "die_after": 2}]}, {}]}
    e = started(fake(script), tmp_path)
    try:
        got = []
        with pytest.raises(EngineDied, match="exit code 3"):
            for t in e.generate([65], 10):
                got.append(t)
        assert [t for t in got if t is not None] == [97, 98] and not e.alive()
        assert "dying mid-stream" in e.death_note()
        e.restart(tries=1)
        assert [t for t in e.generate([65], 3) if t is not None] == [72, 101, 108]
    finally:
        e.close()


def test_silent_engine_is_ended_after_allowance(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_ENGINE_STALL_S", "0")
    e = started(fake({"turns": [{"text": "abc", "silent_after": 1}]}), tmp_path, silence_s=0.3)
    try:
        t0 = time.monotonic()
        with pytest.raises(EngineSilent, match="silent"):
            list(e.generate([65], 10))
        assert time.monotonic() - t0 < 3 and not e.alive()
    finally:
        e.close()


def test_frozen_engine_check(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_ENGINE_STALL_S", "0.4")
    e = started(fake({"turns": [{"text": "abc", "silent_after": 1}]}), tmp_path, silence_s=100)
    try:
        with pytest.raises(EngineDied, match="froze: no answer to PING"):   # the heartbeat's verdict
            list(e.generate([65], 10))
    finally:
        e.close()


def test_exit_before_ready_is_cleaned_up(fake, tmp_path):
    e = StrataEngine(fake({"exit_before_ready": 7}), [], log_path=str(tmp_path / "e.log"))
    with pytest.raises(EngineDied, match="exit code 7.*dying before READY"):
        e.start()
    assert not e.alive() and e._cur is None


def test_ready_timeout(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_ENGINE_READY_S", "0.3")
    e = StrataEngine(fake({"ready_delay_s": 30}), [], log_path=str(tmp_path / "e.log"))
    with pytest.raises(EngineDied, match="READY within"):
        e.start()


def test_invalid_utf8_lines_do_not_crash(fake, tmp_path):
    e = started(fake({"raw_start": ["INFO junk=\xff\xfe"], "turns": [{"text": "ok", "raw": ["WARN \xc3("]}]}),
                tmp_path)
    try:
        assert e.info["junk"] == "\ufffd\ufffd"
        assert [t for t in e.generate([65], 5) if t is not None] == [111, 107, 258]
    finally:
        e.close()


def test_nonfinite(fake, tmp_path):
    e = started(fake({"turns": [{"nonfinite": True}]}), tmp_path)
    try:
        with pytest.raises(EngineNonFinite):
            list(e.generate([65], 5))
    finally:
        e.close()


def test_old_pump_never_marks_successor_dead(fake, tmp_path):
    e = started(fake(), tmp_path)
    old = e._cur
    e.restart(tries=1)
    try:
        old.pump.join(5)
        assert old.ended and e.alive() and e._cur is not old
    finally:
        e.close()


def test_control_commands_take_the_control_lines(fake, tmp_path):
    e = started(fake(), tmp_path)
    try:
        assert e.vram()["ram_used_mib"] == 10
        assert not e.ctl.locked()
    finally:
        e.close()


def test_an_engine_without_slots_is_refused_each_request(fake, tmp_path):
    e = started(fake({"info": "batch_slots=0"}), tmp_path)
    try:
        with pytest.raises(EngineDied, match="no decode slots"):
            list(e.generate([65], 2))
    finally:
        e.close()
