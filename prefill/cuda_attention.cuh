// prefill/cuda_attention.cuh — flash-style attention over the device KV cache (contract: cuk_attention in
// prefill/cuda_kernels.h). Included once, by prefill/cuda_kernels.cu (it uses that file's stream and helpers).
//
// Block = (tile of consecutive entries of one sequence, kv head g and a part of its query heads, position
// split z). Its rows are (entry, query head) pairs, at most ATT_ROWS; warp w owns rows w, w + 8, w + 16, w + 24.
// The block walks its position range in chunks of 32: all threads load the chunk's K and V rows (halves) into
// shared memory (rows padded by 2 halves so that 32 lanes reading 32 different K rows hit 32 banks); then per
// row, lane j scores position c0 + j (masked outside [attn_first(pos), pos]), the warp takes the chunk's max
// and sum (cm::attn_chunk_scale's rule, in parallel), and lane l accumulates dims l, l + 32, ... of
// sum_j p_j v_j. The partial (acc, m, l) of each row and split goes to scratch; attn_combine_kernel merges the
// splits (cm::attn_combine's rule).

namespace {

constexpr int ATT_CHUNK = 32;
constexpr int ATT_WARPS = 8;
constexpr int ATT_ROWS_PER_WARP = 4;
constexpr int ATT_ROWS = ATT_WARPS * ATT_ROWS_PER_WARP;  // 32

struct att_args {
    const float* q;        // (n, n_head * hd)
    const cuk_entry* entries;
    const int32_t* tiles;  // (n_tiles + 1) first entry of each tile, then n
    const cuk_kv_seq* kvs; // this layer's table, indexed by entry.seq
    int n;
    int n_head;
    int n_head_kv;
    int heads_per_block;   // hps: query heads of one kv head per block
    int n_split;
    int32_t split_len;     // positions per split, a multiple of ATT_CHUNK
    float scale;
    float* scratch;        // (n_split, n, n_head, hd + 2): acc, then m, l
};

template <int HD>
__global__ void __launch_bounds__(256) attn_kernel(att_args a) {
    constexpr int KLD = HD + 2;  // halves per shared K/V row
    constexpr int PER_LANE = HD / 32;
    extern __shared__ __align__(16) unsigned char att_smem[];
    float* q_s = reinterpret_cast<float*>(att_smem);                                  // (ATT_ROWS, HD)
    __half* k_s = reinterpret_cast<__half*>(att_smem + ATT_ROWS * HD * sizeof(float));  // (ATT_CHUNK, KLD)
    __half* v_s = k_s + ATT_CHUNK * KLD;                                               // (ATT_CHUNK, KLD)

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int e0 = a.tiles[blockIdx.x], e1 = a.tiles[blockIdx.x + 1];
    const int parts = a.n_head / a.n_head_kv / a.heads_per_block;
    const int g = blockIdx.y / parts, part = blockIdx.y % parts;
    const int head0 = g * (a.n_head / a.n_head_kv) + part * a.heads_per_block;
    const int rows = (e1 - e0) * a.heads_per_block;
    const cuk_kv_seq kv = a.kvs[a.entries[e0].seq];
    const int32_t lo = cm::attn_first(a.entries[e0].pos, kv.n_swa), hi = a.entries[e1 - 1].pos;
    const int32_t p_begin = lo + int32_t(blockIdx.z) * a.split_len;
    const int32_t p_end = min(hi + 1, p_begin + a.split_len);
    const int nq = a.n_head * HD;

    for (int i = tid; i < ATT_ROWS * HD; i += blockDim.x) {
        const int r = i / HD, d = i % HD;
        q_s[i] = r < rows ? a.q[int64_t(e0 + r / a.heads_per_block) * nq + (head0 + r % a.heads_per_block) * HD + d] : 0.0f;
    }
    float acc[ATT_ROWS_PER_WARP][PER_LANE];
    cm::attn_state st[ATT_ROWS_PER_WARP];
    int32_t first[ATT_ROWS_PER_WARP], last[ATT_ROWS_PER_WARP];
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS_PER_WARP; ++rr) {
        st[rr] = cm::attn_init();
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) acc[rr][i] = 0.0f;
        const int r = warp + ATT_WARPS * rr;
        const int32_t pos = r < rows ? a.entries[e0 + r / a.heads_per_block].pos : -1;
        first[rr] = r < rows ? cm::attn_first(pos, kv.n_swa) : 0;
        last[rr] = pos;  // -1: no row
    }
    const uint8_t* kbase = kv.k + int64_t(g) * kv.head_stride;
    const uint8_t* vbase = kv.v + int64_t(g) * kv.head_stride;
    for (int32_t c0 = p_begin; c0 < p_end; c0 += ATT_CHUNK) {
        __syncthreads();  // the previous chunk is consumed (and q_s is written, the first time)
        for (int i = tid; i < ATT_CHUNK * (HD / 2); i += blockDim.x) {
            const int j = i / (HD / 2), d2 = i % (HD / 2);
            const int32_t p = c0 + j;
            uint32_t kw = 0, vw = 0;
            if (p < p_end) {
                const int64_t off = (cm::kv_cell(p, kv.n_ring) * HD + 2 * d2) * 2;
                kw = *reinterpret_cast<const uint32_t*>(kbase + off);
                vw = *reinterpret_cast<const uint32_t*>(vbase + off);
            }
            *reinterpret_cast<uint32_t*>(k_s + j * KLD + 2 * d2) = kw;
            *reinterpret_cast<uint32_t*>(v_s + j * KLD + 2 * d2) = vw;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < ATT_ROWS_PER_WARP; ++rr) {
            const int r = warp + ATT_WARPS * rr;
            if (last[rr] < 0 || c0 > last[rr] || c0 + ATT_CHUNK <= first[rr]) continue;  // warp-uniform
            const int32_t p = c0 + lane;
            float s = -3.0e38f;
            if (p < p_end && p >= first[rr] && p <= last[rr]) {
                const float* qr = q_s + r * HD;
                const __half2* kr = reinterpret_cast<const __half2*>(k_s + lane * KLD);
                float dot = 0.0f;
#pragma unroll 8
                for (int d2 = 0; d2 < HD / 2; ++d2) {
                    const float2 kf = __half22float2(kr[d2]);
                    dot += qr[2 * d2] * kf.x + qr[2 * d2 + 1] * kf.y;
                }
                s = dot * a.scale;
            }
            const float mx = fmaxf(st[rr].m, warp_max(s));
            const float corr = expf(st[rr].m - mx);
            const float pj = s < -1.0e37f ? 0.0f : expf(s - mx);
            st[rr].l = st[rr].l * corr + warp_sum(pj);
            st[rr].m = mx;
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i) acc[rr][i] *= corr;
            for (int j = 0; j < ATT_CHUNK; ++j) {
                const float w = __shfl_sync(0xFFFFFFFFu, pj, j);
                if (w == 0.0f) continue;  // warp-uniform (w is the same in every lane)
#pragma unroll
                for (int i = 0; i < PER_LANE; ++i) acc[rr][i] += w * __half2float(v_s[j * KLD + lane + 32 * i]);
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < ATT_ROWS_PER_WARP; ++rr) {
        const int r = warp + ATT_WARPS * rr;
        if (r >= rows) continue;
        const int e = e0 + r / a.heads_per_block, h = head0 + r % a.heads_per_block;
        float* out = a.scratch + ((int64_t(blockIdx.z) * a.n + e) * a.n_head + h) * (HD + 2);
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) out[lane + 32 * i] = acc[rr][i];
        if (lane == 0) {
            out[HD] = st[rr].m;
            out[HD + 1] = st[rr].l;
        }
    }
}

