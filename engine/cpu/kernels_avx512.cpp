// engine/cpu/kernels_avx512.cpp — AVX-512 (F/BW/VL/DQ) + VNNI kernel set; compiled with -mavx512* (CMakeLists),
// chosen at run time only when CPUID and XGETBV report the features (kernels.cpp).
//
// Row kernels: each 32-element weight block is widened once to 32 int16 lanes (4-bit values centred, q - 8)
// and used against each token of the tile with vpdpwssd (s16 x s16 -> 16 int32 lanes), converted to float
// and scaled by dw * da of the two blocks; Q4_1's offset (m + 8 dw, small once q is centred, so little
// cancellation) is folded per block through the activation blocks' dsum.
#include "kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)

// GCC 12 reports its own intrinsics' _mm512_undefined_*() placeholders (cvtph_ps, cvtps_ph, insert/extract,
// cvtepi32_ps) as uninitialised once they are inlined here: a known false positive, silenced for this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels_group_avx512.h"
#include "kernels_kquant.h"
#include "exp_avx512.h"  // exp_neg, exp_full

namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

void quantize_q16_avx512(const float* x, int64_t k, int16_t* qs, float* d, float* dsum) {
    const __m512 sign_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    for (int64_t b = 0; b < k / QK32; ++b) {
        const __m512 x0 = _mm512_loadu_ps(x + b * QK32), x1 = _mm512_loadu_ps(x + b * QK32 + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(x0, sign_mask), _mm512_and_ps(x1, sign_mask)));
        const float db = amax / 32767.0f;
        const __m512 vid = _mm512_set1_ps(db != 0.0f ? 1.0f / db : 0.0f);
        // cvtps_epi32 rounds to nearest even under the default MXCSR, as nearbyint does in the scalar set
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vid));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vid));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * QK32), _mm512_cvtsepi32_epi16(q0));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * QK32 + 16), _mm512_cvtsepi32_epi16(q1));
        d[b] = db;
        dsum[b] = db * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
    }
}

// 16 packed nibbles -> 32 int16 lanes in element order: low nibbles are elements 0..15, high ones 16..31
inline __m512i unpack_nibbles16(const uint8_t* qs) {
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    const __m256i m = _mm256_set1_epi16(0x0F);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m)), _mm256_srli_epi16(v, 4), 1);
}

// Offset multipliers of up to this many blocks live on the stack (K up to 64Ki elements); longer rows are
// split into runs of this many blocks.
constexpr int64_t ROW_MAX_BLOCKS = 2048;

