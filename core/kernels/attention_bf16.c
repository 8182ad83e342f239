/* bf16 attention, the graph's tensors (what is saved for backward and
 * moved between kernels) bf16 throughout. Three routes:
 *  - heads: one (image, head) task at a time in the thread's lane, where
 *    the rows route fits (up to 1024 keys), on every CPU. With
 *    AVX512_BF16 it runs the rows route's steps on the bf16 values, its
 *    products on the bf16 micro-kernel (below: "the heads route's bf16
 *    products"); without, it widens the head's q, k, v (and o, dout) into
 *    f32 copies, runs the f32 rows route (attention.c) on them and rounds
 *    its result into place, the copies O(T D) against the head's O(T S D)
 *    work. Per block of query rows, both skip the keys the block cannot
 *    see, which the GEMM route's whole-chunk products compute (on the
 *    gpt's shape that route ran at 0.74x of the f32 kernel, the widening
 *    heads 1.08x, the bf16 products 1.4x);
 *  - GEMM (with AVX512_BF16, longer sequences): a chunk of images at a
 *    time, q, k, v gathered head-major in bf16, the score and value
 *    products (Q K^T, P V, and backward's dO V^T, P^T dO, dS K, dS^T Q) on
 *    the bf16 GEMM (gemm_bf16.c) with f32 sums, the softmax and its
 *    statistics in f32, P and dS rounded to bf16 for their products, as
 *    PyTorch's bf16 attention does;
 *  - widening (without it, longer sequences): a chunk of images widened
 *    into contiguous f32 copies in the scratch for the f32 kernels, the
 *    results rounded once. */
#include "kernels.h"
#include "pool.h"
#include "cx_assert.h"
#include "cx_bf16.h"
#include "vmath.h"
#include <cxla/core.h>

#include <stdatomic.h>
#include <string.h>

enum { ALIGN_BYTES = 64 };

static size_t aligned(size_t b) { return (b + ALIGN_BYTES - 1) / ALIGN_BYTES * ALIGN_BYTES; }

/* g with q, k, v, o and dout contiguous (N, T|S, H, D) */
static cx_attn_geom contiguous(const cx_attn_geom *g)
{
    cx_attn_geom c = *g;
    int64_t qs[3] = { g->t * g->h * g->d, g->h * g->d, g->d }, ks[3] = { g->s * g->h * g->d, g->h * g->d, g->d };
    memcpy(c.q_strides, qs, sizeof qs);
    memcpy(c.o_strides, qs, sizeof qs);
    memcpy(c.do_strides, qs, sizeof qs);
    memcpy(c.k_strides, ks, sizeof ks);
    memcpy(c.v_strides, ks, sizeof ks);
    c.interleaved = false;   /* the f32 copies' gradients are packed; round_grads places them */
    return c;
}

typedef struct {
    float *dst;
    const uint16_t *src;
    const int64_t *st;   /* element strides of the source's N, T|S, H dims */
    int64_t rows, h, d;  /* rows per image, heads, head dim */
} widen_job;

/* rows [lo, hi) of the flattened (N * rows * H) head rows */
CX_HOT static void widen_part(void *p, int64_t lo, int64_t hi)
{
    const widen_job *w = p;
    for (int64_t r = lo; r < hi; r++) {
        int64_t hh = r % w->h, t = r / w->h % w->rows, n = r / (w->h * w->rows);
        const uint16_t *s = w->src + n * w->st[0] + t * w->st[1] + hh * w->st[2];
        float *o = w->dst + r * w->d;
        for (int64_t e = 0; e < w->d; e++) o[e] = cx_bf16_to_f32_inline(s[e]);
    }
}

static void widen(float *dst, const uint16_t *src, const int64_t *st, int64_t n, int64_t rows, int64_t h, int64_t d)
{
    widen_job w = { dst, src, st, rows, h, d };
    cx_pool_parallel_for(n * rows * h, 64, widen_part, &w);
}

typedef struct { uint16_t *dst; const float *src; } round_job;

CX_HOT static void round_part(void *p, int64_t lo, int64_t hi)
{
    const round_job *r = p;
    for (int64_t i = lo; i < hi; i++) r->dst[i] = cx_f32_to_bf16_inline(r->src[i]);
}

static void round_all(uint16_t *dst, const float *src, int64_t n)
{
    round_job r = { dst, src };
    cx_pool_parallel_for(n, 4096, round_part, &r);
}

/* Images per call of the f32 kernels: their copies are what the scratch
 * holds, so a chunk of the batch rather than all of it (a step's peak
 * memory counts the scratch); at least 16 (image, head) tasks per call
 * keep the pool's threads busy. Independent of the thread count, so the
 * scratch planned at compile time fits whatever the pool has. */
static int64_t chunk_of(const cx_attn_geom *g)
{
    int64_t c = (16 + g->h - 1) / g->h;
    return c < g->n ? c : g->n;
}

/* the geometry of nb images, contiguous */
static cx_attn_geom chunk_geom(const cx_attn_geom *g, int64_t nb)
{
    cx_attn_geom c = contiguous(g);
    c.n = nb;
    return c;
}

static size_t widen_fwd_scratch(const cx_attn_geom *g)
{
    int64_t nb = chunk_of(g);
    cx_attn_geom c = chunk_geom(g, nb);
    size_t tq = (size_t)(nb * g->t * g->h * g->d) * 4, tk = (size_t)(nb * g->s * g->h * g->d) * 4;
    /* q, k, v, then the f32 output */
    return 2 * aligned(tq) + 2 * aligned(tk) + ALIGN_BYTES + cx_attention_scratch_bytes(&c);
}

