/* Scaled dot-product attention on a CPU, per (batch, head) task, the
 * (T, S) score matrix never in memory at once. Two routes:
 *
 * rows: a block of query rows (RB, or RB_CAUSAL) against all the keys it
 * may see at once, (rows, visible) scores in the lane's scratch: one plain
 * softmax per row (no running max); the GEMMs read q, k, v, dout in place
 * (their strided rows are BLAS leading dimensions) and write out, dq, dk,
 * dv in place (the gradients packed or interleaved, kernels.h). A causal
 * block computes only the keys its last row sees. Up to ROWS_MAX_S keys,
 * where the block's scores and their gradient stay in L2.
 *
 * tiled: (BQ, BK) tiles with an online softmax (running max and sum per
 * row), gathered copies of the head: any S, any strides. Its backward
 * recomputes each row's log-sum-exp in an extra pass over the keys.
 *
 * Both backwards accumulate dK and dV of a head in the task alone, so no two
 * tasks write the same element and the result does not depend on the
 * thread count. */
#include "kernels.h"
#include "pool.h"
#include "vmath.h"
#include <cxla/core.h>

#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

enum { BQ = 64, BK = 64, RB = 64, RB_CAUSAL = 32, ROWS_MAX_S = 1024, ALIGN_FLOATS = 16 };

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

void cx_attn_grad_places(const cx_attn_geom *g, int64_t n, int64_t h, int64_t at[3], int64_t *ld)
{
    const int64_t hd = g->h * g->d;
    if (g->interleaved) {
        at[0] = n * g->t * 3 * hd + h * g->d;
        at[1] = at[0] + hd;
        at[2] = at[0] + 2 * hd;
        *ld = 3 * hd;
        return;
    }
    at[0] = n * g->t * hd + h * g->d;
    at[1] = g->n * g->t * hd + n * g->s * hd + h * g->d;
    at[2] = at[1] + g->n * g->s * hd;
    *ld = hd;
}

typedef struct {
    float *dq, *dk, *dv;
    int64_t ld;
} grad_head;

static grad_head grads_of(const cx_attn_geom *g, float *dqkv, int64_t n, int64_t h)
{
    int64_t at[3], ld;
    cx_attn_grad_places(g, n, h, at, &ld);
    return (grad_head){ dqkv + at[0], dqkv + at[1], dqkv + at[2], ld };
}

/* ---- the rows route ---------------------------------------------------------------------- */

static int64_t rows_ld(const cx_attn_geom *g) { return round_up(g->s); }

/* query rows per block: a causal block computes the keys its last row
 * sees, so smaller blocks skip more of the masked triangle (measured on
 * t = 128 and d 64 or 128: 32 rows beat 64 by 5-10 %; at t = 1024 they
 * lose 4 %) */
static int64_t rows_block(const cx_attn_geom *g) { return g->causal ? RB_CAUSAL : RB; }

/* The forward's scores (RB, s) and K^T (d, s); the backward's also the
 * scores' gradient, V^T and delta. K and V are transposed once a head so
 * that Q K^T and dO V^T are plain products: OpenBLAS ran the transposed
 * ones (a causal block's 32 x 128 x 64) at about half the rate (Zen 5,
 * one thread: 129 against 243 GFLOP/s with its AVX-512 kernels, 91
 * against 103 with Haswell's), and a head's transpose costs under a
 * microsecond. */
static int64_t scores_floats(const cx_attn_geom *g) { return round_up(RB * rows_ld(g)); }
static int64_t transposed_floats(const cx_attn_geom *g) { return round_up(g->d * rows_ld(g)); }

static int64_t rows_lane_floats(const cx_attn_geom *g, bool bwd)
{
    const int64_t p = scores_floats(g), t = transposed_floats(g);
    return bwd ? 2 * p + 2 * t + round_up(RB) : p + t;
}

