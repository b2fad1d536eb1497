#!/usr/bin/env bash
# tools/device_check.sh — the one prepared GPU check (docs/GPU.md): on a bare NVIDIA machine with nvcc, CMake,
# ninja and PyTorch (an H200 here), in well under 8 minutes, everything the GPU path must show, into ONE file:
#   1. build with STRATA_CUDA=ON (sm_90 + PTX), the seconds it took
#   2. the CUDA unit tests (cuda_kernels_test on the device against the CPU; cuda_math_test and the emulated
#      cuda_forward_test on the host), then cuda_kernels_test once more under compute-sanitizer's memcheck
#   3. random-weight models of real shapes (tools/device_models.py: the default model's, Gemma 3 270M's,
#      Llama-3-8B Q4_K_M's; the real files do not travel), greedy tokens on the GPU against the CPU engine's
#   4. speed: prefill tok/s at 512 / 4096 / 16384 and decode tok/s at 1 and 8 slots (strata-bench-cuda), the
#      CPU engine beside it on the small model, PyTorch bf16 (cuBLAS + SDPA) and the physical limits
#      (tools/bench_torch.py), and PfTimer's per-phase lines of a 4096-token read (STRATA_PF_TIMING=1)
#   5. the telemetry sampler's NVML reader (serve/ops/telemetry.py) beside nvidia-smi
# Usage: tools/device_check.sh [--dry]     results: $OUT/device_check.txt (OUT defaults to ./device_check_out),
# the table for docs/GPU.md in $OUT/table.md (tools/device_table.py: shares of the limits, the issue's bars)
# --dry: what runs without a GPU (the host tests, a small model on the CPU); the GPU steps say SKIP. It passes on
# a CPU-only machine, so the script cannot rot between GPU runs. Each step's exit status is in the file; the
# script goes on after a failing step and exits 1 at the end if any failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DRY=0
[[ "${1:-}" == "--dry" ]] && DRY=1
OUT="${OUT:-$ROOT/device_check_out}"
mkdir -p "$OUT"
REPORT="$OUT/device_check.txt"
BUILD="${STRATA_DEVICE_BUILD:-$ROOT/build}"
MODELS="${STRATA_DEVICE_MODELS:-/tmp/strata-device-models}"
JOBS="$(nproc)"
FAILED=0
STEP_TIMEOUT_S=150  # a step that hangs or crawls must not eat the loan: the next steps still run
: > "$REPORT"

say() { printf '%s\n' "$*" | tee -a "$REPORT"; }
# step NAME CMD...: runs CMD with its output into the report, notes its status and seconds
step() {
  local name="$1"; shift
  local t0=$SECONDS rc
  say "=== $name"
  timeout "$STEP_TIMEOUT_S" "$@" 2>&1 | tee -a "$REPORT"
  rc=${PIPESTATUS[0]}
  [[ $rc -eq 124 ]] && say "TIMEOUT: over $STEP_TIMEOUT_S s"
  say "--- $name: rc=$rc seconds=$((SECONDS - t0))"
  [[ $rc -ne 0 && $rc -ne 77 ]] && FAILED=1
  return 0
}
gpu_step() {  # a step that needs the GPU
  if [[ $DRY -eq 1 ]]; then say "=== $1"; say "SKIP: --dry (no GPU step)"; return 0; fi
  step "$@"
}

say "strata device check $(date -u +%FT%TZ) dry=$DRY commit=$(git rev-parse --short HEAD 2>/dev/null || echo ?)"
step "machine" bash -c 'nproc; (nvidia-smi -L || echo "no nvidia-smi"); (command -v nvcc && nvcc --version | tail -2) \
  || (ls /usr/local/cuda/bin/nvcc 2>/dev/null && /usr/local/cuda/bin/nvcc --version | tail -2) || echo "no nvcc"; \
  cmake --version | head -1; ninja --version; python3 -c "import torch; print(\"torch\", torch.__version__, torch.version.cuda)" 2>&1 | tail -1'

