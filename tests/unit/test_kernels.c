/* Dense kernels against naive reference loops written here: conv2d and
 * its two backward ops (references are the direct sum and its adjoint, no
 * finite differences), max/avg pooling, batched matmul, gather and
 * scatter_add. References accumulate in double and also sum |terms|, so
 * the tolerance is relative to the magnitude that float rounding scales
 * with; a wrong or missing term shows up far above it. */
#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "pool.h"
#include <cxla/core.h>

#define REL_TOL 1e-4
#define GUARD 64
#define GUARD_VALUE 12345.678f

/* ---- helpers ------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static void rng_seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ull + 1; }

static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float rng_uniform(void) { return (float)((rng_next() >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f; }

static int64_t rng_int(int64_t lo, int64_t hi) { return lo + (int64_t)(rng_next() % (uint64_t)(hi - lo + 1)); }

/* A buffer with guard floats on both sides, to catch writes out of bounds. */
static float *guarded(size_t n)
{
    float *p = malloc(sizeof(float) * (n + 2 * GUARD));
    cr_assert_not_null(p);
    for (size_t i = 0; i < n + 2 * GUARD; i++) p[i] = GUARD_VALUE;
    return p + GUARD;
}

static void check_guards(const float *p, size_t n, const char *what)
{
    for (size_t i = 0; i < GUARD; i++) {
        cr_assert(p[-1 - (ptrdiff_t)i] == GUARD_VALUE, "%s: write before the buffer", what);
        cr_assert(p[n + i] == GUARD_VALUE, "%s: write past the end", what);
    }
}

static void guarded_free(float *p)
{
    if (p) free(p - GUARD);
}

static float *random_buf(size_t n)
{
    float *p = guarded(n);
    for (size_t i = 0; i < n; i++) p[i] = rng_uniform();
    return p;
}

static void fill_nan(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

/* |got - ref| <= REL_TOL * (sum of |terms|) + a floor for empty sums. */
static void check_close(const float *got, const double *ref, const double *mag, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double tol = REL_TOL * mag[i] + 1e-6;
        cr_assert(fabs((double)got[i] - ref[i]) <= tol, "%s[%zu]: got %.8g, want %.8g (tol %.3g)", what, i,
                  (double)got[i], ref[i], tol);
    }
}

/* Scratch with a guard region, filled with garbage so kernels that read
 * scratch before writing it fail. */
static unsigned char *scratch_alloc(size_t bytes)
{
    unsigned char *p = malloc(bytes + 256);
    cr_assert_not_null(p);
    memset(p, 0x7f, bytes);
    memset(p + bytes, 0xa5, 256);
    return p;
}

static void scratch_check_free(unsigned char *p, size_t bytes)
{
    for (size_t i = 0; i < 256; i++) cr_assert(p[bytes + i] == 0xa5, "kernel wrote past its scratch");
    free(p);
}

/* ---- conv2d ------------------------------------------------------------- */

typedef struct {
    int64_t n, c, h, w, o, kh, kw;
    int sh, sw, ph, pw, dh, dw, groups;
} conv_case;

static cx_conv_geom geom_of(const conv_case *t)
{
    cx_conv_geom g = { .n = t->n, .c = t->c, .h = t->h, .w = t->w, .o = t->o, .kh = t->kh, .kw = t->kw,
                       .stride_h = t->sh, .stride_w = t->sw, .pad_h = t->ph, .pad_w = t->pw,
                       .dil_h = t->dh, .dil_w = t->dw, .groups = t->groups };
    return g;
}

typedef enum { REF_FWD, REF_BWD_INPUT, REF_BWD_WEIGHT } ref_mode;

/* Visits every (output pixel, weight tap) pair that touches a real input
 * pixel and applies the plain sum (REF_FWD) or one of its two adjoints:
 *   y[yi] += x[xi] * w[wi];  dx[xi] += dy[yi] * w[wi];  dw[wi] += dy[yi] * x[xi]. */
static void ref_conv(const cx_conv_geom *g, ref_mode mode, const float *x, const float *w, const float *dy,
                     double *ref, double *mag)
{
    const int64_t og = g->o / g->groups, cg = g->c / g->groups;
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t o = 0; o < g->o; o++)
            for (int64_t oh = 0; oh < g->oh; oh++)
                for (int64_t ow = 0; ow < g->ow; ow++)
                    for (int64_t cc = 0; cc < cg; cc++)
                        for (int64_t kh = 0; kh < g->kh; kh++)
                            for (int64_t kw = 0; kw < g->kw; kw++) {
                                int64_t ih = oh * g->stride_h - g->pad_h + kh * g->dil_h;
                                int64_t iw = ow * g->stride_w - g->pad_w + kw * g->dil_w;
                                if (ih < 0 || ih >= g->h || iw < 0 || iw >= g->w) continue;
                                int64_t c = (o / og) * cg + cc;
                                size_t xi = (size_t)(((n * g->c + c) * g->h + ih) * g->w + iw);
                                size_t yi = (size_t)(((n * g->o + o) * g->oh + oh) * g->ow + ow);
                                size_t wi = (size_t)(((o * cg + cc) * g->kh + kh) * g->kw + kw);
                                double v;
                                size_t at;
                                switch (mode) {
                                case REF_FWD: v = (double)x[xi] * w[wi], at = yi; break;
                                case REF_BWD_INPUT: v = (double)dy[yi] * w[wi], at = xi; break;
                                default: v = (double)dy[yi] * x[xi], at = wi; break;
                                }
                                ref[at] += v;
                                mag[at] += fabs(v);
                            }
}

static void run_conv_case(const conv_case *t)
{
    cx_conv_geom g = geom_of(t);
    cr_assert(cx_conv_geom_finish(&g), "geometry rejected");
    const size_t xs = (size_t)(g.n * g.c * g.h * g.w), ys = (size_t)(g.n * g.o * g.oh * g.ow);
    const size_t ws = (size_t)(g.o * (g.c / g.groups) * g.kh * g.kw);
    float *x = random_buf(xs), *w = random_buf(ws), *dy = random_buf(ys);
    float *y = guarded(ys), *dx = guarded(xs), *dw = guarded(ws);
    size_t most = xs > ys ? xs : ys;
    most = most > ws ? most : ws;
    double *ref = calloc(most, sizeof(double)), *mag = calloc(most, sizeof(double));
    cr_assert(ref && mag);

    /* forward: y = sum x * w */
    size_t sb = cx_conv2d_scratch_bytes(&g);
    unsigned char *scratch = scratch_alloc(sb);
    fill_nan(y, ys);
    cx_conv2d_fwd(y, x, w, NULL, false, &g, scratch, sb);
    ref_conv(&g, REF_FWD, x, w, dy, ref, mag);
    check_guards(y, ys, "conv fwd y");
    check_close(y, ref, mag, ys, "conv fwd y");

    /* forward with the bias + relu epilogue folded in */
    float *bias = random_buf((size_t)g.o);
    fill_nan(y, ys);
    cx_conv2d_fwd(y, x, w, bias, true, &g, scratch, sb);
    scratch_check_free(scratch, sb);
    check_guards(y, ys, "conv fwd y + bias, relu");
    const size_t plane = (size_t)(g.oh * g.ow);
    for (size_t i = 0; i < ys; i++) {
        double want = ref[i] + bias[i / plane % (size_t)g.o];
        want = want > 0 ? want : 0;
        cr_assert(fabs((double)y[i] - want) <= REL_TOL * (mag[i] + fabs(bias[i / plane % (size_t)g.o])) + 1e-6,
                  "conv fwd y + bias, relu [%zu]: got %.8g, want %.8g", i, (double)y[i], want);
    }
    check_guards(bias, (size_t)g.o, "bias");
    guarded_free(bias);

    /* backward input: the adjoint, dx += dy * w over the same pairs */
    memset(ref, 0, sizeof(double) * xs);
    memset(mag, 0, sizeof(double) * xs);
    sb = cx_conv2d_bwd_input_scratch_bytes(&g);
    scratch = scratch_alloc(sb);
    fill_nan(dx, xs);
    cx_conv2d_bwd_input(dx, dy, w, NULL, &g, scratch, sb);
    ref_conv(&g, REF_BWD_INPUT, x, w, dy, ref, mag);
    check_guards(dx, xs, "conv bwd dx");
    check_close(dx, ref, mag, xs, "conv bwd dx");

    /* with relu's gradient folded in: dx kept where the mask is > 0 */
    float *pm = random_buf(xs);
    for (size_t i = 0; i < xs; i++) pm[i] -= 0.5f;
    fill_nan(dx, xs);
    cx_conv2d_bwd_input(dx, dy, w, pm, &g, scratch, sb);
    scratch_check_free(scratch, sb);
    check_guards(dx, xs, "conv bwd dx, posmask");
    for (size_t i = 0; i < xs; i++) {
        double want = pm[i] > 0 ? ref[i] : 0.0;
        cr_assert(fabs((double)dx[i] - want) <= REL_TOL * mag[i] + 1e-6, "conv bwd dx, posmask [%zu]: got %.8g, want %.8g",
                  i, (double)dx[i], want);
    }
    guarded_free(pm);

    /* backward weight: dw += dy * x over the same pairs */
    memset(ref, 0, sizeof(double) * ws);
    memset(mag, 0, sizeof(double) * ws);
    sb = cx_conv2d_bwd_weight_scratch_bytes(&g);
    scratch = scratch_alloc(sb);
    fill_nan(dw, ws);
    cx_conv2d_bwd_weight(dw, x, dy, &g, scratch, sb);
    scratch_check_free(scratch, sb);
    ref_conv(&g, REF_BWD_WEIGHT, x, w, dy, ref, mag);
    check_guards(dw, ws, "conv bwd dw");
    check_close(dw, ref, mag, ws, "conv bwd dw");

    /* inputs are read only */
    check_guards(x, xs, "x");
    check_guards(w, ws, "w");
    check_guards(dy, ys, "dy");
    free(ref);
    free(mag);
    guarded_free(x);
    guarded_free(w);
    guarded_free(dy);
    guarded_free(y);
    guarded_free(dx);
    guarded_free(dw);
}

