// engine/cpu/kernels_avx2.cpp — AVX2 + FMA + F16C kernel set; compiled with -mavx2 -mfma -mf16c (CMakeLists),
// chosen at run time when the CPU has AVX2 but not AVX-512 VNNI (kernels.cpp).
//
// Same arithmetic as the AVX-512 set: each 32-element weight block is widened to 32 int16 lanes (two ymm)
// (4-bit values centred, q - 8) and multiplied with the token's 16-bit activations by pmaddwd (s16 x s16
// pairs -> int32), converted to float and scaled by the block's dw; Q4_1's offset m + 8 dw goes through
// the activation block sums. The row-group kernels over packed weights and the fused attention follow the
// AVX-512 set's structure on 8-lane vectors (each described where it is defined).
#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

#include <cmath>
#include <type_traits>

#include "kernels_act8.h"        // cpu_has_avx_vnni, kernels_group16_avxvnni
#include "kernels_group16_avx2.h"  // group_dispatch
#include "kernels_kquant.h"

namespace {

inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void quantize_q16_avx2(const float* x, int64_t k, int16_t* qs, float* d, float* dsum) {
    const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t b = 0; b < k / QK32; ++b) {
        const float* xb = x + b * QK32;
        __m256 ax = _mm256_and_ps(_mm256_loadu_ps(xb), sign_mask);
        for (int j = 8; j < QK32; j += 8) ax = _mm256_max_ps(ax, _mm256_and_ps(_mm256_loadu_ps(xb + j), sign_mask));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(ax), _mm256_extractf128_ps(ax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float db = _mm_cvtss_f32(m) / 32767.0f;
        const __m256 vid = _mm256_set1_ps(db != 0.0f ? 1.0f / db : 0.0f);
        __m256i s = _mm256_setzero_si256();
        for (int j = 0; j < QK32; j += 16) {
            const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j), vid));
            const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 8), vid));
            s = _mm256_add_epi32(s, _mm256_add_epi32(q0, q1));
            // packs interleaves 128-bit lanes: permute back to element order
            const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * QK32 + j), p);
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        d[b] = db;
        dsum[b] = db * static_cast<float>(_mm_cvtsi128_si32(s4));
    }
}

template <int KIND, int T>
void row_kernel(const uint8_t* w, const act_q16& a, int64_t t0, float* y, size_t y_stride) {
    using blk = std::conditional_t<KIND == 0, block_q4_0, std::conditional_t<KIND == 1, block_q4_1, block_q8_0>>;
    const blk* wb = reinterpret_cast<const blk*>(w);
    const int64_t nb = a.k / QK32;
    __m256 acc[T];
    float acc_off[T];
    for (int t = 0; t < T; ++t) {
        acc[t] = _mm256_setzero_ps();
        acc_off[t] = 0.0f;
    }
    for (int64_t b = 0; b < nb; ++b) {
        __m256i w0, w1;  // elements 0..15, 16..31 as int16
        if constexpr (KIND == 2) {
            w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[b].qs)));
            w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[b].qs + 16)));
        } else {
            const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[b].qs));
            const __m128i mk = _mm_set1_epi8(0x0F);
            const __m256i eight = _mm256_set1_epi16(8);  // centred: q - 8
            w0 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(v, mk)), eight);
            w1 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), mk)), eight);
        }
        const float dw = _cvtsh_ss(wb[b].d);
        for (int t = 0; t < T; ++t) {
            const __m256 sc = _mm256_set1_ps(dw * a.d[(t0 + t) * nb + b]);
            const int16_t* q = a.qs + (t0 + t) * a.k + b * QK32;
            const __m256i p0 = _mm256_madd_epi16(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
            const __m256i p1 = _mm256_madd_epi16(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16)));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), sc, acc[t]);
        }
        if constexpr (KIND == 1) {
            const float off = _cvtsh_ss(wb[b].m) + 8.0f * dw;
            for (int t = 0; t < T; ++t) acc_off[t] += off * a.dsum[(t0 + t) * nb + b];
        }
    }
    for (int t = 0; t < T; ++t) y[t * y_stride] = hsum8(acc[t]) + acc_off[t];
}

