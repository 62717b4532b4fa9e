/*
 * The score transform, mask and online softmax of the attention forward, on a warp's MT m16
 * slabs of scores in the tensor cores' accumulator layout: s[mt][nt][e] is row row0 + 16 mt +
 * 8 (e >> 1) (row0 = the warp's first row + lane / 4), key column col0 + 8 nt + (e & 1) (col0 =
 * the tile's first key + 2 (lane % 4)); o[mt][dt][e] the same rows. That layout is the one of mma.sync m16n8 (attention.cuh) and of each warp's
 * 16 rows of wgmma m64nN (attention_sm90.cu), so both kernels share these steps; the math and
 * the mask convention are those of attention.cuh's header (tkern.h has the contract).
 */
#ifndef TK_ATTENTION_SOFTMAX_CUH
#define TK_ATTENTION_SOFTMAX_CUH

#include "core/math.cuh"

namespace {

constexpr float ATTN_LOG2E = 1.4426950408889634f;
constexpr float ATTN_LN2 = 0.6931471805599453f;

/* The score transform's constants in a kernel's params P (its fields transform, scale, softcap,
 * softcap_in and exp_scale), set on the host from the call. Exponentials are exp2, so log2(e) is
 * folded into exp_scale, and with no transform (no softcap, no ALiBi) the softmax scale too. */
template <typename P> inline void attn_set_score(P &p, float scale, float softcap, bool alibi) {
    p.transform = softcap > 0.0f || alibi;
    p.scale = scale;
    p.softcap = softcap;
    p.softcap_in = softcap > 0.0f ? scale / softcap : 0.0f;
    p.exp_scale = p.transform ? ATTN_LOG2E : scale * ATTN_LOG2E;
}

/* The mask's fields that a KV-cache call has too (window_left, window_right, sinks, chunk), in
 * a kernel's params P from the resolved call C. */
template <typename P, typename C> inline void attn_set_cache_mask(P &p, const C *c) {
    p.window_left = c->window_left;
    p.window_right = c->window_right;
    p.sinks = c->sinks;
    p.chunk = c->chunk;
}

/* Every mask field of a kernel's params P (those above, prefix and doc_ids) from the resolved
 * call C (tk_attention_call). */
template <typename P, typename C> inline void attn_set_mask(P &p, const C *c) {
    attn_set_cache_mask(p, c);
    p.prefix = c->prefix;
    p.doc_ids = c->doc_ids;
}

/* Scores to natural-log units where a transform is on: softcap * tanh(s * softcap_in), else
 * s * scale; then minus slope * |i + shift - j| with ALiBi. s[mt] is the slab of rows
 * row0 + 16 mt (+ 8). */
template <int MT, int NT>
__device__ __forceinline__ void attn_transform_scores(float (&s)[MT][NT][4], float softcap, float softcap_in,
                                                      float scale, bool alibi, float slope, int row0,
                                                      int col0, int shift) {
    if (softcap > 0.0f) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[mt][nt][e] = softcap * tanhf(s[mt][nt][e] * softcap_in);
    } else {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[mt][nt][e] *= scale;
    }
    if (alibi) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = row0 + 16 * mt + 8 * (e >> 1);
                    const int j = col0 + 8 * nt + (e & 1);
                    s[mt][nt][e] -= slope * (float)abs(i + shift - j);
                }
    }
}

/* ---- The mask: one contiguous key range per query position ----
 *
 * Every mask of tkern.h gives query position p = i + shift one range of keys lo(p) .. hi(p)
 * (empty when hi < lo), with lo and hi non-decreasing in p: a window is [p - window_left,
 * p + window_right]; a chunk of C keys intersects it with [floor(p / C) C, floor(p / C) C + C -
 * 1]; a prefix of P keys widens hi to at least P - 1; a document intersects it with the
 * positions sharing p's id (ids non-decreasing: one run). So a band of positions first..last
 * sees lo(first) .. hi(last), and a key tile n0 .. n0 + cols - 1 is fully visible to it when
 * n0 >= lo(last) and n0 + cols - 1 <= hi(first): the kernels skip tiles outside the band and
 * run the per-element test only on tiles that are not fully visible. The kernels compute each
 * row's range once per CTA into a table (attn_fill_table; attn_key_rows gives the backward the
 * inverse, the rows that see a key), so a new mask is one case in attn_row_keys and
 * attn_key_rows. */