/* n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups */
static const conv_case conv_cases[] = {
    { 2, 3, 7, 6, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1 },        /* plain 3x3 */
    { 1, 3, 9, 8, 5, 3, 3, 2, 2, 1, 1, 1, 1, 1 },        /* batch 1, stride 2, padding */
    { 2, 4, 11, 10, 3, 3, 2, 1, 1, 2, 1, 2, 2, 1 },      /* dilation 2, non-square kernel */
    { 2, 1, 11, 10, 3, 3, 2, 1, 1, 2, 1, 2, 2, 1 },      /* the same on the thin path */
    { 5, 4, 8, 9, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2 },        /* groups 2, batch 5 */
    { 3, 6, 10, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 6 },       /* depthwise */
    { 2, 4, 11, 12, 8, 5, 5, 2, 2, 2, 2, 1, 1, 4 },      /* depthwise, multiplier 2, stride 2 */
    { 5, 7, 16, 17, 9, 1, 1, 1, 1, 0, 0, 1, 1, 1 },      /* 1x1 on a large plane (direct sgemm) */
    { 5, 8, 16, 16, 6, 1, 1, 1, 1, 0, 0, 1, 1, 2 },      /* 1x1 direct, groups 2 */
    { 5, 20, 4, 5, 6, 1, 1, 1, 1, 0, 0, 1, 1, 1 },       /* 1x1 on a small plane (chunked) */
    { 5, 7, 4, 5, 6, 1, 1, 1, 1, 0, 0, 1, 1, 1 },        /* 1x1, few channels */
    { 2, 3, 9, 9, 4, 1, 1, 2, 2, 0, 0, 1, 1, 1 },        /* 1x1 stride 2 */
    { 1, 6, 5, 5, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1 },        /* 1x1 with padding */
    { 5, 5, 13, 7, 7, 2, 4, 1, 3, 1, 2, 2, 1, 1 },       /* odd everything */
    { 5, 8, 10, 9, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1 },       /* sgemm path, one chunk of 5 */
    { 3, 1, 28, 28, 32, 3, 3, 1, 1, 0, 0, 1, 1, 1 },     /* MNIST first layer (thin path) */
    { 3, 2, 9, 8, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2 },        /* thin, 3 outputs per group */
    { 2, 1, 7, 7, 5, 3, 3, 2, 1, 0, 1, 1, 1, 1 },        /* thin, 5 outputs (uneven blocks) */
    { 2, 32, 12, 12, 16, 3, 3, 1, 1, 0, 0, 1, 1, 1 },    /* MNIST second layer, smaller */
    { 1, 2, 3, 3, 2, 3, 3, 1, 1, 0, 0, 1, 1, 1 },        /* output 1x1 */
    { 2, 3, 5, 4, 2, 5, 4, 1, 1, 0, 0, 1, 1, 1 },        /* kernel = whole input */
    { 2, 4, 7, 7, 6, 3, 3, 3, 3, 1, 1, 3, 3, 2 },        /* stride 3 dilation 3 groups */
    { 3, 8, 9, 7, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1 },        /* Winograd: padding 1, odd planes, 3 images */
    { 2, 9, 6, 11, 10, 3, 3, 1, 1, 2, 0, 1, 1, 1 },      /* Winograd: padding 2 and 0 */
    { 3, 48, 40, 38, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1 },    /* Winograd: two tile-row blocks per image */
    { 4, 16, 1, 1, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1 },      /* 3x3 padding 1 on a 1x1 plane: not Winograd */
};

/* A 1x1 output is a quarter of a 2x2 tile: Winograd's 16 products for one
 * output cost more than the 9 taps (resnet18's layer4 at 32x32 input ran
 * an epoch 1.35x slower through it). */
Test(conv2d, winograd_needs_a_plane_of_2x2)
{
    conv_case one = { 4, 512, 1, 1, 512, 3, 3, 1, 1, 1, 1, 1, 1, 1 };
    conv_case two = { 4, 512, 2, 2, 512, 3, 3, 1, 1, 1, 1, 1, 1, 1 };
    cx_conv_geom g1 = geom_of(&one), g2 = geom_of(&two);
    cr_assert(cx_conv_geom_finish(&g1) && cx_conv_geom_finish(&g2));
    cr_assert_not(cx_wino_applies(&g1), "a 1x1 output took Winograd");
    cr_assert(cx_wino_applies(&g2), "a 2x2 output did not take Winograd");
}

Test(conv2d, against_reference)
{
    rng_seed(1);
    int winograd = 0;
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) {
        cr_log_info("conv case %zu", i);
        run_conv_case(&conv_cases[i]);
        cx_conv_geom g = geom_of(&conv_cases[i]);
        cr_assert(cx_conv_geom_finish(&g));
        winograd += cx_wino_applies(&g);
    }
    /* the table covers the Winograd path too */
    cr_assert_geq(winograd, 4, "only %d cases take the Winograd path", winograd);
}

Test(conv2d, random_shapes)
{
    rng_seed(2);
    for (int it = 0; it < 40; it++) {
        conv_case t;
        t.groups = (int)rng_int(1, 3);
        t.n = rng_int(1, 5);
        t.c = t.groups * rng_int(1, 4);
        t.o = t.groups * rng_int(1, 4);
        t.kh = rng_int(1, 4);
        t.kw = rng_int(1, 4);
        t.sh = (int)rng_int(1, 3);
        t.sw = (int)rng_int(1, 3);
        t.dh = (int)rng_int(1, 2);
        t.dw = (int)rng_int(1, 2);
        t.ph = (int)rng_int(0, 2);
        t.pw = (int)rng_int(0, 2);
        t.h = rng_int(1, 12) + t.dh * (t.kh - 1);
        t.w = rng_int(1, 12) + t.dw * (t.kw - 1);
        run_conv_case(&t);
    }
}

/* Big enough that each image is split into several blocks of output rows
 * (Winograd tile rows; im2col row blocks for the 5x5 conv), and that the
 * thin path accumulates over chunks of images. */
Test(conv2d, multi_block, .timeout = 240)
{
    rng_seed(3);
    const conv_case winograd_blocks = { 5, 32, 96, 96, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1 };
    const conv_case im2col_blocks = { 3, 32, 40, 40, 16, 5, 5, 1, 1, 2, 2, 1, 1, 1 };
    const conv_case thin_chunks = { 5, 1, 600, 600, 2, 3, 3, 1, 1, 0, 0, 1, 1, 1 };
    run_conv_case(&winograd_blocks);
    run_conv_case(&im2col_blocks);
    run_conv_case(&thin_chunks);
}

/* The scratch is sized for the thread count at compile time; a kernel run
 * with more threads later uses only the lanes its scratch holds, and gives
 * the same bits as with one thread. */
Test(conv2d, more_threads_than_scratch_lanes)
{
    rng_seed(5);
    const conv_case cases[] = {
        { 4, 16, 10, 10, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1 },   /* Winograd */
        { 4, 6, 9, 9, 8, 5, 5, 2, 2, 2, 2, 1, 1, 1 },       /* im2col tiles */
    };
    const int saved = cx_get_num_threads();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cx_conv_geom g = geom_of(&cases[c]);
        cr_assert(cx_conv_geom_finish(&g));
        const size_t xs = (size_t)(g.n * g.c * g.h * g.w), ys = (size_t)(g.n * g.o * g.oh * g.ow);
        const size_t ws = (size_t)(g.o * g.c * g.kh * g.kw);
        float *x = random_buf(xs), *w = random_buf(ws), *dy = random_buf(ys);
        float *out[2][3];
        for (int run = 0; run < 2; run++) {
            cx_set_num_threads(1);
            size_t sb[3] = { cx_conv2d_scratch_bytes(&g), cx_conv2d_bwd_input_scratch_bytes(&g),
                             cx_conv2d_bwd_weight_scratch_bytes(&g) };
            cx_set_num_threads(run ? 3 : 1);
            out[run][0] = guarded(ys);
            out[run][1] = guarded(xs);
            out[run][2] = guarded(ws);
            unsigned char *scratch = scratch_alloc(sb[0]);
            cx_conv2d_fwd(out[run][0], x, w, NULL, false, &g, scratch, sb[0]);
            scratch_check_free(scratch, sb[0]);
            scratch = scratch_alloc(sb[1]);
            cx_conv2d_bwd_input(out[run][1], dy, w, NULL, &g, scratch, sb[1]);
            scratch_check_free(scratch, sb[1]);
            scratch = scratch_alloc(sb[2]);
            cx_conv2d_bwd_weight(out[run][2], x, dy, &g, scratch, sb[2]);
            scratch_check_free(scratch, sb[2]);
        }
        const size_t n[3] = { ys, xs, ws };
        for (int k = 0; k < 3; k++) {
            cr_assert(memcmp(out[0][k], out[1][k], n[k] * sizeof(float)) == 0, "case %zu, kernel %d: 1 vs 3 threads",
                      c, k);
            guarded_free(out[0][k]);
            guarded_free(out[1][k]);
        }
        guarded_free(x);
        guarded_free(w);
        guarded_free(dy);
    }
    cx_set_num_threads(saved);
}

