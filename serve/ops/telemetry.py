"""Machine telemetry: CPU, RAM, process memory, disk and network rates, GPUs; sampled once a second.

Role: read the machine's figures for /metrics, /v1/status and the Monitor page, and keep a short history of
them (plus whatever serving figures a caller's probe adds) in bounded series. Knows nothing of the server,
the engine or HTTP: serve/ops/metrics_views.py gives the sampler a probe for the serving figures.

Readers (each returns plain dicts; a value that cannot be read is None, never 0):
- psutil: CPU share (from cpu_times deltas, so no other caller's `cpu_percent` state is disturbed), RAM,
  this process's RSS and its children's (the engine), disk read/write and network in/out rates.
- NVIDIA: NVML loaded with ctypes (`libnvidia-ml.so.1`, or `STRATA_NVML_LIB`) when present: per GPU its
  name, utilisation %, memory used/total, temperature (°C) and power (W). Tested on a stub library the tests
  build with the C compiler.
- AMD: sysfs under /sys/class/drm/card*/device (amdgpu): `gpu_busy_percent`, `mem_info_vram_used`,
  `mem_info_vram_total`, hwmon `temp1_input` (m°C) and `power1_average` / `power1_input` (µW). Tested on a
  fake sysfs tree.
- Apple (macOS, untested here: no Mac in CI): `ioreg -r -d 1 -c IOAccelerator` is read for the
  PerformanceStatistics keys "Device Utilization %" and "In use system memory" (unified memory: the total is
  the machine's RAM); temperature and power need root (powermetrics) and are not read. `parse_ioreg` is
  tested on a transcript; the command itself has never run here.

Public surface: `machine() -> dict` (the figures now), `Sampler(probe=None)` (`.start()`, `.stop()`,
`.latest()`, `.history()`), `NvmlReader(path=None)`, `amd_gpus(root)`, `parse_ioreg(text)`, `apple_gpus()`,
`gpu_summary(gpus)`, `cpu_model()`, `owned_probe(owner, make_figures)`, `process_rss()` (this process's
RSS, its children's: the engines),
`SAMPLE_S`, `HISTORY_SAMPLES`.
"""
from __future__ import annotations

import ctypes
import glob
import os
import re
import subprocess
import sys
import threading
import time
import weakref
from collections import deque

try:
    import psutil
except ImportError:
    psutil = None

SAMPLE_S = 1.0            # one sample a second: the Monitor's charts move at this rate
HISTORY_SAMPLES = 300     # five minutes of samples per series (bounded: a deque of this length)
CHILDREN_REFRESH_S = 10.0  # the child list (the engine) is re-read this often: the scan reads every /proc entry
APPLE_IOREG_TIMEOUT_S = 2.0   # ioreg answers in milliseconds; a hung one must not stall the sampler
NVML_LIB = "libnvidia-ml.so.1"
AMD_DRM_ROOT = "/sys/class/drm"