static void widen_fwd(uint16_t *out, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                           const cx_attn_geom *g, void *scratch, size_t scratch_bytes)
{
    const int64_t chunk = chunk_of(g), qi = g->t * g->h * g->d;
    size_t tq = (size_t)(chunk * qi) * 4, tk = (size_t)(chunk * g->s * g->h * g->d) * 4;
    char *base = (char *)(((uintptr_t)scratch + ALIGN_BYTES - 1) & ~(uintptr_t)(ALIGN_BYTES - 1));
    float *qf = (float *)base, *kf = (float *)(base + aligned(tq)), *vf = (float *)(base + aligned(tq) + aligned(tk));
    float *of = (float *)(base + aligned(tq) + 2 * aligned(tk));
    char *rest = base + 2 * aligned(tq) + 2 * aligned(tk);
    CX_ASSERT((size_t)(rest - (char *)scratch) <= scratch_bytes);
    for (int64_t n0 = 0; n0 < g->n; n0 += chunk) {
        int64_t nb = g->n - n0 < chunk ? g->n - n0 : chunk;
        cx_attn_geom c = chunk_geom(g, nb);
        widen(qf, q + n0 * g->q_strides[0], g->q_strides, nb, g->t, g->h, g->d);
        widen(kf, k + n0 * g->k_strides[0], g->k_strides, nb, g->s, g->h, g->d);
        widen(vf, v + n0 * g->v_strides[0], g->v_strides, nb, g->s, g->h, g->d);
        cx_attention_fwd(of, qf, kf, vf, &c, rest, scratch_bytes - (size_t)(rest - (char *)scratch));
        round_all(out + n0 * qi, of, nb * qi);
    }
}

static size_t widen_bwd_scratch(const cx_attn_geom *g)
{
    int64_t nb = chunk_of(g);
    cx_attn_geom c = chunk_geom(g, nb);
    size_t tq = (size_t)(nb * g->t * g->h * g->d) * 4, tk = (size_t)(nb * g->s * g->h * g->d) * 4;
    /* q, k, v, o, dout, then dq dk dv */
    return 3 * aligned(tq) + 2 * aligned(tk) + aligned(tq + 2 * tk) + ALIGN_BYTES + cx_attention_bwd_scratch_bytes(&c);
}

/* one chunk of images [n0, n0 + nb): its f32 gradients dq | dk | dv into
 * their places in dqkv: packed (dq (N, T, H, D), then dk and dv (N, S, H,
 * D)) or interleaved ((N, T, 3, H, D), t == s) */
static void round_grads(uint16_t *dqkv, const float *grads, const cx_attn_geom *g, int64_t n0, int64_t nb)
{
    const int64_t hd = g->h * g->d, qi = g->t * hd, ki = g->s * hd;
    if (!g->interleaved) {
        round_all(dqkv + n0 * qi, grads, nb * qi);
        round_all(dqkv + g->n * qi + n0 * ki, grads + nb * qi, nb * ki);
        round_all(dqkv + g->n * (qi + ki) + n0 * ki, grads + nb * (qi + ki), nb * ki);
        return;
    }
    for (int part = 0; part < 3; part++)
        for (int64_t r = 0; r < nb * g->t; r++)
            round_all(dqkv + (n0 * g->t + r) * 3 * hd + part * hd, grads + part * nb * qi + r * hd, hd);
}

static void widen_bwd(uint16_t *dqkv, const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *o,
                           const uint16_t *dout, const cx_attn_geom *g, void *scratch, size_t scratch_bytes)
{
    const int64_t chunk = chunk_of(g);
    size_t tq = (size_t)(chunk * g->t * g->h * g->d) * 4, tk = (size_t)(chunk * g->s * g->h * g->d) * 4;
    char *base = (char *)(((uintptr_t)scratch + ALIGN_BYTES - 1) & ~(uintptr_t)(ALIGN_BYTES - 1));
    float *qf = (float *)base, *kf = (float *)(base + aligned(tq)), *vf = (float *)(base + aligned(tq) + aligned(tk));
    float *of = (float *)(base + aligned(tq) + 2 * aligned(tk)), *df = (float *)(base + 2 * aligned(tq) + 2 * aligned(tk));
    float *grads = (float *)(base + 3 * aligned(tq) + 2 * aligned(tk));
    char *rest = (char *)grads + aligned(tq + 2 * tk);
    CX_ASSERT((size_t)(rest - (char *)scratch) <= scratch_bytes);
    for (int64_t n0 = 0; n0 < g->n; n0 += chunk) {
        int64_t nb = g->n - n0 < chunk ? g->n - n0 : chunk;
        cx_attn_geom c = chunk_geom(g, nb);
        widen(qf, q + n0 * g->q_strides[0], g->q_strides, nb, g->t, g->h, g->d);
        widen(kf, k + n0 * g->k_strides[0], g->k_strides, nb, g->s, g->h, g->d);
        widen(vf, v + n0 * g->v_strides[0], g->v_strides, nb, g->s, g->h, g->d);
        widen(of, o + n0 * g->o_strides[0], g->o_strides, nb, g->t, g->h, g->d);
        widen(df, dout + n0 * g->do_strides[0], g->do_strides, nb, g->t, g->h, g->d);
        cx_attention_bwd(grads, qf, kf, vf, of, df, &c, rest, scratch_bytes - (size_t)(rest - (char *)scratch));
        round_grads(dqkv, grads, g, n0, nb);
    }
}

/* ---- the GEMM route ------------------------------------------------------------------------
 * Per chunk of nb images, B = nb * H heads, each operand head-major:
 * q, dout (B, T, D), k, v (B, S, D), scores and P (B, T, S). */

typedef struct {
    uint16_t *q, *k, *v, *dout, *p16, *ds16, *out;   /* out: (B, T | S, D) results before scatter */
    float *sc, *dp;                                  /* scores (then P), dP (then dS) */
    char *rest;
    size_t left;
} attn_bufs;

static void gemm_sizes(const cx_attn_geom *g, int64_t nb, bool bwd, size_t *fixed, size_t *mm)
{
    const int64_t b = nb * g->h, td = b * g->t * g->d, sd = b * g->s * g->d, ts = b * g->t * g->s;
    size_t f = ALIGN_BYTES + aligned((size_t)td * 2) + 2 * aligned((size_t)sd * 2) + aligned((size_t)ts * 4)
               + aligned((size_t)ts * 2);
    /* forward: the output (B, T, D); backward: dout, dP, and dq | dk | dv
     * (dS takes P's bf16 copy once dV has read it) */
    f += bwd ? aligned((size_t)td * 2) + aligned((size_t)ts * 4) + aligned((size_t)(td + 2 * sd) * 2)
             : aligned((size_t)td * 2);
    *fixed = f;
    /* the largest of the products' scratch: (T, S, D), (T, D, S), (S, D, T) */
    size_t a = cx_matmul_bf16_scratch_bytes(b, g->t, g->s, g->d), c = cx_matmul_bf16_scratch_bytes(b, g->t, g->d, g->s);
    size_t e = bwd ? cx_matmul_bf16_scratch_bytes(b, g->s, g->d, g->t) : 0;
    *mm = a > c ? a : c;
    *mm = *mm > e ? *mm : e;
}