typedef struct {
    float *p, *kt;          /* the block's scores, then P; the head's K^T */
    float *dp, *vt, *delta; /* the backward's: dP, then dS; the head's V^T; delta */
} rows_lane;

static rows_lane rows_lane_at(const cx_attn_geom *g, float *base, bool bwd)
{
    const int64_t p = scores_floats(g), t = transposed_floats(g);
    rows_lane L = { .p = base, .kt = base + p };
    if (bwd) {
        L.dp = L.kt + t;
        L.vt = L.dp + p;
        L.delta = L.vt + t;
    }
    return L;
}

/* dst (d, s), ld rows_ld = the head's (s, d) rows, stride st, transposed */
static void transpose_head(const cx_attn_geom *g, float *dst, const float *src, int64_t st)
{
    cblas_somatcopy(CblasRowMajor, CblasTrans, (blasint)g->s, (blasint)g->d, 1.0f, src, (blasint)st, dst,
                    (blasint)rows_ld(g));
}

/* BLAS reads a head's rows in place when its row stride is a leading
 * dimension (>= d); a broadcast or overlapping view takes the tiled route */
static bool rows_fit(const cx_attn_geom *g, bool bwd)
{
    bool ok = g->s <= ROWS_MAX_S && g->q_strides[1] >= g->d && g->k_strides[1] >= g->d && g->v_strides[1] >= g->d;
    return ok && (!bwd || g->do_strides[1] >= g->d);
}

/* The softmax and delta loops once per vector width (attention_rows_width.h
 * says why), picked by cx_isa_active(); off x86 only the baseline's */
#define WIDTH_FILE "attention_rows_width.h"
#include "each_width.h"

/* P (rows, kend) = the softmax of the block's scores, ld rows_ld */
static void rows_probs(const cx_attn_geom *g, const rows_lane *L, const float *q, int64_t q0, int64_t rows, int64_t kend)
{
    const int64_t ld = rows_ld(g);
    cx_sgemm_serial(false, false, rows, kend, g->d, q, g->q_strides[1], L->kt, ld, 0.0f, L->p, ld);
    CX_BY_WIDTH(softmax_rows)(L->p, ld, g, q0, rows, kend);
}

/* q, k, v at the head's first row; out at the head's first row of (n, t, h, d) */
static void rows_fwd_head(const cx_attn_geom *g, float *lane, float *out, const float *q, const float *k, const float *v)
{
    const int64_t od = g->h * g->d;
    const rows_lane L = rows_lane_at(g, lane, false);
    transpose_head(g, L.kt, k, g->k_strides[1]);
    for (int64_t q0 = 0; q0 < g->t; q0 += rows_block(g)) {
        const int64_t rows = min64(rows_block(g), g->t - q0), kend = cx_attn_visible_keys(g, q0 + rows - 1);
        float *o = out + q0 * od;
        if (kend == 0) {
            for (int64_t i = 0; i < rows; i++) memset(o + i * od, 0, sizeof *o * (size_t)g->d);
            continue;
        }
        rows_probs(g, &L, q + q0 * g->q_strides[1], q0, rows, kend);
        cx_sgemm_serial(false, false, rows, g->d, kend, L.p, rows_ld(g), v, g->v_strides[1], 0.0f, o, od);
    }
}

/* dS = scale * P (dP - delta) in place of dP: the scale of the scores
 * folded in, so dQ and dK need no pass of their own */
CX_HOT static void rows_dscores(float *dp, const float *p, const float *delta, int64_t rows, int64_t kend, int64_t ld,
                                float scale)
{
    for (int64_t i = 0; i < rows; i++) {
        float *ds = dp + i * ld;
        const float *pp = p + i * ld, di = delta[i];
        for (int64_t j = 0; j < kend; j++) ds[j] = scale * pp[j] * (ds[j] - di);
    }
}

typedef struct {
    const float *q, *k, *v, *o, *dout;   /* the head's first rows */
    grad_head grad;
} rows_head;

