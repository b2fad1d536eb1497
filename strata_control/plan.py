"""Launch plans: from the machine's facts and a model, how to run it, with one line of reason per decision.

Role: decide threads, context (what fits: weights + KV cache at the chosen KV type), KV type, lanes (decode
slots, clamped to 1..8 with one notice), replicas and the kernels, or refuse with the numbers when the model
cannot fit. `make_plan` is pure: the machine comes in as a `Machine` (tests write their own); only
`machine_facts()` looks at this computer.

Memory model (the engine's, engine/kv_cache.h and engine/slots.cpp): each engine holds the weights (about the
GGUF's size once repacked) plus one KV cache of n_ctx positions per lane (one decode slot each);
K and V are each (n_layer, n_head_kv, n_ctx, head_dim) at 2 bytes (f16) or 34/32 bytes (q8_0) per value.
A mixture of experts that does not fit whole keeps everything but its experts and the KV cache in RAM, and of
the experts what the rest of the budget holds (`experts_ram`, the engine's --experts-ram-mib: the most used
stay packed, the others are read from the mapped file; engine/expert_tiers.h).

Host limits (strata_control/host.py): threads default to the CPUs this process may use when those are fewer
than the physical cores (affinity, cgroup cpu.max), and the memory budget is the smaller of the free RAM and
what the cgroup's memory.max leaves; both reasons name their source.

Public surface: `Machine`, `machine_facts()`, `Plan`, `PlanRefused`, `make_plan(model, machine, want)`, `memory_budget(machine)`,
`kv_bytes_per_token(model, kv)`, `active_weight_bytes(model)`, `clamp_lanes(asked)`, `default_lanes(cores)`, `LANES_MAX`, `CPU_CONTEXT_CAP`.

Reasons tell where each value came from: the default (and why), asked (`--flag` or the run config), measured
by `serve --calibrate`, clamped, or cut to fit. `want["sources"]` ({key: "flag" | "run config" | "calibrated"},
runconfig.plan_want builds it) says who asked; a value without a source counts as asked by a flag.
"""
from __future__ import annotations

import copy
import os
import platform
from dataclasses import dataclass, field

from strata_control.host import host_limits

LANES_MAX = 8                  # the engine's slot limit (docs/PROTOCOL.md: --batch 1..8)
CPU_CONTEXT_CAP = 8192         # the engine's default context cap on the CPU (engine/main.cpp)
MIN_CONTEXT = 512              # a context smaller than this cannot hold a chat with its template; refuse
ASKED_CONTEXT_MIN = 256        # an asked --ctx below this cannot hold the template, its system prompt and a question
CONTEXT_STEP = 256             # a context cut to fit is rounded down to this
ENGINE_OVERHEAD_BYTES = 64 << 20   # per engine: code, thread stacks, scratch buffers, the tokenizer's tables
RAM_USE_FRACTION = 0.9         # of the RAM free now: the rest stays for the system and the server itself
KV_BYTES = {"f16": 2.0, "q8_0": 34 / 32}   # bytes per cached value (a q8_0 block: 32 values + an f16 scale)
MIB = 1 << 20


class PlanRefused(ValueError):
    """The model cannot run here as asked; the message gives the numbers."""


@dataclass
class Machine:
    cores: int                          # logical CPUs
    physical_cores: int
    ram_bytes: int
    free_ram_bytes: int
    cpu_features: frozenset = frozenset()     # lower-case CPUID flags: "avx2", "avx512f", "avx512_vnni", ...
    gpus: list = field(default_factory=list)  # [{"name", "memory_bytes", "present": bool}] as described
    gpu_kernels: bool = False           # whether this build has GPU kernels (not in this wave)
    os: str = ""
    usable_cpus: int | None = None      # CPUs this process may use (affinity, cgroup cpu.max); None: all
    cpus_source: str = ""               # why that many (strata_control/host.py)
    memory_max_bytes: int | None = None  # the cgroup's memory.max; None: no limit
    memory_used_bytes: int = 0          # in use in that cgroup now
    memory_source: str = ""             # where the limit was read