// up to 4 tokens at once (16 ymm registers); larger tiles in runs of 4 (per-token arithmetic is the same)
template <int KIND>
void row_dispatch(const uint8_t* w, const act_q16& a, int64_t t0, int n_tok, float* y, size_t y_stride) {
    for (int done = 0; done < n_tok; done += 4) {
        const int n = n_tok - done < 4 ? n_tok - done : 4;
        float* yy = y + size_t(done) * y_stride;
        switch (n) {
        case 1: row_kernel<KIND, 1>(w, a, t0 + done, yy, y_stride); break;
        case 2: row_kernel<KIND, 2>(w, a, t0 + done, yy, y_stride); break;
        case 3: row_kernel<KIND, 3>(w, a, t0 + done, yy, y_stride); break;
        default: row_kernel<KIND, 4>(w, a, t0 + done, yy, y_stride); break;
        }
    }
}

float dot_f32_avx2(const float* a, const float* b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum8(acc);
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

float dot_f16_f32_avx2(const uint16_t* a, const float* b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 av = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
        acc = _mm256_fmadd_ps(av, _mm256_loadu_ps(b + i), acc);
    }
    float s = hsum8(acc);
    for (; i < n; ++i) s += _cvtsh_ss(a[i]) * b[i];
    return s;
}

void axpy_f16_avx2(float a, const uint16_t* x, float* y, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; ++i) y[i] += a * _cvtsh_ss(x[i]);
}

void fp32_to_fp16_row_avx2(const float* x, uint16_t* y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

// r[i] = the sum of the 8 lanes of v[i], i < 8 (horizontal adds in a fixed tree)
inline __m256 hsum8x8(const __m256* v) {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// 2^n * e^f for whole n (as floats) in [-127, 127] and |f| <= ln(2)/2: e^f by its Taylor series to degree 7,
// 2^n built in the exponent field (the tail both exps below share)
inline __m256 exp_scaled8(__m256 n, __m256 f) {
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// exp(x) for x <= 0, as the AVX-512 set's exp_neg: 2^n * 2^f with 2^f from its Taylor series to degree 7;
// below -87 the result is 0 (2^n is built in the exponent field)
inline __m256 exp_neg8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504f));
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_mul_ps(_mm256_sub_ps(t, n), _mm256_set1_ps(0.693147181f));
    return exp_scaled8(n, f);
}

// exp(x) over x in [-87.3, 88.3] (clamped; 88.3 keeps 2^n within the exponent field, n <= 127): x = n ln 2 + f
// with ln 2 in two parts (Cody-Waite, as the AVX-512 set's exp_full), e^f by exp_neg8's Taylor series to degree 7,
// within 3e-7 relative of the true value
inline __m256 exp_full8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    f = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606820309417e-06f), f);
    return exp_scaled8(n, f);
}

inline __m256i lanes_below(int n) {  // mask of lanes [0, n)
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// elements [8 j, 8 j + 8) of one head's cache row: halves, or Q8_0 blocks of 32
template <bool Q8>
inline __m256 load_kv8(const uint8_t* row, int j) {
    if constexpr (Q8) {
        const block_q8_0* b = reinterpret_cast<const block_q8_0*>(row) + j / 4;
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + (j % 4) * 8));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_set1_ps(_cvtsh_ss(b->d)));
    } else {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row) + j));
    }
}

// Rows p0 .. p0+nb-1 of a K or V cache (f16, or Q8 blocks; row_bytes apart) as floats: dst (nb, NV * 8).
// Each row read prefetches the row `ahead` bytes on (attn_prefetch_ahead, kernels.h).
template <int NV, bool Q8>
inline void kv_block_to_f32(const uint8_t* rows, size_t row_bytes, size_t ahead, int p0, int nb, float* dst) {
    for (int p = 0; p < nb; ++p) {
        const uint8_t* r = rows + size_t(p0 + p) * row_bytes;
        attn_prefetch_row(r, row_bytes, ahead);
        for (int j = 0; j < NV; ++j) _mm256_store_ps(dst + p * NV * 8 + j * 8, load_kv8<Q8>(r, j));
    }
}