struct attn_mask {
    int shift, seqlen_q, seqlen_k;
    int window_left, window_right; /* -1 = unbounded */
    int chunk;                     /* chunk_size, 0 = off */
    int prefix;                    /* prefix_len, 0 = off */
    const int *doc_ids;            /* this batch's ids [seqlen_k], nullptr = off */
};

/* Position p's chunk start, floor(p / C) C for any sign of p. */
__device__ __forceinline__ int attn_chunk_start(int p, int chunk) {
    const int q = p >= 0 ? p / chunk : -((chunk - 1 - p) / chunk);
    return q * chunk;
}

/* The document runs of positions first..last (0 <= first <= last < seqlen_k): the runs of the
 * two ends, found by a whole warp at once (every lane of the calling warp must call). */
struct attn_docs {
    int first, last;       /* the band */
    int id_first, id_last; /* their ids */
    int start, end;        /* first's run starts at start, last's run ends at end */
};

/* The probes of one search round: each lane probes PROBES positions, so that a round narrows a
 * range 32 PROBES-fold. ATTN_DOC_PROBES = 4: two rounds for up to 16384 ids, where probes of one
 * at a time took three, each waiting for its loads; a warp short of registers (the persistent
 * Hopper forward's producer, at 24) takes 1. */
constexpr int ATTN_DOC_PROBES = 4;

/* The probes of one round by the calling warp over [lo, hi): probe k (= 32 j + lane, j <
 * PROBES) at lo + k step, its id in ids[j] (0 past hi: attn_search_count leaves those out), all
 * loads issued before any is used. */
template <int PROBES>
__device__ __forceinline__ void attn_search_probe(const int *doc_ids, int lo, int hi, int step, int (&ids)[PROBES]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < PROBES; j++) {
        const int x = lo + (32 * j + lane) * step;
        ids[j] = x < hi ? __ldg(doc_ids + x) : 0;
    }
}

/* How many probes of the round (attn_search_probe's) are before `id`: ids below it (or, with
 * `or_equal`, not above it), a prefix of the probes since the ids never decrease. */
template <int PROBES>
__device__ __forceinline__ int attn_search_count(int lo, int hi, int step, const int (&ids)[PROBES], int id,
                                                 bool or_equal) {
    const int lane = threadIdx.x & 31;
    int c = 0;
#pragma unroll
    for (int j = 0; j < PROBES; j++) {
        const bool in = lo + (32 * j + lane) * step < hi;
        c += __popc(__ballot_sync(0xffffffffu, in && (ids[j] < id || (or_equal && ids[j] == id))));
    }
    return c;
}

/* The round's narrowing, c of its probes before the id sought (attn_search_count): the range
 * narrows to the step after the last probe before it; a search ends (lo = hi) when no probe is
 * before it. */
__device__ __forceinline__ void attn_search_narrow(int &lo, int &hi, int step, int c) {
    if (c == 0) {
        hi = lo;
        return;
    }
    const int base = lo;
    lo = base + (c - 1) * step + 1;
    hi = min(hi, base + c * step);
}

template <int PROBES = ATTN_DOC_PROBES>
__device__ __forceinline__ attn_docs attn_doc_band(const attn_mask &m, int first, int last) {
    attn_docs d;
    d.first = first, d.last = last;
    d.id_first = __ldg(m.doc_ids + first);
    d.id_last = __ldg(m.doc_ids + last);
    /* The first index of [0, first) with id_first (else first) and the first of [last, seqlen_k)
     * past id_last: two searches by the whole warp, in step, so that each round's loads are in
     * flight together (the first round's beside the two ids'). */
    constexpr int SPAN = 32 * PROBES;
    int lo_a = 0, hi_a = first, lo_b = last, hi_b = m.seqlen_k;
    while (lo_a < hi_a || lo_b < hi_b) {
        const int step_a = (hi_a - lo_a + SPAN - 1) / SPAN, step_b = (hi_b - lo_b + SPAN - 1) / SPAN;
        int ids_a[PROBES], ids_b[PROBES];
        attn_search_probe(m.doc_ids, lo_a, hi_a, step_a, ids_a);
        attn_search_probe(m.doc_ids, lo_b, hi_b, step_b, ids_b);
        const int c_a = attn_search_count(lo_a, hi_a, step_a, ids_a, d.id_first, false);
        const int c_b = attn_search_count(lo_b, hi_b, step_b, ids_b, d.id_last, true);
        attn_search_narrow(lo_a, hi_a, step_a, c_a);
        attn_search_narrow(lo_b, hi_b, step_b, c_b);
    }
    d.start = lo_a;
    d.end = lo_b - 1;
    return d;
}