Test(conv2d, geometry)
{
    cx_conv_geom g = { .n = 64, .c = 1, .h = 28, .w = 28, .o = 32, .kh = 3, .kw = 3, .stride_h = 1,
                       .stride_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1 };
    cr_assert(cx_conv_geom_finish(&g));
    cr_assert_eq(g.oh, 26);
    cr_assert_eq(g.ow, 26);

    cx_conv_geom s = g;
    s.h = 7, s.w = 8, s.stride_h = 2, s.stride_w = 3, s.pad_h = 1, s.pad_w = 1;
    cr_assert(cx_conv_geom_finish(&s));
    cr_assert_eq(s.oh, 4); /* (7 + 2 - 3) / 2 + 1 */
    cr_assert_eq(s.ow, 3); /* (8 + 2 - 3) / 3 + 1 */

    cx_conv_geom d = g;
    d.h = 10, d.dil_h = 2, d.dil_w = 3;
    cr_assert(cx_conv_geom_finish(&d));
    cr_assert_eq(d.oh, 6);  /* 10 - 2*2 */
    cr_assert_eq(d.ow, 22); /* 28 - 3*2 */

    cx_conv_geom bad;
    bad = g, bad.c = 3, bad.groups = 2;
    cr_assert_not(cx_conv_geom_finish(&bad), "channels not divisible by groups");
    bad = g, bad.c = 4, bad.o = 3, bad.groups = 2;
    cr_assert_not(cx_conv_geom_finish(&bad), "outputs not divisible by groups");
    bad = g, bad.kh = 29;
    cr_assert_not(cx_conv_geom_finish(&bad), "kernel larger than input");
    bad = g, bad.h = 4, bad.dil_h = 2;
    cr_assert_not(cx_conv_geom_finish(&bad), "dilated kernel larger than input");
    bad = g, bad.stride_w = 0;
    cr_assert_not(cx_conv_geom_finish(&bad), "zero stride");
    bad = g, bad.dil_h = 0;
    cr_assert_not(cx_conv_geom_finish(&bad), "zero dilation");
    bad = g, bad.pad_h = -1;
    cr_assert_not(cx_conv_geom_finish(&bad), "negative padding");
    bad = g, bad.groups = 0;
    cr_assert_not(cx_conv_geom_finish(&bad), "zero groups");
    bad = g, bad.n = 0;
    cr_assert_not(cx_conv_geom_finish(&bad), "empty batch");
    bad = g, bad.kw = 0;
    cr_assert_not(cx_conv_geom_finish(&bad), "empty kernel");

    cx_conv_geom edge = g;
    edge.h = 1, edge.w = 1, edge.pad_h = 1, edge.pad_w = 1;
    cr_assert(cx_conv_geom_finish(&edge), "padding makes room for the kernel");
    cr_assert_eq(edge.oh, 1);
}

/* ---- pooling ------------------------------------------------------------ */

static void ref_pool(const cx_pool_geom *g, bool is_max, const float *x, const float *dy, double *y,
                     double *dx)
{
    const int64_t ip = g->h * g->w, op = g->oh * g->ow;
    for (int64_t i = 0; i < g->n * g->c * ip; i++) dx[i] = 0.0;
    for (int64_t t = 0; t < g->n * g->c; t++)
        for (int64_t oh = 0; oh < g->oh; oh++)
            for (int64_t ow = 0; ow < g->ow; ow++) {
                float m = -INFINITY;
                int64_t arg = -1;
                double sum = 0.0;
                for (int64_t kh = 0; kh < g->kh; kh++)
                    for (int64_t kw = 0; kw < g->kw; kw++) {
                        int64_t ih = oh * g->sh - g->ph + kh, iw = ow * g->sw - g->pw + kw;
                        if (ih < 0 || ih >= g->h || iw < 0 || iw >= g->w) continue;
                        float v = x[t * ip + ih * g->w + iw];
                        if (arg < 0 || v > m || isnan(v)) {
                            m = v;
                            arg = ih * g->w + iw;
                        }
                        sum += v;
                    }
                double grad = dy[t * op + oh * g->ow + ow];
                if (is_max) {
                    y[t * op + oh * g->ow + ow] = m;
                    dx[t * ip + arg] += grad;
                } else {
                    y[t * op + oh * g->ow + ow] = sum / (double)(g->kh * g->kw);
                    for (int64_t kh = 0; kh < g->kh; kh++)
                        for (int64_t kw = 0; kw < g->kw; kw++) {
                            int64_t ih = oh * g->sh - g->ph + kh, iw = ow * g->sw - g->pw + kw;
                            if (ih < 0 || ih >= g->h || iw < 0 || iw >= g->w) continue;
                            dx[t * ip + ih * g->w + iw] += grad / (double)(g->kh * g->kw);
                        }
                }
            }
}

static void run_pool_case(cx_pool_geom g, const float *x_in)
{
    cr_assert(cx_pool_geom_finish(&g));
    const size_t xs = (size_t)(g.n * g.c * g.h * g.w), ys = (size_t)(g.n * g.c * g.oh * g.ow);
    float *x = x_in ? guarded(xs) : random_buf(xs);
    if (x_in) memcpy(x, x_in, sizeof(float) * xs);
    float *dy = random_buf(ys), *y = guarded(ys), *dx = guarded(xs);
    double *ry = calloc(ys, sizeof(double)), *rdx = calloc(xs, sizeof(double));
    double *mag_y = calloc(ys, sizeof(double)), *mag_x = calloc(xs, sizeof(double));
    cr_assert(ry && rdx && mag_y && mag_x);
    for (int is_max = 0; is_max < 2; is_max++) {
        ref_pool(&g, is_max, x, dy, ry, rdx);
        fill_nan(y, ys);
        fill_nan(dx, xs);
        if (is_max) {
            cx_max_pool2d_fwd(y, x, &g);
            cx_max_pool2d_bwd(dx, x, dy, NULL, &g);
        } else {
            cx_avg_pool2d_fwd(y, x, &g);
            cx_avg_pool2d_bwd(dx, dy, &g);
        }
        check_guards(y, ys, "pool y");
        check_guards(dx, xs, "pool dx");
        if (is_max) {
            /* a max is a copy and its gradient a sum of copies: exact up to
             * the order of additions */
            for (size_t i = 0; i < ys; i++)
                cr_assert(y[i] == (float)ry[i] || (isnan(y[i]) && isnan(ry[i])), "max y[%zu]: %g vs %g", i,
                          (double)y[i], ry[i]);
        }
        for (size_t i = 0; i < ys; i++) mag_y[i] = fabs(ry[i]) * (double)(g.kh * g.kw) + 1.0;
        for (size_t i = 0; i < xs; i++) mag_x[i] = fabs(rdx[i]) * (double)(g.kh * g.kw) + 1.0;
        if (!is_max) check_close(y, ry, mag_y, ys, "avg pool y");
        check_close(dx, rdx, mag_x, xs, is_max ? "max pool dx" : "avg pool dx");
    }

    /* relu's gradient folded into max pooling's: dx kept where posmask > 0,
     * with posmask the pooled tensor itself (relu before the pool) or any
     * other tensor */
    float *xr = guarded(xs), *pm = guarded(xs);
    for (size_t i = 0; i < xs; i++) {
        xr[i] = x[i] - 0.5f;
        pm[i] = rng_uniform() - 0.5f;
    }
    ref_pool(&g, true, xr, dy, ry, rdx);
    for (int own = 0; own < 2; own++) {
        const float *mask = own ? xr : pm;
        fill_nan(dx, xs);
        cx_max_pool2d_bwd(dx, xr, dy, mask, &g);
        check_guards(dx, xs, "masked pool dx");
        for (size_t i = 0; i < xs; i++) {
            double want = mask[i] > 0 ? rdx[i] : 0.0;
            cr_assert(fabs((double)dx[i] - want) <= 1e-6 * (fabs(want) * (double)(g.kh * g.kw) + 1.0),
                      "max pool dx, posmask %s [%zu]: got %g, want %g", own ? "x" : "other", i, (double)dx[i], want);
        }
    }
    guarded_free(xr);
    guarded_free(pm);
    free(ry);
    free(rdx);
    free(mag_y);
    free(mag_x);
    guarded_free(x);
    guarded_free(dy);
    guarded_free(y);
    guarded_free(dx);
}