// KIND 0: Q4_0, 1: Q4_1, 2: Q8_0.  T tokens of the tile at once, blocks [b0, b1) of the row.
template <int KIND, int T>
void row_run(const uint8_t* w, const act_q16& a, int64_t t0, int64_t b0, int64_t b1, float* part) {
    using blk = std::conditional_t<KIND == 0, block_q4_0, std::conditional_t<KIND == 1, block_q4_1, block_q8_0>>;
    const blk* wb = reinterpret_cast<const blk*>(w);
    const int64_t nb = a.k / QK32;
    alignas(64) float offs[ROW_MAX_BLOCKS + 16];
    // two accumulators per token (even / odd blocks): breaks the fma latency chain of a single token; every
    // tile size uses the same split, so a token's sum never depends on its neighbours
    __m512 acc[2][T];
    for (int t = 0; t < T; ++t) acc[0][t] = acc[1][t] = _mm512_setzero_ps();
    auto block = [&](int64_t b, int h) {
        __m512i wv;
        float dw;
        if constexpr (KIND == 2) {
            wv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].qs)));
            dw = h2f(wb[b].d);
        } else {
            wv = _mm512_sub_epi16(unpack_nibbles16(wb[b].qs), _mm512_set1_epi16(8));  // centred: q - 8
            if constexpr (KIND == 1) {  // d and m converted together
                uint32_t dm;
                std::memcpy(&dm, &wb[b].d, 4);
                const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm)));
                dw = _mm_cvtss_f32(f);
                offs[b - b0] = _mm_cvtss_f32(_mm_movehdup_ps(f)) + 8.0f * dw;
            } else {
                dw = h2f(wb[b].d);
            }
        }
        for (int t = 0; t < T; ++t) {
            const __m512i av = _mm512_loadu_si512(a.qs + (t0 + t) * a.k + b * QK32);
            const __m512i p = _mm512_madd_epi16(wv, av);
            acc[h][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(dw * a.d[(t0 + t) * nb + b]), acc[h][t]);
        }
    };
    int64_t b = b0;
    for (; b + 1 < b1; b += 2) {
        block(b, 0);
        block(b + 1, 1);
    }
    if (b < b1) block(b, 0);
    for (int t = 0; t < T; ++t) {
        float total = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][t], acc[1][t]));
        if constexpr (KIND == 1) {  // offset terms: sum_b offs[b] * block_sum[b], 16 blocks per step
            const float* as = a.dsum + (t0 + t) * nb + b0;
            __m512 o = _mm512_setzero_ps();
            int64_t i = 0;
            for (; i + 16 <= b1 - b0; i += 16) {
                o = _mm512_fmadd_ps(_mm512_load_ps(offs + i), _mm512_loadu_ps(as + i), o);
            }
            if (i < b1 - b0) {
                const __mmask16 m = static_cast<__mmask16>((1u << (b1 - b0 - i)) - 1);
                o = _mm512_fmadd_ps(_mm512_maskz_load_ps(m, offs + i), _mm512_maskz_loadu_ps(m, as + i), o);
            }
            total += _mm512_reduce_add_ps(o);
        }
        part[t] += total;
    }
}

template <int KIND, int T>
void row_kernel(const uint8_t* w, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    const int64_t nb = a.k / QK32;
    float part[T] = {};
    for (int64_t b0 = 0; b0 < nb; b0 += ROW_MAX_BLOCKS) {
        row_run<KIND, T>(w, a, t0, b0, b0 + ROW_MAX_BLOCKS < nb ? b0 + ROW_MAX_BLOCKS : nb, part);
    }
    for (int t = 0; t < T; ++t) y[t * y_stride] = part[t];
}

template <int KIND>
void row_dispatch(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    switch (n_tok) {
    case 1: row_kernel<KIND, 1>(w, a, t0, y, y_stride); break;
    case 2: row_kernel<KIND, 2>(w, a, t0, y, y_stride); break;
    case 3: row_kernel<KIND, 3>(w, a, t0, y, y_stride); break;
    case 4: row_kernel<KIND, 4>(w, a, t0, y, y_stride); break;
    case 5: row_kernel<KIND, 5>(w, a, t0, y, y_stride); break;
    case 6: row_kernel<KIND, 6>(w, a, t0, y, y_stride); break;
    case 7: row_kernel<KIND, 7>(w, a, t0, y, y_stride); break;
    default: row_kernel<KIND, 8>(w, a, t0, y, y_stride); break;
    }
}
static_assert(MM_TOK_TILE == 8, "row_dispatch handles tiles of up to 8 tokens");

// Row-group kernel (layout in kernels.cpp, weight_pack). Per block: the quants of the 16 rows become 16
// vectors of int16 pairs (4-bit: 4 per 64-byte load, by shift and mask); each token's pair (a[2j], a[2j+1])
// is broadcast and vpdpwssd adds both products into the row's int32 lane, so the block's exact integer sum
// of every row is one vector. 4-bit values are stored as 0..15; centring (q - 8) is exact in the integer
// sum: it starts at -8 * (the block's activation sum). Then acc += float(sum) * (dw * da), and for Q4_1
// acc += off * dsum, in block order. Short tiles split the integer sum over more accumulators (exact, so
// the value is the same): it breaks the dependency chain of a lone token.
using pair16 = int32_t __attribute__((may_alias, aligned(4)));