/* The run [start, end] of position x of the band (one thread; at most 7 probes, inside the
 * band, where the ids are cached). */
__device__ __forceinline__ void attn_doc_run(const attn_mask &m, const attn_docs &d, int x, int &start, int &end) {
    if (d.id_first == d.id_last) { /* the band lies in one document (ids never decrease): no load */
        start = d.start;
        end = d.end;
        return;
    }
    const int id = __ldg(m.doc_ids + x);
    if (id == d.id_first) {
        start = d.start;
    } else { /* first index of (first, x] with this id */
        int lo = d.first + 1, hi = x;
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (__ldg(m.doc_ids + mid) < id) lo = mid + 1; else hi = mid;
        }
        start = lo;
    }
    if (id == d.id_last) {
        end = d.end;
    } else { /* last index of [x, last) with this id */
        int lo = x, hi = d.last;
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (__ldg(m.doc_ids + mid) <= id) lo = mid + 1; else hi = mid;
        }
        end = lo - 1;
    }
}

/* The keys lo .. hi (x, y) that query position p of the band sees. */
__device__ __forceinline__ int2 attn_row_keys(const attn_mask &m, const attn_docs &d, int p) {
    int lo = m.window_left >= 0 ? p - m.window_left : 0;
    int hi = m.window_right >= 0 ? p + m.window_right : m.seqlen_k - 1;
    if (m.chunk > 0) {
        const int c0 = attn_chunk_start(p, m.chunk);
        lo = max(lo, c0);
        hi = min(hi, c0 + (m.chunk - 1));
    }
    if (m.prefix > 0)
        hi = max(hi, m.prefix - 1);
    if (m.doc_ids) {
        int start, end;
        attn_doc_run(m, d, p, start, end);
        lo = max(lo, start);
        hi = min(hi, end);
    }
    return make_int2(max(lo, 0), min(hi, m.seqlen_k - 1));
}

/* The query rows i (not positions) that see key j of the band: rlo .. rhi (x, y), empty past
 * the last key. With lo and hi non-decreasing these are the rows with hi(p) >= j and
 * lo(p) <= j: exactly the rows that see j. */
__device__ __forceinline__ int2 attn_key_rows(const attn_mask &m, const attn_docs &d, int j) {
    if (j >= m.seqlen_k)
        return make_int2(1, 0);
    constexpr int FAR = 1 << 30; /* past every position, with room for the sums below */
    int lo = m.window_right >= 0 ? j - m.window_right : -FAR;
    int hi = m.window_left >= 0 ? j + m.window_left : FAR;
    if (m.chunk > 0) {
        const int c0 = attn_chunk_start(j, m.chunk);
        lo = max(lo, c0);
        hi = min(hi, c0 + (m.chunk - 1));
    }
    if (m.prefix > 0 && j < m.prefix)
        lo = -FAR;
    if (m.doc_ids) {
        int start, end;
        attn_doc_run(m, d, j, start, end);
        lo = max(lo, start);
        hi = min(hi, end);
    }
    return make_int2(max(lo - m.shift, 0), min(hi - m.shift, m.seqlen_q - 1));
}

/* The table of a band: entry r for x = first + r, r < count: the row's keys (keys = false:
 * rows first..last, as positions first + shift ..; x clamped to last, so that the table stays
 * monotone past the band's end) or the key's rows (keys = true: keys first..last; none past
 * last). Every
 * thread of the CTA calls it (nthreads of them); the caller synchronises before reading. PROBES:
 * the document search's (attn_search_probe). */
