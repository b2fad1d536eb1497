"""serve/ops/telemetry.py: each reader on a fixture (a stub NVML library built here with the C compiler, a fake
amdgpu sysfs tree, an ioreg transcript), and the sampler's bounded series."""
import os
import subprocess
import threading
import time


from serve.ops import telemetry

def test_nvml_reader_reads_every_gpu_through_ctypes(nvml_stub):
    r = telemetry.NvmlReader(nvml_stub)
    assert r.ok
    gpus = r.read()
    assert [g["name"] for g in gpus] == ["Stub GPU A", "Stub GPU B"]
    a, b = gpus
    assert (a["util"], a["mem_used"], a["mem_total"], a["temp"], a["power"]) == (41.0, 1 << 30, 80 << 30, 61.0, 250.5)
    assert b["util"] == 42.0 and b["temp"] == 62.0
    assert b["power"] is None  # a failing call leaves that figure unknown, never 0


def test_nvml_absent_is_no_gpu(tmp_path):
    r = telemetry.NvmlReader(str(tmp_path / "libnvidia-ml.so.1"))
    assert not r.ok and r.read() == []


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_amd_sysfs_tree(tmp_path):
    root = tmp_path / "drm"
    dev = root / "card1" / "device"
    _write(str(dev / "gpu_busy_percent"), "37\n")
    _write(str(dev / "mem_info_vram_used"), str(3 << 30) + "\n")
    _write(str(dev / "mem_info_vram_total"), str(16 << 30) + "\n")
    _write(str(dev / "hwmon" / "hwmon4" / "temp1_input"), "54000\n")
    _write(str(dev / "hwmon" / "hwmon4" / "power1_average"), "112000000\n")
    _write(str(root / "card1-DP-1" / "device" / "gpu_busy_percent"), "99\n")   # a connector, not a GPU
    _write(str(root / "card0" / "device" / "vendor"), "0x8086\n")               # an Intel card: no busy file
    gpus = telemetry.amd_gpus(str(root))
    assert gpus == [{"index": 0, "vendor": "amd", "name": "card1", "util": 37.0, "mem_used": 3 << 30,
                     "mem_total": 16 << 30, "temp": 54.0, "power": 112.0}]


def test_amd_power_input_when_no_average(tmp_path):
    dev = tmp_path / "card0" / "device"
    _write(str(dev / "gpu_busy_percent"), "0")
    _write(str(dev / "hwmon" / "hwmon0" / "power1_input"), "15000000")
    (g,) = telemetry.amd_gpus(str(tmp_path))
    assert g["power"] == 15.0 and g["temp"] is None and g["mem_total"] is None


IOREG = """+-o AGXAcceleratorG14X  <class AGXAcceleratorG14X, id 0x1000004f1, registered, matched, active, busy 0>
    {
      "model" = "Apple M2"
      "PerformanceStatistics" = {"In use system memory"=1610612736,"Device Utilization %"=23,"Renderer Utilization %"=21}
    }
"""


def test_apple_ioreg_transcript():
    assert telemetry.parse_ioreg(IOREG, ram_total=16 << 30) == [
        {"index": 0, "vendor": "apple", "name": "Apple M2", "util": 23.0, "mem_used": 1610612736,
         "mem_total": 16 << 30, "temp": None, "power": None}]


def test_sampler_series_are_bounded_and_carry_probe_and_gpu(nvml_stub, tmp_path):
    calls = []
    s = telemetry.Sampler(probe=lambda: calls.append(1) or {"decode_tok_s": float(len(calls))}, keep=5,
                          nvml_path=nvml_stub, amd_root=str(tmp_path))
    for _ in range(8):
        s.sample()
    h = s.history()
    assert len(h["t"]) == 5
    assert h["series"]["decode_tok_s"] == [4.0, 5.0, 6.0, 7.0, 8.0]
    assert all(len(v) == 5 for v in h["series"].values())
    assert h["series"]["gpunvidia0_util"][-1] == 41.0 and h["series"]["gpunvidia1_power"][-1] is None
    # the two as one for the Monitor's charts: mean utilisation, memory summed, hottest, power of those known
    assert (h["series"]["gpu_util"][-1], h["series"]["gpu_mem_used"][-1], h["series"]["gpu_temp"][-1],
            h["series"]["gpu_power"][-1]) == (41.5, 3 << 30, 62.0, 250.5)
    assert h["series"]["cpu"][-1] is None or 0.0 <= h["series"]["cpu"][-1] <= 100.0
    assert h["series"]["ram_total"][-1] > 0
    assert len(s.latest()["gpus"]) == 2


def test_sampler_thread_samples_each_interval_and_ends_with_its_owner():
    class Owner:
        shutting_down = threading.Event()
    owner = Owner()
    s = telemetry.Sampler(telemetry.owned_probe(owner, lambda o: {"x": 1}), interval_s=0.02).start()
    deadline = time.monotonic() + 10
    while len(s.history()["t"]) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(s.history()["t"]) >= 4
    owner.shutting_down.set()
    s._thread.join(5)
    assert not s._thread.is_alive()


def test_machine_figures():
    m = telemetry.machine()
    assert m["ram_total"] > 0 and m["ram_used"] > 0 and m["rss_server"] > 0
    assert m["gpu"] is None or m["gpu"] == m["gpus"][0]
    time.sleep(0.05)
    cpu = telemetry.machine()["cpu"]
    assert cpu is None or 0.0 <= cpu <= 100.0


def test_engine_rss_follows_the_children(monkeypatch):
    import sys
    r = telemetry._HostReader()
    r.read()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid not in [k.pid for k in r._children()]   # the list is kept between refreshes
        monkeypatch.setattr(telemetry, "CHILDREN_REFRESH_S", 0.0)
        out = r.read()
        assert child.pid in [k.pid for k in r.kids] and out["rss_engine"] > 0
    finally:
        child.kill()
        child.wait()
    monkeypatch.setattr(telemetry, "CHILDREN_REFRESH_S", 3600.0)
    r.read()                                                  # a child that ended makes the list be read again
    assert child.pid not in [k.pid for k in r.kids]