template <int KIND, int T>
struct group_kernel {
static void run(const uint8_t* g, int64_t nb, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    constexpr size_t SB = KIND == 2 ? 32 : 64, QB = KIND == 2 ? 512 : 256, GB = SB + QB;
    constexpr int NACC = T >= 4 ? 1 : (T == 1 ? 4 : 2);
    const int16_t* aq = a.qs + t0 * a.k;
    const float* ad = a.d + t0 * nb;
    const float* as = a.dsum + t0 * nb;
    const int32_t* ai = a.isum + t0 * nb;
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi16(0x000F);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* gb = g + size_t(b) * GB;
        const uint8_t* q = gb + SB;
        __m512i s[T][NACC];
        for (int t = 0; t < T; ++t) {
            s[t][0] = KIND == 2 ? _mm512_setzero_si512() : _mm512_set1_epi32(-8 * ai[t * nb + b]);
            for (int k = 1; k < NACC; ++k) s[t][k] = _mm512_setzero_si512();
        }
        const pair16* ap[T];  // the block's activations of each token, as 16 pairs of int16
        for (int t = 0; t < T; ++t) ap[t] = reinterpret_cast<const pair16*>(aq + t * a.k + b * QK32);
        auto dot = [&](int j, __m512i v) {
            for (int t = 0; t < T; ++t) {
                s[t][j % NACC] = _mm512_dpwssd_epi32(s[t][j % NACC], v, _mm512_set1_epi32(ap[t][j]));
            }
        };
        if constexpr (KIND == 2) {
            for (int j = 0; j < 16; ++j) {
                dot(j, _mm512_cvtepi8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(q + 32 * j))));
            }
        } else {
            for (int c = 0; c < 4; ++c) {
                const __m512i w = _mm512_load_si512(q + 64 * c);
                dot(4 * c + 0, _mm512_and_si512(w, low4));
                dot(4 * c + 1, _mm512_and_si512(_mm512_srli_epi16(w, 4), low4));
                dot(4 * c + 2, _mm512_and_si512(_mm512_srli_epi16(w, 8), low4));
                dot(4 * c + 3, _mm512_srli_epi16(w, 12));
            }
        }
        __m512 dw, off;
        group_avx512::block_scales<KIND>(gb, dw, off);
        for (int t = 0; t < T; ++t) {
            __m512i sum = s[t][0];
            for (int k = 1; k < NACC; ++k) sum = _mm512_add_epi32(sum, s[t][k]);
            acc[t] = group_avx512::block_accumulate<KIND>(acc[t], sum, dw, off, ad + t * nb, as + t * nb, b);
        }
    }
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + size_t(t) * y_stride, acc[t]);
}
};

float dot_f32_avx512(const float* a, const float* b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

float dot_f16_f32_avx512(const uint16_t* a, const float* b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 av = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i)));
        acc = _mm512_fmadd_ps(av, _mm512_loadu_ps(b + i), acc);
    }
    float s = _mm512_reduce_add_ps(acc);
    for (; i < n; ++i) s += _cvtsh_ss(a[i]) * b[i];
    return s;
}

void axpy_f16_avx512(float a, const uint16_t* x, float* y, int64_t n) {
    const __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 xv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, xv, _mm512_loadu_ps(y + i)));
    }
    for (; i < n; ++i) y[i] += a * _cvtsh_ss(x[i]);
}

void fp32_to_fp16_row_avx512(const float* x, uint16_t* y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

// g[0..n) = silu(g) * u = g / (1 + exp(-g)) * u (SwiGLU), in the scalar form's order, exp by exp_full
void silu_mul_avx512(float* g, const float* u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
        const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        const __m512 e = exp_full(_mm512_sub_ps(_mm512_setzero_ps(), x));
        const __m512 y = _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(m, u + i));
        _mm512_mask_storeu_ps(g + i, m, y);
    }
}

