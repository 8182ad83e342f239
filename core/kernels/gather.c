/* torch.gather / scatter_add along the middle axis of an (outer, dim,
 * inner) view. Out-of-range indices are counted, not trusted: gather
 * yields 0 for them and scatter_add skips them. */
#include "kernels.h"
#include "pool.h"

#include <stdatomic.h>
#include <string.h>

/* Elements per pool task before splitting pays off. */
#define GATHER_GRAIN 16384
/* Inner columns per scatter task: wide enough for contiguous, vectorizable
 * runs, narrow enough to spread a single outer slice over the threads. */
#define SCATTER_COLS 256

typedef struct {
    float *out;
    const float *src;
    const int64_t *index;
    int64_t outer, src_dim, idx_dim, inner, out_dim;
    int64_t col_blocks;
    atomic_int_fast64_t bad;
} gather_job;

/* One task = one (o, i) row of `inner` elements. */
CX_HOT static void gather_range(void *ctx, int64_t begin, int64_t end)
{
    gather_job *j = ctx;
    int64_t bad = 0;
    for (int64_t t = begin; t < end; t++) {
        const int64_t o = t / j->idx_dim;
        const int64_t *idx = j->index + t * j->inner;
        const float *src = j->src + o * j->src_dim * j->inner;
        float *out = j->out + t * j->inner;
        for (int64_t e = 0; e < j->inner; e++) {
            int64_t s = idx[e];
            if (s >= 0 && s < j->src_dim) {
                out[e] = src[s * j->inner + e];
            } else {
                out[e] = 0.0f;
                bad++;
            }
        }
    }
    atomic_fetch_add_explicit(&j->bad, bad, memory_order_relaxed);
}

int64_t cx_gather_f32(float *out, const float *src, const int64_t *index,
                      int64_t outer, int64_t src_dim, int64_t idx_dim, int64_t inner)
{
    if (outer <= 0 || idx_dim <= 0 || inner <= 0) return 0;
    gather_job j = { .out = out, .src = src, .index = index, .outer = outer, .src_dim = src_dim,
                     .idx_dim = idx_dim, .inner = inner };
    atomic_init(&j.bad, 0);
    int64_t grain = GATHER_GRAIN / inner;
    cx_pool_parallel_for(outer * idx_dim, grain > 1 ? grain : 1, gather_range, &j);
    return atomic_load(&j.bad);
}

/* One task = one (o, column block): it walks i in increasing order for its
 * columns only, so every out element receives its additions from a single
 * thread in index order, whatever the thread count (deterministic). */
CX_HOT static void scatter_range(void *ctx, int64_t begin, int64_t end)
{
    gather_job *j = ctx;
    int64_t bad = 0;
    for (int64_t t = begin; t < end; t++) {
        const int64_t o = t / j->col_blocks, e0 = (t % j->col_blocks) * SCATTER_COLS;
        const int64_t e1 = e0 + SCATTER_COLS < j->inner ? e0 + SCATTER_COLS : j->inner;
        float *out = j->out + o * j->out_dim * j->inner;
        const float *src = j->src + o * j->idx_dim * j->inner;
        const int64_t *index = j->index + o * j->idx_dim * j->inner;
        for (int64_t i = 0; i < j->idx_dim; i++) {
            const int64_t *idx = index + i * j->inner;
            const float *s = src + i * j->inner;
            for (int64_t e = e0; e < e1; e++) {
                int64_t d = idx[e];
                if (d >= 0 && d < j->out_dim)
                    out[d * j->inner + e] += s[e];
                else
                    bad++;
            }
        }
    }
    atomic_fetch_add_explicit(&j->bad, bad, memory_order_relaxed);
}

int64_t cx_scatter_add_f32(float *out, const float *src, const int64_t *index,
                           int64_t outer, int64_t out_dim, int64_t idx_dim, int64_t inner)
{
    if (outer <= 0 || idx_dim <= 0 || inner <= 0) return 0;
    gather_job j = { .out = out, .src = src, .index = index, .outer = outer, .out_dim = out_dim,
                     .idx_dim = idx_dim, .inner = inner };
    j.col_blocks = (inner + SCATTER_COLS - 1) / SCATTER_COLS;
    atomic_init(&j.bad, 0);
    int64_t per_task = idx_dim * (inner < SCATTER_COLS ? inner : SCATTER_COLS);
    int64_t grain = GATHER_GRAIN / (per_task > 0 ? per_task : 1);
    cx_pool_parallel_for(outer * j.col_blocks, grain > 1 ? grain : 1, scatter_range, &j);
    return atomic_load(&j.bad);
}

