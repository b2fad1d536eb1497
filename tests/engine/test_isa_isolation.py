"""The engine's objects keep each instruction set behind the dispatcher: a static check of the build.

Contract: CMakeLists.txt compiles `*_avx512.cpp`, `*_avx2.cpp`, `*_avxvnni.cpp` (x86-64) and `*_dotprod.cpp`
(AArch64) for their instruction sets and everything else for the baseline; the engine calls a set's code only
after CPUID / AT_HWCAP says the CPU has it. Two ways that breaks without any test running the bad path:
  - baseline code holds an instruction of a set (a `target` attribute, a flag added to a generic file);
  - an inline function or template (a COMDAT, weak symbol) is compiled in a set's object and in a baseline
    object, or one of another set: the linker keeps one copy, and when it keeps the set's, every caller runs
    it, on CPUs without the set too (an illegal instruction far from any kernel, only on some hosts).
qemu runs (tools/cross_test.sh) catch these only on the paths they exercise; this reads every object of
each executable (the engine, the C++ tests, the benchmarks: its own objects and strata_core's) in build/,
and in build-aarch64/ when the AArch64 cross build is there (`nm`, `objdump` from binutils;
aarch64-linux-gnu-* for the cross build), and catches them on every path. The
checker is itself tested on two tiny objects that plant the second fault, so that it can fail.
Skips when the build, the tools or (for the planted case) a compiler are missing.
"""

import functools
import pathlib
import platform
import re
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOL_TIMEOUT_S = 60.0  # one nm / objdump over one object (the largest takes well under a second)
# what CMakeLists.txt compiles a source for, by the end of its name (x86-64 and AArch64)
SET_SUFFIXES = ("_avx512.cpp", "_avx2.cpp", "_avxvnni.cpp", "_dotprod.cpp")
HOST_ARCH = "x86_64" if platform.machine().lower() in ("x86_64", "amd64") else platform.machine().lower()
# mnemonics beyond the baseline: VEX / EVEX-encoded on x86-64 (every AVX instruction's name starts with v); the
# dot-product and matrix-multiply extensions on AArch64
BEYOND_BASELINE = {"x86_64": re.compile(r"^v[a-z0-9]+$"),
                   "aarch64": re.compile(r"^(sdot|udot|usdot|sudot|smmla|ummla|usmmla)$")}
# the builds read: build/ for this host, and on x86-64 build-aarch64/ (tools/cross_test.sh aarch64's cross
# build, there when ./strata test ran it before pytest) with the cross binutils
BUILDS = [("build", HOST_ARCH, "")] + ([("build-aarch64", "aarch64", "aarch64-linux-gnu-")]
                                       if HOST_ARCH == "x86_64" else [])


def _set_of(obj: pathlib.Path, obj_root: pathlib.Path) -> str:
    """The instruction set an object was compiled for: the suffix of its source's name, or 'baseline'."""
    src = str(obj.relative_to(obj_root))[: -len(".o")]
    for suffix in SET_SUFFIXES:
        if src.endswith(suffix):
            return suffix[1 : -len(".cpp")]
    return "baseline"


def _link_units(build: pathlib.Path) -> dict[str, list[tuple[pathlib.Path, str]]]:
    """Each executable of the build (the engine, the C++ tests, the benchmarks) -> its objects with their
    sets: its own and strata_core's, which it links."""
    dirs = sorted((build / "CMakeFiles").glob("*.dir"))
    objs = {d.name[: -len(".dir")]: [(o, _set_of(o, d)) for o in sorted(d.rglob("*.o"))] for d in dirs}
    core = objs.pop("strata_core", [])
    return {name: core + own for name, own in objs.items() if own} if core else {}


@functools.lru_cache(maxsize=None)
def _run(args: tuple[str, ...]) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=TOOL_TIMEOUT_S).stdout


def _mnemonics(obj: pathlib.Path, prefix: str = "") -> set[str]:
    names = set()
    for line in _run((prefix + "objdump", "-d", "--no-show-raw-insn", str(obj))).splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and re.match(r"^\s*[0-9a-f]+:$", parts[0]) and parts[1].split():
            names.add(parts[1].split()[0])
    return names