// out (n_q, NV * 8) = weights . V for a lone query with NQ heads (weights: the heads' softmax rows, w_stride
// apart), V converted as it is read: 4 vectors (32 dims) of every head at a time, 4 * NQ accumulators kept in
// registers, NV / 4 passes over the positions. Each output lane's fma chain runs over the positions in order
// from zero, as in attn_impl's blocked loop, so the bits are the same; a decode step skips that loop's store
// and reload of every converted row. Rows are prefetched `ahead` bytes on in the first pass.
template <int NV, bool Q8, int NQ>
void attn_v_lone(const float* w, size_t w_stride, int n_pos, const uint8_t* v, size_t row_bytes, size_t ahead,
                 float* out) {
    static_assert(NV % 4 == 0 && NQ >= 1 && NQ <= 3, "4 vectors of up to 3 heads: 12 accumulators");
    for (int j0 = 0; j0 < NV; j0 += 4) {
        __m256 acc[NQ][4];
        for (int h = 0; h < NQ; ++h) {
            for (int j = 0; j < 4; ++j) acc[h][j] = _mm256_setzero_ps();
        }
        for (int p = 0; p < n_pos; ++p) {
            const uint8_t* vr = v + size_t(p) * row_bytes;
            if (j0 == 0) attn_prefetch_row(vr, row_bytes, ahead);
            __m256 wp[NQ];
            for (int h = 0; h < NQ; ++h) wp[h] = _mm256_set1_ps(w[size_t(h) * w_stride + size_t(p)]);
            for (int j = 0; j < 4; ++j) {
                const __m256 vv = load_kv8<Q8>(vr, j0 + j);
                for (int h = 0; h < NQ; ++h) acc[h][j] = _mm256_fmadd_ps(wp[h], vv, acc[h][j]);
            }
        }
        for (int h = 0; h < NQ; ++h) {
            for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out + h * NV * 8 + (j0 + j) * 8, acc[h][j]);
        }
    }
}