// one block per (entry, head), one thread per dim: the splits' partials merged (cm::attn_combine's rule)
__global__ void attn_combine_kernel(const float* scratch, float* out, int n, int n_head, int hd, int n_split) {
    const int e = blockIdx.x / n_head, h = blockIdx.x % n_head, d = threadIdx.x;
    if (d >= hd) return;
    const int64_t stride = int64_t(n) * n_head * (hd + 2);
    const float* p0 = scratch + (int64_t(e) * n_head + h) * (hd + 2);
    float mx = -3.0e38f;
    for (int s = 0; s < n_split; ++s) {
        const float* p = p0 + s * stride;
        if (p[hd + 1] > 0.0f && p[hd] > mx) mx = p[hd];
    }
    float num = 0.0f, den = 0.0f;
    for (int s = 0; s < n_split; ++s) {
        const float* p = p0 + s * stride;
        if (!(p[hd + 1] > 0.0f)) continue;
        const float w = expf(p[hd] - mx);
        den += w * p[hd + 1];
        num += w * p[d];
    }
    out[(int64_t(e) * n_head + h) * hd + d] = den > 0.0f ? num / den : 0.0f;
}

template <int HD>
void attn_launch(const att_args& a, int n_tiles) {
    const size_t smem = ATT_ROWS * HD * sizeof(float) + 2 * ATT_CHUNK * (HD + 2) * sizeof(__half);
    static bool attr_set = false;  // one caller thread (the protocol loop)
    if (!attr_set) {
        note(cudaFuncSetAttribute(attn_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
             "attention smem");
        attr_set = true;
    }
    const int parts = a.n_head / a.n_head_kv / a.heads_per_block;
    const dim3 grid(unsigned(n_tiles), unsigned(a.n_head_kv * parts), unsigned(a.n_split));
    attn_kernel<HD><<<grid, 256, smem, stream()>>>(a);
    note_launch("attention");
}

}  // namespace