Test(pool2d, against_reference)
{
    rng_seed(4);
    /* n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw */
    const cx_pool_geom cases[] = {
        { 64, 64, 24, 24, 0, 0, 2, 2, 2, 2, 0, 0 }, /* MNIST */
        { 1, 3, 7, 7, 0, 0, 3, 3, 2, 2, 1, 1 },
        { 5, 2, 9, 6, 0, 0, 3, 2, 1, 2, 1, 1 },
        { 2, 3, 5, 5, 0, 0, 2, 2, 2, 2, 0, 0 },     /* odd size: last row/col dropped */
        { 3, 2, 11, 13, 0, 0, 5, 4, 3, 2, 2, 2 },
        { 2, 2, 4, 4, 0, 0, 4, 4, 1, 1, 0, 0 },     /* global */
        { 2, 2, 6, 5, 0, 0, 1, 1, 1, 1, 0, 0 },     /* identity */
        { 1, 1, 1, 1, 0, 0, 3, 3, 1, 1, 1, 1 },     /* 1x1 input, all-padding borders */
        { 1, 2, 5, 300, 0, 0, 3, 3, 2, 2, 1, 1 },  /* wide rows: several column blocks */
        { 2, 1, 4, 200, 0, 0, 2, 3, 1, 1, 0, 1 },   /* wide rows, stride 1 */
        { 1, 2, 9, 40, 0, 0, 3, 3, 3, 3, 1, 1 },    /* stride 3 */
        { 3, 2, 9, 40, 0, 0, 2, 2, 2, 2, 0, 0 },    /* 2x2: two 8-wide vectors and a 4-wide one */
        { 2, 3, 7, 37, 0, 0, 2, 2, 2, 2, 0, 0 },    /* 2x2: odd sizes, scalar tail */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_pool_case(cases[i], NULL);
    for (int it = 0; it < 30; it++) {
        cx_pool_geom g = { .n = rng_int(1, 5), .c = rng_int(1, 4), .kh = (int)rng_int(1, 4),
                           .kw = (int)rng_int(1, 4), .sh = (int)rng_int(1, 3), .sw = (int)rng_int(1, 3) };
        g.ph = (int)rng_int(0, g.kh / 2);
        g.pw = (int)rng_int(0, g.kw / 2);
        g.h = rng_int(g.kh, 14);
        g.w = rng_int(g.kw, 14);
        run_pool_case(g, NULL);
    }
}

Test(pool2d, ties_and_infinities)
{
    /* All equal: every window's gradient goes to its first element. */
    cx_pool_geom g = { .n = 1, .c = 1, .h = 4, .w = 4, .kh = 2, .kw = 2, .sh = 2, .sw = 2 };
    cr_assert(cx_pool_geom_finish(&g));
    float x[16], dy[4] = { 1, 2, 3, 4 }, dx[16], y[4];
    for (int i = 0; i < 16; i++) x[i] = 0.5f;
    cx_max_pool2d_fwd(y, x, &g);
    cx_max_pool2d_bwd(dx, x, dy, NULL, &g);
    const float want[16] = { 1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4, 0, 0, 0, 0, 0 };
    for (int i = 0; i < 16; i++) cr_assert_eq(dx[i], want[i], "tie dx[%d] = %g", i, (double)dx[i]);
    for (int i = 0; i < 4; i++) cr_assert_eq(y[i], 0.5f);

    /* Overlapping windows with a tie inside a window: the row-major first
     * maximum wins, and a shared maximum collects both gradients. */
    cx_pool_geom o = { .n = 1, .c = 1, .h = 3, .w = 3, .kh = 2, .kw = 2, .sh = 1, .sw = 1 };
    cr_assert(cx_pool_geom_finish(&o));
    const float xo[9] = { 1, 5, 5, 1, 1, 1, 5, 1, 1 };
    float dyo[4] = { 1, 10, 100, 1000 }, dxo[9], yo[4];
    cx_max_pool2d_fwd(yo, xo, &o);
    cx_max_pool2d_bwd(dxo, xo, dyo, NULL, &o);
    const float wanto[9] = { 0, 11, 0, 0, 1000, 0, 100, 0, 0 };
    for (int i = 0; i < 9; i++) cr_assert_eq(dxo[i], wanto[i], "overlap dx[%d] = %g", i, (double)dxo[i]);

    /* -inf everywhere, with padding: padding never wins, the first real
     * element does. */
    cx_pool_geom p = { .n = 1, .c = 1, .h = 3, .w = 3, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1 };
    cr_assert(cx_pool_geom_finish(&p));
    cr_assert_eq(p.oh, 2);
    float xi[9], dyi[4] = { 1, 1, 1, 1 }, dxi[9], yi[4];
    for (int i = 0; i < 9; i++) xi[i] = -INFINITY;
    cx_max_pool2d_fwd(yi, xi, &p);
    cx_max_pool2d_bwd(dxi, xi, dyi, NULL, &p);
    for (int i = 0; i < 4; i++) cr_assert(isinf(yi[i]) && yi[i] < 0);
    const float wanti[9] = { 1, 1, 0, 1, 1, 0, 0, 0, 0 };
    for (int i = 0; i < 9; i++) cr_assert_eq(dxi[i], wanti[i], "-inf dx[%d] = %g", i, (double)dxi[i]);

    /* Negative values next to padding: avg counts the padding as zeros
     * (divisor always kh*kw), max ignores it. */
    float xn[9];
    for (int i = 0; i < 9; i++) xn[i] = -1.0f - (float)i;
    cx_max_pool2d_fwd(yi, xn, &p);
    cr_assert_eq(yi[0], -1.0f);
    cx_avg_pool2d_fwd(yi, xn, &p);
    cr_assert_float_eq(yi[0], (-1.0f - 2.0f - 4.0f - 5.0f) / 9.0f, 1e-6);

    /* NaN propagates through max pooling. */
    float xq[16];
    for (int i = 0; i < 16; i++) xq[i] = (float)i;
    xq[5] = NAN;
    cx_max_pool2d_fwd(y, xq, &g);
    cr_assert(isnan(y[0]));
    cr_assert_eq(y[1], 7.0f);

    /* The same rules on the vectorized 2x2 path (8 windows per row): ties
     * go to the first tap, a NaN is taken, and of two NaNs the later. */
    cx_pool_geom v = { .n = 1, .c = 1, .h = 2, .w = 16, .kh = 2, .kw = 2, .sh = 2, .sw = 2 };
    cr_assert(cx_pool_geom_finish(&v));
    float xv[32], dyv[8], dxv[32], yv[8];
    for (int i = 0; i < 32; i++) xv[i] = 0.5f;
    for (int i = 0; i < 8; i++) dyv[i] = (float)(i + 1);
    xv[3] = NAN;                /* window 1, tap 1 */
    xv[8] = xv[16 + 9] = NAN;   /* window 4, taps 0 and 3 */
    cx_max_pool2d_fwd(yv, xv, &v);
    cx_max_pool2d_bwd(dxv, xv, dyv, NULL, &v);
    for (int i = 0; i < 8; i++) cr_assert(i == 1 || i == 4 ? isnan(yv[i]) : yv[i] == 0.5f, "vector y[%d]", i);
    float wantv[32] = { 0 };
    for (int i = 0; i < 8; i++) wantv[2 * i] = dyv[i];
    wantv[2] = 0, wantv[3] = dyv[1];
    wantv[8] = 0, wantv[16 + 9] = dyv[4];
    for (int i = 0; i < 32; i++) cr_assert_eq(dxv[i], wantv[i], "vector dx[%d] = %g", i, (double)dxv[i]);
}

Test(pool2d, geometry)
{
    cx_pool_geom g = { .n = 2, .c = 3, .h = 7, .w = 8, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1 };
    cr_assert(cx_pool_geom_finish(&g));
    cr_assert_eq(g.oh, 4); /* floor((7 + 2 - 3) / 2) + 1 */
    cr_assert_eq(g.ow, 4); /* floor((8 + 2 - 3) / 2) + 1 */
    cx_pool_geom m = { .n = 1, .c = 1, .h = 5, .w = 5, .kh = 2, .kw = 2, .sh = 2, .sw = 2 };
    cr_assert(cx_pool_geom_finish(&m));
    cr_assert_eq(m.oh, 2);
    cx_pool_geom ok = { .n = 1, .c = 1, .h = 4, .w = 4, .kh = 2, .kw = 2, .sh = 2, .sw = 2, .ph = 1, .pw = 1 };
    cr_assert(cx_pool_geom_finish(&ok), "padding k/2 is allowed");

    cx_pool_geom bad;
    bad = g, bad.kh = 0;
    cr_assert_not(cx_pool_geom_finish(&bad), "zero kernel");
    bad = g, bad.sw = 0;
    cr_assert_not(cx_pool_geom_finish(&bad), "zero stride");
    bad = g, bad.ph = 2;
    cr_assert_not(cx_pool_geom_finish(&bad), "padding above k/2");
    bad = g, bad.pw = -1;
    cr_assert_not(cx_pool_geom_finish(&bad), "negative padding");
    bad = g, bad.h = 1, bad.ph = 0;
    cr_assert_not(cx_pool_geom_finish(&bad), "empty output");
    bad = g, bad.n = 0;
    cr_assert_not(cx_pool_geom_finish(&bad), "empty batch");
}

/* ---- matmul ------------------------------------------------------------- */

static void run_matmul_case(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t sa,
                            int64_t sb)
{
    const int64_t asz = m * k, bsz = k * n;
    const size_t an = (size_t)(sa ? (batch - 1) * sa + asz : asz), bn = (size_t)(sb ? (batch - 1) * sb + bsz : bsz);
    const size_t cn = (size_t)(batch * m * n);
    float *a = random_buf(an), *b = random_buf(bn), *c = guarded(cn);
    double *ref = calloc(cn + 1, sizeof(double)), *mag = calloc(cn + 1, sizeof(double));
    cr_assert(ref && mag);
    for (int64_t p = 0; p < batch; p++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                for (int64_t l = 0; l < k; l++) {
                    float av = a[p * sa + (ta ? l * m + i : i * k + l)];
                    float bv = b[p * sb + (tb ? j * k + l : l * n + j)];
                    ref[(p * m + i) * n + j] += (double)av * bv;
                    mag[(p * m + i) * n + j] += fabs((double)av * bv);
                }
    fill_nan(c, cn);
    cx_matmul_f32(c, a, b, batch, m, n, k, ta, tb, sa, sb);
    check_guards(c, cn, "matmul c");
    check_close(c, ref, mag, cn, "matmul c");
    free(ref);
    free(mag);
    guarded_free(a);
    guarded_free(b);
    guarded_free(c);
}

/* ---- affine claims (pool.c) ------------------------------------------------ */

typedef struct {
    cx_claims *c;
    int64_t tid, n;
    _Atomic int *taken;   /* times each item was handed out */
    int64_t *order;       /* this thread's items, in the order it got them */
    int64_t count;
    atomic_int *go;
} claim_worker;

static void *claim_all(void *p)
{
    claim_worker *w = p;
    while (!atomic_load(w->go)) {}
    for (int64_t i; (i = cx_claims_next(w->c, w->tid)) >= 0;) {
        cr_assert(i < w->n, "item %lld of %lld", (long long)i, (long long)w->n);
        atomic_fetch_add(&w->taken[i], 1);
        w->order[w->count++] = i;
    }
    return NULL;
}

/* Every item goes out exactly once whatever the threads' race, and a
 * thread alone takes its own range first, front to back, then the
 * others' from their backs. */
Test(pool, claims_hand_out_each_item_once_own_range_first)
{
    const int64_t ns[] = { 0, 1, 3, 7, 64, 1000, 4099 };
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (int threads = 1; threads <= 20; threads += threads < 4 ? 1 : 8) {
            const int64_t n = ns[a];
            cx_claims c;
            cx_claims_init(&c, n, threads);
            _Atomic int *taken = calloc((size_t)n + 1, sizeof *taken);
            claim_worker w[20];
            pthread_t th[20];
            atomic_int go = 0;
            for (int t = 0; t < threads; t++) {
                w[t] = (claim_worker){ &c, t, n, taken, malloc(sizeof(int64_t) * ((size_t)n + 1)), 0, &go };
                cr_assert_eq(pthread_create(&th[t], NULL, claim_all, &w[t]), 0);
            }
            atomic_store(&go, 1);
            for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
            for (int64_t i = 0; i < n; i++) cr_assert_eq(taken[i], 1, "n %lld threads %d: item %lld taken %d times", (long long)n, threads, (long long)i, (int)taken[i]);
            for (int t = 0; t < threads; t++) free(w[t].order);
            free(taken);
        }
    /* one thread of four: its own quarter in order, then the rest from the back of each */
    cx_claims c;
    cx_claims_init(&c, 8, 4);
    const int64_t want[] = { 4, 5, 7, 6, 1, 0, 3, 2 };
    for (int k = 0; k < 8; k++) cr_assert_eq(cx_claims_next(&c, 2), want[k], "claim %d", k);
    cr_assert_eq(cx_claims_next(&c, 2), -1);
    cr_assert_eq(cx_claims_next(&c, 0), -1);
}

Test(matmul, against_reference)
{
    rng_seed(5);
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        for (int64_t batch = 1; batch <= 5; batch += 4) {
            int64_t m = 7, n = 9, k = 13;
            run_matmul_case(batch, m, n, k, ta, tb, m * k, k * n);          /* contiguous */
            run_matmul_case(batch, m, n, k, ta, tb, 0, k * n);              /* broadcast A */
            run_matmul_case(batch, m, n, k, ta, tb, m * k, 0);              /* broadcast B (folded if !ta) */
            run_matmul_case(batch, m, n, k, ta, tb, 0, 0);                  /* both broadcast */
            run_matmul_case(batch, m, n, k, ta, tb, m * k + 5, k * n + 3);  /* gaps between batches */
            run_matmul_case(batch, m, n, k, ta, tb, m * k + 5, 0);          /* gapped A, shared B: no fold */
        }
    }
    /* shapes that OpenBLAS threads and blocks */
    run_matmul_case(3, 130, 70, 300, false, false, 130 * 300, 0);
    run_matmul_case(2, 64, 257, 129, true, true, 64 * 129, 257 * 129);
    run_matmul_case(1, 1, 1, 1, false, false, 1, 1);
    for (int it = 0; it < 20; it++) {
        int64_t batch = rng_int(1, 4), m = rng_int(1, 40), n = rng_int(1, 40), k = rng_int(1, 40);
        bool ta = rng_int(0, 1), tb = rng_int(0, 1);
        int64_t sa = rng_int(0, 1) ? m * k + rng_int(0, 3) : 0, sb = rng_int(0, 1) ? k * n + rng_int(0, 3) : 0;
        run_matmul_case(batch, m, n, k, ta, tb, sa, sb);
    }
}

/* Products of a million multiply-adds and up run through oneDNN when they
 * split by rows (kernels/matmul.c): right against the reference in every
 * transpose, and the same bits with 1 and 3 threads on both sides of the
 * library choice (a row split, a column split, and parts near the size
 * where the library changes). */
Test(matmul, library_paths_right_and_thread_count_free)
{
    rng_seed(11);
    for (int t = 0; t < 4; t++) run_matmul_case(1, 256, 96, 64, t & 1, t & 2, 256 * 64, 0);
    run_matmul_case(2, 96, 300, 48, false, true, 96 * 48, 300 * 48);
    const int64_t shapes[][3] = { { 512, 192, 256 }, { 128, 1024, 64 }, { 160, 96, 80 }, { 1030, 33, 40 }, { 64, 96, 1024 } };
    const int saved = cx_get_num_threads();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        for (int tr = 0; tr < 4; tr++) {
            float *a = random_buf((size_t)(m * k)), *b = random_buf((size_t)(k * n));
            float *c[2] = { guarded((size_t)(m * n)), guarded((size_t)(m * n)) };
            for (int run = 0; run < 2; run++) {
                cx_set_num_threads(run ? 3 : 1);
                cx_matmul_f32(c[run], a, b, 1, m, n, k, tr & 1, tr & 2, m * k, k * n);
            }
            cr_assert(memcmp(c[0], c[1], sizeof(float) * (size_t)(m * n)) == 0, "(%lld, %lld, %lld) transposes %d: 1 vs 3 threads",
                      (long long)m, (long long)n, (long long)k, tr);
            guarded_free(a);
            guarded_free(b);
            guarded_free(c[0]);
            guarded_free(c[1]);
        }
    }
    cx_set_num_threads(saved);
}