// Fused attention over a tile of queries (contract in kernels.h), the AVX-512 kernel's structure on 8
// positions per block: K converted once per block for the tile, scores by fma and a fixed hsum tree,
// softmax with exp_neg8, then out = weights . V with V converted once per block for the tile.
template <int NV, bool Q8>
void attn_impl(const float* q, size_t q_stride, int n_q, int n_tok, const uint8_t* k, const uint8_t* v,
               size_t row_bytes, int n_pos0, float scale, float* scores, float* out, size_t out_stride,
               const float* sinks) {
    constexpr int HD = NV * 8;
    const int n_last = n_pos0 + n_tok - 1;
    auto srow = [&](int t, int h) { return scores + (size_t(t) * size_t(n_q) + size_t(h)) * size_t(n_last); };
    const size_t ahead = attn_prefetch_ahead(row_bytes);
    alignas(32) float kf[8 * HD];
    for (int p0 = 0; p0 < n_last; p0 += 8) {
        const int nb = n_last - p0 < 8 ? n_last - p0 : 8;
        kv_block_to_f32<NV, Q8>(k, row_bytes, ahead, p0, nb, kf);
        for (int t = 0; t < n_tok; ++t) {
            const int n_pos = n_pos0 + t;
            if (p0 >= n_pos) continue;
            const int np = n_pos - p0 < 8 ? n_pos - p0 : 8;
            for (int h = 0; h < n_q; ++h) {
                const float* qh = q + size_t(t) * q_stride + size_t(h) * HD;
                // each 8 floats of the query loaded once for the block's 8 positions (not once per position);
                // per position the fma chain runs over j in order, as before
                __m256 part[8];
                if (np == 8) {
                    const __m256 q0 = _mm256_loadu_ps(qh);
                    for (int p = 0; p < 8; ++p) part[p] = _mm256_mul_ps(q0, _mm256_load_ps(kf + p * HD));
                    for (int j = 1; j < NV; ++j) {
                        const __m256 qj = _mm256_loadu_ps(qh + j * 8);
                        for (int p = 0; p < 8; ++p) part[p] = _mm256_fmadd_ps(qj, _mm256_load_ps(kf + p * HD + j * 8), part[p]);
                    }
                } else {
                    for (int p = 0; p < 8; ++p) {
                        if (p < np) {
                            __m256 a = _mm256_mul_ps(_mm256_loadu_ps(qh), _mm256_load_ps(kf + p * HD));
                            for (int j = 1; j < NV; ++j) a = _mm256_fmadd_ps(_mm256_loadu_ps(qh + j * 8), _mm256_load_ps(kf + p * HD + j * 8), a);
                            part[p] = a;
                        } else {
                            part[p] = _mm256_setzero_ps();
                        }
                    }
                }
                _mm256_maskstore_ps(srow(t, h) + p0, lanes_below(np), _mm256_mul_ps(hsum8x8(part), _mm256_set1_ps(scale)));
            }
        }
    }
    for (int t = 0; t < n_tok; ++t) {
        const int n_pos = n_pos0 + t;
        for (int h = 0; h < n_q; ++h) {
            float* sc = srow(t, h);
            __m256 mv8 = _mm256_set1_ps(sc[0]);  // the max on 8 lanes (exact in any order), then across them
            for (int p = 0; p < n_pos; p += 8) {
                const __m256i mk = lanes_below(n_pos - p);
                mv8 = _mm256_max_ps(mv8, _mm256_blendv_ps(mv8, _mm256_maskload_ps(sc + p, mk), _mm256_castsi256_ps(mk)));
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv8), _mm256_extractf128_ps(mv8, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            if (sinks) m = sinks[h] > m ? sinks[h] : m;  // the sink joins the max and the denominator
            const __m256 mv = _mm256_set1_ps(m);
            __m256 sum = _mm256_setzero_ps();
            for (int p = 0; p < n_pos; p += 8) {
                const __m256i mk = lanes_below(n_pos - p);
                const __m256 e = _mm256_and_ps(exp_neg8(_mm256_sub_ps(_mm256_maskload_ps(sc + p, mk), mv)), _mm256_castsi256_ps(mk));
                _mm256_maskstore_ps(sc + p, mk, e);
                sum = _mm256_add_ps(sum, e);
            }
            const float sink_e = sinks ? std::exp(sinks[h] - m) : 0.0f;
            const __m256 inv = _mm256_set1_ps(1.0f / (hsum8(sum) + sink_e));
            for (int p = 0; p < n_pos; p += 8) {
                const __m256i mk = lanes_below(n_pos - p);
                _mm256_maskstore_ps(sc + p, mk, _mm256_mul_ps(_mm256_maskload_ps(sc + p, mk), inv));
            }
        }
    }
    if (n_tok == 1 && n_q <= 3) {  // a decode step's lone query: attn_v_lone (the same bits)
        const size_t ws = size_t(n_last);
        if (n_q == 1) attn_v_lone<NV, Q8, 1>(srow(0, 0), ws, n_pos0, v, row_bytes, ahead, out);
        if (n_q == 2) attn_v_lone<NV, Q8, 2>(srow(0, 0), ws, n_pos0, v, row_bytes, ahead, out);
        if (n_q == 3) attn_v_lone<NV, Q8, 3>(srow(0, 0), ws, n_pos0, v, row_bytes, ahead, out);
        return;
    }
    // out = weights . V, by blocks of 8 positions as the scores: each block's V rows are converted once for the
    // tile (per (token, head) they cost ~2/3 of a 2048-token prompt read's attention, callgrind), then every
    // (token, head) adds them to its accumulators, kept in out between blocks. Each output's fma chain still
    // runs over the positions in order from zero, so the bits are those of one walk over all positions.
    alignas(32) float vf[8 * HD];
    for (int p0 = 0; p0 < n_last; p0 += 8) {
        const int nb = n_last - p0 < 8 ? n_last - p0 : 8;
        kv_block_to_f32<NV, Q8>(v, row_bytes, ahead, p0, nb, vf);
        for (int t = 0; t < n_tok; ++t) {
            const int n_pos = n_pos0 + t;
            if (p0 >= n_pos) continue;
            const int np = n_pos - p0 < 8 ? n_pos - p0 : 8;
            for (int h = 0; h < n_q; ++h) {
                const float* w = srow(t, h) + p0;
                float* o = out + size_t(t) * out_stride + size_t(h) * HD;
                __m256 acc[NV];
                for (int j = 0; j < NV; ++j) acc[j] = p0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(o + j * 8);
                for (int p = 0; p < np; ++p) {
                    const __m256 wp = _mm256_set1_ps(w[p]);
                    for (int j = 0; j < NV; ++j) acc[j] = _mm256_fmadd_ps(wp, _mm256_load_ps(vf + p * HD + j * 8), acc[j]);
                }
                for (int j = 0; j < NV; ++j) _mm256_storeu_ps(o + j * 8, acc[j]);
            }
        }
    }
}

void attn_avx2(const float* q, size_t q_stride, int n_q, int n_tok, const uint8_t* k, const uint8_t* v,
               size_t row_bytes, bool kv_q8, int n_pos0, int hd, float scale, float* scores, float* out,
               size_t out_stride, const float* sinks) {
    // model.cpp calls this only for hd 64, 128 or 256 (Gemma 3)
    if (hd == 64) {
        if (kv_q8) attn_impl<8, true>(q, q_stride, n_q, n_tok, k, v, row_bytes, n_pos0, scale, scores, out, out_stride, sinks);
        else attn_impl<8, false>(q, q_stride, n_q, n_tok, k, v, row_bytes, n_pos0, scale, scores, out, out_stride, sinks);
    } else if (hd == 128) {
        if (kv_q8) attn_impl<16, true>(q, q_stride, n_q, n_tok, k, v, row_bytes, n_pos0, scale, scores, out, out_stride, sinks);
        else attn_impl<16, false>(q, q_stride, n_q, n_tok, k, v, row_bytes, n_pos0, scale, scores, out, out_stride, sinks);
    } else if (hd == 256) {
        if (kv_q8) attn_impl<32, true>(q, q_stride, n_q, n_tok, k, v, row_bytes, n_pos0, scale, scores, out, out_stride, sinks);
        else attn_impl<32, false>(q, q_stride, n_q, n_tok, k, v, row_bytes, n_pos0, scale, scores, out, out_stride, sinks);
    }
}

// g[0..n) = silu(g) * u = g / (1 + exp(-g)) * u (SwiGLU), in the scalar form's order, exp by exp_full8 (the scalar
// loop's std::exp was 6.6 % of a 512-token prompt read's instructions under STRATA_KERNELS=avx2, callgrind)
void silu_mul_avx2(float* g, const float* u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = exp_full8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    if (i < n) {
        const __m256i mk = lanes_below(int(n - i));
        const __m256 x = _mm256_maskload_ps(g + i, mk);
        const __m256 e = exp_full8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_maskstore_ps(g + i, mk, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_maskload_ps(u + i, mk)));
    }
}

