/* Scaled dot-product attention, flash style on a CPU: per (batch, head) a
 * task walks query tiles and, for each, the key tiles it may see, keeping a
 * running max and sum per query row (online softmax). The (T, S) score
 * matrix never exists in memory: one (BQ, BK) tile at a time, in cache.
 *
 * The backward pass recomputes each score tile from the row's log-sum-exp
 * (one extra pass over the keys per query tile) and accumulates dK and dV of
 * the whole head in the task's scratch, so no two tasks write the same
 * element and the result does not depend on the thread count. */
#include "kernels.h"
#include "pool.h"
#include "vmath.h"
#include <cxla/core.h>

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

enum { BQ = 64, BK = 64, ALIGN_FLOATS = 16 };

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t round_up(int64_t n) { return (n + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS; }

static const float *row_of(const float *base, const int64_t *st, int64_t n, int64_t r, int64_t h)
{
    return base + n * st[0] + r * st[1] + h * st[2];
}

/* rows of a (rows, d) head slice into a contiguous block, times `mul` */
CX_HOT static void gather_rows(float *dst, const float *base, const int64_t *st, int64_t n, int64_t r0, int64_t rows,
                        int64_t h, int64_t d, float mul)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *src = row_of(base, st, n, r0 + r, h);
        float *o = dst + r * d;
        for (int64_t e = 0; e < d; e++) o[e] = src[e] * mul;
    }
}

/* ---- forward ------------------------------------------------------------------------ */

typedef struct {
    float *k, *v;             /* the head's keys and values, (s, d) */
    float *q, *o, *p;         /* a query tile (BQ, d), its output, its scores (BQ, BK) */
    float *m, *l;             /* running row max and sum */
} fwd_lane;

static int64_t fwd_lane_floats(const cx_attn_geom *g)
{
    return 2 * round_up(g->s * g->d) + 2 * round_up(BQ * g->d) + round_up(BQ * BK) + 2 * round_up(BQ);
}

static fwd_lane fwd_lane_at(const cx_attn_geom *g, float *base)
{
    fwd_lane L;
    L.k = base; base += round_up(g->s * g->d);
    L.v = base; base += round_up(g->s * g->d);
    L.q = base; base += round_up(BQ * g->d);
    L.o = base; base += round_up(BQ * g->d);
    L.p = base; base += round_up(BQ * BK);
    L.m = base; base += round_up(BQ);
    L.l = base;
    return L;
}

/* One key tile [k0, k0 + cols) for a query tile at q0: scores, the online
 * softmax update of m, l and the output rows, then O += P V. */
CX_HOT static void fwd_key_tile(const cx_attn_geom *g, const fwd_lane *L, int64_t q0, int64_t rows, int64_t k0, int64_t cols)
{
    const int64_t d = g->d;
    cx_sgemm_serial(false, true, rows, cols, d, L->q, d, L->k + k0 * d, d, 0.0f, L->p, BK);
    for (int64_t i = 0; i < rows; i++) {
        float *s = L->p + i * BK;
        int64_t lim = min64(cols, cx_attn_visible_keys(g, q0 + i) - k0);
        if (lim <= 0) { memset(s, 0, sizeof *s * (size_t)cols); continue; }
        float mx = L->m[i];
        for (int64_t j = 0; j < lim; j++) mx = s[j] > mx ? s[j] : mx;
        float alpha = cx_vexpf(L->m[i] - mx), sum = 0.0f;
        for (int64_t j = 0; j < lim; j++) { s[j] = cx_vexpf(s[j] - mx); sum += s[j]; }
        for (int64_t j = lim; j < cols; j++) s[j] = 0.0f;
        L->l[i] = L->l[i] * alpha + sum;
        L->m[i] = mx;
        float *o = L->o + i * d;
        for (int64_t e = 0; e < d; e++) o[e] *= alpha;
    }
    cx_sgemm_serial(false, false, rows, d, cols, L->p, BK, L->v + k0 * d, d, 1.0f, L->o, d);
}