/* A signal handled while oneDNN's sgemm runs. Debian's oneDNN 2.6 points
 * rsp at a heap workspace inside its f32 gemm kernels (fixed upstream in
 * 2026, oneDNN commit d090db1), so the kernel's signal frame lands in the
 * heap: a preempted trainer's SIGTERM aborted it with "corrupted size vs.
 * prev_size". Here a thread signals the one running oneDNN's products as
 * fast as it can; every signal must be handled, and nothing corrupted. */
static atomic_int g_signals_handled;
static atomic_bool g_stop_signalling;

static void count_signal(int sig)
{
    (void)sig;
    atomic_fetch_add(&g_signals_handled, 1);
}

static void *signal_often(void *target)
{
    const struct timespec nap = { 0, 20000 };
    while (!atomic_load(&g_stop_signalling)) {
        pthread_kill(*(pthread_t *)target, SIGUSR1);
        nanosleep(&nap, NULL);
    }
    return NULL;
}

Test(matmul, onednn_products_survive_signals, .timeout = 120)
{
    struct sigaction sa, was;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = count_signal;
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGUSR1, &sa, &was), 0);
    pthread_t self = pthread_self(), th;
    atomic_store(&g_stop_signalling, false);
    cr_assert_eq(pthread_create(&th, NULL, signal_often, &self), 0);
    /* the mlp's test-set products, and the transposes of its backward */
    const int64_t shapes[][3] = { { 1000, 64, 784 }, { 784, 64, 1000 }, { 512, 256, 512 } };
    rng_seed(17);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        /* below AVX-512 f32 products go to OpenBLAS (an AVX2-only CPU's);
         * oneDNN, called below by itself, still runs them there */
        if (cx_isa_active() >= CX_ISA_AVX512)
            cr_assert(cx_sgemm_prefers_dnnl(m, n, k), "(%lld, %lld, %lld) is not a oneDNN shape", (long long)m,
                      (long long)n, (long long)k);
        float *a = random_buf((size_t)(m * k)), *b = random_buf((size_t)(k * n));
        float *want = guarded((size_t)(m * n)), *got = guarded((size_t)(m * n));
        for (int tr = 0; tr < 4; tr++) {
            bool ta = tr & 1, tb = tr & 2;
            int64_t lda = ta ? m : k, ldb = tb ? k : n;
            cx_sgemm_serial(ta, tb, m, n, k, a, lda, b, ldb, 0.0f, want, n);
            for (int rep = 0; rep < 20; rep++) {
                cx_sgemm_serial_on(true, ta, tb, m, n, k, a, lda, b, ldb, 0.0f, got, n);
                for (int64_t i = 0; i < m * n; i++)
                    cr_assert(fabsf(got[i] - want[i]) <= 1e-3f * (1.0f + fabsf(want[i])),
                              "(%lld, %lld, %lld) transposes %d: element %lld is %g, OpenBLAS gives %g", (long long)m,
                              (long long)n, (long long)k, tr, (long long)i, got[i], want[i]);
            }
        }
        guarded_free(a);
        guarded_free(b);
        guarded_free(want);
        guarded_free(got);
    }
    atomic_store(&g_stop_signalling, true);
    pthread_join(th, NULL);
    sigaction(SIGUSR1, &was, NULL);
    /* a blocked signal waits for the call's end (those sent meanwhile
     * merge into one): many must have been handled */
    cr_assert_gt(atomic_load(&g_signals_handled), 100, "only %d signals were handled", atomic_load(&g_signals_handled));
}