def shared_code_across_sets(objects: list[tuple[pathlib.Path, str]], prefix: str = "") -> list[str]:
    """Weak code symbols defined in a set's object and defined or used in an object of another set (or the
    baseline): 'symbol: sets' lines, empty when none."""
    defined: dict[str, set[str]] = {}
    used: dict[str, set[str]] = {}
    for obj, iset in objects:
        for line in _run((prefix + "nm", str(obj))).splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] == "W":  # a weak code symbol defined here (inline, template)
                defined.setdefault(parts[2], set()).add(iset)
            elif len(parts) == 2 and parts[0] in ("U", "w"):
                used.setdefault(parts[1], set()).add(iset)
    bad = []
    for sym, sets in sorted(defined.items()):
        everywhere = sets | used.get(sym, set())
        if sets != {"baseline"} and len(everywhere) > 1:
            bad.append(f"{sym}: {', '.join(sorted(everywhere))}")
    return bad


def _need_build(build_dir: str, prefix: str) -> dict[str, list[tuple[pathlib.Path, str]]]:
    if not shutil.which(prefix + "nm") or not shutil.which(prefix + "objdump"):
        pytest.skip(f"binutils ({prefix}nm, {prefix}objdump) not found")
    units = _link_units(REPO / build_dir)
    if "strata-engine" not in units:
        pytest.skip(f"no engine objects under {build_dir}/CMakeFiles (build the engine first)")
    return units


@pytest.mark.parametrize("build_dir, arch, prefix", BUILDS, ids=[b[0] for b in BUILDS])
def test_baseline_objects_hold_no_instruction_beyond_the_baseline(build_dir, arch, prefix):
    objects = {obj: iset for unit in _need_build(build_dir, prefix).values() for obj, iset in unit}
    bad = {}
    for obj, iset in objects.items():
        if iset == "baseline":
            found = sorted(m for m in _mnemonics(obj, prefix) if BEYOND_BASELINE[arch].match(m))
            if found:
                bad[str(obj.relative_to(REPO))] = found[:8]
    assert not bad, f"baseline objects with instructions the dispatcher does not guard: {bad}"


@pytest.mark.parametrize("build_dir, arch, prefix", BUILDS, ids=[b[0] for b in BUILDS])
def test_no_inline_code_is_shared_between_instruction_sets(build_dir, arch, prefix):
    bad = {name: found for name, unit in _need_build(build_dir, prefix).items()
           if (found := shared_code_across_sets(unit, prefix))}
    assert not bad, ("inline or template code compiled for one instruction set and also defined or used by "
                     f"code of another in one executable (the linker may keep the set's copy for every caller): {bad}")


@pytest.mark.skipif(HOST_ARCH != "x86_64", reason="the planted case is x86-64 (AVX-512 flags)")
def test_the_checker_finds_a_planted_shared_inline(tmp_path):
    """An inline sum in one header, used by a generic file and by a file compiled for AVX-512: the fault the
    check above exists for (kept out of line, as the compiler does with larger inline functions and library
    templates); and the same two files with the inline made file-local (static): no fault."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx or not shutil.which("nm"):
        pytest.skip("no C++ compiler or nm")
    for local, expect_fault in (("", True), ("static ", False)):
        case = tmp_path / ("static" if local else "inline")  # a folder each: _run caches by path
        case.mkdir()
        (case / "sum.h").write_text(
            f"{local}inline __attribute__((noinline)) float planted_sum(const float* x, int n) {{\n"
            "    float s = 0.0f;\n    for (int i = 0; i < n; ++i) s += x[i] * x[i];\n    return s;\n}\n")
        (case / "kern_avx512.cpp").write_text(
            '#include "sum.h"\nfloat kern(const float* x, int n) { return planted_sum(x, n); }\n')
        (case / "main.cpp").write_text(
            '#include "sum.h"\nfloat gen(const float* x, int n) { return planted_sum(x, n); }\n')
        objs = []
        for name, flags in (("kern_avx512", ["-mavx512f"]), ("main", [])):
            obj = case / f"{name}.cpp.o"
            subprocess.run([cxx, "-O3", "-c", *flags, str(case / f"{name}.cpp"), "-o", str(obj)], check=True,
                           capture_output=True, timeout=TOOL_TIMEOUT_S)
            objs.append((obj, _set_of(obj, case)))
        assert [s for _, s in objs] == ["avx512", "baseline"]
        bad = shared_code_across_sets(objs)
        assert bool(bad) == expect_fault, (local, bad)
        if expect_fault:
            assert any("planted_sum" in line for line in bad)