/* rows of a head's (rows, d) slice of an (.., h, d) tensor to 0: each task
 * zeroes what it accumulates into, in parallel, rather than the caller
 * the whole packed gradient on one thread */
static void zero_rows(float *x, int64_t rows, int64_t ld, int64_t d)
{
    for (int64_t r = 0; r < rows; r++) memset(x + r * ld, 0, sizeof *x * (size_t)d);
}

/* per query block: dV += P^T dO, dP = dO V^T, dQ = dS K, dK += dS^T Q
 * (K^T and V^T transposed once, above) */
static void rows_bwd_head(const cx_attn_geom *g, float *lane, const rows_head *x)
{
    const int64_t d = g->d, gl = x->grad.ld, ld = rows_ld(g);
    const rows_lane L = rows_lane_at(g, lane, true);
    float *p = L.p, *dp = L.dp, *delta = L.delta;
    float *dq = x->grad.dq, *dk = x->grad.dk, *dv = x->grad.dv;
    transpose_head(g, L.kt, x->k, g->k_strides[1]);
    transpose_head(g, L.vt, x->v, g->v_strides[1]);
    zero_rows(dk, g->s, gl, d);
    zero_rows(dv, g->s, gl, d);
    for (int64_t q0 = 0; q0 < g->t; q0 += rows_block(g)) {
        const int64_t rows = min64(rows_block(g), g->t - q0), kend = cx_attn_visible_keys(g, q0 + rows - 1);
        if (kend == 0) { zero_rows(dq + q0 * gl, rows, gl, d); continue; }
        const float *q = x->q + q0 * g->q_strides[1], *dout = x->dout + q0 * g->do_strides[1];
        rows_probs(g, &L, q, q0, rows, kend);
        CX_BY_WIDTH(row_dots)(delta, dout, g->do_strides[1], x->o + q0 * g->o_strides[1], g->o_strides[1], rows, d);
        cx_sgemm_serial(true, false, kend, d, rows, p, ld, dout, g->do_strides[1], 1.0f, dv, gl);
        cx_sgemm_serial(false, false, rows, kend, d, dout, g->do_strides[1], L.vt, ld, 0.0f, dp, ld);
        rows_dscores(dp, p, delta, rows, kend, ld, g->scale);
        cx_sgemm_serial(false, false, rows, d, kend, dp, ld, x->k, g->k_strides[1], 0.0f, dq + q0 * gl, gl);
        cx_sgemm_serial(true, false, kend, d, rows, dp, ld, q, g->q_strides[1], 1.0f, dk, gl);
    }
}

/* ---- one head over contiguous copies (attention_bf16.c's heads route) ---------------------- */

/* g's head alone: one image, one head, rows d apart */
static cx_attn_geom head_geom(const cx_attn_geom *g)
{
    cx_attn_geom c = *g;
    const int64_t qs[3] = { g->t * g->d, g->d, g->d }, ks[3] = { g->s * g->d, g->d, g->d };
    c.n = 1;
    c.h = 1;
    memcpy(c.q_strides, qs, sizeof qs);
    memcpy(c.o_strides, qs, sizeof qs);
    memcpy(c.do_strides, qs, sizeof qs);
    memcpy(c.k_strides, ks, sizeof ks);
    memcpy(c.v_strides, ks, sizeof ks);
    c.interleaved = false;
    return c;
}

bool cx_attention_head_fits(const cx_attn_geom *g) { return g->s <= ROWS_MAX_S && g->d > 0; }

int64_t cx_attention_head_lane_floats(const cx_attn_geom *g, bool bwd) { return rows_lane_floats(g, bwd); }

void cx_attention_head_fwd(const cx_attn_geom *g, float *lane, float *out, const float *q, const float *k, const float *v)
{
    const cx_attn_geom c = head_geom(g);
    rows_fwd_head(&c, lane, out, q, k, v);
}