Test(matmul, empty_k_gives_zeros)
{
    float c[6];
    fill_nan(c, 6);
    float a[1] = { 1 }, b[1] = { 1 };
    cx_matmul_f32(c, a, b, 2, 1, 3, 0, false, false, 0, 0);
    for (int i = 0; i < 6; i++) cr_assert_eq(c[i], 0.0f);
}

/* ---- gather / scatter_add ----------------------------------------------- */

static int64_t random_index(int64_t dim, bool allow_bad)
{
    if (dim <= 0) return rng_int(-2, 2);
    if (allow_bad && rng_int(0, 9) == 0) return rng_int(0, 1) ? -rng_int(1, 3) : dim + rng_int(0, 3);
    return rng_int(0, dim - 1);
}

static void run_gather_case(int64_t outer, int64_t src_dim, int64_t idx_dim, int64_t inner, bool allow_bad)
{
    const size_t sn = (size_t)(outer * src_dim * inner), on = (size_t)(outer * idx_dim * inner);
    float *src = random_buf(sn), *out = guarded(on);
    int64_t *index = malloc(sizeof(int64_t) * on);
    cr_assert_not_null(index);
    int64_t want_bad = 0;
    for (size_t i = 0; i < on; i++) {
        index[i] = random_index(src_dim, allow_bad);
        want_bad += index[i] < 0 || index[i] >= src_dim;
    }
    fill_nan(out, on);
    int64_t bad = cx_gather_f32(out, src, index, outer, src_dim, idx_dim, inner);
    cr_assert_eq(bad, want_bad);
    check_guards(out, on, "gather out");
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < idx_dim; i++)
            for (int64_t e = 0; e < inner; e++) {
                size_t at = (size_t)((o * idx_dim + i) * inner + e);
                int64_t s = index[at];
                float want = s >= 0 && s < src_dim ? src[(o * src_dim + s) * inner + e] : 0.0f;
                cr_assert_eq(out[at], want, "gather out[%zu]", at);
            }
    free(index);
    guarded_free(src);
    guarded_free(out);
}

static void run_scatter_case(int64_t outer, int64_t out_dim, int64_t idx_dim, int64_t inner, bool allow_bad)
{
    const size_t on = (size_t)(outer * out_dim * inner), sn = (size_t)(outer * idx_dim * inner);
    float *src = random_buf(sn), *out = random_buf(on), *out2 = guarded(on);
    float *ref = malloc(sizeof(float) * on);
    int64_t *index = malloc(sizeof(int64_t) * sn);
    cr_assert(ref && index);
    memcpy(ref, out, sizeof(float) * on);
    memcpy(out2, out, sizeof(float) * on);
    int64_t want_bad = 0;
    for (size_t i = 0; i < sn; i++) {
        index[i] = random_index(out_dim, allow_bad);
        want_bad += index[i] < 0 || index[i] >= out_dim;
    }
    /* Each element gets its additions in increasing i: the kernel must
     * reproduce this order exactly (bitwise), whatever the thread count. */
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < idx_dim; i++)
            for (int64_t e = 0; e < inner; e++) {
                int64_t d = index[(o * idx_dim + i) * inner + e];
                if (d >= 0 && d < out_dim) ref[(o * out_dim + d) * inner + e] += src[(o * idx_dim + i) * inner + e];
            }
    int64_t bad = cx_scatter_add_f32(out, src, index, outer, out_dim, idx_dim, inner);
    cr_assert_eq(bad, want_bad);
    check_guards(out, on, "scatter out");
    for (size_t i = 0; i < on; i++) cr_assert_eq(out[i], ref[i], "scatter out[%zu]: %.9g vs %.9g", i, (double)out[i], (double)ref[i]);
    cx_scatter_add_f32(out2, src, index, outer, out_dim, idx_dim, inner);
    cr_assert(memcmp(out, out2, sizeof(float) * on) == 0, "scatter_add is not deterministic");
    free(ref);
    free(index);
    guarded_free(src);
    guarded_free(out);
    guarded_free(out2);
}

Test(gather, against_reference)
{
    rng_seed(6);
    run_gather_case(1, 1, 1, 1, false);
    run_gather_case(64, 10, 1, 1, false);      /* pick one class per row */
    run_gather_case(3, 7, 5, 4, true);
    run_gather_case(2, 50, 3000, 3, true);      /* enough rows to split over threads */
    run_gather_case(1, 1000, 200, 300, true);   /* wide rows */
    run_gather_case(4, 0, 3, 2, false);         /* empty source: everything out of range */
    for (int it = 0; it < 20; it++)
        run_gather_case(rng_int(1, 6), rng_int(1, 9), rng_int(1, 9), rng_int(1, 9), true);
}

Test(scatter_add, against_reference_and_deterministic)
{
    rng_seed(7);
    run_scatter_case(1, 1, 1, 1, false);
    run_scatter_case(1, 3, 5000, 1, false);      /* heavy duplicates, one column */
    run_scatter_case(3, 10, 50, 1000, true);     /* several column blocks per slice */
    run_scatter_case(1, 1000, 4000, 40, true);   /* embedding-backward-like */
    run_scatter_case(64, 10, 1, 1, true);
    run_scatter_case(2, 4, 300, 700, true);
    for (int it = 0; it < 20; it++)
        run_scatter_case(rng_int(1, 6), rng_int(1, 9), rng_int(1, 9), rng_int(1, 9), true);
}

/* The row-index kernels against the element kernels on the same index
 * expanded over the rows: the same bits, the same count of bad indices. */
static void run_rows_case(int64_t outer, int64_t dim, int64_t idx_dim, int64_t inner, int64_t gap)
{
    const int64_t sd = gap, so = idx_dim * gap + 1;   /* strided rows, and outer rows apart */
    const size_t rn = (size_t)(outer * so), xn = (size_t)(outer * idx_dim * inner), dn = (size_t)(outer * dim * inner);
    int64_t *rows = malloc(sizeof(int64_t) * rn), *full = malloc(sizeof(int64_t) * xn);
    cr_assert(rows && full);
    for (size_t i = 0; i < rn; i++) rows[i] = random_index(dim, true);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < idx_dim; i++)
            for (int64_t e = 0; e < inner; e++) full[(o * idx_dim + i) * inner + e] = rows[o * so + i * sd];
    float *src = random_buf(dn), *a = guarded(xn), *b = guarded(xn);
    fill_nan(a, xn);
    fill_nan(b, xn);
    cr_assert_eq(cx_gather_rows_f32(a, src, rows, so, sd, outer, dim, idx_dim, inner),
                 cx_gather_f32(b, src, full, outer, dim, idx_dim, inner));
    check_guards(a, xn, "gather rows out");
    cr_assert(memcmp(a, b, sizeof(float) * xn) == 0, "gather rows differ from gather");
    float *vals = random_buf(xn), *acc = random_buf(dn), *acc2 = guarded(dn);
    memcpy(acc2, acc, sizeof(float) * dn);
    cr_assert_eq(cx_scatter_add_rows_f32(acc, vals, rows, so, sd, outer, dim, idx_dim, inner),
                 cx_scatter_add_f32(acc2, vals, full, outer, dim, idx_dim, inner));
    check_guards(acc, dn, "scatter rows out");
    cr_assert(memcmp(acc, acc2, sizeof(float) * dn) == 0, "scatter_add rows differ from scatter_add");
    free(rows);
    free(full);
    guarded_free(src); guarded_free(a); guarded_free(b);
    guarded_free(vals); guarded_free(acc); guarded_free(acc2);
}

Test(gather, row_indices_match_the_expanded_index)
{
    rng_seed(8);
    run_rows_case(1, 256, 2048, 256, 1);   /* the gpt's token embedding */
    run_rows_case(1, 50, 3000, 3, 2);
    run_rows_case(3, 10, 50, 1000, 1);     /* several column blocks per slice */
    run_rows_case(2, 4, 300, 700, 3);
    for (int it = 0; it < 20; it++) run_rows_case(rng_int(1, 6), rng_int(1, 9), rng_int(1, 9), rng_int(1, 9), rng_int(1, 3));
}

Test(gather, reports_every_bad_index)
{
    const float src[6] = { 1, 2, 3, 4, 5, 6 }; /* (1, 3, 2) */
    const int64_t index[4] = { -1, 2, 3, 0 };  /* (1, 2, 2) */
    float out[4];
    cr_assert_eq(cx_gather_f32(out, src, index, 1, 3, 2, 2), 2);
    cr_assert_eq(out[0], 0.0f);
    cr_assert_eq(out[1], 6.0f);
    cr_assert_eq(out[2], 0.0f);
    cr_assert_eq(out[3], 2.0f);
    float acc[6] = { 0 };
    const float vals[4] = { 10, 20, 30, 40 };
    cr_assert_eq(cx_scatter_add_f32(acc, vals, index, 1, 3, 2, 2), 2);
    const float want[6] = { 0, 40, 0, 0, 0, 20 };
    for (int i = 0; i < 6; i++) cr_assert_eq(acc[i], want[i]);
}

/* ---- attention: the rows route and the tiled route ------------------------------------ */

typedef struct {
    int64_t n, h, t, s, d;
    bool causal;
} attn_shape;