// r[i] = the sum of the 16 lanes of v[i], i < 16 (transpose-and-add: 2 ops per vector instead of 8)
inline __m512 hsum16x16(const __m512* v) {
    __m512 g[4];
    for (int k = 0; k < 4; ++k) {
        const __m512* w = v + 4 * k;
        const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(w[0], w[1]), _mm512_unpackhi_ps(w[0], w[1]));
        const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(w[2], w[3]), _mm512_unpackhi_ps(w[2], w[3]));
        const __m512d a = _mm512_castps_pd(s01), b = _mm512_castps_pd(s23);
        g[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(g[0], g[1], 0x88), _mm512_shuffle_f32x4(g[0], g[1], 0xDD));
    const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(g[2], g[3], 0x88), _mm512_shuffle_f32x4(g[2], g[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0x88), _mm512_shuffle_f32x4(u01, u23, 0xDD));
}

// elements [16 j, 16 j + 16) of one head's cache row: halves, or Q8_0 blocks of 32
template <bool Q8>
inline __m512 load_kv16(const uint8_t* row, int j) {
    if constexpr (Q8) {
        const block_q8_0* b = reinterpret_cast<const block_q8_0*>(row) + j / 2;
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + (j % 2) * 16));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(h2f(b->d)));
    } else {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row) + j));
    }
}