CUDA_FLAG="-DSTRATA_CUDA=ON"
[[ $DRY -eq 1 ]] && CUDA_FLAG="-DSTRATA_CUDA=AUTO"
STEP_TIMEOUT_S=420 step "build" bash -c "cmake -S . -B '$BUILD' -G Ninja -DCMAKE_BUILD_TYPE=Release $CUDA_FLAG > '$OUT/cmake.log' 2>&1 \
  || { tail -30 '$OUT/cmake.log'; exit 1; }; grep 'strata:' '$OUT/cmake.log'; \
  cmake --build '$BUILD' -j $JOBS > '$OUT/build.log' 2>&1 || { grep -B2 -A8 -m5 error '$OUT/build.log'; exit 1; }; \
  echo built: \$(ls '$BUILD'/strata-engine '$BUILD'/strata-bench-cuda)"

STEP_TIMEOUT_S=300 step "models" python3 tools/device_models.py "$MODELS" small gemma $([[ $DRY -eq 1 ]] || echo llama8b)
SMALL="$MODELS/small.gguf" GEMMA="$MODELS/gemma.gguf" L8B="$MODELS/llama8b.gguf"

# the host-emulated forward reads STRATA_TEST_MODEL (the random small model: the default one is not here)
step "unit tests (ctest -R cuda)" bash -c "cd '$BUILD' && STRATA_TEST_MODEL='$SMALL' ctest -R cuda --output-on-failure"
SANITIZER="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
gpu_step "compute-sanitizer memcheck (cuda_kernels_test)" "$SANITIZER" --tool memcheck --error-exitcode 1 \
  "$BUILD/cuda_kernels_test"

BENCH="$BUILD/strata-bench-cuda"
gpu_step "greedy: small model, GPU vs CPU" "$BENCH" --model "$SMALL" --greedy 32
# 700 prompt positions in chunks of 256: past the 512-position window, so the window layers' rings wrap
gpu_step "greedy: gemma3 shape, GPU vs CPU" "$BENCH" --model "$GEMMA" --greedy 32 --greedy-prompt 700 --chunk 256
gpu_step "speed: small model on the GPU" "$BENCH" --model "$SMALL" --backend cuda --prefill 512,4096,16384 --slots 1,8
step "speed: small model on the CPU" "$BENCH" --model "$SMALL" --backend cpu --prefill 512 --chunk 512 --slots 1 \
  --decode-steps 16
gpu_step "speed: gemma3 shape on the GPU" "$BENCH" --model "$GEMMA" --backend cuda --prefill 512,4096,16384 --slots 1,8
gpu_step "speed: llama-3-8B Q4_K_M shape on the GPU" "$BENCH" --model "$L8B" --backend cuda --prefill 512,4096,16384 \
  --slots 1,8
gpu_step "PfTimer: a 4096-token read, llama-3-8B shape (STRATA_PF_TIMING=1)" env STRATA_PF_TIMING=1 "$BENCH" \
  --model "$L8B" --backend cuda --prefill 4096 --chunk 4096 --slots 1 --decode-steps 4
gpu_step "PyTorch bf16 baseline and limits: llama-3-8B shape" python3 tools/bench_torch.py --shape llama8b
gpu_step "PyTorch bf16 baseline: small shape" python3 tools/bench_torch.py --shape small --slots 1,8
gpu_step "NVML reader vs nvidia-smi" bash -c 'python3 -c "
import json, sys; sys.path.insert(0, \".\")
from serve.ops.telemetry import NvmlReader
r = NvmlReader(); print(\"nvml ok:\", r.ok); print(json.dumps(r.read(), indent=1))"; \
  nvidia-smi --query-gpu=name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw --format=csv'

step "table (tools/device_table.py)" bash -c "python3 tools/device_table.py '$REPORT' | tee '$OUT/table.md'"
say "=== summary"
grep -E "^(BENCH|GREEDY|TORCH|LIMIT|MODEL|pf cuda timing)|--- .*rc=" "$REPORT" | grep -v "^=== summary" > "$OUT/summary.txt"
cat "$OUT/summary.txt" >> "$REPORT"
say "device check done: failed=$FAILED"
exit $FAILED