CX_HOT static void fwd_head(const cx_attn_geom *g, const fwd_lane *L, float *out, const float *q, const float *k,
                     const float *v, int64_t n, int64_t h)
{
    const int64_t d = g->d;
    gather_rows(L->k, k, g->k_strides, n, 0, g->s, h, d, 1.0f);
    gather_rows(L->v, v, g->v_strides, n, 0, g->s, h, d, 1.0f);
    for (int64_t q0 = 0; q0 < g->t; q0 += BQ) {
        const int64_t rows = min64(BQ, g->t - q0), kend = cx_attn_visible_keys(g, q0 + rows - 1);
        gather_rows(L->q, q, g->q_strides, n, q0, rows, h, d, g->scale);
        for (int64_t i = 0; i < rows; i++) { L->m[i] = -INFINITY; L->l[i] = 0.0f; }
        memset(L->o, 0, sizeof *L->o * (size_t)(rows * d));
        for (int64_t k0 = 0; k0 < kend; k0 += BK) fwd_key_tile(g, L, q0, rows, k0, min64(BK, kend - k0));
        for (int64_t i = 0; i < rows; i++) {
            /* a row that sees no key (causal, s < t) is 0 */
            const float inv = L->l[i] > 0.0f ? 1.0f / L->l[i] : 0.0f;
            float *dst = out + ((n * g->t + q0 + i) * g->h + h) * d;
            for (int64_t e = 0; e < d; e++) dst[e] = L->o[i * d + e] * inv;
        }
    }
}

/* ---- lanes: one scratch block per participating thread ---------------------------------- */

typedef struct {
    const cx_attn_geom *g;
    char *scratch;
    int64_t lane_floats, lanes;
    atomic_int_fast64_t next;
    float *out;
    const float *q, *k, *v, *o, *dout;
    bool backward;
} attn_job;

static void bwd_head(const attn_job *j, float *lane, int64_t n, int64_t h);

static void attn_each(void *p, int64_t tid, int64_t nthreads)
{
    attn_job *j = p;
    if (tid >= min64(j->lanes, nthreads)) return;
    float *lane = (float *)(void *)(j->scratch + (size_t)tid * (size_t)j->lane_floats * sizeof(float));
    const cx_attn_geom *g = j->g;
    fwd_lane L = j->backward ? (fwd_lane){ 0 } : fwd_lane_at(g, lane);
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (t >= g->n * g->h) return;
        if (j->backward) bwd_head(j, lane, t / g->h, t % g->h);
        else fwd_head(g, &L, j->out, j->q, j->k, j->v, t / g->h, t % g->h);
    }
}

static float *align_scratch(void *scratch)
{
    uintptr_t p = (uintptr_t)scratch;
    return (float *)(void *)((p + 63) & ~(uintptr_t)63);
}

static size_t scratch_for(int64_t lane_floats, const cx_attn_geom *g)
{
    int64_t lanes = min64(g->n * g->h, cx_get_num_threads() > 0 ? cx_get_num_threads() : 1);
    return (size_t)(lanes * lane_floats) * sizeof(float) + 64;
}

static void run_lanes(attn_job *j, void *scratch, size_t scratch_bytes)
{
    j->scratch = (char *)align_scratch(scratch);
    size_t usable = scratch_bytes - (size_t)(j->scratch - (char *)scratch);
    j->lanes = (int64_t)(usable / ((size_t)j->lane_floats * sizeof(float)));
    if (j->lanes < 1) j->lanes = 1;   /* never: the scratch is sized for one lane at least */
    atomic_init(&j->next, 0);
    cx_pool_run_each(attn_each, j);
}

size_t cx_attention_scratch_bytes(const cx_attn_geom *g) { return scratch_for(fwd_lane_floats(g), g); }

void cx_attention_fwd(float *out, const float *q, const float *k, const float *v, const cx_attn_geom *g,
                      void *scratch, size_t scratch_bytes)
{
    if (g->n * g->h * g->t == 0) return;
    attn_job j = { .g = g, .lane_floats = fwd_lane_floats(g), .out = out, .q = q, .k = k, .v = v };
    if (g->s == 0) { memset(out, 0, sizeof *out * (size_t)(g->n * g->t * g->h * g->d)); return; }
    run_lanes(&j, scratch, scratch_bytes);
}