def machine_facts() -> Machine:
    """This computer, read from the OS (psutil when installed, else os/proc)."""
    cores = os.cpu_count() or 1
    physical, total, free = cores, 0, 0
    try:
        import psutil
        physical = psutil.cpu_count(logical=False) or cores
        vm = psutil.virtual_memory()
        total, free = vm.total, vm.available
    except ImportError:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]}
        total, free = info.get("MemTotal", 0), info.get("MemAvailable", 0)
    flags: set = set()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    gpus = [{"name": name, "memory_bytes": 0, "present": True}
            for name in sorted(os.listdir("/proc/driver/nvidia/gpus"))] \
        if os.path.isdir("/proc/driver/nvidia/gpus") else []
    limits = host_limits()
    return Machine(cores=cores, physical_cores=physical, ram_bytes=total, free_ram_bytes=free,
                   cpu_features=frozenset(flags), gpus=gpus, os=f"{platform.system()} {platform.release()}",
                   usable_cpus=limits.cpus, cpus_source=limits.cpus_source,
                   memory_max_bytes=limits.memory_max_bytes, memory_used_bytes=limits.memory_used_bytes,
                   memory_source=limits.memory_source)


@dataclass
class Plan:
    model: str
    threads: int
    n_ctx: int
    kv: str
    lanes: int
    replicas: int
    kernels: str
    device: str
    memory: dict                        # bytes: weights, kv, overhead, total, budget
    reasons: list = field(default_factory=list)    # one line per decision
    experts_ram: int | None = None      # bytes of packed experts the engine keeps in RAM (--experts-ram-mib);
                                        # None = every expert (engine/expert_tiers.h)
    notices: list = field(default_factory=list)    # values changed from what was asked

    def engine_args(self) -> list[str]:
        args = ["--max-context", str(self.n_ctx), "--threads", str(self.threads), "--kv", self.kv]
        if self.experts_ram is not None:
            args += ["--experts-ram-mib", str(self.experts_ram // MIB)]
        return args + ["--batch", str(self.lanes)]  # one lane is one slot (docs/PROTOCOL.md "Slot steps")

    def view(self) -> dict:
        return {"model": self.model, "threads": self.threads, "context": self.n_ctx, "kv": self.kv,
                "lanes": self.lanes, "replicas": self.replicas, "kernels": self.kernels, "device": self.device,
                "memory_mib": {k: round(v / MIB) for k, v in self.memory.items()},
                "experts_ram_mib": None if self.experts_ram is None else self.experts_ram // MIB,
                "reasons": list(self.reasons), "notices": list(self.notices)}

    def render(self) -> str:
        m = {k: round(v / MIB) for k, v in self.memory.items()}
        head = (f"plan for {self.model}: threads {self.threads}, context {self.n_ctx}, kv {self.kv}, "
                f"lanes {self.lanes}, replicas {self.replicas}, kernels {self.kernels}, {self.device}; "
                f"RAM {m['total']} MiB of {m['budget']} MiB usable "
                f"(weights {m['weights']}, KV {m['kv']}, overhead {m['overhead']})")
        return "\n".join([head, *(f"  - {r}" for r in self.reasons), *(f"  ! {n}" for n in self.notices)])


def kv_bytes_per_token(model, kv: str) -> float:
    """K and V for one position of one sequence, all layers."""
    return 2 * model.n_layer * model.n_head_kv * model.head_dim * KV_BYTES[kv]


def _kernels(features) -> tuple[str, str]:
    if "avx512_vnni" in features or "avx512vnni" in features:
        return "avx512_vnni", "the CPU has AVX-512 VNNI: the row-group kernels with vpdpwssd"
    if "avx2" in features:
        return "avx2", "the CPU has AVX2 (no AVX-512 VNNI): the AVX2 kernels"
    return "scalar", "the CPU has neither AVX2 nor AVX-512: the scalar kernels (slow)"


def _device(machine: Machine) -> tuple[str, str]:
    if not machine.gpus:
        return "cpu", "no GPU described: the CPU"
    names = ", ".join(str(g.get("name", "?")) for g in machine.gpus)
    if not any(g.get("present", True) for g in machine.gpus):
        return "cpu", f"GPU described ({names}) but not present: the CPU"
    if not machine.gpu_kernels:
        return "cpu", f"GPU present ({names}) but this build has no GPU kernels: the CPU"
    return "gpu", f"GPU {names}"


FLAG_OF = {"max_context": "--ctx", "threads": "--threads", "parallel": "--parallel", "replicas": "--replicas",
           "kv": "--kv", "experts_ram_mib": "--experts-ram-mib"}


def _who(key: str, sources: dict) -> str:
    """Who asked for a value: its flag, the run config, or serve --calibrate (which wrote the run config)."""
    return {"run config": "the run config", "calibrated": "serve --calibrate, in the run config"}.get(
        sources.get(key, "flag"), FLAG_OF[key])


def _asked(key: str, sources: dict) -> str:
    if sources.get(key) == "calibrated":
        return "measured fastest here by serve --calibrate (run config)"
    return f"as asked ({_who(key, sources)})"


def default_lanes(cores: int) -> int:
    """Decode lanes when neither flag nor run config names them: 4 on 2+ cores (a second client is answered
    while one long reply runs; 4 lanes cost 4 KV caches, small beside the weights at the default context), 1 on
    a single core (where lanes only share one core's time)."""
    return 4 if cores >= 2 else 1


def clamp_lanes(asked) -> tuple[int, str | None]:
    """--parallel N -> (lanes in 1..LANES_MAX, the one notice when it was clamped, else None); None -> 1."""
    if asked is None:
        return 1, None
    lanes = min(LANES_MAX, max(1, int(asked)))
    return lanes, (None if lanes == int(asked) else f"--parallel {asked}: lanes are 1..{LANES_MAX}; using {lanes}")


def _lanes(asked, machine: Machine, sources: dict, notices) -> tuple[int, str]:
    if asked is None:
        cpus = min(machine.cores, machine.usable_cpus or machine.cores)  # those this process may use
        lanes = default_lanes(cpus)
        return lanes, (f"lanes {lanes}: the default on {cpus} CPUs (a second request is answered while "
                       "a long reply runs; --parallel N to change)" if lanes > 1 else
                       "lanes 1: the default on one CPU (--parallel N for more)")
    lanes, notice = clamp_lanes(asked)
    if notice:
        notices.append(notice)
        return lanes, f"lanes {lanes}: {asked} asked ({_who('parallel', sources)}), clamped to the engine's 1..{LANES_MAX}"
    return lanes, f"lanes {lanes}: {_asked('parallel', sources)}"


def _threads(asked, machine: Machine, replicas: int, sources: dict, notices) -> tuple[int, str]:
    usable = machine.usable_cpus
    limited = usable is not None and usable < machine.physical_cores
    base = usable if limited else machine.physical_cores
    share = max(1, base // replicas)
    if asked is None:
        per = (f"one per CPU this process may use ({machine.cpus_source})" if limited else
               "one per physical core")
        return share, (f"threads {share}: the default, {per}" if replicas == 1 else
                       f"threads {share}: the default, {base} {'usable CPUs' if limited else 'physical cores'} "
                       f"shared by {replicas} replicas")
    if not 1 <= int(asked) <= machine.cores:
        raise PlanRefused(f"--threads {asked}: this machine has {machine.cores} CPUs; use 1..{machine.cores}")
    if usable is not None and int(asked) > usable:
        notices.append(f"--threads {asked}: this process may use {usable} CPUs ({machine.cpus_source}); "
                       "the threads will share them")
    return int(asked), f"threads {asked}: {_asked('threads', sources)}"


def memory_budget(machine: Machine) -> tuple[int, str]:
    """Bytes a plan may allocate, and where the bound comes from: RAM_USE_FRACTION of the RAM free now, or
    of what the cgroup's memory.max leaves (less what its members use now) when that is smaller."""
    free = int(machine.free_ram_bytes * RAM_USE_FRACTION)
    if machine.memory_max_bytes is None:
        return free, f"{machine.free_ram_bytes // MIB} MiB free now"
    left = int(max(0, machine.memory_max_bytes - machine.memory_used_bytes) * RAM_USE_FRACTION)
    if left >= free:
        return free, f"{machine.free_ram_bytes // MIB} MiB free now; the cgroup allows more"
    return left, (f"{machine.memory_source}: {machine.memory_max_bytes // MIB} MiB, "
                  f"{machine.memory_used_bytes // MIB} MiB of it in use; {machine.free_ram_bytes // MIB} MiB free")


def make_plan(model, machine: Machine, want: dict | None = None) -> Plan:
    """The launch plan for `model` (a strata_control.models.ModelInfo) on `machine`.

    `want`: the merged run config and flags (`max_context`, `threads`, `parallel`, `replicas`, `kv`; None =
    decide). Raises PlanRefused with the numbers when it cannot run or fit."""
    want = want or {}
    if not model.usable:
        raise PlanRefused(f"{model.id}: {model.problem}")
    notices: list[str] = []
    replicas = int(want.get("replicas") or 1)
    if replicas < 1:
        raise PlanRefused(f"--replicas {replicas}: at least 1")
    sources = want.get("sources") or {}
    lanes, lanes_why = _lanes(want.get("parallel"), machine, sources, notices)
    threads, threads_why = _threads(want.get("threads"), machine, replicas, sources, notices)
    kernels, kernels_why = _kernels(machine.cpu_features)
    device, device_why = _device(machine)
    reasons = [device_why, kernels_why, threads_why, lanes_why]
    asked_experts = want.get("experts_ram_mib")
    if asked_experts is not None and getattr(model, "expert_bytes", 0):
        n_ctx, kv, ctx_why, memory, experts_ram = _fit_tiered(model, machine, want, lanes, replicas, sources,
                                                              int(asked_experts) * MIB)
    else:
        try:
            n_ctx, kv, ctx_why, memory = _fit(model, machine, want, lanes, replicas, sources)
            experts_ram = None
        except PlanRefused:
            if not getattr(model, "expert_bytes", 0):
                raise
            n_ctx, kv, ctx_why, memory, experts_ram = _fit_tiered(model, machine, want, lanes, replicas, sources)
    reasons += ctx_why
    if getattr(model, "expert_bytes", 0) and model.n_expert:
        reasons.append(f"speed: a decoded token reads about {active_weight_bytes(model) // MIB} MiB of weights (all "
                       f"but the experts, and {model.n_expert_used} of the {model.n_expert} experts of each layer); "
                       f"memory counts all {model.size_bytes // MIB} MiB")
    if replicas > 1:
        reasons.append(f"replicas {replicas}: {_asked('replicas', sources)}; each holds its own weights and KV cache")
    return Plan(model=model.id, threads=threads, n_ctx=n_ctx, kv=kv, lanes=lanes, replicas=replicas,
                kernels=kernels, device=device, memory=memory, reasons=reasons, notices=notices,
                experts_ram=experts_ram)


def _fit(model, machine: Machine, want: dict, lanes: int, replicas: int, sources: dict):
    """-> (n_ctx, kv, reasons, memory): the largest context up to the asked/default one that fits, f16 KV
    first, q8_0 when f16 does not fit (and the head size allows it)."""
    train = model.n_ctx_train or CPU_CONTEXT_CAP
    asked_ctx, asked_kv = want.get("max_context"), want.get("kv")
    if asked_ctx is not None and not ASKED_CONTEXT_MIN <= int(asked_ctx) <= train:
        raise PlanRefused(f"--ctx {asked_ctx}: {model.id} takes {ASKED_CONTEXT_MIN}..{train} tokens "
                          f"(its training context is {train})")
    target = int(asked_ctx) if asked_ctx is not None else min(train, CPU_CONTEXT_CAP)
    sequences = lanes   # one slot per lane: every request runs in a slot
    budget, budget_why = memory_budget(machine)
    fixed = replicas * (model.size_bytes + ENGINE_OVERHEAD_BYTES)
    kinds = [asked_kv] if asked_kv else ["f16"] + (["q8_0"] if model.head_dim % 32 == 0 else [])
    per_token = {k: kv_bytes_per_token(model, k) * sequences * replicas for k in kinds}
    memory = lambda kv, n: {"weights": replicas * model.size_bytes, "kv": int(per_token[kv] * n),
                            "overhead": replicas * ENGINE_OVERHEAD_BYTES,
                            "total": fixed + int(per_token[kv] * n), "budget": budget}
    why_seq = f"{sequences} sequence{'s' if sequences > 1 else ''} x {replicas} engine{'s' if replicas > 1 else ''}"
    for kv in kinds:
        if fixed + per_token[kv] * target <= budget:
            src = _asked("max_context", sources) if asked_ctx is not None else \
                f"the default (the model's {train}, at most {CPU_CONTEXT_CAP})"
            kv_why = f"kv {kv}: " + (_asked("kv", sources) if asked_kv else "the default, f16; it fits" if kv == "f16" else
                                     "f16 does not fit at this context, q8_0 does (about half the bytes)")
            return target, kv, [f"context {target}: {src}; fits ({why_seq})",
                                f"memory {budget // MIB} MiB usable: {budget_why}", kv_why], memory(kv, target)
    if asked_ctx is None:   # cut the default context to what fits, smallest KV type
        kv = kinds[-1]
        n = int((budget - fixed) / per_token[kv]) // CONTEXT_STEP * CONTEXT_STEP if budget > fixed else 0
        if n >= MIN_CONTEXT:
            kv_why = f"kv {kv}: " + (_asked("kv", sources) if asked_kv else "the smallest cache type")
            return n, kv, [f"context {n}: cut from {target} to fit {budget // MIB} MiB usable ({why_seq})",
                           f"memory {budget // MIB} MiB usable: {budget_why}", kv_why], memory(kv, n)
    kv = kinds[-1]
    need = memory(kv, asked_ctx or MIN_CONTEXT)
    raise PlanRefused(f"{model.id} does not fit: needs {need['total'] // MIB} MiB (weights "
                      f"{need['weights'] // MIB}, KV {need['kv'] // MIB} at {asked_ctx or MIN_CONTEXT} tokens, "
                      f"{kv}, {why_seq}, overhead {need['overhead'] // MIB}) but {budget // MIB} MiB are usable "
                      f"({budget_why})")


def active_weight_bytes(model) -> int:
    """Weight bytes one decoded token reads: the whole file for a dense model; for a mixture of experts all but
    the experts, plus the share of them a token uses (n_expert_used of n_expert per layer)."""
    if not (getattr(model, "expert_bytes", 0) and model.n_expert):
        return model.size_bytes
    return model.size_bytes - model.expert_bytes + model.expert_bytes * model.n_expert_used // model.n_expert


def _fit_tiered(model, machine: Machine, want: dict, lanes: int, replicas: int, sources: dict,
                asked: int | None = None):
    """A MoE model that does not fit whole, or whose expert RAM was asked (`asked` bytes, --experts-ram-mib):
    everything but the experts in RAM with the KV cache (as _fit sizes them, the asked experts counted in),
    and of the experts what the rest of the budget holds (or what was asked), the most used ones, the others
    read from the mapped file on demand (engine/expert_tiers.h). -> (n_ctx, kv, reasons, memory, experts_ram)."""
    light = copy.copy(model)
    light.size_bytes = model.size_bytes - model.expert_bytes + min(asked or 0, model.expert_bytes)
    n_ctx, kv, why, memory = _fit(light, machine, want, lanes, replicas, sources)  # PlanRefused: not even that
    if asked is not None:
        experts_ram = min(asked, model.expert_bytes) // MIB * MIB
        return n_ctx, kv, why + [f"experts: {experts_ram // MIB} MiB of their {model.expert_bytes // MIB} MiB kept "
                                 f"in RAM ({_asked('experts_ram_mib', sources)}), the most used, the rest read "
                                 f"from the mapped file as steps need them"], memory, experts_ram
    experts_ram = max(0, (memory["budget"] - memory["total"]) // replicas // MIB * MIB)
    memory = dict(memory, weights=memory["weights"] + replicas * experts_ram,
                  total=memory["total"] + replicas * experts_ram)
    why = why + [f"experts: {experts_ram // MIB} MiB of their {model.expert_bytes // MIB} MiB kept in RAM, the "
                 f"most used, the rest read from the mapped file as steps need them: the whole model "
                 f"({model.size_bytes // MIB} MiB) does not fit {memory['budget'] // MIB} MiB usable"]
    return n_ctx, kv, why, memory, experts_ram