/* q, k, v column blocks of one (N, L, 3, H, D) projection (L = max(T, S)),
 * as the gpt's are; o and dout contiguous (N, T, H, D) */
static cx_attn_geom attn_geom_of(const attn_shape *a)
{
    const int64_t l = a->t > a->s ? a->t : a->s, hd = a->h * a->d;
    cx_attn_geom g = { .n = a->n, .t = a->t, .s = a->s, .h = a->h, .d = a->d, .causal = a->causal,
                       .scale = 1.0f / sqrtf((float)a->d) };
    const int64_t proj[3] = { l * 3 * hd, 3 * hd, a->d }, plain[3] = { a->t * hd, hd, a->d };
    memcpy(g.q_strides, proj, sizeof proj);
    memcpy(g.k_strides, proj, sizeof proj);
    memcpy(g.v_strides, proj, sizeof proj);
    memcpy(g.o_strides, plain, sizeof plain);
    memcpy(g.do_strides, plain, sizeof plain);
    return g;
}

static double at_of(const float *base, const int64_t *st, int64_t n, int64_t r, int64_t h, int64_t e)
{
    return base[n * st[0] + r * st[1] + h * st[2] + e];
}

/* The definition in double, per head: P = softmax(scale q k^T) over the
 * visible keys, o = P v; dP = dout v^T, dS = P (dP - rowsum(P dP)),
 * dq = scale dS k, dk = scale dS^T q, dv = P^T dout (packed as the kernel's). */
static void ref_attention(double *o, double *dqkv, const float *q, const float *k, const float *v, const float *dout,
                          const cx_attn_geom *g)
{
    const int64_t t = g->t, s = g->s, d = g->d, hd = g->h * d;
    double *p = malloc(sizeof *p * (size_t)(t * s)), *dp = malloc(sizeof *dp * (size_t)(t * s));
    cr_assert(p && dp);
    memset(dqkv, 0, sizeof *dqkv * (size_t)(g->n * hd * (t + 2 * s)));
    double *dq = dqkv, *dk = dq + g->n * t * hd, *dv = dk + g->n * s * hd;
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t h = 0; h < g->h; h++) {
            for (int64_t i = 0; i < t; i++) {
                const int64_t vis = cx_attn_visible_keys(g, i);
                double mx = -INFINITY, sum = 0, delta = 0;
                for (int64_t j = 0; j < s; j++) {
                    double acc = 0;
                    for (int64_t e = 0; e < d; e++) acc += at_of(q, g->q_strides, n, i, h, e) * at_of(k, g->k_strides, n, j, h, e);
                    p[i * s + j] = j < vis ? acc * g->scale : -INFINITY;
                    if (j < vis && p[i * s + j] > mx) mx = p[i * s + j];
                }
                for (int64_t j = 0; j < s; j++) sum += p[i * s + j] = j < vis ? exp(p[i * s + j] - mx) : 0.0;
                for (int64_t j = 0; j < s; j++) p[i * s + j] = sum > 0 ? p[i * s + j] / sum : 0.0;
                for (int64_t e = 0; e < d; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < s; j++) acc += p[i * s + j] * at_of(v, g->v_strides, n, j, h, e);
                    o[(n * t + i) * hd + h * d + e] = acc;
                }
                for (int64_t j = 0; j < s; j++) {
                    double acc = 0;
                    for (int64_t e = 0; e < d; e++) acc += at_of(dout, g->do_strides, n, i, h, e) * at_of(v, g->v_strides, n, j, h, e);
                    dp[i * s + j] = acc;
                    delta += p[i * s + j] * acc;
                }
                for (int64_t j = 0; j < s; j++) {
                    const double ds = p[i * s + j] * (dp[i * s + j] - delta) * g->scale;
                    for (int64_t e = 0; e < d; e++) {
                        dq[(n * t + i) * hd + h * d + e] += ds * at_of(k, g->k_strides, n, j, h, e);
                        dk[(n * s + j) * hd + h * d + e] += ds * at_of(q, g->q_strides, n, i, h, e);
                        dv[(n * s + j) * hd + h * d + e] += p[i * s + j] * at_of(dout, g->do_strides, n, i, h, e);
                    }
                }
            }
        }
    free(p);
    free(dp);
}

/* within 1e-4 of the tensor's largest reference value: a wrong or missing
 * term is of the size of the values themselves */
static void check_attn(const float *got, const double *ref, size_t n, const char *what, const attn_shape *a)
{
    double big = 0;
    for (size_t i = 0; i < n; i++) big = fmax(big, fabs(ref[i]));
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs((double)got[i] - ref[i]) <= 1e-4 * big + 1e-7, "%s[%zu] (N%lld H%lld T%lld S%lld D%lld%s): got %.8g, want %.8g",
                  what, i, (long long)a->n, (long long)a->h, (long long)a->t, (long long)a->s, (long long)a->d,
                  a->causal ? " causal" : "", (double)got[i], ref[i]);
}

typedef struct {
    float *qkv, *dout, *o, *dqkv;
    size_t no, ng;
} attn_bufs;

/* one route's forward and backward into b->o and b->dqkv (the backward
 * given the reference output), scratch of `fwd_bytes` / `bwd_bytes` */
static void run_attn_route(attn_bufs *b, const cx_attn_geom *g, const float *o_ref, bool tiled, size_t fwd_bytes,
                           size_t bwd_bytes)
{
    const int64_t hd = g->h * g->d;
    const float *q = b->qkv, *k = b->qkv + hd, *v = b->qkv + 2 * hd;
    unsigned char *sf = scratch_alloc(fwd_bytes), *sb = scratch_alloc(bwd_bytes);
    fill_nan(b->o, b->no);
    cx_attention_route_fwd(b->o, q, k, v, g, sf, fwd_bytes, tiled);
    fill_nan(b->dqkv, b->ng);
    cx_attention_route_bwd(b->dqkv, q, k, v, o_ref, b->dout, g, sb, bwd_bytes, tiled);
    scratch_check_free(sf, fwd_bytes);
    scratch_check_free(sb, bwd_bytes);
    check_guards(b->o, b->no, "attention out");
    check_guards(b->dqkv, b->ng, "attention dqkv");
}

/* The interleaved backward writes the same bits as the packed one b holds,
 * each row's dq, dk, dv side by side */
static void check_interleaved(const attn_bufs *b, const cx_attn_geom *g, const float *o_in, bool tiled, size_t bwd_bytes)
{
    cx_attn_geom gi = *g;
    gi.interleaved = true;
    attn_bufs x = *b;
    x.dqkv = guarded(b->ng);
    unsigned char *sb = scratch_alloc(bwd_bytes);
    fill_nan(x.dqkv, x.ng);
    const int64_t hd = g->h * g->d, rows = g->n * g->t;
    cx_attention_route_bwd(x.dqkv, b->qkv, b->qkv + hd, b->qkv + 2 * hd, o_in, b->dout, &gi, sb, bwd_bytes, tiled);
    scratch_check_free(sb, bwd_bytes);
    check_guards(x.dqkv, x.ng, "interleaved dqkv");
    for (int64_t r = 0; r < rows; r++)
        for (int part = 0; part < 3; part++)
            cr_assert(memcmp(x.dqkv + (r * 3 + part) * hd, b->dqkv + (part * rows + r) * hd, sizeof(float) * (size_t)hd) == 0,
                      "%s interleaved: row %lld part %d differs from the packed", tiled ? "tiled" : "rows", (long long)r, part);
    guarded_free(x.dqkv);
}

static void run_attention_case(const attn_shape *a)
{
    const cx_attn_geom g = attn_geom_of(a);
    const int64_t l = a->t > a->s ? a->t : a->s, hd = a->h * a->d;
    attn_bufs b = { .no = (size_t)(a->n * a->t * hd), .ng = (size_t)(a->n * hd * (a->t + 2 * a->s)) };
    b.qkv = random_buf((size_t)(a->n * l * 3 * hd));
    b.dout = random_buf(b.no);
    b.o = guarded(b.no);
    b.dqkv = guarded(b.ng);
    double *o_ref = malloc(sizeof *o_ref * b.no), *g_ref = malloc(sizeof *g_ref * b.ng);
    float *o_in = malloc(sizeof *o_in * b.no);
    cr_assert(o_ref && g_ref && o_in);
    ref_attention(o_ref, g_ref, b.qkv, b.qkv + hd, b.qkv + 2 * hd, b.dout, &g);
    for (size_t i = 0; i < b.no; i++) o_in[i] = (float)o_ref[i];
    for (int tiled = 0; tiled < 2; tiled++) {
        const size_t fb = cx_attention_route_scratch_bytes(&g, false, tiled), bb = cx_attention_route_scratch_bytes(&g, true, tiled);
        run_attn_route(&b, &g, o_in, tiled, fb, bb);
        check_attn(b.o, o_ref, b.no, tiled ? "tiled out" : "rows out", a);
        check_attn(b.dqkv, g_ref, b.ng, tiled ? "tiled dqkv" : "rows dqkv", a);
        if (a->t == a->s) check_interleaved(&b, &g, o_in, tiled, bb);
    }
    free(o_ref);
    free(g_ref);
    free(o_in);
    guarded_free(b.qkv);
    guarded_free(b.dout);
    guarded_free(b.o);
    guarded_free(b.dqkv);
}

