/* bf16 attention: the operands are widened into contiguous f32 copies in
 * the scratch, a chunk of images at a time, the f32 kernels (attention.c)
 * run on them, and the results are rounded once to bf16. The widening is O(T D) per head against the
 * kernels' O(T S D), and the graph's tensors (what is saved for backward
 * and moved between kernels) stay bf16. */
#include "kernels.h"
#include "pool.h"
#include "cx_assert.h"
#include "cx_bf16.h"

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

size_t cx_attention_bf16_scratch_bytes(const cx_attn_geom *g)
{
    int64_t nb = chunk_of(g);
    cx_attn_geom c = chunk_geom(g, nb);
    size_t tq = (size_t)(nb * g->t * g->h * g->d) * 4, tk = (size_t)(nb * g->s * g->h * g->d) * 4;
    /* q, k, v, then the f32 output */
    return 2 * aligned(tq) + 2 * aligned(tk) + ALIGN_BYTES + cx_attention_scratch_bytes(&c);
}

void cx_attention_bf16_fwd(uint16_t *out, const uint16_t *q, const uint16_t *k, const uint16_t *v,
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

size_t cx_attention_bf16_bwd_scratch_bytes(const cx_attn_geom *g)
{
    int64_t nb = chunk_of(g);
    cx_attn_geom c = chunk_geom(g, nb);
    size_t tq = (size_t)(nb * g->t * g->h * g->d) * 4, tk = (size_t)(nb * g->s * g->h * g->d) * 4;
    /* q, k, v, o, dout, then dq dk dv */
    return 3 * aligned(tq) + 2 * aligned(tk) + aligned(tq + 2 * tk) + ALIGN_BYTES + cx_attention_bwd_scratch_bytes(&c);
}

/* one chunk of images [n0, n0 + nb): its f32 gradients dq | dk | dv into
 * their places in dqkv (dq (N, T, H, D), then dk and dv (N, S, H, D)) */
static void round_grads(uint16_t *dqkv, const float *grads, const cx_attn_geom *g, int64_t n0, int64_t nb)
{
    const int64_t qi = g->t * g->h * g->d, ki = g->s * g->h * g->d;
    round_all(dqkv + n0 * qi, grads, nb * qi);
    round_all(dqkv + g->n * qi + n0 * ki, grads + nb * qi, nb * ki);
    round_all(dqkv + g->n * (qi + ki) + n0 * ki, grads + nb * (qi + ki), nb * ki);
}

void cx_attention_bf16_bwd(uint16_t *dqkv, const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *o,
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