/* the least the GEMM route runs in: its buffers and one thread's tiles */
static size_t gemm_least(const cx_attn_geom *g, bool bwd)
{
    size_t fixed, mm;
    int64_t nb = chunk_of(g), b = nb * g->h;
    gemm_sizes(g, nb, bwd, &fixed, &mm);
    size_t a = cx_matmul_bf16_min_scratch_bytes(b, g->t, g->s, g->d), c = cx_matmul_bf16_min_scratch_bytes(b, g->t, g->d, g->s);
    size_t e = bwd ? cx_matmul_bf16_min_scratch_bytes(b, g->s, g->d, g->t) : 0;
    a = a > c ? a : c;
    return fixed + (a > e ? a : e);
}

static attn_bufs attn_carve(const cx_attn_geom *g, bool bwd, void *scratch, size_t scratch_bytes)
{
    const int64_t b = chunk_of(g) * g->h, td = b * g->t * g->d, sd = b * g->s * g->d, ts = b * g->t * g->s;
    attn_bufs u = { 0 };
    char *p = (char *)(((uintptr_t)scratch + ALIGN_BYTES - 1) & ~(uintptr_t)(ALIGN_BYTES - 1));
    u.q = (uint16_t *)p; p += aligned((size_t)td * 2);
    u.k = (uint16_t *)p; p += aligned((size_t)sd * 2);
    u.v = (uint16_t *)p; p += aligned((size_t)sd * 2);
    u.sc = (float *)p; p += aligned((size_t)ts * 4);
    u.p16 = (uint16_t *)p; p += aligned((size_t)ts * 2);
    if (bwd) {
        u.dout = (uint16_t *)p; p += aligned((size_t)td * 2);
        u.dp = (float *)p; p += aligned((size_t)ts * 4);
        u.ds16 = u.p16;
        u.out = (uint16_t *)p; p += aligned((size_t)(td + 2 * sd) * 2);
    } else {
        u.out = (uint16_t *)p; p += aligned((size_t)td * 2);
    }
    CX_ASSERT((size_t)(p - (char *)scratch) <= scratch_bytes);
    u.rest = p;
    u.left = scratch_bytes - (size_t)(p - (char *)scratch);
    return u;
}

/* Up to four operands moved by one pool dispatch (each dispatch is a
 * barrier of the pool's threads): gathered head-major (nb, H, rows, D)
 * from strided views, or scattered from head-major into contiguous
 * (nb, rows, H, D) ones. */
enum { MOVE_MAX = 4 };

typedef struct {
    int n;
    uint16_t *hm[MOVE_MAX];
    uint16_t *to[MOVE_MAX];          /* scatter: the destination, rows ld[] apart */
    int64_t ld[MOVE_MAX];
    const uint16_t *from[MOVE_MAX];  /* gather: the strided source */
    const int64_t *st[MOVE_MAX];     /* its element strides of N, T|S, H */
    int64_t rows[MOVE_MAX], first[MOVE_MAX + 1];   /* head rows before each operand */
    int64_t h, d;
    bool gather;
} move_job;

/* head rows [lo, hi) of the operands' (nb, H, rows) concatenated */
static void move_part(void *p, int64_t lo, int64_t hi)
{
    const move_job *m = p;
    int o = 0;
    for (int64_t x = lo; x < hi; x++) {
        while (x >= m->first[o + 1]) o++;
        int64_t r = x - m->first[o], rows = m->rows[o];
        int64_t t = r % rows, hh = r / rows % m->h, n = r / (rows * m->h);
        if (m->gather)
            memcpy(m->hm[o] + r * m->d, m->from[o] + n * m->st[o][0] + t * m->st[o][1] + hh * m->st[o][2],
                   sizeof(uint16_t) * (size_t)m->d);
        else
            memcpy(m->to[o] + (n * rows + t) * m->ld[o] + hh * m->d, m->hm[o] + r * m->d, sizeof(uint16_t) * (size_t)m->d);
    }
}

/* operand i: rows per image; the job's first[] from them, then the run */
static void move_run(move_job *m, int64_t nb)
{
    m->first[0] = 0;
    for (int i = 0; i < m->n; i++) m->first[i + 1] = m->first[i] + nb * m->h * m->rows[i];
    cx_pool_parallel_for(m->first[m->n], 64, move_part, m);
}

typedef struct {
    const cx_attn_geom *g;
    float *sc, *dp;
    uint16_t *p16, *ds16;
} soft_job;


/* Row reductions in 16 lanes, so they compile to vectors (a single f32
 * accumulator must keep its order); the lanes are combined in a fixed
 * order, so the result does not depend on the threads. */
enum { LANES = 16 };

static float lane_sum(const float *acc)
{
    float t = 0.0f;
    for (int l = 0; l < LANES; l++) t += acc[l];
    return t;
}

/* the largest scale s[c], c < n */
CX_HOT static float row_max(const float *s, int64_t n, float scale)
{
    float acc[LANES];
    for (int l = 0; l < LANES; l++) acc[l] = -INFINITY;
    int64_t c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int l = 0; l < LANES; l++) acc[l] = scale * s[c + l] > acc[l] ? scale * s[c + l] : acc[l];
    for (; c < n; c++) acc[0] = scale * s[c] > acc[0] ? scale * s[c] : acc[0];
    float m = acc[0];
    for (int l = 1; l < LANES; l++) m = acc[l] > m ? acc[l] : m;
    return m;
}

/* s[c] = exp(scale s[c] - shift) for c < n; their sum */
CX_HOT static float row_exp(float *s, int64_t n, float scale, float shift)
{
    float acc[LANES] = { 0 };
    int64_t c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int l = 0; l < LANES; l++) { s[c + l] = cx_vexpf(scale * s[c + l] - shift); acc[l] += s[c + l]; }
    for (; c < n; c++) { s[c] = cx_vexpf(scale * s[c] - shift); acc[0] += s[c]; }
    return lane_sum(acc);
}

/* rows [lo, hi) of (B, T): P = softmax(scale s) over the visible keys in
 * f32 (in place), 0 elsewhere, and its bf16 copy for the products */