Test(attention, both_routes_against_reference, .timeout = 120)
{
    rng_seed(21);
    static const attn_shape cases[] = {
        { 2, 2, 128, 128, 64, true },    /* the gpt's head: four causal row blocks */
        { 1, 2, 128, 128, 64, false },   /* two full row blocks */
        { 2, 1, 130, 130, 16, true },    /* ragged last block */
        { 1, 2, 70, 150, 32, false },    /* fewer queries than keys */
        { 1, 1, 3, 7, 4, true },         /* causal with S > T: bottom-right aligned */
        { 1, 2, 40, 20, 128, true },     /* causal with S < T: the first rows see no key */
        { 1, 1, 33, 1030, 8, true },     /* more keys than the rows route takes: both tiled */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_attention_case(&cases[c]);
}

static attn_bufs attn_bufs_of(float *qkv, float *dout, const attn_shape *a)
{
    const int64_t hd = a->h * a->d;
    attn_bufs b = { .qkv = qkv, .dout = dout, .no = (size_t)(a->n * a->t * hd), .ng = (size_t)(a->n * hd * (a->t + 2 * a->s)) };
    b.o = guarded(b.no);
    b.dqkv = guarded(b.ng);
    return b;
}

static void attn_same(const attn_bufs *x, const attn_bufs *y, const char *what)
{
    cr_assert(memcmp(x->o, y->o, sizeof(float) * x->no) == 0, "%s: out differs", what);
    cr_assert(memcmp(x->dqkv, y->dqkv, sizeof(float) * x->ng) == 0, "%s: dqkv differs", what);
}

/* The rows route's result does not depend on the thread count; with
 * strides BLAS cannot take (a broadcast key row) it runs tiled, bit for
 * bit. */
Test(attention, rows_route_thread_count_free_and_strides)
{
    rng_seed(22);
    const attn_shape a = { 3, 2, 96, 96, 32, true };
    cx_attn_geom g = attn_geom_of(&a);
    const size_t n = (size_t)(a.n * a.t * a.h * a.d);
    float *qkv = random_buf(3 * n), *dout = random_buf(n), *o_in = random_buf(n);
    attn_bufs r[3] = { attn_bufs_of(qkv, dout, &a), attn_bufs_of(qkv, dout, &a), attn_bufs_of(qkv, dout, &a) };
    const int saved = cx_get_num_threads();
    for (int run = 0; run < 3; run++) {
        cx_set_num_threads(run == 1 ? 3 : 1);
        run_attn_route(&r[run], &g, o_in, run == 2, cx_attention_route_scratch_bytes(&g, false, run == 2),
                       cx_attention_route_scratch_bytes(&g, true, run == 2));
    }
    cx_set_num_threads(saved);
    attn_same(&r[0], &r[1], "rows route, 1 vs 3 threads");
    cr_assert(memcmp(r[0].o, r[2].o, sizeof(float) * r[0].no) != 0, "the rows route ran tiled");
    g.k_strides[1] = 0;
    run_attn_route(&r[0], &g, o_in, false, cx_attention_route_scratch_bytes(&g, false, false),
                   cx_attention_route_scratch_bytes(&g, true, false));
    run_attn_route(&r[1], &g, o_in, true, cx_attention_route_scratch_bytes(&g, false, true),
                   cx_attention_route_scratch_bytes(&g, true, true));
    attn_same(&r[0], &r[1], "broadcast key row: rows route vs tiled");
    for (int run = 0; run < 3; run++) { guarded_free(r[run].o); guarded_free(r[run].dqkv); }
    guarded_free(qkv);
    guarded_free(dout);
    guarded_free(o_in);
}

/* A scratch planned for the tiled route with no room for a rows lane (as
 * a persistent-cache executable from an older build has): the rows route
 * runs tiled, bit for bit, and writes nothing past the scratch. */
Test(attention, rows_route_given_tiled_scratch_runs_tiled)
{
    rng_seed(23);
    const attn_shape a = { 1, 1, 64, 1000, 8, false };
    const cx_attn_geom g = attn_geom_of(&a);
    const size_t n = (size_t)(a.n * a.s * a.h * a.d);
    float *qkv = random_buf(3 * n), *dout = random_buf(n), *o_in = random_buf(n);
    attn_bufs r[2] = { attn_bufs_of(qkv, dout, &a), attn_bufs_of(qkv, dout, &a) };
    const int saved = cx_get_num_threads();
    cx_set_num_threads(1);
    const size_t fb = cx_attention_route_scratch_bytes(&g, false, true), bb = cx_attention_route_scratch_bytes(&g, true, true);
    cr_assert(fb < cx_attention_route_scratch_bytes(&g, false, false) && bb < cx_attention_route_scratch_bytes(&g, true, false),
              "the case needs a rows lane larger than a tiled one");
    for (int run = 0; run < 2; run++) run_attn_route(&r[run], &g, o_in, run == 1, fb, bb);
    cx_set_num_threads(saved);
    attn_same(&r[0], &r[1], "rows route on the tiled scratch vs tiled");
    for (int run = 0; run < 2; run++) { guarded_free(r[run].o); guarded_free(r[run].dqkv); }
    guarded_free(qkv);
    guarded_free(dout);
    guarded_free(o_in);
}

/* ---- the vectorizable exp and erf (kernels/vmath.h) ------------------------------------ */

#include "vmath.h"

static double ulp_err(float got, double ref)
{
    if (ref == 0) return got == 0 ? 0 : INFINITY;
    double ulp = ldexp(1.0, ilogb((float)ref) - 23);
    return fabs((double)got - ref) / ulp;
}

Test(kernels, vexpf_is_within_2_ulp)
{
    double worst = 0, at = 0;
    for (double x = -87.3; x <= 88.7; x += 0.0137) {
        double e = ulp_err(cx_vexpf((float)x), exp((double)(float)x));
        if (e > worst) { worst = e; at = x; }
    }
    cr_assert_leq(worst, 2.0, "exp: %.2f ulp at x = %g", worst, at);
    cr_assert_eq(cx_vexpf(0.0f), 1.0f);
    cr_assert(isinf(cx_vexpf(89.0f)) && cx_vexpf(89.0f) > 0);
    cr_assert(isinf(cx_vexpf(INFINITY)));
    cr_assert_eq(cx_vexpf(-INFINITY), 0.0f);
    cr_assert_eq(cx_vexpf(-104.0f), 0.0f);
    cr_assert(isnan(cx_vexpf(NAN)));
}

/* The shortcut the GELU gradient takes must not move a bit: every 61st
 * non-positive float (subnormals, the underflow edge, -inf) and NaN. */
Test(kernels, vexpf_nonpos_is_vexpf_to_the_bit)
{
    long differ = 0;
    uint32_t first = 0;
    for (uint64_t u = 0x80000000u; u <= 0xff800000u; u += 61) {
        float x, a, b;
        uint32_t v = (uint32_t)u;
        memcpy(&x, &v, sizeof x);
        a = cx_vexpf(x);
        b = cx_vexpf_nonpos(x);
        if (memcmp(&a, &b, sizeof a) && !differ++) first = v;
    }
    const float edges[] = { -87.3365f, -87.33654475f, -87.33655f, -86.0f, -0.0f, -INFINITY, NAN };
    for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) {
        float a = cx_vexpf(edges[i]), b = cx_vexpf_nonpos(edges[i]);
        if (memcmp(&a, &b, sizeof a)) differ++;
    }
    cr_assert_eq(differ, 0, "%ld values differ, the first at bits 0x%08x", differ, first);
}

Test(kernels, vlogf_is_within_2_ulp)
{
    double worst = 0, at = 0;
    /* every 4097th positive float, subnormals included */
    for (uint32_t u = 1; u < 0x7f800000u; u += 4097) {
        float x;
        memcpy(&x, &u, sizeof x);
        double r = log((double)x);
        double e = ulp_err(cx_vlogf(x), r);
        if (e > worst) { worst = e; at = x; }
    }
    cr_assert_leq(worst, 2.0, "log: %.2f ulp at x = %g", worst, at);
    cr_assert_eq(cx_vlogf(1.0f), 0.0f);
    cr_assert(isinf(cx_vlogf(0.0f)) && cx_vlogf(0.0f) < 0);
    cr_assert(isinf(cx_vlogf(-0.0f)) && cx_vlogf(-0.0f) < 0);
    cr_assert(isinf(cx_vlogf(INFINITY)) && cx_vlogf(INFINITY) > 0);
    cr_assert(isnan(cx_vlogf(-1.0f)));
    cr_assert(isnan(cx_vlogf(-INFINITY)));
    cr_assert(isnan(cx_vlogf(NAN)));
}

Test(kernels, verff_is_within_6_ulp)
{
    double worst = 0, at = 0;
    for (double x = -6; x <= 6; x += 0.00071) {
        float xf = (float)x;
        double r = erf((double)xf);
        double e = fabs(r) < 1e-30 ? fabs(cx_verff(xf)) : ulp_err(cx_verff(xf), r);
        if (e > worst) { worst = e; at = x; }
    }
    cr_assert_leq(worst, 6.0, "erf: %.2f ulp at x = %g", worst, at);
    for (double x = 1e-30; x < 0.5; x *= 1.7) {
        double e = ulp_err(cx_verff((float)x), erf((double)(float)x));
        cr_assert_leq(e, 2.0, "erf: %.2f ulp at small x = %g", e, x);
    }
    cr_assert_eq(cx_verff(0.0f), 0.0f);
    cr_assert_eq(cx_verff(INFINITY), 1.0f);
    cr_assert_eq(cx_verff(-INFINITY), -1.0f);
    cr_assert(isnan(cx_verff(NAN)));
}