/* ---- row indices: one index per (outer, dim) row, read through strides ----
 * An embedding's gather and its gradient's scatter-add take a row index
 * expanded over the row's width (index.unsqueeze(-1).expand(..., C)), every
 * element of a row the same. Read in place, rows move whole: no expanded
 * i64 index written and read back, one index read per row. */

typedef struct {
    float *out;
    const float *src;
    const int64_t *index;
    int64_t idx_outer_stride, idx_dim_stride;
    int64_t idx_dim, other_dim, inner;
    int64_t col_blocks;
    atomic_int_fast64_t bad;
} rows_job;

static inline int64_t row_index(const rows_job *j, int64_t o, int64_t i)
{
    return j->index[o * j->idx_outer_stride + i * j->idx_dim_stride];
}

/* One task = one (o, i) output row. */
CX_HOT static void gather_rows_range(void *ctx, int64_t begin, int64_t end)
{
    rows_job *j = ctx;
    int64_t bad = 0;
    for (int64_t t = begin; t < end; t++) {
        const int64_t o = t / j->idx_dim, s = row_index(j, o, t % j->idx_dim);
        float *out = j->out + t * j->inner;
        if (s >= 0 && s < j->other_dim) {
            memcpy(out, j->src + (o * j->other_dim + s) * j->inner, sizeof *out * (size_t)j->inner);
        } else {
            memset(out, 0, sizeof *out * (size_t)j->inner);
            bad += j->inner;
        }
    }
    atomic_fetch_add_explicit(&j->bad, bad, memory_order_relaxed);
}

int64_t cx_gather_rows_f32(float *out, const float *src, const int64_t *index, int64_t idx_outer_stride,
                           int64_t idx_dim_stride, int64_t outer, int64_t src_dim, int64_t idx_dim, int64_t inner)
{
    if (outer <= 0 || idx_dim <= 0 || inner <= 0) return 0;
    rows_job j = { .out = out, .src = src, .index = index, .idx_outer_stride = idx_outer_stride,
                   .idx_dim_stride = idx_dim_stride, .idx_dim = idx_dim, .other_dim = src_dim, .inner = inner };
    atomic_init(&j.bad, 0);
    int64_t grain = GATHER_GRAIN / inner;
    cx_pool_parallel_for(outer * idx_dim, grain > 1 ? grain : 1, gather_rows_range, &j);
    return atomic_load(&j.bad);
}

/* One task = one (o, column block), walking i in increasing order, as
 * scatter_range: each out element gets its additions from one thread in
 * index order, whatever the thread count. */
CX_HOT static void scatter_rows_range(void *ctx, int64_t begin, int64_t end)
{
    rows_job *j = ctx;
    int64_t bad = 0;
    for (int64_t t = begin; t < end; t++) {
        const int64_t o = t / j->col_blocks, e0 = (t % j->col_blocks) * SCATTER_COLS;
        const int64_t e1 = e0 + SCATTER_COLS < j->inner ? e0 + SCATTER_COLS : j->inner;
        float *out = j->out + o * j->other_dim * j->inner;
        const float *src = j->src + o * j->idx_dim * j->inner;
        for (int64_t i = 0; i < j->idx_dim; i++) {
            const int64_t d = row_index(j, o, i);
            if (d < 0 || d >= j->other_dim) { bad += e1 - e0; continue; }
            float *dst = out + d * j->inner;
            const float *s = src + i * j->inner;
            for (int64_t e = e0; e < e1; e++) dst[e] += s[e];
        }
    }
    atomic_fetch_add_explicit(&j->bad, bad, memory_order_relaxed);
}

int64_t cx_scatter_add_rows_f32(float *out, const float *src, const int64_t *index, int64_t idx_outer_stride,
                                int64_t idx_dim_stride, int64_t outer, int64_t out_dim, int64_t idx_dim, int64_t inner)
{
    if (outer <= 0 || idx_dim <= 0 || inner <= 0) return 0;
    rows_job j = { .out = out, .src = src, .index = index, .idx_outer_stride = idx_outer_stride,
                   .idx_dim_stride = idx_dim_stride, .idx_dim = idx_dim, .other_dim = out_dim, .inner = inner };
    j.col_blocks = (inner + SCATTER_COLS - 1) / SCATTER_COLS;
    atomic_init(&j.bad, 0);
    int64_t per_task = idx_dim * (inner < SCATTER_COLS ? inner : SCATTER_COLS);
    int64_t grain = GATHER_GRAIN / (per_task > 0 ? per_task : 1);
    cx_pool_parallel_for(outer * j.col_blocks, grain > 1 ? grain : 1, scatter_rows_range, &j);
    return atomic_load(&j.bad);
}