CX_HOT static void softmax_part(void *p, int64_t lo, int64_t hi)
{
    const soft_job *j = p;
    const int64_t S = j->g->s;
    const float scale = j->g->scale;
    for (int64_t r = lo; r < hi; r++) {
        float *s = j->sc + r * S;
        uint16_t *h = j->p16 + r * S;
        int64_t lim = cx_attn_visible_keys(j->g, r % j->g->t);
        float sum = lim ? row_exp(s, lim, scale, row_max(s, lim, scale)) : 0.0f;
        float inv = lim ? 1.0f / sum : 0.0f;
        for (int64_t c = 0; c < lim; c++) { s[c] *= inv; h[c] = cx_f32_to_bf16_inline(s[c]); }
        for (int64_t c = lim; c < S; c++) { s[c] = 0.0f; h[c] = 0; }
    }
}

/* rows [lo, hi) of (B, T): dS = scale P (dP - sum_j P dP), rounded to bf16
 * for the products */
CX_HOT static void dsoftmax_part(void *p, int64_t lo, int64_t hi)
{
    const soft_job *j = p;
    const int64_t S = j->g->s;
    for (int64_t r = lo; r < hi; r++) {
        const float *pr = j->sc + r * S, *d = j->dp + r * S;
        uint16_t *h = j->ds16 + r * S;
        float acc[LANES] = { 0 };
        int64_t c = 0;
        for (; c + LANES <= S; c += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += pr[c + l] * d[c + l];
        for (; c < S; c++) acc[0] += pr[c] * d[c];
        float delta = lane_sum(acc);
        for (c = 0; c < S; c++) h[c] = cx_f32_to_bf16_inline(j->g->scale * pr[c] * (d[c] - delta));
    }
}

/* scores, then P (f32 in u->sc, bf16 in u->p16), of the chunk's B heads */
static void probabilities(const cx_attn_geom *g, const attn_bufs *u, int64_t b)
{
    cx_matmul_bf16_f32(u->sc, false, u->q, u->k, b, g->t, g->s, g->d, false, true, g->t * g->d, g->s * g->d, u->rest,
                       u->left);
    soft_job sj = { .g = g, .sc = u->sc, .p16 = u->p16 };
    cx_pool_parallel_for(b * g->t, 8, softmax_part, &sj);
}

static void gemm_fwd(uint16_t *out, const uint16_t *q, const uint16_t *k, const uint16_t *v, const cx_attn_geom *g,
                     void *scratch, size_t scratch_bytes)
{
    const int64_t chunk = chunk_of(g), qi = g->t * g->h * g->d;
    attn_bufs u = attn_carve(g, false, scratch, scratch_bytes);
    for (int64_t n0 = 0; n0 < g->n; n0 += chunk) {
        const int64_t nb = g->n - n0 < chunk ? g->n - n0 : chunk, b = nb * g->h;
        move_job in = { .n = 3, .hm = { u.q, u.k, u.v }, .st = { g->q_strides, g->k_strides, g->v_strides },
                        .from = { q + n0 * g->q_strides[0], k + n0 * g->k_strides[0], v + n0 * g->v_strides[0] },
                        .rows = { g->t, g->s, g->s }, .h = g->h, .d = g->d, .gather = true };
        move_run(&in, nb);
        probabilities(g, &u, b);
        cx_matmul_bf16(u.out, u.p16, u.v, b, g->t, g->d, g->s, false, false, g->t * g->s, g->s * g->d, u.rest, u.left);
        move_job res = { .n = 1, .hm = { u.out }, .to = { out + n0 * qi }, .ld = { g->h * g->d }, .rows = { g->t },
                         .h = g->h, .d = g->d };
        move_run(&res, nb);
    }
}

/* the chunk's dq, dk, dv (head-major in u->out) from P and dout */
static void grads(const cx_attn_geom *g, const attn_bufs *u, int64_t b)
{
    const int64_t td = g->t * g->d, sd = g->s * g->d, ts = g->t * g->s;
    uint16_t *dq = u->out, *dk = dq + b * td, *dv = dk + b * sd;
    /* dV = P^T dO, dP = dO V^T; then dS over P's bf16 copy */
    cx_matmul_bf16(dv, u->p16, u->dout, b, g->s, g->d, g->t, true, false, ts, td, u->rest, u->left);
    cx_matmul_bf16_f32(u->dp, false, u->dout, u->v, b, g->t, g->s, g->d, false, true, td, sd, u->rest, u->left);
    soft_job sj = { .g = g, .sc = u->sc, .dp = u->dp, .ds16 = u->ds16 };
    cx_pool_parallel_for(b * g->t, 8, dsoftmax_part, &sj);
    /* dQ = dS K, dK = dS^T Q */
    cx_matmul_bf16(dq, u->ds16, u->k, b, g->t, g->d, g->s, false, false, ts, sd, u->rest, u->left);
    cx_matmul_bf16(dk, u->ds16, u->q, b, g->s, g->d, g->t, true, false, ts, td, u->rest, u->left);
}

static void gemm_bwd(uint16_t *dqkv, const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *dout,
                     const cx_attn_geom *g, void *scratch, size_t scratch_bytes)
{
    /* P is recomputed from q and k, and softmax's backward needs only P
     * and dP, so the forward's output is not an input */
    const int64_t chunk = chunk_of(g), hd = g->h * g->d, qi = g->t * hd, ki = g->s * hd;
    attn_bufs u = attn_carve(g, true, scratch, scratch_bytes);
    for (int64_t n0 = 0; n0 < g->n; n0 += chunk) {
        const int64_t nb = g->n - n0 < chunk ? g->n - n0 : chunk, b = nb * g->h;
        move_job in = { .n = 4, .hm = { u.q, u.k, u.v, u.dout },
                        .st = { g->q_strides, g->k_strides, g->v_strides, g->do_strides },
                        .from = { q + n0 * g->q_strides[0], k + n0 * g->k_strides[0], v + n0 * g->v_strides[0],
                                  dout + n0 * g->do_strides[0] },
                        .rows = { g->t, g->s, g->s, g->t }, .h = g->h, .d = g->d, .gather = true };
        move_run(&in, nb);
        probabilities(g, &u, b);
        grads(g, &u, b);
        move_job res = { .n = 3, .hm = { u.out, u.out + b * g->t * g->d, u.out + b * (g->t + g->s) * g->d },
                         .to = { dqkv + n0 * qi, dqkv + g->n * qi + n0 * ki, dqkv + g->n * (qi + ki) + n0 * ki },
                         .ld = { hd, hd, hd }, .rows = { g->t, g->s, g->s }, .h = g->h, .d = g->d };
        if (g->interleaved) {
            /* (N, T, 3, H, D): each row's dq, dk, dv side by side */
            uint16_t *row0 = dqkv + n0 * g->t * 3 * hd;
            for (int part = 0; part < 3; part++) { res.to[part] = row0 + part * hd; res.ld[part] = 3 * hd; }
        }
        move_run(&res, nb);
    }
}

/* ---- the heads route ------------------------------------------------------------------------ */

static int64_t up16(int64_t n) { return (n + 15) / 16 * 16; }

static bool heads_fit(const cx_attn_geom *g)
{
    return cx_attention_head_fits(g) && g->n * g->h * g->t > 0 && g->s > 0;
}

/* a widening lane: the rows route's floats, then the copies: q k v out
 * forward; q k v o dout dq dk dv backward */
static int64_t widen_lane_floats(const cx_attn_geom *g, bool bwd)
{
    const int64_t td = up16(g->t * g->d), sd = up16(g->s * g->d);
    return up16(cx_attention_head_lane_floats(g, bwd)) + (bwd ? 4 * td + 4 * sd : 2 * td + 2 * sd);
}

static int64_t product_lane_floats(const cx_attn_geom *g, bool bwd);

/* A lane holds either variant's (heads_task), whichever the CPU runs: a
 * plan made under one CX_CPU_ISA (the persistent cache) runs under any. */
static int64_t heads_lane_floats(const cx_attn_geom *g, bool bwd)
{
    int64_t w = widen_lane_floats(g, bwd), p = product_lane_floats(g, bwd);
    return w > p ? w : p;
}

static size_t heads_least(const cx_attn_geom *g, bool bwd) { return (size_t)heads_lane_floats(g, bwd) * 4 + ALIGN_BYTES; }

static size_t heads_scratch(const cx_attn_geom *g, bool bwd)
{
    int64_t th = cx_get_num_threads() > 0 ? cx_get_num_threads() : 1, tasks = g->n * g->h;
    int64_t lanes = tasks < th ? (tasks > 0 ? tasks : 1) : th;
    return (size_t)(lanes * heads_lane_floats(g, bwd)) * 4 + ALIGN_BYTES;
}

typedef struct {
    const cx_attn_geom *g;
    float *lanes;
    int64_t lane_floats, nlanes;
    atomic_int_fast64_t next;
    uint16_t *out;
    const uint16_t *q, *k, *v, *o, *dout;
    bool bwd;
} heads_job;

/* head h of image n, (rows, d) rows st[1] apart, into dst (rows, d) */
CX_HOT static void widen_head(float *dst, const uint16_t *src, const int64_t *st, int64_t n, int64_t h, int64_t rows,
                              int64_t d)
{
    const uint16_t *s0 = src + n * st[0] + h * st[2];
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *s = s0 + r * st[1];
        float *o = dst + r * d;
        for (int64_t e = 0; e < d; e++) o[e] = cx_bf16_to_f32_inline(s[e]);
    }
}

