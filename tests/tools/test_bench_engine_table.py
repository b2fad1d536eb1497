"""tools/bench_engine.py's table names where it ran: the CPU, STRATA_KERNELS, our kernel set and activation
bits, and the peer's SIMD build (README rows per CPU and kernel set are copied from it)."""

from tools import bench_engine


def test_table_header_names_cpu_kernels_and_peer(monkeypatch):
    monkeypatch.setenv("STRATA_KERNELS", "avx2")
    monkeypatch.setattr(bench_engine, "peer_features", lambda: "AVX,AVX2,FMA")
    table = bench_engine.format_table([("pp128", 400.0, 200.0), ("tg256", 150.0, None)], 2, "avx2, act_bits 8")
    first, second = table.splitlines()[:2]
    assert first == "cpu: %s  STRATA_KERNELS=avx2  peer built with: AVX,AVX2,FMA" % bench_engine.cpu_name()
    assert "strata-engine (avx2, act_bits 8)" in second
    assert "2.00x" in table and "150.0" in table


def test_cpu_name_is_the_model_name():
    name = bench_engine.cpu_name()
    with open("/proc/cpuinfo") as f:
        models = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    assert name == (models[0] if models else name) and name


def test_simd_features_of_llama_cpp_system_info():
    info = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 0 | "
            "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")
    assert bench_engine.simd_features(info) == "SSE3,SSSE3,AVX,AVX2,F16C,FMA,BMI2"
    assert bench_engine.simd_features("CPU : LLAMAFILE = 1 | ") == "?"
