"""strata_control/host.py and its use in the plan (issue 25, host limits): the CPUs this process may use
(affinity: `taskset`; cgroup v2 cpu.max) set the default threads, and a cgroup memory.max below the plan is a
refusal with the numbers, from `strata plan` and at the start of `strata serve`. The cgroup here is a fake
directory (STRATA_CGROUP_DIR); tests/strata_control/test_host_cgroup.py runs the same refusal in a real one."""
import os
import shutil
import subprocess
import sys

import pytest

from strata_control.host import host_limits
from strata_control.models import describe
from strata_control.plan import MIB, Machine, PlanRefused, make_plan
from tests.conftest import ROOT
from tests.strata_control.ggufs import write_model

GIB = 1 << 30


def _cgroup(tmp_path, cpu_max=None, memory_max=None, memory_current=None):
    d = tmp_path / "cgroup"
    d.mkdir(exist_ok=True)
    for name, value in (("cpu.max", cpu_max), ("memory.max", memory_max), ("memory.current", memory_current)):
        if value is not None:
            (d / name).write_text(f"{value}\n")
    return str(d)


def _cli(*args, env=None, prefix=()):
    return subprocess.run([*prefix, sys.executable, "-m", "strata_cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


@pytest.fixture
def small(tmp_path):
    return str(write_model(tmp_path / "small.gguf", pad_bytes=90 * MIB))


def test_cpu_max_quota_rounds_up_to_whole_cpus(tmp_path):
    limits = host_limits(_cgroup(tmp_path, cpu_max="150000 100000"))
    assert limits.cpus == min(2, len(os.sched_getaffinity(0)))  # 1.5 CPUs: two threads' worth
    if len(os.sched_getaffinity(0)) > 2:
        assert "cpu quota '150000 100000'" in limits.cpus_source
    limits = host_limits(_cgroup(tmp_path, cpu_max="50000 100000"))
    assert limits.cpus == 1 and "allows 0.5 CPUs" in limits.cpus_source


def test_no_quota_and_no_memory_limit_read_as_none(tmp_path):
    limits = host_limits(_cgroup(tmp_path, cpu_max="max 100000", memory_max="max"))
    assert limits.cpus == len(os.sched_getaffinity(0)) and limits.memory_max_bytes is None
    assert limits.memory_source == ""


def test_memory_max_and_current_are_read(tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_CGROUP_DIR", _cgroup(tmp_path, memory_max=512 * MIB, memory_current=100 * MIB))
    limits = host_limits()
    assert (limits.memory_max_bytes, limits.memory_used_bytes) == (512 * MIB, 100 * MIB)
    assert "memory.max" in limits.memory_source and str(tmp_path) in limits.memory_source


def test_cgroup_v1_names_are_read_too(tmp_path):
    d = tmp_path / "v1"
    d.mkdir()
    (d / "cpu.cfs_quota_us").write_text("50000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    (d / "memory.limit_in_bytes").write_text(f"{256 * MIB}\n")
    (d / "memory.usage_in_bytes").write_text(f"{10 * MIB}\n")
    limits = host_limits(str(d))
    assert limits.cpus == 1 and (limits.memory_max_bytes, limits.memory_used_bytes) == (256 * MIB, 10 * MIB)
    (d / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    (d / "cpu.cfs_quota_us").write_text("-1\n")
    limits = host_limits(str(d))
    assert limits.memory_max_bytes is None and limits.cpus == len(os.sched_getaffinity(0))


def test_this_hosts_own_limits_read_without_error():
    limits = host_limits()
    assert 1 <= limits.cpus <= (os.cpu_count() or 1) and limits.cpus_source


def test_the_plan_threads_follow_the_usable_cpus(tmp_path):
    m = describe(str(write_model(tmp_path / "m.gguf", pad_bytes=90 * MIB)))
    machine = Machine(cores=64, physical_cores=32, ram_bytes=64 * GIB, free_ram_bytes=60 * GIB,
                      usable_cpus=2, cpus_source="cgroup cpu.max '200000 100000' in /x allows 2 CPUs")
    p = make_plan(m, machine, {})
    assert p.threads == 2 and "one per CPU this process may use (cgroup cpu.max" in p.reasons[2]
    p = make_plan(m, machine, {"threads": 8})
    assert p.threads == 8 and any("may use 2 CPUs" in n for n in p.notices)
    p = make_plan(m, Machine(cores=64, physical_cores=32, ram_bytes=64 * GIB, free_ram_bytes=60 * GIB,
                             usable_cpus=64, cpus_source="all 64 CPUs"), {})
    assert p.threads == 32 and p.reasons[2] == "threads 32: the default, one per physical core"


def test_a_cgroup_memory_limit_below_the_plan_is_refused_with_the_numbers(tmp_path):
    m = describe(str(write_model(tmp_path / "m.gguf", pad_bytes=90 * MIB)))
    machine = Machine(cores=4, physical_cores=4, ram_bytes=64 * GIB, free_ram_bytes=60 * GIB,
                      memory_max_bytes=300 * MIB, memory_used_bytes=100 * MIB, memory_source="cgroup memory.max in /c")
    with pytest.raises(PlanRefused, match=r"needs \d+ MiB .* but 180 MiB are usable \(cgroup memory.max in /c: "
                                          r"300 MiB, 100 MiB of it in use"):
        make_plan(m, machine, {"max_context": 8192})
    roomy = Machine(cores=4, physical_cores=4, ram_bytes=64 * GIB, free_ram_bytes=60 * GIB,
                    memory_max_bytes=8 * GIB, memory_source="cgroup memory.max in /c")
    p = make_plan(m, roomy, {})
    assert p.memory["budget"] == int(8 * GIB * 0.9) and any(r.startswith("memory ") and "cgroup" in r
                                                            for r in p.reasons)


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset is not installed (util-linux)")
def test_strata_plan_under_taskset_says_threads_1_and_why(small):
    r = _cli("plan", small, prefix=("taskset", "-c", "0"))
    assert r.returncode == 0, r.stderr
    assert "threads 1," in r.stdout
    assert "threads 1: the default, one per CPU this process may use (affinity allows 1 of" in r.stdout


def test_strata_serve_refuses_at_start_under_a_small_memory_max(small, tmp_path):
    env = {"STRATA_CGROUP_DIR": _cgroup(tmp_path, memory_max=280 * MIB, memory_current=100 * MIB)}
    r = _cli("plan", small, env=env)
    assert r.returncode == 1 and "does not fit" in r.stderr and "cgroup memory.max" in r.stderr
    r = _cli("serve", "--model", small, "--port", "0", env=env)
    assert r.returncode != 0 and "does not fit: needs" in r.stderr
    assert "162 MiB are usable (cgroup memory.max in" in r.stderr and "100 MiB of it in use" in r.stderr