# ------------------------------------------------------------------------------------------------ NVIDIA
class _NvmlUtil(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class NvmlReader:
    """NVML through ctypes. `ok` is False when the library is absent or nvmlInit fails (then `read()` is
    []). Each figure is read on its own: a call that fails leaves that figure None."""
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, path: str | None = None):
        self.ok, self.handles, self.lib = False, [], None
        try:
            self.lib = ctypes.CDLL(path or os.environ.get("STRATA_NVML_LIB") or NVML_LIB)
            init = getattr(self.lib, "nvmlInit_v2", None) or self.lib.nvmlInit
            if init() != 0:
                return
            count = ctypes.c_uint(0)
            get_count = getattr(self.lib, "nvmlDeviceGetCount_v2", None) or self.lib.nvmlDeviceGetCount
            if get_count(ctypes.byref(count)) != 0:
                return
            by_index = getattr(self.lib, "nvmlDeviceGetHandleByIndex_v2", None) or \
                self.lib.nvmlDeviceGetHandleByIndex
            for i in range(count.value):
                h = ctypes.c_void_p()
                if by_index(ctypes.c_uint(i), ctypes.byref(h)) == 0:
                    self.handles.append(h)
            self.ok = True
        except (OSError, AttributeError):
            self.ok = False

    def _call(self, name, *args) -> bool:
        fn = getattr(self.lib, name, None)
        return fn is not None and fn(*args) == 0

    def read(self) -> list[dict]:
        out = []
        for i, h in enumerate(self.handles if self.ok else []):
            g = {"index": i, "vendor": "nvidia", "name": None, "util": None, "mem_used": None,
                 "mem_total": None, "temp": None, "power": None}
            name = ctypes.create_string_buffer(96)
            if self._call("nvmlDeviceGetName", h, name, ctypes.c_uint(96)):
                g["name"] = name.value.decode("utf-8", "replace")
            util = _NvmlUtil()
            if self._call("nvmlDeviceGetUtilizationRates", h, ctypes.byref(util)):
                g["util"] = float(util.gpu)
            mem = _NvmlMemory()
            if self._call("nvmlDeviceGetMemoryInfo", h, ctypes.byref(mem)):
                g["mem_used"], g["mem_total"] = int(mem.used), int(mem.total)
            temp = ctypes.c_uint(0)
            if self._call("nvmlDeviceGetTemperature", h, ctypes.c_int(self.NVML_TEMPERATURE_GPU),
                          ctypes.byref(temp)):
                g["temp"] = float(temp.value)
            mw = ctypes.c_uint(0)
            if self._call("nvmlDeviceGetPowerUsage", h, ctypes.byref(mw)):
                g["power"] = mw.value / 1000.0
            out.append(g)
        return out


# ------------------------------------------------------------------------------------------------ AMD
def _read_number(path: str) -> float | None:
    try:
        with open(path, encoding="ascii") as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


def amd_gpus(root: str = AMD_DRM_ROOT) -> list[dict]:
    """Every amdgpu card under `root` (one with `device/gpu_busy_percent`)."""
    out = []
    for card in sorted(glob.glob(os.path.join(root, "card[0-9]*"))):
        dev = os.path.join(card, "device")
        busy = _read_number(os.path.join(dev, "gpu_busy_percent"))
        if busy is None or "-" in os.path.basename(card):  # card0-DP-1 and friends are connectors
            continue
        g = {"index": len(out), "vendor": "amd", "name": os.path.basename(card), "util": busy,
             "mem_used": None, "mem_total": None, "temp": None, "power": None}
        for key, name in (("mem_used", "mem_info_vram_used"), ("mem_total", "mem_info_vram_total")):
            v = _read_number(os.path.join(dev, name))
            g[key] = int(v) if v is not None else None
        for hwmon in sorted(glob.glob(os.path.join(dev, "hwmon", "hwmon*"))):
            t = _read_number(os.path.join(hwmon, "temp1_input"))
            p = _read_number(os.path.join(hwmon, "power1_average"))
            if p is None:
                p = _read_number(os.path.join(hwmon, "power1_input"))
            g["temp"] = t / 1000.0 if t is not None else g["temp"]
            g["power"] = p / 1e6 if p is not None else g["power"]
        out.append(g)
    return out


# ------------------------------------------------------------------------------------------------ Apple
def parse_ioreg(text: str, ram_total: int | None = None) -> list[dict]:
    """GPUs from `ioreg -r -d 1 -c IOAccelerator` output (untested on a real Mac; see the docstring)."""
    out = []
    for block in re.split(r"\n(?=\+-o )", text):
        util = re.search(r'"Device Utilization %"\s*=\s*(\d+)', block)
        if util is None:
            continue
        used = re.search(r'"In use system memory"\s*=\s*(\d+)', block)
        name = re.search(r'"model"\s*=\s*"([^"]*)"', block) or re.search(r"\+-o (\S+)", block)
        out.append({"index": len(out), "vendor": "apple", "name": name.group(1) if name else None,
                    "util": float(util.group(1)), "mem_used": int(used.group(1)) if used else None,
                    "mem_total": ram_total, "temp": None, "power": None})
    return out