int cuk_attn_heads_per_block(int group) {
    int hps = group < ATT_ROWS ? group : ATT_ROWS;
    while (group % hps != 0) --hps;
    return hps;
}

int cuk_attn_tile_entries(int group) { return ATT_ROWS / cuk_attn_heads_per_block(group); }

size_t cuk_attn_scratch_floats(int n, int n_head, int hd, int n_split) {
    return size_t(n_split) * size_t(n) * size_t(n_head) * size_t(hd + 2);
}

void cuk_attention(const float* q, float* out, int n, const cuk_entry* entries, const int32_t* tiles, int n_tiles,
                   const cuk_kv_seq* kvs, int n_head, int n_head_kv, int hd, float scale, int n_split,
                   int32_t max_span, float* scratch) {
    att_args a{};
    a.q = q;
    a.entries = entries;
    a.tiles = tiles;
    a.kvs = kvs;
    a.n = n;
    a.n_head = n_head;
    a.n_head_kv = n_head_kv;
    a.heads_per_block = cuk_attn_heads_per_block(n_head / n_head_kv);
    a.n_split = n_split < 1 ? 1 : n_split;
    const int32_t per = (max_span + a.n_split - 1) / a.n_split;
    a.split_len = (per + ATT_CHUNK - 1) / ATT_CHUNK * ATT_CHUNK;
    if (a.split_len < ATT_CHUNK) a.split_len = ATT_CHUNK;
    a.scale = scale;
    a.scratch = scratch;
    switch (hd) {
    case 64: attn_launch<64>(a, n_tiles); break;
    case 128: attn_launch<128>(a, n_tiles); break;
    case 256: attn_launch<256>(a, n_tiles); break;
    default:
        if (g_first_error.empty()) g_first_error = "attention: head size " + std::to_string(hd) + " has no kernel";
        return;
    }
    attn_combine_kernel<<<unsigned(n * n_head), unsigned(hd), 0, stream()>>>(scratch, out, n, n_head, hd, a.n_split);
    note_launch("attention combine");
}