/* src (rows, d), rows lds apart, rounded into dst's rows, ld apart */
CX_HOT static void round_rows_into(uint16_t *dst, int64_t ld, const float *src, int64_t lds, int64_t rows, int64_t d)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < d; e++) dst[r * ld + e] = cx_f32_to_bf16_inline(src[r * lds + e]);
}

static void round_head(uint16_t *dst, int64_t ld, const float *src, int64_t rows, int64_t d)
{
    round_rows_into(dst, ld, src, d, rows, d);
}

/* ---- the heads route's bf16 products (AVX512_BF16) ----------------------------------------
 * The rows route's steps on the head's bf16 values themselves: each block
 * of query rows against the keys it sees, its score and value products on
 * the bf16 micro-kernel with f32 sums, the softmax in f32, P and dS
 * rounded to bf16 for their products (as PyTorch's bf16 attention, and
 * this file's GEMM route). K^T's panels (and V^T's for dP) are packed once
 * a head; a block's own operands are copied or packed per block. A block's
 * products run over all the keys its last row sees, P being 0 for those
 * an earlier row may not: an inf or NaN in such a key's value (or its dP)
 * reaches that row as NaN, as in the GEMM route and PyTorch's math
 * attention, where the f32 rows route would not have read it. */

/* query rows per block: whole micro-tiles of rows. A causal block computes
 * the keys its last row sees, so one tile of rows skips the most of the
 * masked triangle (Zen 4, fwd + bwd against the f32 rows route, t = 128,
 * d 64: 12 rows 1.33x / 1.59x, 24 rows 1.30x / 1.45x); without a mask 48
 * rows (24: 1.42x / 1.45x, 48: 1.46x / 1.61x, 96: 1.24x / 1.39x). */
enum { PB = 4 * CX_BF16_TILE_ROWS, PB_CAUSAL = CX_BF16_TILE_ROWS };