def apple_gpus() -> list[dict]:
    if sys.platform != "darwin":
        return []
    try:
        text = subprocess.run(["ioreg", "-r", "-d", "1", "-c", "IOAccelerator"], capture_output=True,
                              text=True, timeout=APPLE_IOREG_TIMEOUT_S).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_ioreg(text, psutil.virtual_memory().total if psutil else None)


# ------------------------------------------------------------------------------------------------ psutil
class _HostReader:
    """psutil figures; the rates and the CPU share are deltas since this reader's previous call."""

    def __init__(self):
        self.prev: dict | None = None
        self.proc = psutil.Process() if psutil else None
        self.kids: list = []
        self.kids_at = float("-inf")

    def _children(self) -> list:
        now = time.monotonic()
        if now - self.kids_at >= CHILDREN_REFRESH_S or any(not k.is_running() for k in self.kids):
            self.kids, self.kids_at = self.proc.children(recursive=True), now
        return self.kids

    def _counters(self) -> dict:
        c = {"t": time.monotonic(), "cpu": psutil.cpu_times()}
        with _suppress():
            d = psutil.disk_io_counters()
            c["disk"] = (d.read_bytes, d.write_bytes) if d else None
        with _suppress():
            n = psutil.net_io_counters()
            c["net"] = (n.bytes_recv, n.bytes_sent) if n else None
        return c

    def read(self) -> dict:
        out = {"cpu": None, "ram_used": None, "ram_total": None, "rss_server": None, "rss_engine": None,
               "disk_read_bps": None, "disk_write_bps": None, "net_in_bps": None, "net_out_bps": None}
        if psutil is None:
            return out
        with _suppress():
            vm = psutil.virtual_memory()
            out["ram_used"], out["ram_total"] = vm.total - vm.available, vm.total
        with _suppress():
            out["rss_server"] = self.proc.memory_info().rss
            kids = self._children()
            out["rss_engine"] = sum(_rss(k) for k in kids) if kids else None
        with _suppress():
            now = self._counters()
            prev, self.prev = self.prev, now
            if prev is not None and now["t"] > prev["t"]:
                dt = now["t"] - prev["t"]
                busy = lambda c: sum(c) - c.idle - getattr(c, "iowait", 0.0)  # noqa: E731
                total = sum(now["cpu"]) - sum(prev["cpu"])
                if total > 0:
                    out["cpu"] = round(100.0 * (busy(now["cpu"]) - busy(prev["cpu"])) / total, 1)
                for key, names in (("disk", ("disk_read_bps", "disk_write_bps")),
                                   ("net", ("net_in_bps", "net_out_bps"))):
                    if now.get(key) and prev.get(key):
                        for name, a, b in zip(names, now[key], prev[key]):
                            out[name] = max(0.0, (a - b) / dt)
        return out


def _rss(proc) -> int:
    try:
        return proc.memory_info().rss
    except (OSError, psutil.Error):
        return 0


class _suppress:
    """Skip a figure whose read fails (psutil raises OSError or its own errors; None stays None)."""

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and (issubclass(kind, OSError) or (psutil is not None and
                                                                   issubclass(kind, psutil.Error)))


def gpu_summary(gpus: list[dict]) -> dict:
    """The machine's GPUs as one: mean utilisation, memory summed, the hottest temperature, power summed
    (each None when no GPU reports it)."""
    def known(key):
        return [g[key] for g in gpus if g.get(key) is not None]
    util, used, total, temp, power = (known(k) for k in ("util", "mem_used", "mem_total", "temp", "power"))
    return {"gpu_util": sum(util) / len(util) if util else None, "gpu_mem_used": sum(used) if used else None,
            "gpu_mem_total": sum(total) if total else None, "gpu_temp": max(temp) if temp else None,
            "gpu_power": sum(power) if power else None}