// NV = hd / 16 zmm per head row. K and V are converted to float 16 positions at a time, once for the whole
// tile.
template <int NV, bool Q8>
void attn_impl(const float* q, size_t q_stride, int n_q, int n_tok, const uint8_t* k, const uint8_t* v,
               size_t row_bytes, int n_pos0, float scale, float* scores, float* out, size_t out_stride,
               const float* sinks) {
    constexpr int HD = NV * 16;
    const int n_last = n_pos0 + n_tok - 1;  // positions the tile's last query sees
    auto srow = [&](int t, int h) { return scores + (size_t(t) * size_t(n_q) + size_t(h)) * size_t(n_last); };
    const size_t ahead = attn_prefetch_ahead(row_bytes);  // kernels.h
    alignas(64) float kf[16 * HD];  // 16 positions of K (then of V) in float
    for (int p0 = 0; p0 < n_last; p0 += 16) {
        const int nb = n_last - p0 < 16 ? n_last - p0 : 16;
        for (int p = 0; p < nb; ++p) {
            const uint8_t* kr = k + size_t(p0 + p) * row_bytes;
            attn_prefetch_row(kr, row_bytes, ahead);
            for (int j = 0; j < NV; ++j) _mm512_store_ps(kf + p * HD + j * 16, load_kv16<Q8>(kr, j));
        }
        for (int t = 0; t < n_tok; ++t) {
            const int n_pos = n_pos0 + t;
            if (p0 >= n_pos) continue;
            const int np = n_pos - p0 < 16 ? n_pos - p0 : 16;
            for (int h = 0; h < n_q; ++h) {
                const float* qh = q + size_t(t) * q_stride + size_t(h) * HD;
                __m512 part[16];
                if (NV >= 16 && np == 16) {  // hd 256: 16 independent chains, one q vector live (no spills)
                    const __m512 q0 = _mm512_loadu_ps(qh);
                    for (int p = 0; p < 16; ++p) part[p] = _mm512_mul_ps(q0, _mm512_load_ps(kf + p * HD));
                    for (int j = 1; j < NV; ++j) {
                        const __m512 qj = _mm512_loadu_ps(qh + j * 16);
                        for (int p = 0; p < 16; ++p) part[p] = _mm512_fmadd_ps(qj, _mm512_load_ps(kf + p * HD + j * 16), part[p]);
                    }
                } else {  // the same steps per position (the same bits)
                    __m512 qv[NV];
                    for (int j = 0; j < NV; ++j) qv[j] = _mm512_loadu_ps(qh + j * 16);
                    for (int p = 0; p < 16; ++p) {
                        if (p < np) {
                            __m512 a = _mm512_mul_ps(qv[0], _mm512_load_ps(kf + p * HD));
                            for (int j = 1; j < NV; ++j) a = _mm512_fmadd_ps(qv[j], _mm512_load_ps(kf + p * HD + j * 16), a);
                            part[p] = a;
                        } else {
                            part[p] = _mm512_setzero_ps();
                        }
                    }
                }
                const __m512 sc = _mm512_mul_ps(hsum16x16(part), _mm512_set1_ps(scale));
                _mm512_mask_storeu_ps(srow(t, h) + p0, static_cast<__mmask16>((1u << np) - 1), sc);
            }
        }
    }
    for (int t = 0; t < n_tok; ++t) {  // softmax per query head
        const int n_pos = n_pos0 + t;
        for (int h = 0; h < n_q; ++h) {
            float* sc = srow(t, h);
            __m512 mx = _mm512_set1_ps(-INFINITY);
            int p = 0;
            for (; p + 16 <= n_pos; p += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(sc + p));
            float m = _mm512_reduce_max_ps(mx);
            for (; p < n_pos; ++p) m = sc[p] > m ? sc[p] : m;
            if (sinks) m = sinks[h] > m ? sinks[h] : m;  // the sink joins the max and the denominator
            const __m512 mv = _mm512_set1_ps(m);
            __m512 sum = _mm512_setzero_ps();
            for (p = 0; p < n_pos; p += 16) {
                const __mmask16 mk = static_cast<__mmask16>(n_pos - p >= 16 ? 0xFFFF : (1u << (n_pos - p)) - 1);
                const __m512 e = _mm512_maskz_mov_ps(mk, exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, sc + p), mv)));
                _mm512_mask_storeu_ps(sc + p, mk, e);
                sum = _mm512_add_ps(sum, e);
            }
            const float sink_e = sinks ? std::exp(sinks[h] - m) : 0.0f;
            const __m512 inv = _mm512_set1_ps(1.0f / (_mm512_reduce_add_ps(sum) + sink_e));
            for (p = 0; p < n_pos; p += 16) {
                const __mmask16 mk = static_cast<__mmask16>(n_pos - p >= 16 ? 0xFFFF : (1u << (n_pos - p)) - 1);
                _mm512_mask_storeu_ps(sc + p, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, sc + p), inv));
            }
        }
    }
    // out = weights . V: V converted to float 16 positions at a time, once for the whole tile (as K), then
    // every query and head of the tile reads those rows; each output lane still sums its products in
    // position order from zero (kept in `out` between blocks of 16 positions), so the tile size does not
    // change a bit. A lone query (decode) of head size <= 128 whose heads fit one pass (HC) converts V as it
    // reads it instead: the same steps, without the buffer's store and reload (a long context's decode is
    // mostly this loop); at head size 256 HC heads' accumulators fill the registers and the buffer wins.
    constexpr int HC = NV <= 4 ? 4 : 2;
    if (NV <= 8 && n_tok == 1 && n_q <= HC) {
        const int n_pos = n_pos0;
        __m512 acc[HC][NV];
        for (int h = 0; h < HC; ++h) {
            for (int j = 0; j < NV; ++j) acc[h][j] = _mm512_setzero_ps();
        }
        for (int p = 0; p < n_pos; ++p) {
            const uint8_t* vr = v + size_t(p) * row_bytes;
            attn_prefetch_row(vr, row_bytes, ahead);
            for (int j = 0; j < NV; ++j) {
                const __m512 vv = load_kv16<Q8>(vr, j);
                for (int h = 0; h < HC; ++h) {
                    if (h < n_q) acc[h][j] = _mm512_fmadd_ps(_mm512_set1_ps(srow(0, h)[p]), vv, acc[h][j]);
                }
            }
        }
        for (int h = 0; h < n_q; ++h) {
            for (int j = 0; j < NV; ++j) _mm512_storeu_ps(out + h * HD + j * 16, acc[h][j]);
        }
        return;
    }
    for (int t = 0; t < n_tok; ++t) {
        for (int i = 0; i < n_q * HD; ++i) out[size_t(t) * out_stride + size_t(i)] = 0.0f;
    }
    for (int p0 = 0; p0 < n_last; p0 += 16) {
        const int nb = n_last - p0 < 16 ? n_last - p0 : 16;
        for (int p = 0; p < nb; ++p) {
            const uint8_t* vr = v + size_t(p0 + p) * row_bytes;
            attn_prefetch_row(vr, row_bytes, ahead);
            for (int j = 0; j < NV; ++j) _mm512_store_ps(kf + p * HD + j * 16, load_kv16<Q8>(vr, j));
        }
        for (int t = 0; t < n_tok; ++t) {
            const int n_pos = n_pos0 + t;
            if (p0 >= n_pos) continue;
            const int np = n_pos - p0 < 16 ? n_pos - p0 : 16;
            for (int h = 0; h < n_q; ++h) {
                float* o = out + size_t(t) * out_stride + size_t(h) * HD;
                const float* w = srow(t, h) + p0;
                __m512 acc[NV];
                for (int j = 0; j < NV; ++j) acc[j] = _mm512_loadu_ps(o + j * 16);
                for (int p = 0; p < np; ++p) {
                    const __m512 wv = _mm512_set1_ps(w[p]);
                    for (int j = 0; j < NV; ++j) acc[j] = _mm512_fmadd_ps(wv, _mm512_load_ps(kf + p * HD + j * 16), acc[j]);
                }
                for (int j = 0; j < NV; ++j) _mm512_storeu_ps(o + j * 16, acc[j]);
            }
        }
    }
}