static int64_t up_to(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
static int64_t product_rows(const cx_attn_geom *g) { return g->causal ? PB_CAUSAL : PB; }

typedef struct {
    float *sc, *dp, *ob, *dk, *dv;           /* scores then P, dP; a block's O or dQ; dK, dV sums */
    uint16_t *p16, *ds16, *qb, *db;          /* P, dS rounded; the block's q and dout rows */
    uint32_t *ap, *bp, *kp, *vtp;            /* panels: A, a block's B, K^T and V^T of the head */
    int64_t ld, ldh, dd, rb;                 /* sc and p16 row lengths; q, dout, O rows; block rows */
} prod_lane;

/* carves the lane (NULL: only sizes it); @return its bytes */
static size_t prod_carve(const cx_attn_geom *g, bool bwd, char *base, prod_lane *L)
{
    const int64_t rb = product_rows(g), ld = up_to(g->s, CX_BF16_TILE_COLS), ldh = up_to(g->d, 2);
    const int64_t dd = up_to(g->d, CX_BF16_TILE_COLS), kmax = g->s > rb ? g->s : rb;
    const size_t sizes[] = {
        (size_t)(rb * ld) * 4, bwd ? (size_t)(rb * ld) * 4 : 0, (size_t)(rb * dd) * 4,
        bwd ? (size_t)(up_to(g->s, CX_BF16_TILE_ROWS) * dd) * 4 : 0,
        bwd ? (size_t)(up_to(g->s, CX_BF16_TILE_ROWS) * dd) * 4 : 0,
        (size_t)(rb * ld) * 2, bwd ? (size_t)(rb * ld) * 2 : 0, (size_t)(rb * ldh) * 2, bwd ? (size_t)(rb * ldh) * 2 : 0,
        cx_bf16_panel_words(g->s, rb, true) * 4, cx_bf16_panel_words(g->d, kmax, false) * 4,
        cx_bf16_panel_words(g->s, g->d, false) * 4, bwd ? cx_bf16_panel_words(g->s, g->d, false) * 4 : 0,
    };
    void **at[] = { (void **)&L->sc, (void **)&L->dp, (void **)&L->ob, (void **)&L->dk, (void **)&L->dv,
                    (void **)&L->p16, (void **)&L->ds16, (void **)&L->qb, (void **)&L->db,
                    (void **)&L->ap, (void **)&L->bp, (void **)&L->kp, (void **)&L->vtp };
    _Static_assert(sizeof sizes / sizeof *sizes == sizeof at / sizeof *at, "one size per buffer");
    size_t off = 0;
    for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
        if (base) *at[i] = sizes[i] ? base + off : NULL;
        off += aligned(sizes[i]);
    }
    if (base) { L->ld = ld; L->ldh = ldh; L->dd = dd; L->rb = rb; }
    return off;
}

static int64_t product_lane_floats(const cx_attn_geom *g, bool bwd)
{
    prod_lane unused;
    return up16((int64_t)(prod_carve(g, bwd, NULL, &unused) / 4));
}

/* rows [r0, r0 + rows) of the head (rows st[1] apart) into dst (rb, ldh):
 * an odd d's last column and the rows past `rows` 0, so the micro-kernel
 * reads whole pairs and whole tiles in place */
static void copy_rows(uint16_t *dst, int64_t ldh, const uint16_t *head, int64_t ld, int64_t r0, int64_t rows,
                      int64_t rb, int64_t d)
{
    for (int64_t r = 0; r < rb; r++) {
        uint16_t *o = dst + r * ldh;
        if (r < rows) memcpy(o, head + (r0 + r) * ld, sizeof *o * (size_t)d);
        else memset(o, 0, sizeof *o * (size_t)d);
        if (ldh > d) o[d] = 0;
    }
}

/* P = softmax(scale S) of the block's rows over [0, lim) in f32 (in
 * place) and rounded into p16, both 0 over [lim, kend) and past the
 * rows; every row's p16 0 up to an even length */
CX_HOT static void prod_softmax(const cx_attn_geom *g, const prod_lane *L, int64_t q0, int64_t rows, int64_t kend)
{
    const int64_t ke = up_to(kend, 2);
    for (int64_t i = 0; i < L->rb; i++) {
        float *s = L->sc + i * L->ld;
        uint16_t *h = L->p16 + i * L->ld;
        int64_t lim = i < rows ? cx_attn_visible_keys(g, q0 + i) : 0;
        float sum = lim ? row_exp(s, lim, g->scale, row_max(s, lim, g->scale)) : 0.0f;
        float inv = lim ? 1.0f / sum : 0.0f;
        for (int64_t c = 0; c < lim; c++) { s[c] *= inv; h[c] = cx_f32_to_bf16_inline(s[c]); }
        for (int64_t c = lim; c < ke; c++) { s[c] = 0.0f; h[c] = 0; }
    }
}

/* S, then P, of the block: Q's rows against the head's K^T panels */
static void prod_probs(const cx_attn_geom *g, const prod_lane *L, const uint16_t *qh, int64_t q0, int64_t rows,
                       int64_t kend)
{
    copy_rows(L->qb, L->ldh, qh, g->q_strides[1], q0, rows, L->rb, g->d);
    cx_bf16_gemm_panels(L->sc, L->ld, false, NULL, L->qb, L->ldh, L->kp, L->rb, kend, L->ldh, true);
    prod_softmax(g, L, q0, rows, kend);
}

static void prod_head_fwd(const cx_attn_geom *g, float *lane, uint16_t *out, const uint16_t *qh, const uint16_t *kh,
                          const uint16_t *vh)
{
    prod_lane L;
    prod_carve(g, false, (char *)lane, &L);
    const int64_t od = g->h * g->d;
    cx_bf16_pack_panels(L.kp, false, false, kh, g->k_strides[1], g->s, g->d);
    for (int64_t q0 = 0; q0 < g->t; q0 += L.rb) {
        const int64_t rows = g->t - q0 < L.rb ? g->t - q0 : L.rb, kend = cx_attn_visible_keys(g, q0 + rows - 1);
        uint16_t *o = out + q0 * od;
        if (kend == 0) {
            for (int64_t i = 0; i < rows; i++) memset(o + i * od, 0, sizeof *o * (size_t)g->d);
            continue;
        }
        prod_probs(g, &L, qh, q0, rows, kend);
        /* O = P V: V's rows [0, kend) as B (K along the keys); P's pairs
         * past kend are 0, so an even count of them reads V's panels */
        cx_bf16_pack_panels(L.bp, false, true, vh, g->v_strides[1], g->d, kend);
        cx_bf16_gemm_panels(L.ob, L.dd, false, NULL, L.p16, L.ld, L.bp, L.rb, g->d, up_to(kend, 2), true);
        round_rows_into(o, od, L.ob, L.dd, rows, g->d);
    }
}

/* dS = scale P (dP - delta), delta = rowsum(P dP), rounded into ds16 (0
 * where P is). delta from P and dP, as the GEMM route's, not as
 * rowsum(dO O): those are in the lane, while O's rows were strided loads
 * that missed the cache (1 % of a gpt step's samples). */
