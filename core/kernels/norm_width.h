/* norm.c's row loops compiled for one vector width and its instructions,
 * as conv_direct_bf16_width.h and attention_rows_width.h are (the former
 * says why each width is written out): norm.c includes this file once per
 * width, with
 *   WIDTH         floats per vector: 16 (AVX-512), 8 (AVX2), 4 (baseline);
 *   WIDTH_TARGET  the instructions that width is compiled for.
 *
 * Why not the plain loops they were: a row's LANES lane sums lived in
 * arrays on the stack, folded by scalar adds each waiting on the store
 * before it, and the weight-gradient updates went through runtime alias
 * checks; the backward took 0.6 ns an element (Zen 5, one thread), a GPT
 * step's nine of them about 1.7 ms. Here the lanes stay in registers.
 *
 * The sums are norm.c's, bit for bit, at every width: element e of a row
 * goes to lane e % LANES (16), a row's tail too, the lanes are folded in
 * halves (8, 4, 2, 1), and each expression is the one norm.c had, so the
 * compiler contracts the same products into the same fused multiply-adds
 * (at the widths that have them). */

#ifndef WIDTH
#error "norm_width.h: include it through each_width.h (norm.c does)"
#endif

#define VECS (LANES / WIDTH)

typedef float AT_WIDTH(norm_floats) __attribute__((vector_size(WIDTH * sizeof(float))));
#define vf AT_WIDTH(norm_floats)