void cx_attention_head_bwd(const cx_attn_geom *g, float *lane, float *dq, float *dk, float *dv, const float *q,
                           const float *k, const float *v, const float *o, const float *dout)
{
    const cx_attn_geom c = head_geom(g);
    const rows_head x = { .q = q, .k = k, .v = v, .o = o, .dout = dout, .grad = { dq, dk, dv, g->d } };
    rows_bwd_head(&c, lane, &x);
}

/* ---- lanes: one scratch block per participating thread ---------------------------------- */

typedef struct {
    const cx_attn_geom *g;
    char *scratch;
    int64_t lane_floats, lanes;
    atomic_int_fast64_t next;
    float *out;
    const float *q, *k, *v, *o, *dout;
    bool backward, rows;
} attn_job;

static void bwd_head(const attn_job *j, float *lane, int64_t n, int64_t h);

static const float *head_of(const float *base, const int64_t *st, int64_t n, int64_t h) { return row_of(base, st, n, 0, h); }

static void rows_task(const attn_job *j, float *lane, int64_t n, int64_t h)
{
    const cx_attn_geom *g = j->g;
    const int64_t d = g->d, od = g->h * d;
    if (!j->backward) {
        rows_fwd_head(g, lane, j->out + n * g->t * od + h * d, head_of(j->q, g->q_strides, n, h),
                      head_of(j->k, g->k_strides, n, h), head_of(j->v, g->v_strides, n, h));
        return;
    }
    rows_head x = { .q = head_of(j->q, g->q_strides, n, h), .k = head_of(j->k, g->k_strides, n, h),
                    .v = head_of(j->v, g->v_strides, n, h), .o = head_of(j->o, g->o_strides, n, h),
                    .dout = head_of(j->dout, g->do_strides, n, h), .grad = grads_of(g, j->out, n, h) };
    rows_bwd_head(g, lane, &x);
}