CX_HOT static void prod_dscores(const prod_lane *L, int64_t kend, float scale)
{
    const int64_t ke = up_to(kend, 2);
    for (int64_t i = 0; i < L->rb; i++) {
        const float *p = L->sc + i * L->ld, *dp = L->dp + i * L->ld;
        uint16_t *h = L->ds16 + i * L->ld;
        float acc[LANES] = { 0 };
        int64_t c = 0;
        for (; c + LANES <= ke; c += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += p[c + l] * dp[c + l];
        for (; c < ke; c++) acc[0] += p[c] * dp[c];
        const float di = lane_sum(acc);
        for (c = 0; c < ke; c++) h[c] = cx_f32_to_bf16_inline(scale * p[c] * (dp[c] - di));
    }
}

typedef struct {
    const uint16_t *q, *k, *v, *dout;   /* the head's first rows (softmax's backward needs P, not O) */
    uint16_t *dq, *dk, *dv;             /* its gradients' first rows, ld apart */
    int64_t ld;
} prod_head;

/* per block: dV += P^T dO, dP = dO V^T, dQ = dS K, dK += dS^T Q */
static void prod_head_bwd(const cx_attn_geom *g, float *lane, const prod_head *x)
{
    prod_lane L;
    prod_carve(g, true, (char *)lane, &L);
    const int64_t d = g->d, sk = up_to(g->s, CX_BF16_TILE_ROWS);
    memset(L.dk, 0, sizeof *L.dk * (size_t)(sk * L.dd));
    memset(L.dv, 0, sizeof *L.dv * (size_t)(sk * L.dd));
    cx_bf16_pack_panels(L.kp, false, false, x->k, g->k_strides[1], g->s, d);
    cx_bf16_pack_panels(L.vtp, false, false, x->v, g->v_strides[1], g->s, d);
    for (int64_t q0 = 0; q0 < g->t; q0 += L.rb) {
        const int64_t rows = g->t - q0 < L.rb ? g->t - q0 : L.rb, kend = cx_attn_visible_keys(g, q0 + rows - 1);
        if (kend == 0) {
            for (int64_t i = 0; i < rows; i++) memset(x->dq + (q0 + i) * x->ld, 0, sizeof *x->dq * (size_t)d);
            continue;
        }
        prod_probs(g, &L, x->q, q0, rows, kend);
        copy_rows(L.db, L.ldh, x->dout, g->do_strides[1], q0, rows, L.rb, d);
        /* dV[0, kend) += P^T dO: P^T packed (K along the block's rows) */
        cx_bf16_pack_panels(L.ap, true, true, L.p16, L.ld, kend, L.rb);
        cx_bf16_pack_panels(L.bp, false, true, L.db, L.ldh, d, L.rb);
        cx_bf16_gemm_panels(L.dv, L.dd, true, L.ap, NULL, 0, L.bp, kend, d, L.rb, true);
        /* dP = dO V^T, then dS */
        cx_bf16_gemm_panels(L.dp, L.ld, false, NULL, L.db, L.ldh, L.vtp, L.rb, kend, L.ldh, true);
        prod_dscores(&L, kend, g->scale);
        /* dQ = dS K */
        cx_bf16_pack_panels(L.bp, false, true, x->k, g->k_strides[1], d, kend);
        cx_bf16_gemm_panels(L.ob, L.dd, false, NULL, L.ds16, L.ld, L.bp, L.rb, d, up_to(kend, 2), true);
        round_rows_into(x->dq + q0 * x->ld, x->ld, L.ob, L.dd, rows, d);
        /* dK[0, kend) += dS^T Q */
        cx_bf16_pack_panels(L.ap, true, true, L.ds16, L.ld, kend, L.rb);
        cx_bf16_pack_panels(L.bp, false, true, L.qb, L.ldh, d, L.rb);
        cx_bf16_gemm_panels(L.dk, L.dd, true, L.ap, NULL, 0, L.bp, kend, d, L.rb, true);
    }
    round_rows_into(x->dk, x->ld, L.dk, L.dd, g->s, d);
    round_rows_into(x->dv, x->ld, L.dv, L.dd, g->s, d);
}

static void heads_task(const heads_job *j, float *lane, int64_t n, int64_t h)
{
    const cx_attn_geom *g = j->g;
    if (cx_isa_active() >= CX_ISA_AVX512_BF16) {
        const uint16_t *q = j->q + n * g->q_strides[0] + h * g->q_strides[2];
        const uint16_t *k = j->k + n * g->k_strides[0] + h * g->k_strides[2];
        const uint16_t *v = j->v + n * g->v_strides[0] + h * g->v_strides[2];
        if (!j->bwd) {
            prod_head_fwd(g, lane, j->out + n * g->t * g->h * g->d + h * g->d, q, k, v);
            return;
        }
        int64_t at[3], ld;
        cx_attn_grad_places(g, n, h, at, &ld);
        const prod_head x = { .q = q, .k = k, .v = v,
                              .dout = j->dout + n * g->do_strides[0] + h * g->do_strides[2],
                              .dq = j->out + at[0], .dk = j->out + at[1], .dv = j->out + at[2], .ld = ld };
        prod_head_bwd(g, lane, &x);
        return;
    }
    const int64_t d = g->d, hd = g->h * d, td = up16(g->t * d), sd = up16(g->s * d);
    float *q = lane + up16(cx_attention_head_lane_floats(g, j->bwd)), *k = q + td, *v = k + sd, *o = v + sd;
    widen_head(q, j->q, g->q_strides, n, h, g->t, d);
    widen_head(k, j->k, g->k_strides, n, h, g->s, d);
    widen_head(v, j->v, g->v_strides, n, h, g->s, d);
    if (!j->bwd) {
        cx_attention_head_fwd(g, lane, o, q, k, v);
        round_head(j->out + n * g->t * hd + h * d, hd, o, g->t, d);
        return;
    }
    float *dout = o + td, *dq = dout + td, *dk = dq + td, *dv = dk + sd;
    widen_head(o, j->o, g->o_strides, n, h, g->t, d);
    widen_head(dout, j->dout, g->do_strides, n, h, g->t, d);
    cx_attention_head_bwd(g, lane, dq, dk, dv, q, k, v, o, dout);
    int64_t at[3], ld;
    cx_attn_grad_places(g, n, h, at, &ld);
    round_head(j->out + at[0], ld, dq, g->t, d);
    round_head(j->out + at[1], ld, dk, g->s, d);
    round_head(j->out + at[2], ld, dv, g->s, d);
}

static void heads_each(void *p, int64_t tid, int64_t nthreads)
{
    heads_job *j = p;
    if (tid >= (j->nlanes < nthreads ? j->nlanes : nthreads)) return;
    float *lane = j->lanes + tid * j->lane_floats;
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (t >= j->g->n * j->g->h) return;
        heads_task(j, lane, t / j->g->h, t % j->g->h);
    }
}