def cpu_model() -> str | None:
    """The CPU's model name (Linux /proc/cpuinfo), else what the platform says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or None


# ------------------------------------------------------------------------------------------------ sampler
class Sampler:
    """A daemon thread that samples the machine (and `probe()`, a dict of extra figures, when given) every
    SAMPLE_S into bounded series. The probe returning None ends the thread (its owner is gone)."""

    def __init__(self, probe=None, interval_s: float = SAMPLE_S, keep: int = HISTORY_SAMPLES,
                 nvml_path: str | None = None, amd_root: str = AMD_DRM_ROOT):
        self.probe, self.interval_s = probe, interval_s
        self.host = _HostReader()
        self.nvml = NvmlReader(nvml_path)
        self.amd_root = amd_root
        self._read_lock = threading.Lock()  # guards the readers' and the probe's delta state: one sample at a time
        self._lock = threading.Lock()       # guards times, series, last
        self.times: deque = deque(maxlen=keep)
        self.series: dict[str, deque] = {}
        self.last: dict = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def gpus(self) -> list[dict]:
        return self.nvml.read() + amd_gpus(self.amd_root) + apple_gpus()

    def sample(self) -> dict | None:
        """Take one sample now (the thread calls this every SAMPLE_S); None when the probe says stop."""
        with self._read_lock:
            extra = self.probe() if self.probe is not None else {}
            if extra is None:
                return None
            figures = self.host.read()
            gpus = self.gpus()
        figures["gpus"] = gpus
        flat = {k: v for k, v in figures.items() if k != "gpus"}
        flat.update(gpu_summary(gpus))
        if len(gpus) > 1:  # each GPU also on its own: gpu<vendor><index>_<figure>
            for g in gpus:
                for key in ("util", "mem_used", "temp", "power"):
                    flat[f"gpu{g['vendor']}{g['index']}_{key}"] = g[key]
        flat.update(extra)
        with self._lock:
            keep = self.times.maxlen
            self.times.append(time.time())
            for name, value in flat.items():
                if isinstance(value, (int, float)) or value is None:
                    self.series.setdefault(name, deque([None] * (len(self.times) - 1), maxlen=keep))
            for name, values in self.series.items():
                v = flat.get(name)
                values.append(round(v, 3) if isinstance(v, float) else v)
            self.last = figures | {"extra": extra}
        return figures

    def _loop(self):
        while not self._stop.wait(self.interval_s):
            if self.sample() is None:
                return

    def start(self) -> "Sampler":
        self.sample()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="telemetry-sampler")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def latest(self) -> dict:
        with self._lock:
            return dict(self.last)

    def history(self) -> dict:
        """{"t": [unix seconds...], "series": {name: [value or None, ...]}} aligned with "t"."""
        with self._lock:
            return {"t": [round(t, 3) for t in self.times],
                    "series": {k: list(v) for k, v in self.series.items()}}


_machine_lock = threading.Lock()   # guards _machine_reader (the psutil deltas of machine())
_machine_reader: _HostReader | None = None
_gpu_reader: NvmlReader | None = None


def machine() -> dict:
    """The machine now: {"cpu", "ram_used", "ram_total", ..., "gpu": first GPU or None, "gpus": [...]}.
    The CPU share is over the time since the previous call (None on the first)."""
    global _machine_reader, _gpu_reader
    with _machine_lock:
        if _machine_reader is None:
            _machine_reader, _gpu_reader = _HostReader(), NvmlReader()
        out = _machine_reader.read()
        gpus = _gpu_reader.read() + amd_gpus() + apple_gpus()
    out["gpus"] = gpus
    out["gpu"] = gpus[0] if gpus else None
    return out


def process_rss() -> tuple[int | None, int | None]:
    """(this process's RSS, the sum over its child processes: the engines) in bytes; None when unreadable."""
    if psutil is None:
        return None, None
    try:
        me = psutil.Process()
        own = me.memory_info().rss
    except (OSError, psutil.Error):
        return None, None
    engines = 0
    for child in me.children(recursive=True):
        try:
            engines += child.memory_info().rss
        except (OSError, psutil.Error):
            pass
    return own, engines


def owned_probe(owner, make_figures):
    """A sampler probe that calls make_figures(owner) while `owner` lives and returns None (ending the
    sampler) once it is garbage or its `shutting_down` event is set."""
    ref = weakref.ref(owner)

    def probe():
        o = ref()
        if o is None or (getattr(o, "shutting_down", None) is not None and o.shutting_down.is_set()):
            return None
        return make_figures(o)
    return probe
