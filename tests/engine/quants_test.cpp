// tests/engine/quants_test.cpp — dequantize_row for all fifteen tensor types, block by block, against an
// element-indexed float64 decoder written here from the GGUF block layouts (each element's value computed
// from its index alone, the opposite direction of the engine's block walk), plus half/bfloat16 conversion.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/quants.h"
#include "test_check.h"

namespace {

std::mt19937 g_rng(99);

uint16_t rd16(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }

// IEEE binary16 from its fields
double half_value(uint16_t h) {
    const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = std::ldexp(double(m), -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = std::ldexp(double(1024 + m), e - 25);
    return sign ? -v : v;
}

// the value of element i of a row of type t starting at p
double element(ggml_type t, const uint8_t* p, int64_t i) {
    switch (t) {
    case GGML_TYPE_F32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
    case GGML_TYPE_F16: return half_value(rd16(p + 2 * i));
    case GGML_TYPE_BF16: { const uint32_t u = uint32_t(rd16(p + 2 * i)) << 16; float f; std::memcpy(&f, &u, 4); return f; }
    default: break;
    }
    const int64_t bs = quant_block_size(t), b = i / bs, j = i % bs;
    const uint8_t* blk = p + size_t(b) * quant_block_bytes(t);
    switch (t) {
    case GGML_TYPE_Q8_0: return half_value(rd16(blk)) * double(int8_t(blk[2 + j]));
    case GGML_TYPE_Q4_0: {  // d, then 16 bytes: element j < 16 is the low nibble of byte j, else the high of j-16
        const int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
        return half_value(rd16(blk)) * (q - 8);
    }
    case GGML_TYPE_Q4_1: {  // d, m, 16 bytes
        const int q = j < 16 ? (blk[4 + j] & 15) : (blk[4 + j - 16] >> 4);
        return half_value(rd16(blk)) * q + half_value(rd16(blk + 2));
    }
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: {
        // d, dmin, scales[12], (Q5_K: qh[32]), qs[128]; sub-block s = j / 32 of 8; byte j%32 of the 64-element
        // chunk s/2, low nibble for even s; 6-bit scale/min: s < 4 in the low 6 bits of scales[s], scales[s+4];
        // s >= 4 in nibbles of scales[s+4] with the two high bits from scales[s-4], scales[s]
        const uint8_t* sc = blk + 4;
        const int s = int(j / 32), l = int(j % 32);
        int scale, mn;
        if (s < 4) {
            scale = sc[s] & 63;
            mn = sc[s + 4] & 63;
        } else {
            scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
            mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
        }
        const uint8_t* qs = blk + (t == GGML_TYPE_Q5_K ? 48 : 16);
        int q = (s % 2 == 0) ? (qs[(s / 2) * 32 + l] & 15) : (qs[(s / 2) * 32 + l] >> 4);
        if (t == GGML_TYPE_Q5_K && (blk[16 + l] >> s) & 1) q += 16;
        return half_value(rd16(blk)) * scale * q - half_value(rd16(blk + 2)) * mn;
    }
    case GGML_TYPE_Q6_K: {
        // ql[128], qh[64], scales[16] (int8), d; per 128-element half h: quarter qd = (j%128)/32 takes the
        // low (qd < 2) or high nibble of ql[h*64 + (qd%2)*32 + l] and bits 2qd..2qd+1 of qh[h*32 + l];
        // 16-element sub-block scale index h*8 + qd*2 + l/16
        const int h = int(j / 128), r = int(j % 128), qd = r / 32, l = r % 32;
        const uint8_t qlb = blk[h * 64 + (qd % 2) * 32 + l];
        const int lo = qd < 2 ? (qlb & 15) : (qlb >> 4);
        const int hi = (blk[128 + h * 32 + l] >> (2 * qd)) & 3;
        const int sc = int8_t(blk[192 + h * 8 + qd * 2 + l / 16]);
        return half_value(rd16(blk + 208)) * sc * ((lo | hi << 4) - 32);
    }
    case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: {
        // d, (Q5_1: m), qh[4] (bit j of the little-endian word: fifth bit of element j), 16 nibble bytes
        const int off = t == GGML_TYPE_Q5_1 ? 4 : 2;
        const uint32_t qh = uint32_t(blk[off]) | uint32_t(blk[off + 1]) << 8 | uint32_t(blk[off + 2]) << 16 |
                            uint32_t(blk[off + 3]) << 24;
        const int lo = j < 16 ? (blk[off + 4 + j] & 15) : (blk[off + 4 + j - 16] >> 4);
        const int q = lo + 16 * int(qh >> j & 1);
        if (t == GGML_TYPE_Q5_0) return half_value(rd16(blk)) * (q - 16);
        return half_value(rd16(blk)) * q + half_value(rd16(blk + 2));
    }
    case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: {
        // 2-bit q of element j: bits 2k..2k+1 of qs[half * 32 + l], half = j / 128, k = (j % 128) / 32,
        // l = j % 32; sub-block of 16: j / 16
        const int half = int(j / 128), k = int(j % 128) / 32, l = int(j % 32), s = int(j / 16);
        const int qs_at = t == GGML_TYPE_Q2_K ? 16 : 32;
        int q = blk[qs_at + half * 32 + l] >> (2 * k) & 3;
        if (t == GGML_TYPE_Q2_K) {  // scales[16] (scale | min << 4), qs[64], d, dmin
            const int sc = blk[s] & 15, mn = blk[s] >> 4;
            return half_value(rd16(blk + 80)) * sc * q - half_value(rd16(blk + 82)) * mn;
        }
        // hmask[32], qs[64], scales[12], d: q - 4 unless bit (4 half + k) of hmask[l] is set; scale s from a
        // 12-byte field: low nibble of byte s (s < 8) or high nibble of byte s - 8, top 2 bits of byte 8 + s%4
        if (!(blk[l] >> (4 * half + k) & 1)) q -= 4;
        const uint8_t* sc = blk + 96;
        const int lo = s < 8 ? (sc[s] & 15) : (sc[s - 8] >> 4);
        const int scale = (lo | ((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4) - 32;
        return half_value(rd16(blk + 108)) * scale * q;
    }
    case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS: {
        static const int levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        if (t == GGML_TYPE_IQ4_NL) {  // d, 16 bytes as Q4_0
            const int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
            return half_value(rd16(blk)) * levels[q];
        }
        // d, scales_h (u16), scales_l[4], qs[128]: sub-block s = j / 32 owns qs[16 s .. 16 s + 16) as IQ4_NL
        const int s = int(j / 32), r = int(j % 32);
        const uint8_t b = blk[8 + 16 * s + r % 16];
        const int q = r < 16 ? (b & 15) : (b >> 4);
        const int scale = (((blk[4 + s / 2] >> (4 * (s % 2))) & 15) | ((rd16(blk + 2) >> (2 * s)) & 3) << 4) - 32;
        return half_value(rd16(blk)) * scale * levels[q];
    }
    default: return NAN;
    }
}

void test_type(ggml_type t, size_t expect_block_bytes) {
    CHECK(quant_block_bytes(t) == expect_block_bytes, "%s: block bytes %zu", quant_name(t), quant_block_bytes(t));
    const int64_t n = 4 * 256;  // several blocks of every type
    const size_t bytes = quant_row_bytes(t, n);
    std::vector<uint8_t> row(bytes);
    for (int trial = 0; trial < 20; ++trial) {
        for (uint8_t& b : row) b = uint8_t(g_rng());
        // keep half scales finite (random bytes may be inf/nan); data bits stay random
        if (t != GGML_TYPE_F32 && t != GGML_TYPE_F16 && t != GGML_TYPE_BF16) {
            const size_t bb = quant_block_bytes(t);
            for (size_t off = 0; off < bytes; off += bb) {
                size_t scale_at[] = {0, 2};
                if (t == GGML_TYPE_Q6_K) scale_at[0] = 208;
                if (t == GGML_TYPE_Q3_K) scale_at[0] = 108;
                if (t == GGML_TYPE_Q2_K) scale_at[0] = 80, scale_at[1] = 82;
                const int n_scales = (t == GGML_TYPE_Q4_1 || t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K ||
                                      t == GGML_TYPE_Q5_1 || t == GGML_TYPE_Q2_K) ? 2 : 1;
                for (int k = 0; k < n_scales; ++k) row[off + scale_at[k] + 1] &= 0x3B;  // exponent < 31
            }
        } else if (t == GGML_TYPE_F16 || t == GGML_TYPE_BF16) {
            for (size_t off = 1; off < bytes; off += 2) row[off] &= 0x3B;
        } else {
            for (size_t off = 3; off < bytes; off += 4) row[off] &= 0x3F;
        }
        std::vector<float> y(static_cast<size_t>(n));
        dequantize_row(t, row.data(), y.data(), n);
        for (int64_t i = 0; i < n; ++i) {
            const double r = element(t, row.data(), i);
            const double tol = 1e-6 * std::fmax(1.0, std::fabs(r));
            if (!(std::fabs(double(y[size_t(i)]) - r) <= tol)) {
                CHECK(false, "%s: element %ld (block %ld): %.9g vs %.9g", quant_name(t), long(i), long(i / quant_block_size(t)), double(y[size_t(i)]), r);
                return;
            }
        }
    }
}

// Q5_0 / IQ4_NL rewritten as Q8_0 dequantise to the very same floats
void test_widen(ggml_type t) {
    CHECK(quant_widens_to_q8_0(t), "%s should widen to Q8_0", quant_name(t));
    const int64_t n = 8 * 32;
    std::vector<uint8_t> row(quant_row_bytes(t, n));
    for (uint8_t& b : row) b = uint8_t(g_rng());
    for (size_t off = 0; off < row.size(); off += quant_block_bytes(t)) row[off + 1] &= 0x3B;
    std::vector<block_q8_0> wide(size_t(n / 32));
    quant_row_to_q8_0(t, row.data(), wide.data(), n);
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    dequantize_row(t, row.data(), a.data(), n);
    dequantize_row(GGML_TYPE_Q8_0, wide.data(), b.data(), n);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0, "%s: widened Q8_0 differs", quant_name(t));
}

// MXFP4 widens exactly where every block's exponent makes a half (all of 104..143 here), and says no beyond it
void test_widen_mxfp4() {
    const ggml_type t = GGML_TYPE_MXFP4;
    const int64_t n = 40 * 32;
    std::vector<uint8_t> row(quant_row_bytes(t, n));
    for (uint8_t& b : row) b = uint8_t(g_rng());
    for (int64_t i = 0; i < n / 32; ++i) row[size_t(i) * 17] = uint8_t(104 + i);
    CHECK(quant_block_bytes(t) == 17 && quant_rows_widen_exactly(t, row.data(), n), "MXFP4 in range widens");
    std::vector<block_q8_0> wide(size_t(n / 32));
    quant_row_to_q8_0(t, row.data(), wide.data(), n);
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    dequantize_row(t, row.data(), a.data(), n);
    dequantize_row(GGML_TYPE_Q8_0, wide.data(), b.data(), n);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0, "MXFP4: widened Q8_0 differs");
    row[17 * 3] = 144;  // 2^16: past the largest half
    CHECK(!quant_rows_widen_exactly(t, row.data(), n), "MXFP4 past a half must keep the float path");
    row[17 * 3] = 103;  // 2^-25: under the smallest half
    CHECK(!quant_rows_widen_exactly(t, row.data(), n), "MXFP4 under a half must keep the float path");
}

void test_half() {
    for (uint32_t h = 0; h < 65536; ++h) {
        const double r = half_value(uint16_t(h));
        const float f = fp16_to_fp32(uint16_t(h));
        if (std::isnan(r)) {
            CHECK(std::isnan(f), "half %04x: not nan", h);
            continue;
        }
        CHECK(double(f) == r, "half %04x: %.9g vs %.9g", h, double(f), r);
        CHECK(fp32_to_fp16(f) == uint16_t(h), "half %04x does not round-trip", h);
    }
    // rounding: the nearest half, ties to even
    std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
    for (int i = 0; i < 200000; ++i) {
        const float f = i % 2 ? u(g_rng) : u(g_rng) * 1e-6f;
        const uint16_t h = fp32_to_fp16(f);
        const double v = half_value(h);
        if (std::isinf(v)) {
            CHECK(std::fabs(f) >= 65520.0f, "%.9g rounded to inf", double(f));
            continue;
        }
        const double e = std::fabs(double(f) - v);
        const double up = half_value(uint16_t(h + 1)), dn = half_value(uint16_t(h - 1));
        CHECK(e <= std::fabs(double(f) - up) && e <= std::fabs(double(f) - dn), "%.9g -> %04x not nearest", double(f), h);
    }
}

}  // namespace

int main() {
    test_half();
    test_type(GGML_TYPE_F32, 4);
    test_type(GGML_TYPE_F16, 2);
    test_type(GGML_TYPE_BF16, 2);
    test_type(GGML_TYPE_Q8_0, 34);
    test_type(GGML_TYPE_Q4_0, 18);
    test_type(GGML_TYPE_Q4_1, 20);
    test_type(GGML_TYPE_Q4_K, 144);
    test_type(GGML_TYPE_Q5_K, 176);
    test_type(GGML_TYPE_Q6_K, 210);
    test_type(GGML_TYPE_Q5_0, 22);
    test_type(GGML_TYPE_Q5_1, 24);
    test_type(GGML_TYPE_Q2_K, 84);
    test_type(GGML_TYPE_Q3_K, 110);
    test_type(GGML_TYPE_IQ4_NL, 18);
    test_type(GGML_TYPE_IQ4_XS, 136);
    test_widen(GGML_TYPE_Q5_0);
    test_widen(GGML_TYPE_IQ4_NL);
    test_widen_mxfp4();
    CHECK(!quant_widens_to_q8_0(GGML_TYPE_Q5_1) && !quant_widens_to_q8_0(GGML_TYPE_IQ4_XS), "only exact types widen");
    for (uint32_t t = 0; t < 64; ++t) {
        const bool want = t == 0 || t == 1 || t == 2 || t == 3 || t == 6 || t == 7 || t == 8 || t == 10 || t == 11 ||
                          t == 12 || t == 13 || t == 14 || t == 20 || t == 23 || t == 30 || t == 39;
        CHECK(quant_supported(t) == want, "type %u supported=%d", t, int(quant_supported(t)));
    }
    if (g_failures) {
        std::fprintf(stderr, "%d failures\n", g_failures);
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}