template <int PROBES = ATTN_DOC_PROBES>
__device__ __forceinline__ void attn_fill_table(const attn_mask &m, int2 *table, int first, int last, int count,
                                                bool keys, int tid, int nthreads) {
    const int off = keys ? 0 : m.shift;
    attn_docs d;
    if (m.doc_ids)
        d = attn_doc_band<PROBES>(m, first + off, last + off);
    for (int r = tid; r < count; r += nthreads) {
        const int x = first + r;
        table[r] = keys ? (x <= last ? attn_key_rows(m, d, x) : make_int2(1, 0))
                        : attn_row_keys(m, d, min(x, last) + off);
    }
}

/* attn_fill_table's entries r0 .. r0 + count - 1 (keys = false) of the band of rows first..last, for
 * a party of nthreads threads (tid among them) that fills only its own rows of a table, and the
 * keys of the band's first and last rows (its entries 0 and last - first) in front and back, from
 * the same document search: each party then has the whole band's key range without reading the
 * others' rows. Every lane of the calling warps must call (the document search). */
template <int PROBES = ATTN_DOC_PROBES>
__device__ __forceinline__ void attn_fill_table_rows(const attn_mask &m, int2 *table, int first, int last, int r0,
                                                     int count, int tid, int nthreads, int2 &front, int2 &back) {
    attn_docs d;
    if (m.doc_ids)
        d = attn_doc_band<PROBES>(m, first + m.shift, last + m.shift);
    for (int r = r0 + tid; r < r0 + count; r += nthreads)
        table[r] = attn_row_keys(m, d, min(first + r, last) + m.shift);
    front = attn_row_keys(m, d, first + m.shift);
    back = attn_row_keys(m, d, last + m.shift);
}

/* The keys of the first and last rows of the band first..last (attn_fill_table_rows's front and
 * back) with no table: closed form, or through one document search by the calling warp (every
 * lane must call then). */
template <int PROBES = ATTN_DOC_PROBES>
__device__ __forceinline__ void attn_band_ends(const attn_mask &m, int first, int last, int2 &front, int2 &back) {
    attn_docs d;
    if (m.doc_ids)
        d = attn_doc_band<PROBES>(m, first + m.shift, last + m.shift);
    front = attn_row_keys(m, d, first + m.shift);
    back = attn_row_keys(m, d, last + m.shift);
}

/* Whether the band whose first and last rows see keys `front` and `back` (table entries) holds
 * an invisible pair in keys n0 .. n0 + cols - 1: only such tiles need attn_mask_scores. */
__device__ __forceinline__ bool attn_tile_partial(int n0, int cols, int2 front, int2 back) {
    return n0 < back.x || n0 + cols - 1 > front.y;
}

/* -inf where key j is outside row i's range, table[i - table_row0] (attn_fill_table). LEFT =
 * false: the caller knows that every key of the tile is at or past each row's first (its first
 * key at or past the band's last row's first, the largest), so only the right bound is tested:
 * a causal diagonal tile's case, half the comparisons. */
template <int MT, int NT, bool LEFT = true>
__device__ __forceinline__ void attn_mask_scores(float (&s)[MT][NT][4], int row0, int col0, const int2 *table,
                                                 int table_row0) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            /* The row's range relative to the thread's first column, so that each test compares
             * against the element's constant offset (an immediate operand, no address sum). */
            const int2 keys = table[row0 + 16 * mt + 8 * h - table_row0];
            const int lo = keys.x - col0, hi = keys.y - col0;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = 8 * nt + e;
                    if ((LEFT && j < lo) || j > hi)
                        s[mt][nt][2 * h + e] = -INFINITY;
                }
        }
}

/* A row's 1 / denominator and natural-log lse at the end of the online softmax: sum is the
 * row's (quad-reduced) sum of exp2(s exp_scale - max2), max2 its running max times exp_scale,
 * sink2 the sink logit times log2(e) (-inf without sinks). A row that saw no key gets inv = 0
 * and lse = the sink (-inf without one). */