/* ---- backward ---------------------------------------------------------------------------- */

typedef struct {
    float *k, *v, *dk, *dv;   /* the head's keys and values and their gradients, (s, d) */
    float *q, *dout, *dq;     /* a query tile (scaled), its output gradient, its dq (BQ, d) */
    float *p, *dp;            /* a score tile and its gradient (BQ, BK) */
    float *lse, *delta;       /* per query row: log-sum-exp of its scores, rowsum(dO * O) */
} bwd_lane;

static int64_t bwd_lane_floats(const cx_attn_geom *g)
{
    return 4 * round_up(g->s * g->d) + 3 * round_up(BQ * g->d) + 2 * round_up(BQ * BK) + 2 * round_up(BQ);
}

static bwd_lane bwd_lane_at(const cx_attn_geom *g, float *base)
{
    bwd_lane L;
    const int64_t sd = round_up(g->s * g->d), qd = round_up(BQ * g->d), pk = round_up(BQ * BK);
    L.k = base; base += sd;
    L.v = base; base += sd;
    L.dk = base; base += sd;
    L.dv = base; base += sd;
    L.q = base; base += qd;
    L.dout = base; base += qd;
    L.dq = base; base += qd;
    L.p = base; base += pk;
    L.dp = base; base += pk;
    L.lse = base; base += round_up(BQ);
    L.delta = base;
    return L;
}

/* The log-sum-exp of each query row's visible scores (the forward's
 * softmax denominator), recomputed tile by tile. */