/* as many lanes as the scratch holds (at least one: heads_least) */
static void heads_run(heads_job *j, void *scratch, size_t scratch_bytes)
{
    char *base = (char *)(((uintptr_t)scratch + ALIGN_BYTES - 1) & ~(uintptr_t)(ALIGN_BYTES - 1));
    j->lanes = (float *)(void *)base;
    j->lane_floats = heads_lane_floats(j->g, j->bwd);
    j->nlanes = (int64_t)((scratch_bytes - (size_t)(base - (char *)scratch)) / ((size_t)j->lane_floats * 4));
    CX_ASSERT(j->nlanes >= 1);
    atomic_init(&j->next, 0);
    cx_pool_run_each(heads_each, j);
}

static void heads_fwd(uint16_t *out, const uint16_t *q, const uint16_t *k, const uint16_t *v, const cx_attn_geom *g,
                      void *scratch, size_t scratch_bytes)
{
    heads_job j = { .g = g, .out = out, .q = q, .k = k, .v = v };
    heads_run(&j, scratch, scratch_bytes);
}

static void heads_bwd(uint16_t *dqkv, const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *o,
                      const uint16_t *dout, const cx_attn_geom *g, void *scratch, size_t scratch_bytes)
{
    heads_job j = { .g = g, .out = dqkv, .q = q, .k = k, .v = v, .o = o, .dout = dout, .bwd = true };
    heads_run(&j, scratch, scratch_bytes);
}

/* ---- the route --------------------------------------------------------------------------- */

/* The route a scratch runs: heads wherever it fits and the scratch holds
 * one of its lanes (its own plan does; another route's plan, planned
 * under another CX_CPU_ISA for a longer sequence, may not, and then runs
 * its own route as below); else the GEMM with AVX512_BF16 and
 * widening without, and a scratch planned for the other of those two
 * (the persistent cache, another CX_CPU_ISA) runs the one it fits. */
static cx_attn_bf16_route route_for(const cx_attn_geom *g, bool bwd, size_t scratch_bytes)
{
    if (heads_fit(g) && scratch_bytes >= heads_least(g, bwd)) return CX_ATTN_BF16_HEADS;
    bool gemm = cx_isa_active() >= CX_ISA_AVX512_BF16 ? scratch_bytes >= gemm_least(g, bwd)
                                                      : scratch_bytes < (bwd ? widen_bwd_scratch(g) : widen_fwd_scratch(g));
    return gemm ? CX_ATTN_BF16_GEMM : CX_ATTN_BF16_WIDEN;
}

/* the route a plan takes */
static cx_attn_bf16_route planned_route(const cx_attn_geom *g)
{
    if (heads_fit(g)) return CX_ATTN_BF16_HEADS;
    return cx_isa_active() >= CX_ISA_AVX512_BF16 ? CX_ATTN_BF16_GEMM : CX_ATTN_BF16_WIDEN;
}

size_t cx_attention_bf16_route_scratch_bytes(const cx_attn_geom *g, bool bwd, cx_attn_bf16_route r)
{
    if (r == CX_ATTN_BF16_HEADS && heads_fit(g)) return heads_scratch(g, bwd);
    if (r == CX_ATTN_BF16_GEMM) {
        size_t fixed, mm;
        gemm_sizes(g, chunk_of(g), bwd, &fixed, &mm);
        return fixed + mm;
    }
    return bwd ? widen_bwd_scratch(g) : widen_fwd_scratch(g);
}

size_t cx_attention_bf16_min_scratch_bytes(const cx_attn_geom *g, bool bwd)
{
    /* nothing to compute: the kernels return before the scratch */
    if (g->n * g->h * g->t == 0 || g->s == 0 || g->d == 0) return 0;
    if (heads_fit(g)) return heads_least(g, bwd);
    /* route_for: from the GEMM route's least it runs the GEMM route, or
     * without AVX512_BF16 widening once the scratch holds widening's
     * whole plan; below the GEMM route's least, widening (its whole plan) */
    size_t gemm = gemm_least(g, bwd), widen = bwd ? widen_bwd_scratch(g) : widen_fwd_scratch(g);
    return gemm < widen ? gemm : widen;
}

size_t cx_attention_bf16_scratch_bytes(const cx_attn_geom *g)
{
    return cx_attention_bf16_route_scratch_bytes(g, false, planned_route(g));
}

size_t cx_attention_bf16_bwd_scratch_bytes(const cx_attn_geom *g)
{
    return cx_attention_bf16_route_scratch_bytes(g, true, planned_route(g));
}

void cx_attention_bf16_route_fwd(uint16_t *out, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                 const cx_attn_geom *g, void *scratch, size_t scratch_bytes, cx_attn_bf16_route r)
{
    if (r == CX_ATTN_BF16_HEADS && heads_fit(g)) heads_fwd(out, q, k, v, g, scratch, scratch_bytes);
    else if (r == CX_ATTN_BF16_GEMM) gemm_fwd(out, q, k, v, g, scratch, scratch_bytes);
    else widen_fwd(out, q, k, v, g, scratch, scratch_bytes);
}

void cx_attention_bf16_route_bwd(uint16_t *dqkv, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                 const uint16_t *o, const uint16_t *dout, const cx_attn_geom *g, void *scratch,
                                 size_t scratch_bytes, cx_attn_bf16_route r)
{
    if (r == CX_ATTN_BF16_HEADS && heads_fit(g)) heads_bwd(dqkv, q, k, v, o, dout, g, scratch, scratch_bytes);
    else if (r == CX_ATTN_BF16_GEMM) gemm_bwd(dqkv, q, k, v, dout, g, scratch, scratch_bytes);
    else widen_bwd(dqkv, q, k, v, o, dout, g, scratch, scratch_bytes);
}

void cx_attention_bf16_fwd(uint16_t *out, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                           const cx_attn_geom *g, void *scratch, size_t scratch_bytes)
{
    cx_attention_bf16_route_fwd(out, q, k, v, g, scratch, scratch_bytes, route_for(g, false, scratch_bytes));
}

void cx_attention_bf16_bwd(uint16_t *dqkv, const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *o,
                           const uint16_t *dout, const cx_attn_geom *g, void *scratch, size_t scratch_bytes)
{
    cx_attention_bf16_route_bwd(dqkv, q, k, v, o, dout, g, scratch, scratch_bytes, route_for(g, true, scratch_bytes));
}