// Row-group kernels over packed weights: kernels_group16_avx2.h (shared with the AVX-VNNI form).

const kernel_set AVX2_SET = {
    "avx2",          quantize_q16_avx2,    row_dispatch<0>,  row_dispatch<1>,        row_dispatch<2>,
    row_q45k_kq<0>, row_q45k_kq<1>, row_q6k_kq,
    dot_f32_avx2,    dot_f16_f32_avx2,     axpy_f16_avx2,    fp32_to_fp16_row_avx2,
    attn_avx2,       group_dispatch<0, false>, group_dispatch<1, false>, group_dispatch<2, false>,
};

// The AVX2 set with, on a CPU that has AVX-VNNI, the Q4_0 / Q4_1 / Q8_0 row-group kernels in their vpdpwssd
// form (the same bits: kernels_group16_avx2.h); its name stays "avx2" (STRATA_KERNELS=avx2, the tests).
kernel_set avx2_set_for_cpu() {
    kernel_set ks = AVX2_SET;
    const mm_group_fn* vnni = kernels_group16_avxvnni();
    if (vnni && cpu_has_avx_vnni()) {
        ks.group_q4_0 = vnni[0];
        ks.group_q4_1 = vnni[1];
        ks.group_q8_0 = vnni[2];
    }
    return ks;
}

}  // namespace

const kernel_set* kernels_avx2() {
    static const kernel_set set = avx2_set_for_cpu();
    return &set;
}
silu_mul_fn kernels_silu_mul_avx2() { return silu_mul_avx2; }

#else

const kernel_set* kernels_avx2() { return nullptr; }
silu_mul_fn kernels_silu_mul_avx2() { return nullptr; }

#endif