CX_HOT static void row_lse(const cx_attn_geom *g, const bwd_lane *L, int64_t q0, int64_t rows, int64_t kend)
{
    float m[BQ], l[BQ];
    for (int64_t i = 0; i < rows; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
    for (int64_t k0 = 0; k0 < kend; k0 += BK) {
        const int64_t cols = min64(BK, kend - k0);
        cx_sgemm_serial(false, true, rows, cols, g->d, L->q, g->d, L->k + k0 * g->d, g->d, 0.0f, L->p, BK);
        for (int64_t i = 0; i < rows; i++) {
            const float *s = L->p + i * BK;
            int64_t lim = min64(cols, cx_attn_visible_keys(g, q0 + i) - k0);
            if (lim <= 0) continue;
            float mx = m[i], sum = 0.0f;
            for (int64_t jj = 0; jj < lim; jj++) mx = s[jj] > mx ? s[jj] : mx;
            for (int64_t jj = 0; jj < lim; jj++) sum += cx_vexpf(s[jj] - mx);
            l[i] = l[i] * cx_vexpf(m[i] - mx) + sum;
            m[i] = mx;
        }
    }
    for (int64_t i = 0; i < rows; i++) L->lse[i] = l[i] > 0.0f ? m[i] + logf(l[i]) : INFINITY;
}

/* One key tile of a query tile: P from the log-sum-exp, then
 * dV += P^T dO, dP = dO V^T, dS = P (dP - delta), dQ += dS K, dK += dS^T Q. */
CX_HOT static void bwd_key_tile(const cx_attn_geom *g, const bwd_lane *L, int64_t q0, int64_t rows, int64_t k0, int64_t cols)
{
    const int64_t d = g->d;
    cx_sgemm_serial(false, true, rows, cols, d, L->q, d, L->k + k0 * d, d, 0.0f, L->p, BK);
    for (int64_t i = 0; i < rows; i++) {
        float *s = L->p + i * BK;
        int64_t lim = min64(cols, cx_attn_visible_keys(g, q0 + i) - k0);
        if (lim < 0) lim = 0;
        for (int64_t jj = 0; jj < lim; jj++) s[jj] = cx_vexpf(s[jj] - L->lse[i]);
        for (int64_t jj = lim; jj < cols; jj++) s[jj] = 0.0f;
    }
    cx_sgemm_serial(true, false, cols, d, rows, L->p, BK, L->dout, d, 1.0f, L->dv + k0 * d, d);
    cx_sgemm_serial(false, true, rows, cols, d, L->dout, d, L->v + k0 * d, d, 0.0f, L->dp, BK);
    for (int64_t i = 0; i < rows; i++) {
        float *ds = L->dp + i * BK;
        const float *pp = L->p + i * BK;
        for (int64_t jj = 0; jj < cols; jj++) ds[jj] = pp[jj] * (ds[jj] - L->delta[i]);
    }
    cx_sgemm_serial(false, false, rows, d, cols, L->dp, BK, L->k + k0 * d, d, 1.0f, L->dq, d);
    cx_sgemm_serial(true, false, cols, d, rows, L->dp, BK, L->q, d, 1.0f, L->dk + k0 * d, d);
}

/* The packed gradient: dq (n, t, h, d), then dk and dv (n, s, h, d). */
CX_HOT static void bwd_head(const attn_job *j, float *lane, int64_t n, int64_t h)
{
    const cx_attn_geom *g = j->g;
    const int64_t d = g->d;
    bwd_lane L = bwd_lane_at(g, lane);
    gather_rows(L.k, j->k, g->k_strides, n, 0, g->s, h, d, 1.0f);
    gather_rows(L.v, j->v, g->v_strides, n, 0, g->s, h, d, 1.0f);
    memset(L.dk, 0, sizeof *L.dk * (size_t)(g->s * d));
    memset(L.dv, 0, sizeof *L.dv * (size_t)(g->s * d));
    float *dq_out = j->out, *dk_out = dq_out + g->n * g->t * g->h * d, *dv_out = dk_out + g->n * g->s * g->h * d;
    for (int64_t q0 = 0; q0 < g->t; q0 += BQ) {
        const int64_t rows = min64(BQ, g->t - q0), kend = cx_attn_visible_keys(g, q0 + rows - 1);
        gather_rows(L.q, j->q, g->q_strides, n, q0, rows, h, d, g->scale);
        gather_rows(L.dout, j->dout, g->do_strides, n, q0, rows, h, d, 1.0f);
        for (int64_t i = 0; i < rows; i++) {
            const float *o = row_of(j->o, g->o_strides, n, q0 + i, h), *dout = L.dout + i * d;
            float acc = 0.0f;
            for (int64_t e = 0; e < d; e++) acc += dout[e] * o[e];
            L.delta[i] = acc;
        }
        memset(L.dq, 0, sizeof *L.dq * (size_t)(rows * d));
        row_lse(g, &L, q0, rows, kend);
        for (int64_t k0 = 0; k0 < kend; k0 += BK) bwd_key_tile(g, &L, q0, rows, k0, min64(BK, kend - k0));
        for (int64_t i = 0; i < rows; i++) {
            float *dst = dq_out + ((n * g->t + q0 + i) * g->h + h) * d;
            for (int64_t e = 0; e < d; e++) dst[e] = L.dq[i * d + e] * g->scale;
        }
    }
    /* dK accumulated dS^T (scale Q): the scale is already in */
    for (int64_t r = 0; r < g->s; r++) {
        memcpy(dk_out + ((n * g->s + r) * g->h + h) * d, L.dk + r * d, sizeof(float) * (size_t)d);
        memcpy(dv_out + ((n * g->s + r) * g->h + h) * d, L.dv + r * d, sizeof(float) * (size_t)d);
    }
}

size_t cx_attention_bwd_scratch_bytes(const cx_attn_geom *g) { return scratch_for(bwd_lane_floats(g), g); }

void cx_attention_bwd(float *dqkv, const float *q, const float *k, const float *v, const float *o, const float *dout,
                      const cx_attn_geom *g, void *scratch, size_t scratch_bytes)
{
    const int64_t total = g->n * g->h * g->d * (g->t + 2 * g->s);
    memset(dqkv, 0, sizeof *dqkv * (size_t)total);
    if (g->n * g->h == 0 || g->t == 0 || g->s == 0) return;
    attn_job j = { .g = g, .lane_floats = bwd_lane_floats(g), .out = dqkv, .q = q, .k = k, .v = v, .o = o,
                   .dout = dout, .backward = true };
    run_lanes(&j, scratch, scratch_bytes);
}