static void attn_each(void *p, int64_t tid, int64_t nthreads)
{
    attn_job *j = p;
    if (tid >= min64(j->lanes, nthreads)) return;
    float *lane = (float *)(void *)(j->scratch + (size_t)tid * (size_t)j->lane_floats * sizeof(float));
    const cx_attn_geom *g = j->g;
    fwd_lane L = j->backward || j->rows ? (fwd_lane){ 0 } : fwd_lane_at(g, lane);
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (t >= g->n * g->h) return;
        if (j->rows) rows_task(j, lane, t / g->h, t % g->h);
        else if (j->backward) bwd_head(j, lane, t / g->h, t % g->h);
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

static int64_t fwd_lane_floats(const cx_attn_geom *g);
static int64_t bwd_lane_floats(const cx_attn_geom *g);

static int64_t lane_floats_of(const cx_attn_geom *g, bool bwd, bool tiled)
{
    return tiled ? (bwd ? bwd_lane_floats(g) : fwd_lane_floats(g)) : rows_lane_floats(g, bwd);
}

size_t cx_attention_route_scratch_bytes(const cx_attn_geom *g, bool bwd, bool tiled)
{
    return scratch_for(lane_floats_of(g, bwd, tiled || !rows_fit(g, bwd)), g);
}

/* The rows route where it fits and the scratch has room for one of its
 * lanes: a scratch planned by an older build (a persistent-cache
 * executable) may be sized for the tiled route only. */
static bool take_rows(const cx_attn_geom *g, bool bwd, bool tiled, size_t scratch_bytes)
{
    return !tiled && rows_fit(g, bwd) && scratch_bytes >= (size_t)rows_lane_floats(g, bwd) * sizeof(float) + 64;
}

size_t cx_attention_scratch_bytes(const cx_attn_geom *g) { return cx_attention_route_scratch_bytes(g, false, false); }

size_t cx_attention_min_scratch_bytes(const cx_attn_geom *g, bool bwd)
{
    /* nothing to compute: the routes return before the scratch */
    if (g->n * g->h * g->t == 0 || g->s == 0 || g->d == 0) return 0;
    /* take_rows: rows from one rows lane up, tiled below it */
    size_t tiled = (size_t)lane_floats_of(g, bwd, true) * sizeof(float) + 64;
    if (!rows_fit(g, bwd)) return tiled;
    size_t rows = (size_t)rows_lane_floats(g, bwd) * sizeof(float) + 64;
    return rows < tiled ? rows : tiled;
}

void cx_attention_route_fwd(float *out, const float *q, const float *k, const float *v, const cx_attn_geom *g,
                            void *scratch, size_t scratch_bytes, bool tiled)
{
    /* no head dimension: nothing to write (and no matrix a BLAS accepts) */
    if (g->n * g->h * g->t == 0 || g->d == 0) return;
    if (g->s == 0) { memset(out, 0, sizeof *out * (size_t)(g->n * g->t * g->h * g->d)); return; }
    const bool rows = take_rows(g, false, tiled, scratch_bytes);
    attn_job j = { .g = g, .lane_floats = lane_floats_of(g, false, !rows), .out = out, .q = q, .k = k, .v = v,
                   .rows = rows };
    run_lanes(&j, scratch, scratch_bytes);
}

void cx_attention_fwd(float *out, const float *q, const float *k, const float *v, const cx_attn_geom *g,
                      void *scratch, size_t scratch_bytes)
{
    cx_attention_route_fwd(out, q, k, v, g, scratch, scratch_bytes, false);
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

CX_HOT static void bwd_head(const attn_job *j, float *lane, int64_t n, int64_t h)
{
    const cx_attn_geom *g = j->g;
    const int64_t d = g->d;
    bwd_lane L = bwd_lane_at(g, lane);
    gather_rows(L.k, j->k, g->k_strides, n, 0, g->s, h, d, 1.0f);
    gather_rows(L.v, j->v, g->v_strides, n, 0, g->s, h, d, 1.0f);
    memset(L.dk, 0, sizeof *L.dk * (size_t)(g->s * d));
    memset(L.dv, 0, sizeof *L.dv * (size_t)(g->s * d));
    const grad_head out = grads_of(g, j->out, n, h);
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
            float *dst = out.dq + (q0 + i) * out.ld;
            for (int64_t e = 0; e < d; e++) dst[e] = L.dq[i * d + e] * g->scale;
        }
    }
    /* dK accumulated dS^T (scale Q): the scale is already in */
    for (int64_t r = 0; r < g->s; r++) {
        memcpy(out.dk + r * out.ld, L.dk + r * d, sizeof(float) * (size_t)d);
        memcpy(out.dv + r * out.ld, L.dv + r * d, sizeof(float) * (size_t)d);
    }
}

size_t cx_attention_bwd_scratch_bytes(const cx_attn_geom *g) { return cx_attention_route_scratch_bytes(g, true, false); }

void cx_attention_route_bwd(float *dqkv, const float *q, const float *k, const float *v, const float *o,
                            const float *dout, const cx_attn_geom *g, void *scratch, size_t scratch_bytes, bool tiled)
{
    /* both routes write every element of a head's dq, dk and dv */
    if (g->n * g->h * g->d == 0 || g->t == 0 || g->s == 0) {
        memset(dqkv, 0, sizeof *dqkv * (size_t)(g->n * g->h * g->d * (g->t + 2 * g->s)));
        return;
    }
    const bool rows = take_rows(g, true, tiled, scratch_bytes);
    attn_job j = { .g = g, .lane_floats = lane_floats_of(g, true, !rows), .out = dqkv, .q = q, .k = k, .v = v,
                   .o = o, .dout = dout, .backward = true, .rows = rows };
    run_lanes(&j, scratch, scratch_bytes);
}

void cx_attention_bwd(float *dqkv, const float *q, const float *k, const float *v, const float *o, const float *dout,
                      const cx_attn_geom *g, void *scratch, size_t scratch_bytes)
{
    cx_attention_route_bwd(dqkv, q, k, v, o, dout, g, scratch, scratch_bytes, false);
}