void attn_avx512(const float* q, size_t q_stride, int n_q, int n_tok, const uint8_t* k, const uint8_t* v,
                 size_t row_bytes, bool kv_q8, int n_pos0, int hd, float scale, float* scores, float* out,
                 size_t out_stride, const float* sinks) {
    // model.cpp calls this only for hd 64, 128 or 256 (Gemma 3)
    if (hd == 64) {
        if (kv_q8) attn_impl<4, true>(q, q_stride, n_q, n_tok, k, v, row_bytes, n_pos0, scale, scores, out, out_stride, sinks);
        else attn_impl<4, false>(q, q_stride, n_q, n_tok, k, v, row_bytes, n_pos0, scale, scores, out, out_stride, sinks);
    } else if (hd == 128) {
        if (kv_q8) attn_impl<8, true>(q, q_stride, n_q, n_tok, k, v, row_bytes, n_pos0, scale, scores, out, out_stride, sinks);
        else attn_impl<8, false>(q, q_stride, n_q, n_tok, k, v, row_bytes, n_pos0, scale, scores, out, out_stride, sinks);
    } else if (hd == 256) {
        if (kv_q8) attn_impl<16, true>(q, q_stride, n_q, n_tok, k, v, row_bytes, n_pos0, scale, scores, out, out_stride, sinks);
        else attn_impl<16, false>(q, q_stride, n_q, n_tok, k, v, row_bytes, n_pos0, scale, scores, out, out_stride, sinks);
    }
}

const kernel_set AVX512_SET = {
    "avx512_vnni",        quantize_q16_avx512,      row_dispatch<0>,   row_dispatch<1>,          row_dispatch<2>,
    row_q45k_kq<0>, row_q45k_kq<1>, row_q6k_kq,
    dot_f32_avx512,       dot_f16_f32_avx512,      axpy_f16_avx512,   fp32_to_fp16_row_avx512,
    attn_avx512,          group_avx512::tile_dispatch<group_kernel, 0>, group_avx512::tile_dispatch<group_kernel, 1>,
    group_avx512::tile_dispatch<group_kernel, 2>,
};

}  // namespace

const kernel_set* kernels_avx512() { return &AVX512_SET; }
silu_mul_fn kernels_silu_mul_avx512() { return silu_mul_avx512; }

#else

const kernel_set* kernels_avx512() { return nullptr; }
silu_mul_fn kernels_silu_mul_avx512() { return nullptr; }

#endif
