/* The row loops of attention.c's rows route compiled for one vector
 * width and its instructions: the softmax of a block's scores and the
 * backward's delta (a dot product per row). attention.c includes this file
 * once per width, as conv_direct_bf16.c includes conv_direct_bf16_width.h
 * (which says why each width is written out rather than cloned):
 *   WIDTH         floats per vector: 16 (AVX-512), 8 (AVX2), 4 (baseline);
 *   WIDTH_TARGET  the instructions that width is compiled for.
 * Each name below gets the width as a suffix (AT_WIDTH).
 *
 * Why not the plain loops of the other kernels: a causal block's rows are
 * short (at most 8 vectors of 16 at t = 128), and the compiler kept the
 * max and the sum of a row's lanes as a chain of 15 scalar operations
 * through the stack, each waiting on the store before it. That chain and
 * the per-lane bounds checks made the softmax a quarter of the attention's
 * time, 1.2 ns a score (Zen 5, one thread). Here each row's lanes stay in
 * registers and are folded in halves; only the row's last vector checks
 * its lanes. */

#ifndef WIDTH
#error "attention_rows_width.h: include it through each_width.h (attention.c does)"
#endif

typedef float AT_WIDTH(row_floats) __attribute__((vector_size(WIDTH * sizeof(float))));
typedef int32_t AT_WIDTH(row_ints) __attribute__((vector_size(WIDTH * sizeof(int32_t))));
#define vf AT_WIDTH(row_floats)
#define vi AT_WIDTH(row_ints)

/* m ? a : b, lane by lane (C has no vector conditional) */
WIDTH_INLINE vf AT_WIDTH(select)(vi m, vf a, vf b)
{
    vi ai, bi;
    memcpy(&ai, &a, sizeof ai);
    memcpy(&bi, &b, sizeof bi);
    vi r = (ai & m) | (bi & ~m);
    vf f;
    memcpy(&f, &r, sizeof f);
    return f;
}

WIDTH_INLINE vf AT_WIDTH(splat)(float x) { return (vf){ 0 } + x; }

/* lanes < n of WIDTH (n may exceed WIDTH) */
WIDTH_INLINE vi AT_WIDTH(lanes_below)(int64_t n)
{
    static const int32_t iota[16] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 };
    vi idx;
    memcpy(&idx, iota, sizeof idx);
    return idx < (int32_t)(n < WIDTH ? n : WIDTH);
}

/* cx_vexpf (vmath.h) on every lane, step for step */
WIDTH_INLINE vf AT_WIDTH(exp)(vf x)
{
    const vi finite = x == x;
    vf xc = AT_WIDTH(select)(x > 88.7228f, AT_WIDTH(splat)(88.7228f), x);
    xc = AT_WIDTH(select)(xc < -87.3365f, AT_WIDTH(splat)(-87.3365f), xc);
    xc = AT_WIDTH(select)(finite, xc, AT_WIDTH(splat)(0.0f));
    const float shifter = 12582912.0f;
    vf n = (xc * 1.44269504088896341f + shifter) - shifter;
    vf r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = AT_WIDTH(splat)(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vi ni = __builtin_convertvector(n, vi), half = ni / 2;
    vi e1 = (half + 127) << 23, e2 = (ni - half + 127) << 23;
    vf s1, s2;
    memcpy(&s1, &e1, sizeof s1);
    memcpy(&s2, &e2, sizeof s2);
    vf y = p * s1 * s2;
    y = AT_WIDTH(select)(x > 88.72283935546875f, AT_WIDTH(splat)(INFINITY), y);
    y = AT_WIDTH(select)(x < -87.33654475f, AT_WIDTH(splat)(0.0f), y);
    return AT_WIDTH(select)(finite, y, x);
}

/* the lanes folded in halves: max (the larger, NaN ignored as the
 * scalar loop's s > m ? s : m) or sum */
WIDTH_INLINE float AT_WIDTH(fold)(vf x, bool max)
{
    float a[WIDTH];
    memcpy(a, &x, sizeof a);
#pragma GCC unroll 16
    for (int w = WIDTH / 2; w > 0; w /= 2)
#pragma GCC unroll 16
        for (int e = 0; e < w; e++) a[e] = max ? (a[e + w] > a[e] ? a[e + w] : a[e]) : a[e] + a[e + w];
    return a[0];
}

/* s[0, lim) <- softmax(scale * s), s[lim, cols) <- 0; a row that sees no
 * key all 0. s has room for lim rounded up to WIDTH. */
WIDTH_INLINE void AT_WIDTH(softmax_row)(float *s, int64_t lim, int64_t cols, float scale)
{
    if (lim == 0) {
        memset(s, 0, sizeof *s * (size_t)cols);
        return;
    }
    const int64_t body = lim / WIDTH * WIDTH;
    const vi tail = AT_WIDTH(lanes_below)(lim - body);
    vf m = AT_WIDTH(splat)(-INFINITY), v;
    for (int64_t j = 0; j < body; j += WIDTH) {
        memcpy(&v, s + j, sizeof v);
        m = AT_WIDTH(select)(v > m, v, m);
    }
    if (body < lim) {
        memcpy(&v, s + body, sizeof v);
        m = AT_WIDTH(select)((v > m) & tail, v, m);
    }
    const float mx = AT_WIDTH(fold)(m, true);
    vf sum = { 0 };
    for (int64_t j = 0; j < body; j += WIDTH) {
        memcpy(&v, s + j, sizeof v);
        v = AT_WIDTH(exp)((v - mx) * scale);
        memcpy(s + j, &v, sizeof v);
        sum += v;
    }
    if (body < lim) {
        memcpy(&v, s + body, sizeof v);
        v = AT_WIDTH(select)(tail, AT_WIDTH(exp)((v - mx) * scale), AT_WIDTH(splat)(0.0f));
        memcpy(s + body, &v, sizeof v);
        sum += v;
    }
    const float total = AT_WIDTH(fold)(sum, false), inv = total > 0.0f ? 1.0f / total : 0.0f;
    const int64_t vec = body < lim ? body + WIDTH : body;
    for (int64_t j = 0; j < vec; j += WIDTH) {
        memcpy(&v, s + j, sizeof v);
        v *= inv;
        memcpy(s + j, &v, sizeof v);
    }
    for (int64_t j = vec; j < cols; j++) s[j] = 0.0f;
}

/* every row of a block: row i (query q0 + i) over its visible keys */
WIDTH_TARGET static void AT_WIDTH(softmax_rows)(float *p, int64_t ld, const cx_attn_geom *g, int64_t q0, int64_t rows,
                                                int64_t kend)
{
    for (int64_t i = 0; i < rows; i++) AT_WIDTH(softmax_row)(p + i * ld, cx_attn_visible_keys(g, q0 + i), kend, g->scale);
}

/* delta_i = rowsum(dO * O) of the block's rows */
WIDTH_TARGET static void AT_WIDTH(row_dots)(float *delta, const float *a, int64_t lda, const float *b, int64_t ldb,
                                            int64_t rows, int64_t d)
{
    const int64_t body = d / WIDTH * WIDTH;
    for (int64_t i = 0; i < rows; i++) {
        const float *x = a + i * lda, *y = b + i * ldb;
        vf acc = { 0 }, u, w;
        for (int64_t e = 0; e < body; e += WIDTH) {
            memcpy(&u, x + e, sizeof u);
            memcpy(&w, y + e, sizeof w);
            acc += u * w;
        }
        float sum = AT_WIDTH(fold)(acc, false);
        for (int64_t e = body; e < d; e++) sum += x[e] * y[e];
        delta[i] = sum;
    }
}

#undef vf
#undef vi