__device__ __forceinline__ void attn_finish_row(float sum, float max2, float sink2, float &inv, float &lse) {
    if (sink2 == -INFINITY || sum == 0.0f) {
        inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        lse = sum > 0.0f ? (max2 + __log2f(sum)) * ATTN_LN2 : sink2 * ATTN_LN2;
        return;
    }
    const float top = fmaxf(max2, sink2); /* the denominator against the larger exponent */
    const float denom = sum * exp2f(max2 - top) + exp2f(sink2 - top);
    inv = exp2f(max2 - top) / denom;
    lse = (top + __log2f(denom)) * ATTN_LN2;
}

/* How far (in exp2 units) a tile's max may pass a row's running max before the row takes it:
 * below this the row keeps its max, so that its p of the tile are at most 2^ATTN_MAX_SLACK
 * (256: exact enough in f32 and in the 16-bit P) and its output accumulators need no rescale.
 * The final o / l and lse use the max that was kept, so the result is the same softmax. */
constexpr float ATTN_MAX_SLACK = 8.0f;

/* One key tile of the online softmax on the scores alone (the 4 threads of a quad share a
 * row): per row the running max and this thread's partial sum move on, s becomes p =
 * exp2(s exp_scale - m exp_scale), and alpha gets the factor by which the row's output
 * accumulators must shrink (attn_rescale_o), so that a kernel whose O is still being written
 * by the tensor cores can apply it later. A row's max moves only when the tile's passes it by
 * more than ATTN_MAX_SLACK (its alpha is 1 otherwise); returns whether any row of the warp
 * moved, i.e. whether the warp's O needs attn_rescale_o at all (after the first few tiles of a
 * row, rarely: the FMULs of the rescale, one per output accumulator, are skipped). */
template <int MT, int NT>
__device__ __forceinline__ bool attn_softmax_scores(float (&s)[MT][NT][4], float (&row_max)[MT][2],
                                                    float (&row_sum)[MT][2], float exp_scale,
                                                    float (&alpha)[MT][2]) {
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float tile = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                tile = fmaxf(tile, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
            tile = fmaxf(tile, __shfl_xor_sync(0xffffffffu, tile, 1));
            tile = fmaxf(tile, __shfl_xor_sync(0xffffffffu, tile, 2));
            /* From -inf (nothing seen) any visible max moves the row (+inf > slack); a tile with
             * nothing visible (-inf) never does (the difference is -inf, or NaN from -inf). */
            const float old = row_max[mt][h];
            const float mx = (tile - old) * exp_scale > ATTN_MAX_SLACK ? tile : old;
            /* A row that has seen only masked keys keeps max -inf; exponentiate against 0
             * so that its p are exp2(-inf) = 0 rather than NaN. */
            const float m_use = mx == -INFINITY ? 0.0f : mx;
            alpha[mt][h] = mx == old ? 1.0f : tk_exp2_approx((old - m_use) * exp_scale);
            moved |= mx != old;
            const float base = m_use * exp_scale;
            row_max[mt][h] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float pe = tk_exp2_approx(fmaf(s[mt][nt][2 * h + e], exp_scale, -base));
                    s[mt][nt][2 * h + e] = pe;
                    sum += pe;
                }
            row_sum[mt][h] = row_sum[mt][h] * alpha[mt][h] + sum;
        }
    return __any_sync(0xffffffffu, moved);
}

/* The output accumulators o (DT n8 slices) of each row scaled by its alpha. */
template <int MT, int DT>
__device__ __forceinline__ void attn_rescale_o(float (&o)[MT][DT][4], const float (&alpha)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[mt][dt][e] *= alpha[mt][e >> 1];
}

/* One key tile of the online softmax with the output accumulators rescaled in the same step. */
template <int MT, int NT, int DT>
__device__ __forceinline__ void attn_online_softmax(float (&s)[MT][NT][4], float (&row_max)[MT][2],
                                                    float (&row_sum)[MT][2], float exp_scale,
                                                    float (&o)[MT][DT][4]) {
    float alpha[MT][2];
    if (attn_softmax_scores(s, row_max, row_sum, exp_scale, alpha))
        attn_rescale_o(o, alpha);
}

} // namespace

#endif