WIDTH_INLINE vf AT_WIDTH(load)(const float *p)
{
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

WIDTH_INLINE void AT_WIDTH(store)(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* The LANES lane sums as VECS vectors. Every access below names its
 * vector by a constant (EACH_VEC), and no address of one is taken, so the
 * compiler keeps them in registers: indexed by a loop variable, or passed
 * by pointer, they had lived on the stack, every add waiting on the store
 * before it. */
typedef struct {
    vf v[4];
} AT_WIDTH(lanes);
#define lanes_t AT_WIDTH(lanes)
#define EACH_VEC(...)                                                                                               \
    do {                                                                                                            \
        { enum { q = 0 }; __VA_ARGS__; }                                                                            \
        if (VECS > 1) { enum { q = 1 }; __VA_ARGS__; }                                                              \
        if (VECS > 2) { enum { q = 2 }; __VA_ARGS__; }                                                              \
        if (VECS > 3) { enum { q = 3 }; __VA_ARGS__; }                                                              \
    } while (0)
#define NO_LANES ((lanes_t){ .v = { (vf){ 0 }, (vf){ 0 }, (vf){ 0 }, (vf){ 0 } } })

/* lane l of the sums */
WIDTH_INLINE float AT_WIDTH(lane)(const lanes_t *a, int l) { return a->v[l / WIDTH][l % WIDTH]; }

/* the sums folded in halves (8, 4, 2, 1), as norm.c's lanes_total was */
WIDTH_INLINE float AT_WIDTH(total)(lanes_t a)
{
    float t[LANES];
#pragma GCC unroll 16
    for (int l = 0; l < LANES; l++) t[l] = AT_WIDTH(lane)(&a, l);
#pragma GCC unroll 8
    for (int w = LANES / 2; w > 0; w /= 2)
#pragma GCC unroll 8
        for (int l = 0; l < w; l++) t[l] += t[l + w];
    return t[0];
}

/* the row's tail (fewer than LANES elements from e) of p, the lanes past
 * it 0; nothing read past the row */
WIDTH_INLINE lanes_t AT_WIDTH(tail)(const float *p, int64_t n)
{
    float t[LANES] = { 0 };
    for (int64_t l = 0; l < n; l++) t[l] = p[l];
    lanes_t r;
    EACH_VEC(r.v[q] = AT_WIDTH(load)(t + q * WIDTH));
    return r;
}

/* mean and 1/std of one row, as norm.c's row_stats was: element e in
 * lane e % LANES, the tail's lanes past the row adding +0 (a sum that
 * starts at +0 is never -0, so +0 changes none), and (x - mu)^2 added by
 * the same fused multiply-add where the width has them */
WIDTH_INLINE void AT_WIDTH(stats)(const float *x, int64_t c, float eps, float *mean, float *rstd)
{
    const int64_t body = c / LANES * LANES;
    lanes_t a = NO_LANES;
    for (int64_t e = 0; e < body; e += LANES) EACH_VEC(a.v[q] += AT_WIDTH(load)(x + e + q * WIDTH));
    if (body < c) {
        const lanes_t t = AT_WIDTH(tail)(x + body, c - body);
        EACH_VEC(a.v[q] += t.v[q]);
    }
    const float mu = AT_WIDTH(total)(a) / (float)c;
    lanes_t s = NO_LANES;
    for (int64_t e = 0; e < body; e += LANES) {
        EACH_VEC({
            const vf d = AT_WIDTH(load)(x + e + q * WIDTH) - mu;
            s.v[q] += d * d;
        });
    }
    if (body < c) {
        /* the lanes past the row: 0 - 0, not 0 - mu */
        float t[LANES] = { 0 };
        for (int64_t e = body; e < c; e++) t[e - body] = x[e] - mu;
        EACH_VEC({
            const vf d = AT_WIDTH(load)(t + q * WIDTH);
            s.v[q] += d * d;
        });
    }
    *mean = mu;
    *rstd = 1.0f / sqrtf(AT_WIDTH(total)(s) / (float)c + eps);
}

WIDTH_TARGET static void AT_WIDTH(fwd_rows)(void *p, int64_t r0, int64_t r1)
{
    const norm_job *j = p;
    const int64_t c = j->c;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * c;
        float mu, rs;
        AT_WIDTH(stats)(x, c, j->eps, &mu, &rs);
        if (j->out_bf16) {
            uint16_t *y = j->out_bf16 + r * c;
            for (int64_t e = 0; e < c; e++) y[e] = cx_f32_to_bf16_inline(norm_value(j, x, e, mu, rs));
            continue;
        }
        float *y = j->out + r * c;
        for (int64_t e = 0; e < c; e++) y[e] = norm_value(j, x, e, mu, rs);
    }
}

/* One block of rows: dx, and its partial dw and db (norm.c's bwd_block
 * was, expression for expression). */
WIDTH_TARGET static void AT_WIDTH(bwd_block)(const norm_job *j, int64_t blk)
{
    const int64_t c = j->c, r1 = (blk + 1) * ROW_BLOCK < j->rows ? (blk + 1) * ROW_BLOCK : j->rows;
    const int64_t body = c / LANES * LANES;
    float *dw = j->part + blk * 2 * c, *db = dw + c;
    const float *wt = j->w;
    memset(dw, 0, sizeof *dw * (size_t)(2 * c));
    for (int64_t r = blk * ROW_BLOCK; r < r1; r++) {
        const float *x = j->x + r * c, *dy = j->dy + r * c;
        float *dx = j->out + r * c, mu, rs;
        AT_WIDTH(stats)(x, c, j->eps, &mu, &rs);
        lanes_t sg = NO_LANES, sgx = NO_LANES;
        for (int64_t e = 0; e < body; e += LANES) {
            EACH_VEC({
                const int64_t at = e + q * WIDTH;
                const vf d = AT_WIDTH(load)(dy + at), xh = (AT_WIDTH(load)(x + at) - mu) * rs;
                const vf g = wt ? d * AT_WIDTH(load)(wt + at) : d;
                sg.v[q] += g;
                sgx.v[q] += g * xh;
                AT_WIDTH(store)(dw + at, AT_WIDTH(load)(dw + at) + d * xh);
                AT_WIDTH(store)(db + at, AT_WIDTH(load)(db + at) + d);
            });
        }
        if (body < c) {
            /* the tail, element body + l in lane l; the lanes past the
             * row add g = 0 (0 x a finite xh) */
            float tg[LANES] = { 0 }, txh[LANES] = { 0 };
            for (int64_t e = body; e < c; e++) {
                float xh = (x[e] - mu) * rs, g = dy[e] * (wt ? wt[e] : 1.0f);
                tg[e - body] = g;
                txh[e - body] = xh;
                dw[e] += dy[e] * xh;
                db[e] += dy[e];
            }
            EACH_VEC({
                const vf g = AT_WIDTH(load)(tg + q * WIDTH);
                sg.v[q] += g;
                sgx.v[q] += g * AT_WIDTH(load)(txh + q * WIDTH);
            });
        }
        const float mg = AT_WIDTH(total)(sg) / (float)c, mgx = AT_WIDTH(total)(sgx) / (float)c;
        const int64_t vbody = c / WIDTH * WIDTH;
        int64_t e = 0;
        for (; e < vbody; e += WIDTH) {
            const vf d = AT_WIDTH(load)(dy + e), xh = (AT_WIDTH(load)(x + e) - mu) * rs;
            const vf g = wt ? d * AT_WIDTH(load)(wt + e) : d;
            AT_WIDTH(store)(dx + e, rs * (g - mg - xh * mgx));
        }
        for (; e < c; e++) {
            float xh = (x[e] - mu) * rs, g = dy[e] * (wt ? wt[e] : 1.0f);
            dx[e] = rs * (g - mg - xh * mgx);
        }
    }
}

WIDTH_TARGET static void AT_WIDTH(bwd_blocks)(void *p, int64_t b0, int64_t b1)
{
    for (int64_t b = b0; b < b1; b++) AT_WIDTH(bwd_block)(p, b);
}

#undef EACH_VEC
#undef NO_LANES
#undef lanes_t
#undef vf
#undef VECS
