/* Every op of core.h against a naive reference computed here in plain C
 * with double accumulation. Inputs go in through cx_from_host, results come
 * back through cx_to_host. Each test runs inside one step and checks that
 * the step ends cleanly. */
#include "ref.h"
#include <cxla/debug.h>

#define TOL 1e-5      /* plain arithmetic, reductions, movement, matmul */
#define TOL_T 1e-4    /* transcendental chains, conv */

#define BEGIN() cx_step_begin()
#define END()                                                                              \
    do {                                                                                   \
        cx_status st_ = cx_step_end();                                                     \
        cr_assert_eq(st_, CX_OK, "cx_step_end -> %d (%s)", (int)st_, cx_last_error());    \
    } while (0)

static cx_tensor *rnd(const int64_t *shape, int nd, double lo, double hi, float **host)
{
    float *h = rand_f32(ref_numel(shape, nd), lo, hi);
    cx_tensor *t = tf32(h, shape, nd);
    if (host) *host = h;
    else free(h);
    return t;
}

/* ======================================================================
 * elementwise unary
 * ====================================================================== */

static double r_neg(double x) { return -x; }
static double r_sign(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }
static double r_rsqrt(double x) { return 1.0 / sqrt(x); }
static double r_relu(double x) { return x > 0 ? x : 0.0; }
static double r_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double r_silu(double x) { return x / (1.0 + exp(-x)); }
static double r_gelu_erf(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double r_gelu_tanh(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
static cx_tensor *gelu_erf(cx_tensor *a) { return cx_gelu(a, false); }
static cx_tensor *gelu_tanh(cx_tensor *a) { return cx_gelu(a, true); }

typedef struct {
    const char *name;
    cx_tensor *(*op)(cx_tensor *);
    double (*ref)(double);
    double lo, hi;
    bool zeros;   /* sprinkle exact zeros into the input */
    double tol;
} unary_case;

static const unary_case unary_cases[] = {
    { "neg", cx_neg, r_neg, -3, 3, true, TOL },
    { "exp", cx_exp, exp, -4, 4, true, TOL },
    { "log", cx_log, log, 0.01, 10, false, TOL },
    { "sqrt", cx_sqrt, sqrt, 0.0, 10, true, TOL },
    { "rsqrt", cx_rsqrt, r_rsqrt, 0.01, 10, false, TOL },
    { "tanh", cx_tanh, tanh, -4, 4, true, TOL },
    { "erf", cx_erf, erf, -3, 3, true, TOL },
    { "abs", cx_abs, fabs, -3, 3, true, TOL },
    { "sign", cx_sign, r_sign, -3, 3, true, TOL },
    { "relu", cx_relu, r_relu, -3, 3, true, TOL },
    { "sigmoid", cx_sigmoid, r_sigmoid, -8, 8, true, TOL_T },
    { "silu", cx_silu, r_silu, -6, 6, true, TOL_T },
    { "gelu_erf", gelu_erf, r_gelu_erf, -5, 5, true, TOL_T },
    { "gelu_tanh", gelu_tanh, r_gelu_tanh, -5, 5, true, TOL_T },
};

Test(ops, unary_elementwise)
{
    rng_seed(1);
    const int64_t shape[] = { 3, 4, 5 };
    for (size_t c = 0; c < sizeof unary_cases / sizeof unary_cases[0]; c++) {
        const unary_case *u = &unary_cases[c];
        BEGIN();
        float *x = rand_f32(60, u->lo, u->hi);
        if (u->zeros) x[0] = x[17] = x[59] = 0.0f;
        cx_tensor *y = u->op(tf32(x, shape, 3));
        double ref[60];
        for (int i = 0; i < 60; i++) ref[i] = u->ref((double)x[i]);
        expect_tensor(u->name, y, shape, 3, ref, u->tol);
        free(x);
        END();
    }
}

/* A 0-d input and a larger, odd-sized 1-d input (parallel split remainders). */
Test(ops, unary_scalar_and_large)
{
    rng_seed(2);
    BEGIN();
    cx_tensor *s = cx_exp(cx_scalar(1.5, CX_F32));
    double e = exp(1.5);
    expect_tensor("exp(scalar)", s, NULL, 0, &e, TOL);
    const int64_t n[] = { 100003 };
    float *x;
    cx_tensor *y = cx_tanh(rnd(n, 1, -3, 3, &x));
    double *ref = dalloc(n[0]);
    for (int64_t i = 0; i < n[0]; i++) ref[i] = tanh(x[i]);
    expect_tensor("tanh(100003)", y, n, 1, ref, TOL);
    free(x);
    free(ref);
    END();
}

/* ======================================================================
 * elementwise binary with broadcasting
 * ====================================================================== */

typedef struct {
    const char *name;
    cx_tensor *(*op)(cx_tensor *, cx_tensor *);
    int kind;
} binary_case;

enum { B_ADD, B_SUB, B_MUL, B_DIV, B_MAX, B_MIN, B_POW };

static const binary_case binary_cases[] = {
    { "add", cx_add, B_ADD }, { "sub", cx_sub, B_SUB },         { "mul", cx_mul, B_MUL },
    { "div", cx_div, B_DIV }, { "maximum", cx_maximum, B_MAX }, { "minimum", cx_minimum, B_MIN },
    { "pow", cx_pow, B_POW },
};

static double bin_ref(int kind, double a, double b)
{
    switch (kind) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return a / b;
    case B_MAX: return a > b ? a : b;
    case B_MIN: return a < b ? a : b;
    default: return pow(a, b);
    }
}

typedef struct {
    int na, nb;
    int64_t a[4], b[4];
} shape_pair;

static const shape_pair bcast_pairs[] = {
    { 3, 2, { 3, 1, 5 }, { 4, 1 } },        /* -> (3, 4, 5) */
    { 2, 2, { 4, 6 }, { 4, 6 } },           /* same shape */
    { 2, 1, { 2, 3 }, { 3 } },              /* row vector */
    { 0, 2, { 0 }, { 2, 3 } },              /* 0-d with 2-d */
    { 2, 0, { 2, 3 }, { 0 } },              /* 2-d with 0-d */
    { 1, 3, { 1 }, { 4, 1, 2 } },           /* size-1 */
    { 2, 2, { 5, 1 }, { 1, 6 } },           /* outer product shape */
    { 4, 3, { 2, 1, 3, 1 }, { 4, 1, 5 } },  /* -> (2, 4, 3, 5): interleaved ones */
};

static void run_binary(const binary_case *bc, const shape_pair *sp)
{
    int64_t os[8];
    int no = ref_bcast_shape(sp->a, sp->na, sp->b, sp->nb, os);
    cr_assert(no >= 0);
    int64_t na = ref_numel(sp->a, sp->na), nb = ref_numel(sp->b, sp->nb), nout = ref_numel(os, no);
    float *a, *b;
    if (bc->kind == B_POW) {
        a = rand_f32(na, 0.5, 2.0);
        b = rand_f32(nb, -2.0, 2.0);
    } else if (bc->kind == B_DIV) {
        a = rand_f32(na, -3, 3);
        b = rand_f32_away0(nb, 0.5, 2.0);
    } else {
        a = rand_f32(na, -3, 3);
        b = rand_f32(nb, -3, 3);
    }
    cx_tensor *ta = tf32(a, sp->a, sp->na), *tb = tf32(b, sp->b, sp->nb);
    cx_tensor *y = bc->op(ta, tb);
    double *ref = dalloc(nout);
    int64_t idx[8];
    for (int64_t i = 0; i < nout; i++) {
        ref_unravel(i, os, no, idx);
        ref[i] = bin_ref(bc->kind, a[ref_bcast_offset(idx, no, sp->a, sp->na)],
                         b[ref_bcast_offset(idx, no, sp->b, sp->nb)]);
    }
    char what[160], s1[64], s2[64];
    snprintf(what, sizeof what, "%s %s %s", bc->name, ref_shape_str(sp->a, sp->na, s1, sizeof s1),
             ref_shape_str(sp->b, sp->nb, s2, sizeof s2));
    expect_tensor(what, y, os, no, ref, bc->kind == B_POW ? TOL_T : TOL);
    free(a);
    free(b);
    free(ref);
}

Test(ops, binary_broadcasting)
{
    rng_seed(3);
    for (size_t c = 0; c < sizeof binary_cases / sizeof binary_cases[0]; c++)
        for (size_t p = 0; p < sizeof bcast_pairs / sizeof bcast_pairs[0]; p++) {
            BEGIN();
            run_binary(&binary_cases[c], &bcast_pairs[p]);
            END();
        }
}

Test(ops, binary_explicit_3_1_5_with_4_1)
{
    /* The issue's example, spelled out: (3,1,5) + (4,1) -> (3,4,5). */
    BEGIN();
    float a[15], b[4];
    for (int i = 0; i < 15; i++) a[i] = (float)(i * 10);
    for (int i = 0; i < 4; i++) b[i] = (float)i;
    const int64_t sa[] = { 3, 1, 5 }, sb[] = { 4, 1 }, so[] = { 3, 4, 5 };
    cx_tensor *y = cx_add(tf32(a, sa, 3), tf32(b, sb, 2));
    double ref[60];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 5; k++) ref[(i * 4 + j) * 5 + k] = a[i * 5 + k] + b[j];
    expect_tensor("add (3,1,5)+(4,1)", y, so, 3, ref, TOL);
    END();
}

Test(ops, scalar_conveniences)
{
    rng_seed(4);
    BEGIN();
    const int64_t s[] = { 2, 7 };
    float *x;
    cx_tensor *t = rnd(s, 2, 0.1, 3, &x);
    double r1[14], r2[14], r3[14];
    for (int i = 0; i < 14; i++) {
        r1[i] = x[i] + 1.25;
        r2[i] = x[i] * -0.5;
        r3[i] = pow(x[i], 1.5);
    }
    expect_tensor("add_scalar", cx_add_scalar(t, 1.25), s, 2, r1, TOL);
    expect_tensor("mul_scalar", cx_mul_scalar(t, -0.5), s, 2, r2, TOL);
    expect_tensor("pow_scalar", cx_pow_scalar(t, 1.5), s, 2, r3, TOL_T);
    for (int i = 0; i < 14; i++) r3[i] = (double)x[i] * x[i];
    expect_tensor("pow_scalar 2", cx_pow_scalar(t, 2.0), s, 2, r3, TOL);
    free(x);
    END();
}

typedef struct {
    const char *name;
    cx_tensor *(*op)(cx_tensor *, cx_tensor *);
    int kind; /* 0 lt 1 le 2 eq 3 gt 4 ge */
} cmp_case;

Test(ops, comparisons)
{
    rng_seed(5);
    const cmp_case cases[] = {
        { "lt", cx_lt, 0 }, { "le", cx_le, 1 }, { "eq", cx_eq, 2 }, { "gt", cx_gt, 3 }, { "ge", cx_ge, 4 },
    };
    const int64_t sa[] = { 3, 1, 5 }, sb[] = { 4, 1 }, so[] = { 3, 4, 5 };
    float a[15], b[4];
    /* integer-valued data so that equality happens often */
    for (int i = 0; i < 15; i++) a[i] = (float)(rng_int(5) - 2);
    for (int i = 0; i < 4; i++) b[i] = (float)(i - 2);
    for (int c = 0; c < 5; c++) {
        BEGIN();
        cx_tensor *y = cases[c].op(tf32(a, sa, 3), tf32(b, sb, 2));
        check_shape(cases[c].name, y, so, 3);
        cr_assert_eq(cx_dtype_of(y), CX_BOOL, "%s: dtype %s, expected bool", cases[c].name,
                     cx_dtype_name(cx_dtype_of(y)));
        float *got = fetch_f32(cases[c].name, y);
        int ntrue = 0;
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++)
                for (int k = 0; k < 5; k++) {
                    double x = a[i * 5 + k], z = b[j];
                    bool r = cases[c].kind == 0   ? x < z
                             : cases[c].kind == 1 ? x <= z
                             : cases[c].kind == 2 ? x == z
                             : cases[c].kind == 3 ? x > z
                                                  : x >= z;
                    int at = (i * 4 + j) * 5 + k;
                    cr_assert_eq(got[at], r ? 1.0f : 0.0f, "%s: element %d: got %g, expected %d",
                                 cases[c].name, at, got[at], (int)r);
                    ntrue += r;
                }
        cr_assert(ntrue > 0 && ntrue < 60, "%s: degenerate test data", cases[c].name);
        /* raw bool read-back: one byte per element, 0 or 1 */
        uint8_t raw[60];
        cr_assert_eq(cx_to_host(y, raw, CX_BOOL), CX_OK);
        for (int i = 0; i < 60; i++)
            cr_assert_eq(raw[i], got[i] != 0.0f ? 1 : 0, "%s: bool byte %d = %d", cases[c].name, i, raw[i]);
        free(got);
        END();
    }
}

Test(ops, where_broadcast)
{
    rng_seed(6);
    BEGIN();
    const int64_t sc[] = { 3, 1 }, sa[] = { 1, 4 }, sb[] = { 3, 4 }, so[] = { 3, 4 };
    bool cond[3] = { true, false, true };
    cx_tensor *tc = cx_from_host(cond, sc, 2, CX_BOOL);
    cr_assert(tc && !cx_tensor_error(tc));
    float *a, *b;
    cx_tensor *ta = rnd(sa, 2, -1, 1, &a), *tb = rnd(sb, 2, -1, 1, &b);
    double ref[12];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) ref[i * 4 + j] = cond[i] ? a[j] : b[i * 4 + j];
    expect_tensor("where(bool host cond)", cx_where(tc, ta, tb), so, 2, ref, TOL);
    /* condition from a comparison, with a 0-d branch */
    cx_tensor *c2 = cx_gt(tb, cx_scalar(0.0, CX_F32));
    for (int i = 0; i < 12; i++) ref[i] = b[i] > 0 ? b[i] : -7.0;
    expect_tensor("where(b > 0, b, -7)", cx_where(c2, tb, cx_scalar(-7.0, CX_F32)), so, 2, ref, TOL);
    free(a);
    free(b);
    END();
}

Test(ops, type_promotion_and_integer_arith)
{
    BEGIN();
    const int64_t s[] = { 5 };
    float f[5] = { 0.5f, -1.5f, 2.25f, 3.0f, -4.0f };
    int32_t i[5] = { 1, -2, 3, 30000, -7 };
    cx_tensor *tf = tf32(f, s, 1), *ti = ti32(i, s, 1);
    cx_tensor *y = cx_add(tf, ti);
    cr_assert_eq(cx_dtype_of(y), CX_F32, "f32 + i32 -> %s", cx_dtype_name(cx_dtype_of(y)));
    double ref[5];
    for (int k = 0; k < 5; k++) ref[k] = f[k] + i[k];
    expect_tensor("f32+i32", y, s, 1, ref, TOL);
    cx_tensor *z = cx_mul(ti, ti);
    cr_assert_eq(cx_dtype_of(z), CX_I32, "i32 * i32 -> %s", cx_dtype_name(cx_dtype_of(z)));
    int64_t *zi = fetch_i64("i32*i32", z);
    for (int k = 0; k < 5; k++)
        cr_assert_eq(zi[k], (int64_t)i[k] * i[k], "i32*i32[%d] = %lld", k, (long long)zi[k]);
    free(zi);
    /* i64 arithmetic beyond 2^31 stays exact */
    int64_t l[3] = { 3000000000ll, -5, 7 };
    const int64_t s3[] = { 3 };
    cx_tensor *tl = ti64(l, s3, 1);
    cx_tensor *w = cx_add(tl, tl);
    cr_assert_eq(cx_dtype_of(w), CX_I64);
    int64_t *wl = fetch_i64("i64+i64", w);
    for (int k = 0; k < 3; k++) cr_assert_eq(wl[k], 2 * l[k], "i64+i64[%d] = %lld", k, (long long)wl[k]);
    free(wl);
    END();
}

/* ======================================================================
 * zero-size and size-1 dims
 * ====================================================================== */

Test(ops, zero_size_dims)
{
    BEGIN();
    const int64_t s0[] = { 0, 3 }, s1[] = { 1, 3 }, s3[] = { 3 };
    float one[3] = { 1, 2, 3 };
    cx_tensor *z = tf32(NULL, s0, 2);
    cr_assert_eq(cx_numel(z), 0);
    cx_tensor *e = cx_exp(z);
    check_shape("exp(0x3)", e, s0, 2);
    float dummy[1] = { 42.0f };
    cr_assert_eq(cx_to_host(e, dummy, CX_F32), CX_OK, "to_host of empty: %s", cx_last_error());
    cr_assert_eq(dummy[0], 42.0f, "to_host of an empty tensor wrote data");
    cx_tensor *a = cx_add(z, tf32(one, s1, 2));
    check_shape("(0,3)+(1,3)", a, s0, 2);
    cr_assert_eq(cx_to_host(a, dummy, CX_F32), CX_OK);
    /* sum over the empty axis is zeros; over everything it is 0 */
    int ax0 = 0;
    double zeros3[3] = { 0, 0, 0 }, zero = 0;
    expect_tensor("sum(0x3, axis 0)", cx_sum(z, &ax0, 1, false), s3, 1, zeros3, TOL);
    expect_tensor("sum(0x3)", cx_sum(z, NULL, 0, false), NULL, 0, &zero, TOL);
    /* concat with an empty part */
    float two[6] = { 1, 2, 3, 4, 5, 6 };
    const int64_t s23[] = { 2, 3 };
    cx_tensor *parts[2] = { z, tf32(two, s23, 2) };
    double r6[6] = { 1, 2, 3, 4, 5, 6 };
    expect_tensor("concat(empty, 2x3)", cx_concat(parts, 2, 0), s23, 2, r6, TOL);
    /* matmul with an empty batch row count, and with K = 0 (zeros) */
    const int64_t s04[] = { 0, 4 }, s43[] = { 4, 3 }, s20[] = { 2, 0 }, s03[] = { 0, 3 };
    float w12[12];
    for (int i = 0; i < 12; i++) w12[i] = (float)i;
    cx_tensor *m0 = cx_matmul(tf32(NULL, s04, 2), tf32(w12, s43, 2));
    check_shape("matmul (0,4)@(4,3)", m0, s03, 2);
    cr_assert_eq(cx_to_host(m0, dummy, CX_F32), CX_OK);
    double zeros6[6] = { 0 };
    expect_tensor("matmul (2,0)@(0,3)", cx_matmul(tf32(NULL, s20, 2), tf32(NULL, s03, 2)), s23, 2, zeros6, TOL);
    /* reshape and permute of empties */
    const int64_t s30[] = { 3, 0 };
    int perm[2] = { 1, 0 };
    check_shape("permute(0x3)", cx_permute(z, perm), s30, 2);
    const int64_t s0_[] = { 0 };
    check_shape("reshape(0x3, -1)", cx_reshape(z, (const int64_t[]){ -1 }, 1), s0_, 1);
    END();
}

Test(ops, size_one_dims)
{
    rng_seed(7);
    BEGIN();
    const int64_t s[] = { 1, 1, 5 }, t[] = { 3, 1, 1 }, so[] = { 3, 1, 5 };
    float *a, *b;
    cx_tensor *ta = rnd(s, 3, -1, 1, &a), *tb = rnd(t, 3, -1, 1, &b);
    double ref[15];
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 5; k++) ref[i * 5 + k] = (double)a[k] * b[i];
    expect_tensor("(1,1,5)*(3,1,1)", cx_mul(ta, tb), so, 3, ref, TOL);
    /* reduce over size-1 axes */
    int ax[2] = { 0, 1 };
    const int64_t s5[] = { 5 };
    double r5[5];
    for (int k = 0; k < 5; k++) r5[k] = a[k];
    expect_tensor("sum over size-1 axes", cx_sum(ta, ax, 2, false), s5, 1, r5, TOL);
    /* 1x1 matmul */
    const int64_t s11[] = { 1, 1 };
    float u = 3.0f, v = -2.0f;
    double uv = -6.0;
    expect_tensor("matmul 1x1", cx_matmul(tf32(&u, s11, 2), tf32(&v, s11, 2)), s11, 2, &uv, TOL);
    free(a);
    free(b);
    END();
}

/* ======================================================================
 * reductions
 * ====================================================================== */

enum { R_SUM, R_MAX, R_MEAN, R_VAR };

/* Reduces x over axes in `mask`; out has the keepdim shape's numel. */
static void ref_reduce(const float *x, const int64_t *shape, int nd, const bool *mask, int kind, int corr,
                       double *out)
{
    int64_t ks[8];
    for (int i = 0; i < nd; i++) ks[i] = mask[i] ? 1 : shape[i];
    int64_t nout = ref_numel(ks, nd), n = ref_numel(shape, nd), cnt = n / (nout ? nout : 1);
    double *mean = dalloc(nout);
    for (int64_t o = 0; o < nout; o++) out[o] = kind == R_MAX ? -INFINITY : 0.0;
    int64_t idx[8];
    for (int64_t i = 0; i < n; i++) {
        ref_unravel(i, shape, nd, idx);
        int64_t o = ref_bcast_offset(idx, nd, ks, nd);
        if (kind == R_MAX) out[o] = x[i] > out[o] ? x[i] : out[o];
        else mean[o] += x[i];
    }
    if (kind == R_SUM) {
        for (int64_t o = 0; o < nout; o++) out[o] = mean[o];
    } else if (kind == R_MEAN) {
        for (int64_t o = 0; o < nout; o++) out[o] = mean[o] / (double)cnt;
    } else if (kind == R_VAR) {
        for (int64_t o = 0; o < nout; o++) mean[o] /= (double)cnt;
        for (int64_t i = 0; i < n; i++) {
            ref_unravel(i, shape, nd, idx);
            int64_t o = ref_bcast_offset(idx, nd, ks, nd);
            double d = x[i] - mean[o];
            out[o] += d * d;
        }
        for (int64_t o = 0; o < nout; o++) out[o] /= (double)(cnt - corr);
    }
    free(mean);
}

/* Output shape for a reduction with/without keepdim. */
static int red_shape(const int64_t *shape, int nd, const bool *mask, bool keep, int64_t *out)
{
    int k = 0;
    for (int i = 0; i < nd; i++) {
        if (!mask[i]) out[k++] = shape[i];
        else if (keep) out[k++] = 1;
    }
    return k;
}

typedef struct {
    int naxes;
    int axes[3];
} axis_set;

static const axis_set axis_sets[] = {
    { 0, { 0 } },  { 1, { 0 } },     { 1, { 1 } },     { 1, { 2 } },        { 1, { -1 } },
    { 2, { 0, 2 } }, { 2, { 1, 2 } }, { 2, { -3, -2 } }, { 3, { 0, 1, 2 } }, { 2, { 2, 0 } },
};

Test(ops, reductions_sum_max_mean_var)
{
    rng_seed(8);
    const int64_t shape[] = { 3, 4, 5 };
    float *x = rand_f32(60, -2, 2);
    const char *names[] = { "sum", "max", "mean", "var0", "var1" };
    for (size_t a = 0; a < sizeof axis_sets / sizeof axis_sets[0]; a++) {
        bool mask[3] = { false, false, false };
        const axis_set *as = &axis_sets[a];
        for (int i = 0; i < as->naxes; i++) mask[(as->axes[i] + 3) % 3] = true;
        if (as->naxes == 0) mask[0] = mask[1] = mask[2] = true;
        for (int kind = 0; kind < 5; kind++) {
            for (int keep = 0; keep < 2; keep++) {
                BEGIN();
                cx_tensor *t = tf32(x, shape, 3);
                cx_tensor *y;
                int rk = kind == 4 ? R_VAR : kind;
                int corr = kind == 4 ? 1 : 0;
                switch (kind) {
                case 0: y = cx_sum(t, as->axes, as->naxes, keep); break;
                case 1: y = cx_max(t, as->axes, as->naxes, keep); break;
                case 2: y = cx_mean(t, as->axes, as->naxes, keep); break;
                default: y = cx_var(t, as->axes, as->naxes, corr, keep); break;
                }
                double ref[60];
                ref_reduce(x, shape, 3, mask, rk, corr, ref);
                int64_t os[3];
                int no = red_shape(shape, 3, mask, keep, os);
                char what[128];
                snprintf(what, sizeof what, "%s axes[%d]={%d,%d,%d} keepdim=%d", names[kind], as->naxes,
                         as->axes[0], as->axes[1], as->axes[2], keep);
                expect_tensor(what, y, os, no, ref, TOL);
                END();
            }
        }
    }
    free(x);
}

/* Max over rows longer than a block and not a multiple of the lanes: the
 * largest value wherever it sits, a NaN anywhere (here in the tail) wins as
 * in torch.max, +inf wins, and a row of -inf gives -inf. */
Test(ops, max_over_long_rows_finds_the_largest_and_nan)
{
    enum { R = 5, C = 1000 };
    rng_seed(12);
    float *x = rand_f32(R * C, -5, -1);
    x[0 * C + 0] = -0.5f;                      /* the first value */
    x[1 * C + 517] = -0.25f;                   /* inside the third block */
    x[2 * C + 999] = NAN;                      /* the tail's last value */
    x[3 * C + 300] = INFINITY;
    for (int c = 0; c < C; c++) x[4 * C + c] = -INFINITY;
    BEGIN();
    const int64_t shape[] = { R, C };
    const int ax = 1;
    cx_tensor *y = cx_max(tf32(x, shape, 2), &ax, 1, false);
    float got[R];
    cr_assert_eq(cx_to_host(y, got, CX_F32), CX_OK, "%s", cx_last_error());
    END();
    cr_assert_eq(got[0], -0.5f);
    cr_assert_eq(got[1], -0.25f);
    cr_assert(isnan(got[2]), "row 2: %g, not NaN", got[2]);
    cr_assert(isinf(got[3]) && got[3] > 0, "row 3: %g", got[3]);
    cr_assert(isinf(got[4]) && got[4] < 0, "row 4: %g", got[4]);
    free(x);
}

Test(ops, reduction_large_sum_accuracy)
{
    /* 1M values: a naive float accumulator drifts far beyond 1e-5. */
    rng_seed(9);
    BEGIN();
    const int64_t n[] = { 1 << 20 };
    float *x;
    cx_tensor *t = rnd(n, 1, 0.0, 1.0, &x);
    double s = 0;
    for (int64_t i = 0; i < n[0]; i++) s += x[i];
    expect_tensor("sum(1M)", cx_sum(t, NULL, 0, false), NULL, 0, &s, TOL);
    double m = s / (double)n[0];
    expect_tensor("mean(1M)", cx_mean(t, NULL, 0, false), NULL, 0, &m, TOL);
    free(x);
    END();
}

Test(ops, argmax)
{
    rng_seed(10);
    const int64_t shape[] = { 3, 4, 5 };
    float *x = distinct_f32(60, -3, 0.1);
    for (int axis = -1; axis < 3; axis++) {
        for (int keep = 0; keep < 2; keep++) {
            BEGIN();
            cx_tensor *y = cx_argmax(tf32(x, shape, 3), axis, keep);
            int ax = (axis + 3) % 3;
            bool mask[3] = { false, false, false };
            mask[ax] = true;
            int64_t os[3];
            int no = red_shape(shape, 3, mask, keep, os);
            char what[64];
            snprintf(what, sizeof what, "argmax axis %d keepdim %d", axis, keep);
            check_shape(what, y, os, no);
            cr_assert_eq(cx_dtype_of(y), CX_I64, "%s: dtype %s", what, cx_dtype_name(cx_dtype_of(y)));
            int64_t *got = fetch_i64(what, y);
            int64_t st[3];
            ref_strides(shape, 3, st);
            int64_t ks[3] = { 3, 4, 5 };
            ks[ax] = 1;
            for (int64_t o = 0; o < ref_numel(ks, 3); o++) {
                int64_t idx[3];
                ref_unravel(o, ks, 3, idx);
                int64_t best = 0;
                for (int64_t k = 0; k < shape[ax]; k++) {
                    idx[ax] = k;
                    int64_t off = idx[0] * st[0] + idx[1] * st[1] + idx[2] * st[2];
                    idx[ax] = best;
                    int64_t boff = idx[0] * st[0] + idx[1] * st[1] + idx[2] * st[2];
                    if (x[off] > x[boff]) best = k;
                }
                cr_assert_eq(got[o], best, "%s: element %lld: got %lld, expected %lld", what, (long long)o,
                             (long long)got[o], (long long)best);
            }
            free(got);
            END();
        }
    }
    free(x);
}

Test(ops, argmax_ties_first)
{
    BEGIN();
    float x[6] = { 1, 5, 5, 2, 5, 0 };
    const int64_t s[] = { 6 };
    int64_t *got = fetch_i64("argmax ties", cx_argmax(tf32(x, s, 1), 0, false));
    cr_assert_eq(got[0], 1, "argmax with ties: %lld, expected the first maximum (1)", (long long)got[0]);
    free(got);
    END();
}

Test(ops, logsumexp)
{
    rng_seed(11);
    const int64_t shape[] = { 3, 4, 5 };
    float *x = rand_f32(60, -3, 3);
    /* one row with huge values: exp overflows float; stable lse must not */
    for (int k = 0; k < 5; k++) x[k] = (float)(90.0 + 2.0 * k);
    for (int axis = -1; axis < 3; axis++)
        for (int keep = 0; keep < 2; keep++) {
            BEGIN();
            int ax = (axis + 3) % 3;
            bool mask[3] = { false, false, false };
            mask[ax] = true;
            double mx[60], ref[60];
            ref_reduce(x, shape, 3, mask, R_MAX, 0, mx);
            int64_t ks[3] = { 3, 4, 5 };
            ks[ax] = 1;
            for (int64_t o = 0; o < ref_numel(ks, 3); o++) ref[o] = 0;
            int64_t idx[3];
            for (int64_t i = 0; i < 60; i++) {
                ref_unravel(i, shape, 3, idx);
                int64_t o = ref_bcast_offset(idx, 3, ks, 3);
                ref[o] += exp(x[i] - mx[o]);
            }
            for (int64_t o = 0; o < ref_numel(ks, 3); o++) ref[o] = mx[o] + log(ref[o]);
            int64_t os[3];
            int no = red_shape(shape, 3, mask, keep, os);
            char what[64];
            snprintf(what, sizeof what, "logsumexp axis %d keepdim %d", axis, keep);
            expect_tensor(what, cx_logsumexp(tf32(x, shape, 3), axis, keep), os, no, ref, TOL_T);
            END();
        }
    free(x);
}

/* ======================================================================
 * movement
 * ====================================================================== */

static void ref_permute(const float *x, const int64_t *shape, int nd, const int *perm, double *out, int64_t *os)
{
    int64_t st[8];
    ref_strides(shape, nd, st);
    for (int i = 0; i < nd; i++) os[i] = shape[perm[i]];
    int64_t n = ref_numel(shape, nd), idx[8];
    for (int64_t o = 0; o < n; o++) {
        ref_unravel(o, os, nd, idx);
        int64_t off = 0;
        for (int i = 0; i < nd; i++) off += idx[i] * st[perm[i]];
        out[o] = x[off];
    }
}

Test(ops, reshape)
{
    rng_seed(12);
    BEGIN();
    const int64_t s[] = { 2, 3, 4 }, s1[] = { 4, -1 }, e1[] = { 4, 6 }, e2[] = { 24 }, e3[] = { 2, 2, 2, 3 };
    float *x;
    cx_tensor *t = rnd(s, 3, -1, 1, &x);
    double ref[24];
    for (int i = 0; i < 24; i++) ref[i] = x[i];
    expect_tensor("reshape (4,-1)", cx_reshape(t, s1, 2), e1, 2, ref, TOL);
    expect_tensor("reshape (24)", cx_reshape(t, e2, 1), e2, 1, ref, TOL);
    expect_tensor("reshape (2,2,2,3)", cx_reshape(t, e3, 4), e3, 4, ref, TOL);
    /* reshape of a non-contiguous (permuted) tensor */
    int perm[3] = { 2, 0, 1 };
    int64_t ps[3];
    double pr[24];
    ref_permute(x, s, 3, perm, pr, ps);
    expect_tensor("reshape(permute)", cx_reshape(cx_permute(t, perm), e1, 2), e1, 2, pr, TOL);
    /* to and from 0-d */
    float v = 2.5f;
    const int64_t one[] = { 1, 1 };
    cx_tensor *sc = tf32(&v, one, 2);
    double dv = 2.5;
    expect_tensor("reshape (1,1)->()", cx_reshape(sc, NULL, 0), NULL, 0, &dv, TOL);
    free(x);
    END();
}

Test(ops, permute_transpose)
{
    rng_seed(13);
    const int64_t s[] = { 2, 3, 4, 5 };
    float *x = rand_f32(120, -1, 1);
    const int perms[][4] = { { 0, 1, 2, 3 }, { 3, 2, 1, 0 }, { 1, 3, 0, 2 }, { 0, 2, 1, 3 }, { 2, 0, 3, 1 } };
    for (int p = 0; p < 5; p++) {
        BEGIN();
        double ref[120];
        int64_t os[4];
        ref_permute(x, s, 4, perms[p], ref, os);
        char what[64];
        snprintf(what, sizeof what, "permute(%d,%d,%d,%d)", perms[p][0], perms[p][1], perms[p][2], perms[p][3]);
        expect_tensor(what, cx_permute(tf32(x, s, 4), perms[p]), os, 4, ref, TOL);
        END();
    }
    BEGIN();
    {
        int perm[4] = { 0, 3, 2, 1 };
        double ref[120];
        int64_t os[4];
        ref_permute(x, s, 4, perm, ref, os);
        expect_tensor("transpose(1,3)", cx_transpose(tf32(x, s, 4), 1, 3), os, 4, ref, TOL);
        expect_tensor("transpose(-1,1)", cx_transpose(tf32(x, s, 4), -1, 1), os, 4, ref, TOL);
        /* permute of a permute */
        int p1[4] = { 1, 0, 3, 2 }, p2[4] = { 2, 3, 0, 1 }, pc[4];
        for (int i = 0; i < 4; i++) pc[i] = p1[p2[i]];
        ref_permute(x, s, 4, pc, ref, os);
        expect_tensor("permute∘permute", cx_permute(cx_permute(tf32(x, s, 4), p1), p2), os, 4, ref, TOL);
    }
    END();
    free(x);
}

Test(ops, expand)
{
    rng_seed(14);
    BEGIN();
    const int64_t s[] = { 3, 1 }, e[] = { 2, 3, 4 };
    float *x;
    cx_tensor *t = rnd(s, 2, -1, 1, &x);
    double ref[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) ref[(i * 3 + j) * 4 + k] = x[j];
    expect_tensor("expand (3,1)->(2,3,4)", cx_expand(t, e, 3), e, 3, ref, TOL);
    /* expand of 0-d */
    float v = 1.5f;
    double r2[24];
    for (int i = 0; i < 24; i++) r2[i] = 1.5;
    expect_tensor("expand ()->(2,3,4)", cx_expand(tf32(&v, NULL, 0), e, 3), e, 3, r2, TOL);
    free(x);
    END();
}

static void ref_slice(const float *x, const int64_t *shape, int nd, int axis, int64_t start, int64_t end,
                      int64_t step, double *out, int64_t *os)
{
    if (end > shape[axis]) end = shape[axis];
    for (int i = 0; i < nd; i++) os[i] = shape[i];
    os[axis] = end > start ? (end - start + step - 1) / step : 0;
    int64_t st[8], idx[8];
    ref_strides(shape, nd, st);
    int64_t n = ref_numel(os, nd);
    for (int64_t o = 0; o < n; o++) {
        ref_unravel(o, os, nd, idx);
        idx[axis] = start + idx[axis] * step;
        int64_t off = 0;
        for (int i = 0; i < nd; i++) off += idx[i] * st[i];
        out[o] = x[off];
    }
}

Test(ops, slice)
{
    rng_seed(15);
    const int64_t s[] = { 5, 7, 3 };
    float *x = rand_f32(105, -1, 1);
    const struct { int axis; int64_t start, end, step; } cases[] = {
        { 1, 1, 7, 3 }, { 0, 2, 100, 1 }, { 2, 0, 3, 2 }, { 1, 0, 7, 1 }, { 0, 4, 5, 1 }, { -1, 1, 2, 1 }, { 1, 6, 7, 5 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        BEGIN();
        double ref[105];
        int64_t os[3];
        int ax = (cases[c].axis + 3) % 3;
        ref_slice(x, s, 3, ax, cases[c].start, cases[c].end, cases[c].step, ref, os);
        char what[96];
        snprintf(what, sizeof what, "slice(axis %d, %lld:%lld:%lld)", cases[c].axis, (long long)cases[c].start,
                 (long long)cases[c].end, (long long)cases[c].step);
        expect_tensor(what, cx_slice(tf32(x, s, 3), cases[c].axis, cases[c].start, cases[c].end, cases[c].step),
                      os, 3, ref, TOL);
        END();
    }
    /* slice of a slice */
    BEGIN();
    double r1[105], r2[105];
    int64_t s1[3], s2[3];
    ref_slice(x, s, 3, 1, 1, 7, 2, r1, s1); /* (5,3,3) */
    float f1[105];
    for (int i = 0; i < 45; i++) f1[i] = (float)r1[i];
    ref_slice(f1, s1, 3, 0, 1, 5, 2, r2, s2);
    expect_tensor("slice∘slice", cx_slice(cx_slice(tf32(x, s, 3), 1, 1, 7, 2), 0, 1, 5, 2), s2, 3, r2, TOL);
    END();
    free(x);
}

Test(ops, pad)
{
    rng_seed(16);
    BEGIN();
    const int64_t s[] = { 2, 3 }, lo[] = { 1, 0 }, hi[] = { 0, 2 }, e[] = { 3, 5 };
    float *x;
    cx_tensor *t = rnd(s, 2, -1, 1, &x);
    double ref[15];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++) ref[i * 5 + j] = (i >= 1 && j < 3) ? x[(i - 1) * 3 + j] : 0.5;
    expect_tensor("pad value 0.5", cx_pad(t, lo, hi, 0.5), e, 2, ref, TOL);
    for (int i = 0; i < 15; i++)
        if (ref[i] == 0.5) ref[i] = 0.0;
    expect_tensor("pad value 0", cx_pad(t, lo, hi, 0.0), e, 2, ref, TOL);
    /* 3-d, padding on every side */
    const int64_t s3[] = { 2, 2, 2 }, l3[] = { 1, 0, 2 }, h3[] = { 1, 1, 0 }, e3[] = { 4, 3, 4 };
    float *y;
    cx_tensor *t3 = rnd(s3, 3, -1, 1, &y);
    double r3[48];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) {
                int a = i - 1, b = j, c = k - 2;
                r3[(i * 3 + j) * 4 + k] = (a >= 0 && a < 2 && b < 2 && c >= 0) ? y[(a * 2 + b) * 2 + c] : -1.0;
            }
    expect_tensor("pad 3-d value -1", cx_pad(t3, l3, h3, -1.0), e3, 3, r3, TOL);
    free(x);
    free(y);
    END();
}

Test(ops, concat)
{
    rng_seed(17);
    BEGIN();
    const int64_t a[] = { 2, 3 }, b[] = { 1, 3 }, c[] = { 4, 3 }, e0[] = { 7, 3 };
    float *x, *y, *z;
    cx_tensor *ts[3] = { rnd(a, 2, -1, 1, &x), rnd(b, 2, -1, 1, &y), rnd(c, 2, -1, 1, &z) };
    double ref[64];
    int k = 0;
    for (int i = 0; i < 6; i++) ref[k++] = x[i];
    for (int i = 0; i < 3; i++) ref[k++] = y[i];
    for (int i = 0; i < 12; i++) ref[k++] = z[i];
    expect_tensor("concat axis 0", cx_concat(ts, 3, 0), e0, 2, ref, TOL);
    /* axis 1 (and -1) */
    const int64_t p[] = { 2, 1 }, e1[] = { 2, 4 };
    float *w;
    cx_tensor *t2[2] = { rnd(p, 2, -1, 1, &w), ts[0] };
    for (int i = 0; i < 2; i++) {
        ref[i * 4] = w[i];
        for (int j = 0; j < 3; j++) ref[i * 4 + 1 + j] = x[i * 3 + j];
    }
    expect_tensor("concat axis 1", cx_concat(t2, 2, 1), e1, 2, ref, TOL);
    expect_tensor("concat axis -1", cx_concat(t2, 2, -1), e1, 2, ref, TOL);
    /* a single input, and a concat of views */
    double r6[6];
    for (int i = 0; i < 6; i++) r6[i] = x[i];
    expect_tensor("concat n=1", cx_concat(ts, 1, 0), a, 2, r6, TOL);
    /* (3,2) transposed view ++ (3,2) transposed stepped slice */
    cx_tensor *v[2] = { cx_transpose(ts[0], 0, 1), cx_transpose(cx_slice(ts[2], 0, 0, 4, 2), 0, 1) };
    const int64_t e4[] = { 3, 4 };
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            ref[i * 4 + j] = x[j * 3 + i];
            ref[i * 4 + 2 + j] = z[(2 * j) * 3 + i];
        }
    expect_tensor("concat of views", cx_concat(v, 2, 1), e4, 2, ref, TOL);
    free(x);
    free(y);
    free(z);
    free(w);
    END();
}

Test(ops, flatten_squeeze_unsqueeze)
{
    rng_seed(18);
    BEGIN();
    const int64_t s[] = { 2, 3, 4, 5 }, f1[] = { 2, 12, 5 }, f2[] = { 120 }, f3[] = { 2, 3, 20 };
    float *x;
    cx_tensor *t = rnd(s, 4, -1, 1, &x);
    double ref[120];
    for (int i = 0; i < 120; i++) ref[i] = x[i];
    expect_tensor("flatten(1,2)", cx_flatten(t, 1, 2), f1, 3, ref, TOL);
    expect_tensor("flatten(0,-1)", cx_flatten(t, 0, -1), f2, 1, ref, TOL);
    expect_tensor("flatten(-2,-1)", cx_flatten(t, -2, -1), f3, 3, ref, TOL);
    expect_tensor("flatten(2,2)", cx_flatten(t, 2, 2), s, 4, ref, TOL);
    const int64_t q[] = { 3, 4 }, u1[] = { 3, 1, 4 }, u2[] = { 3, 4, 1 }, u0[] = { 1, 3, 4 };
    float *y;
    cx_tensor *tq = rnd(q, 2, -1, 1, &y);
    for (int i = 0; i < 12; i++) ref[i] = y[i];
    cx_tensor *a = cx_unsqueeze(tq, 1);
    expect_tensor("unsqueeze(1)", a, u1, 3, ref, TOL);
    expect_tensor("unsqueeze(-1)", cx_unsqueeze(tq, -1), u2, 3, ref, TOL);
    expect_tensor("unsqueeze(0)", cx_unsqueeze(tq, 0), u0, 3, ref, TOL);
    expect_tensor("squeeze(1)", cx_squeeze(a, 1), q, 2, ref, TOL);
    expect_tensor("squeeze(-2)", cx_squeeze(a, -2), q, 2, ref, TOL);
    /* flatten of a permuted tensor copies in the permuted order */
    int perm[2] = { 1, 0 };
    double pr[12];
    int64_t ps[2];
    ref_permute(y, q, 2, perm, pr, ps);
    const int64_t e12[] = { 12 };
    expect_tensor("flatten(transpose)", cx_flatten(cx_permute(tq, perm), 0, 1), e12, 1, pr, TOL);
    free(x);
    free(y);
    END();
}

/* ======================================================================
 * non-contiguous views as op inputs
 * ====================================================================== */

Test(ops, ops_on_views)
{
    rng_seed(19);
    BEGIN();
    const int64_t s[] = { 4, 6, 5 };
    float *x;
    cx_tensor *t = rnd(s, 3, -1, 1, &x);
    /* permute then add a contiguous tensor */
    int perm[3] = { 2, 0, 1 };
    double pr[120];
    int64_t ps[3];
    ref_permute(x, s, 3, perm, pr, ps);
    float *y;
    cx_tensor *ty = rnd(ps, 3, -1, 1, &y);
    double ref[120];
    for (int i = 0; i < 120; i++) ref[i] = pr[i] + y[i];
    expect_tensor("permute + y", cx_add(cx_permute(t, perm), ty), ps, 3, ref, TOL);
    for (int i = 0; i < 120; i++) ref[i] = y[i] * pr[i];
    expect_tensor("y * permute", cx_mul(ty, cx_permute(t, perm)), ps, 3, ref, TOL);
    /* exp of a stepped slice */
    double sr[120];
    int64_t ss[3];
    ref_slice(x, s, 3, 1, 1, 6, 2, sr, ss);
    for (int i = 0; i < ref_numel(ss, 3); i++) ref[i] = exp(sr[i]);
    expect_tensor("exp(slice step 2)", cx_exp(cx_slice(t, 1, 1, 6, 2)), ss, 3, ref, TOL);
    /* expand then multiply */
    const int64_t s15[] = { 1, 5 }, s45[] = { 4, 5 };
    float *z, *w;
    cx_tensor *tz = rnd(s15, 2, -1, 1, &z), *tw = rnd(s45, 2, -1, 1, &w);
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 5; k++) ref[i * 5 + k] = (double)z[k] * w[i * 5 + k];
    expect_tensor("expand * w", cx_mul(cx_expand(tz, s45, 2), tw), s45, 2, ref, TOL);
    /* reduction of a permuted view */
    int ax0 = 0;
    const int64_t s46[] = { 4, 6 };
    for (int i = 0; i < 24; i++) {
        double acc = 0;
        for (int k = 0; k < 5; k++) acc += pr[k * 24 + i];
        ref[i] = acc;
    }
    expect_tensor("sum(permute, axis 0)", cx_sum(cx_permute(t, perm), &ax0, 1, false), s46, 2, ref, TOL);
    /* softmax over a transposed view, axis 0 of the view */
    cx_tensor *tt = cx_transpose(tw, 0, 1); /* (5,4) */
    const int64_t s54[] = { 5, 4 };
    for (int j = 0; j < 4; j++) {
        double m = -INFINITY, acc = 0;
        for (int i = 0; i < 5; i++) m = fmax(m, w[j * 5 + i]);
        for (int i = 0; i < 5; i++) acc += exp(w[j * 5 + i] - m);
        for (int i = 0; i < 5; i++) ref[i * 4 + j] = exp(w[j * 5 + i] - m) / acc;
    }
    expect_tensor("softmax(transpose, 0)", cx_softmax(tt, 0), s54, 2, ref, TOL_T);
    /* pad of a slice, then an elementwise op */
    const int64_t lo[] = { 0, 1 }, hi[] = { 1, 0 }, e[] = { 3, 4 };
    cx_tensor *sl = cx_slice(tw, 1, 0, 5, 2); /* (4,3) cols 0,2,4 */
    cx_tensor *sl2 = cx_slice(sl, 0, 1, 3, 1); /* (2,3) rows 1,2 */
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            ref[i * 4 + j] = (i < 2 && j >= 1) ? 2.0 * w[(i + 1) * 5 + 2 * (j - 1)] : 0.0;
    expect_tensor("2*pad(slice(slice))", cx_mul_scalar(cx_pad(sl2, lo, hi, 0.0), 2.0), e, 2, ref, TOL);
    free(x);
    free(y);
    free(z);
    free(w);
    END();
}

/* ======================================================================
 * matmul
 * ====================================================================== */

/* a (..., M, K), b (..., K, N) with >= 2 dims each (1-d promoted by the
 * caller); batch dims broadcast. Output flat order = broadcast batch, M, N. */
static int64_t ref_matmul(const float *a, const int64_t *as, int na, const float *b, const int64_t *bs, int nb,
                          double *out)
{
    int64_t M = as[na - 2], K = as[na - 1], N = bs[nb - 1];
    cr_assert_eq(bs[nb - 2], K);
    int64_t bshape[8];
    int nbt = ref_bcast_shape(as, na - 2, bs, nb - 2, bshape);
    cr_assert(nbt >= 0);
    int64_t B = ref_numel(bshape, nbt), idx[8];
    for (int64_t bi = 0; bi < B; bi++) {
        ref_unravel(bi, bshape, nbt, idx);
        int64_t ao = ref_bcast_offset(idx, nbt, as, na - 2) * M * K;
        int64_t bo = ref_bcast_offset(idx, nbt, bs, nb - 2) * K * N;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) acc += (double)a[ao + m * K + k] * b[bo + k * N + n];
                out[(bi * M + m) * N + n] = acc;
            }
    }
    return B * M * N;
}

typedef struct {
    int na, nb, no;
    int64_t a[4], b[4], o[4];
} mm_case;

Test(ops, matmul)
{
    rng_seed(20);
    const mm_case cases[] = {
        { 2, 2, 2, { 5, 7 }, { 7, 3 }, { 5, 3 } },
        { 2, 2, 2, { 33, 65 }, { 65, 17 }, { 33, 17 } },
        { 3, 3, 3, { 4, 3, 6 }, { 4, 6, 2 }, { 4, 3, 2 } },
        { 4, 3, 4, { 2, 1, 4, 6 }, { 3, 6, 5 }, { 2, 3, 4, 5 } },
        { 2, 3, 3, { 4, 6 }, { 3, 6, 5 }, { 3, 4, 5 } },
        { 3, 2, 3, { 3, 4, 6 }, { 6, 5 }, { 3, 4, 5 } },
        { 1, 2, 1, { 7 }, { 7, 3 }, { 3 } },
        { 2, 1, 1, { 5, 7 }, { 7 }, { 5 } },
        { 1, 1, 0, { 7 }, { 7 }, { 0 } },
        { 3, 1, 2, { 2, 4, 6 }, { 6 }, { 2, 4 } },
        { 1, 3, 2, { 6 }, { 2, 6, 4 }, { 2, 4 } },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        BEGIN();
        const mm_case *m = &cases[c];
        float *a, *b;
        cx_tensor *ta = rnd(m->a, m->na, -1, 1, &a), *tb = rnd(m->b, m->nb, -1, 1, &b);
        int64_t pa[4], pb[4];
        int npa = m->na, npb = m->nb;
        memcpy(pa, m->a, sizeof pa);
        memcpy(pb, m->b, sizeof pb);
        if (npa == 1) { pa[1] = pa[0]; pa[0] = 1; npa = 2; }
        if (npb == 1) { pb[1] = 1; npb = 2; }
        double *ref = dalloc(4096);
        ref_matmul(a, pa, npa, b, pb, npb, ref);
        char what[128], s1[48], s2[48];
        snprintf(what, sizeof what, "matmul %s @ %s", ref_shape_str(m->a, m->na, s1, sizeof s1),
                 ref_shape_str(m->b, m->nb, s2, sizeof s2));
        expect_tensor(what, cx_matmul(ta, tb), m->o, m->no, ref, TOL);
        free(a);
        free(b);
        free(ref);
        END();
    }
}

Test(ops, matmul_transposed_operands)
{
    rng_seed(21);
    BEGIN();
    const int64_t sa[] = { 5, 7 }, sbt[] = { 3, 7 }, sat[] = { 7, 5 }, so[] = { 5, 3 };
    float *a, *bt, *at;
    cx_tensor *ta = rnd(sa, 2, -1, 1, &a), *tbt = rnd(sbt, 2, -1, 1, &bt), *tat = rnd(sat, 2, -1, 1, &at);
    double ref[15];
    /* a @ bt^T */
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 3; j++) {
            double acc = 0;
            for (int k = 0; k < 7; k++) acc += (double)a[i * 7 + k] * bt[j * 7 + k];
            ref[i * 3 + j] = acc;
        }
    expect_tensor("a @ transpose(b)", cx_matmul(ta, cx_transpose(tbt, 0, 1)), so, 2, ref, TOL);
    /* at^T @ bt^T */
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 3; j++) {
            double acc = 0;
            for (int k = 0; k < 7; k++) acc += (double)at[k * 5 + i] * bt[j * 7 + k];
            ref[i * 3 + j] = acc;
        }
    expect_tensor("transpose(a) @ transpose(b)", cx_matmul(cx_transpose(tat, 0, 1), cx_transpose(tbt, 1, 0)), so, 2,
                  ref, TOL);
    /* batched, transposed last two dims of a 3-d operand */
    const int64_t s3[] = { 2, 7, 4 }, s3b[] = { 2, 7, 3 }, s3o[] = { 2, 4, 3 };
    float *c, *d;
    cx_tensor *tc = rnd(s3, 3, -1, 1, &c), *td = rnd(s3b, 3, -1, 1, &d);
    double r3[24];
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++) {
                double acc = 0;
                for (int k = 0; k < 7; k++) acc += (double)c[(b * 7 + k) * 4 + i] * d[(b * 7 + k) * 3 + j];
                r3[(b * 4 + i) * 3 + j] = acc;
            }
    expect_tensor("batched transpose(c,-1,-2) @ d", cx_matmul(cx_transpose(tc, -1, -2), td), s3o, 3, r3, TOL);
    /* matmul of a stepped slice (non-unit stride rows) */
    const int64_t s10[] = { 10, 7 };
    float *e;
    cx_tensor *te = rnd(s10, 2, -1, 1, &e);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 3; j++) {
            double acc = 0;
            for (int k = 0; k < 7; k++) acc += (double)e[(2 * i + 1) * 7 + k] * bt[j * 7 + k];
            ref[i * 3 + j] = acc;
        }
    expect_tensor("slice(step 2) @ transpose(b)", cx_matmul(cx_slice(te, 0, 1, 10, 2), cx_transpose(tbt, 0, 1)), so,
                  2, ref, TOL);
    free(a);
    free(bt);
    free(at);
    free(c);
    free(d);
    free(e);
    END();
}

/* ======================================================================
 * conv2d and pools
 * ====================================================================== */

static void ref_conv2d(const float *x, const float *w, const float *bias, int64_t N, int64_t C, int64_t H, int64_t W,
                       int64_t O, int64_t KH, int64_t KW, int sh, int sw, int ph, int pw, int dh, int dw, int groups,
                       double *y, int64_t *OH, int64_t *OW)
{
    int64_t oh = (H + 2 * ph - dh * (KH - 1) - 1) / sh + 1, ow = (W + 2 * pw - dw * (KW - 1) - 1) / sw + 1;
    int64_t cg = C / groups, og = O / groups;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            int64_t g = o / og;
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++) {
                    double acc = bias ? bias[o] : 0.0;
                    for (int64_t c = 0; c < cg; c++)
                        for (int64_t ki = 0; ki < KH; ki++)
                            for (int64_t kj = 0; kj < KW; kj++) {
                                int64_t hi = i * sh - ph + ki * dh, wj = j * sw - pw + kj * dw;
                                if (hi < 0 || hi >= H || wj < 0 || wj >= W) continue;
                                acc += (double)x[((n * C + g * cg + c) * H + hi) * W + wj] *
                                       w[((o * cg + c) * KH + ki) * KW + kj];
                            }
                    y[((n * O + o) * oh + i) * ow + j] = acc;
                }
        }
    *OH = oh;
    *OW = ow;
}

typedef struct {
    int64_t n, c, h, w, o, kh, kw;
    int sh, sw, ph, pw, dh, dw, groups;
    bool bias;
} conv_case;

static const conv_case conv_cases[] = {
    { 2, 4, 7, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, false },   /* same padding */
    { 2, 3, 9, 8, 5, 3, 3, 2, 2, 0, 0, 1, 1, 1, true },    /* stride 2, bias */
    { 1, 2, 10, 9, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1, true },   /* dilation 2 */
    { 2, 4, 6, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2, true },    /* groups 2 */
    { 1, 4, 5, 7, 4, 3, 3, 1, 2, 1, 0, 1, 1, 4, false },   /* depthwise */
    { 2, 3, 8, 7, 4, 3, 2, 2, 1, 1, 0, 1, 2, 1, true },    /* asymmetric everything */
    { 1, 3, 5, 5, 2, 1, 1, 1, 1, 0, 0, 1, 1, 1, true },    /* 1x1 */
    { 1, 2, 4, 4, 2, 5, 5, 1, 1, 2, 2, 1, 1, 1, false },   /* kernel larger than input (padded) */
};

static void run_conv(const conv_case *k, bool views)
{
    int64_t sx[4] = { k->n, k->c, k->h, k->w }, swt[4] = { k->o, k->c / k->groups, k->kh, k->kw }, sb[1] = { k->o };
    float *x = rand_f32(ref_numel(sx, 4), -1, 1), *w = rand_f32(ref_numel(swt, 4), -1, 1), *b = rand_f32(k->o, -1, 1);
    cx_tensor *tx;
    if (views) {
        /* feed x as a permuted view of an NHWC buffer */
        int64_t nhwc[4] = { k->n, k->h, k->w, k->c };
        float *xh = malloc((size_t)ref_numel(sx, 4) * sizeof(float));
        for (int64_t n = 0; n < k->n; n++)
            for (int64_t c = 0; c < k->c; c++)
                for (int64_t i = 0; i < k->h; i++)
                    for (int64_t j = 0; j < k->w; j++)
                        xh[((n * k->h + i) * k->w + j) * k->c + c] = x[((n * k->c + c) * k->h + i) * k->w + j];
        int perm[4] = { 0, 3, 1, 2 };
        tx = cx_permute(tf32(xh, nhwc, 4), perm);
        free(xh);
    } else {
        tx = tf32(x, sx, 4);
    }
    cx_tensor *y = cx_conv2d(tx, tf32(w, swt, 4), k->bias ? tf32(b, sb, 1) : NULL, k->sh, k->sw, k->ph, k->pw,
                             k->dh, k->dw, k->groups);
    int64_t oh, ow;
    double *ref = dalloc(k->n * k->o * (k->h + 4) * (k->w + 4));
    ref_conv2d(x, w, k->bias ? b : NULL, k->n, k->c, k->h, k->w, k->o, k->kh, k->kw, k->sh, k->sw, k->ph, k->pw,
               k->dh, k->dw, k->groups, ref, &oh, &ow);
    int64_t so[4] = { k->n, k->o, oh, ow };
    char what[200];
    snprintf(what, sizeof what,
             "conv2d x(%lld,%lld,%lld,%lld) w(%lld,%lld,%lld,%lld) s(%d,%d) p(%d,%d) d(%d,%d) g%d bias%d views%d",
             (long long)k->n, (long long)k->c, (long long)k->h, (long long)k->w, (long long)k->o,
             (long long)(k->c / k->groups), (long long)k->kh, (long long)k->kw, k->sh, k->sw, k->ph, k->pw, k->dh,
             k->dw, k->groups, k->bias, views);
    expect_tensor(what, y, so, 4, ref, TOL_T);
    free(x);
    free(w);
    free(b);
    free(ref);
}

Test(ops, conv2d)
{
    rng_seed(22);
    for (size_t c = 0; c < sizeof conv_cases / sizeof conv_cases[0]; c++) {
        BEGIN();
        run_conv(&conv_cases[c], false);
        END();
    }
    BEGIN();
    run_conv(&conv_cases[3], true);
    END();
}

Test(ops, conv2d_larger)
{
    /* Big enough that an implementation may pick im2col+sgemm. */
    rng_seed(23);
    const conv_case k = { 4, 16, 20, 20, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, true };
    BEGIN();
    run_conv(&k, false);
    END();
    const conv_case k2 = { 2, 16, 17, 15, 8, 5, 3, 2, 1, 2, 1, 1, 1, 4, true };
    BEGIN();
    run_conv(&k2, false);
    END();
}

static void ref_pool(const float *x, int64_t N, int64_t C, int64_t H, int64_t W, int kh, int kw, int sh, int sw,
                     int ph, int pw, bool is_max, double *y, int64_t *OH, int64_t *OW)
{
    int64_t oh = (H + 2 * ph - kh) / sh + 1, ow = (W + 2 * pw - kw) / sw + 1;
    for (int64_t nc = 0; nc < N * C; nc++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < ow; j++) {
                double acc = is_max ? -INFINITY : 0.0;
                for (int a = 0; a < kh; a++)
                    for (int b = 0; b < kw; b++) {
                        int64_t hi = i * sh - ph + a, wj = j * sw - pw + b;
                        if (hi < 0 || hi >= H || wj < 0 || wj >= W) continue;
                        double v = x[(nc * H + hi) * W + wj];
                        if (is_max) acc = v > acc ? v : acc;
                        else acc += v;
                    }
                y[(nc * oh + i) * ow + j] = is_max ? acc : acc / (double)(kh * kw);
            }
    *OH = oh;
    *OW = ow;
}

Test(ops, pools)
{
    rng_seed(24);
    const struct { int kh, kw, sh, sw, ph, pw; } cases[] = {
        { 2, 2, 2, 2, 0, 0 }, { 3, 3, 2, 2, 1, 1 }, { 3, 2, 1, 2, 1, 0 }, { 3, 3, 1, 1, 0, 0 }, { 2, 3, 3, 1, 1, 1 },
    };
    const int64_t N = 2, C = 3, H = 7, W = 6;
    const int64_t sx[] = { N, C, H, W };
    /* all-negative data: a max pool that treats padding as 0 fails */
    float *x = rand_f32(N * C * H * W, -3, -0.1);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int is_max = 0; is_max < 2; is_max++) {
            BEGIN();
            int64_t oh, ow;
            double ref[512];
            ref_pool(x, N, C, H, W, cases[c].kh, cases[c].kw, cases[c].sh, cases[c].sw, cases[c].ph, cases[c].pw,
                     is_max, ref, &oh, &ow);
            cx_tensor *t = tf32(x, sx, 4);
            cx_tensor *y = is_max ? cx_max_pool2d(t, cases[c].kh, cases[c].kw, cases[c].sh, cases[c].sw, cases[c].ph,
                                                  cases[c].pw)
                                  : cx_avg_pool2d(t, cases[c].kh, cases[c].kw, cases[c].sh, cases[c].sw, cases[c].ph,
                                                  cases[c].pw);
            int64_t so[4] = { N, C, oh, ow };
            char what[128];
            snprintf(what, sizeof what, "%s_pool2d k(%d,%d) s(%d,%d) p(%d,%d)", is_max ? "max" : "avg", cases[c].kh,
                     cases[c].kw, cases[c].sh, cases[c].sw, cases[c].ph, cases[c].pw);
            expect_tensor(what, y, so, 4, ref, TOL);
            END();
        }
    free(x);
}

/* ======================================================================
 * gather / scatter_add / embedding / one_hot
 * ====================================================================== */

Test(ops, gather)
{
    rng_seed(25);
    /* 2-d along axis 0 and 1, 3-d along axis 1, with i64 and i32 indices */
    const struct { int nd; int64_t src[3]; int axis; int64_t idx_dim; } cases[] = {
        { 2, { 4, 5 }, 0, 6 }, { 2, { 4, 5 }, 1, 3 }, { 3, { 2, 5, 3 }, 1, 4 }, { 3, { 2, 5, 3 }, -1, 2 },
        { 1, { 7 }, 0, 10 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int use32 = 0; use32 < 2; use32++) {
            BEGIN();
            int nd = cases[c].nd, ax = (cases[c].axis + nd) % nd;
            float *src;
            cx_tensor *ts = rnd(cases[c].src, nd, -1, 1, &src);
            int64_t is[3];
            memcpy(is, cases[c].src, sizeof is);
            is[ax] = cases[c].idx_dim;
            int64_t ni = ref_numel(is, nd);
            int64_t *idx = malloc((size_t)ni * sizeof(int64_t));
            int32_t *idx32 = malloc((size_t)ni * sizeof(int32_t));
            for (int64_t i = 0; i < ni; i++) idx32[i] = (int32_t)(idx[i] = rng_int(cases[c].src[ax]));
            cx_tensor *ti = use32 ? ti32(idx32, is, nd) : ti64(idx, is, nd);
            cx_tensor *y = cx_gather(ts, cases[c].axis, ti);
            double ref[256];
            int64_t st[3], mi[3];
            ref_strides(cases[c].src, nd, st);
            for (int64_t o = 0; o < ni; o++) {
                ref_unravel(o, is, nd, mi);
                mi[ax] = idx[o];
                int64_t off = 0;
                for (int d = 0; d < nd; d++) off += mi[d] * st[d];
                ref[o] = src[off];
            }
            char what[64];
            snprintf(what, sizeof what, "gather case %zu axis %d %s", c, cases[c].axis, use32 ? "i32" : "i64");
            expect_tensor(what, y, is, nd, ref, TOL);
            free(src);
            free(idx);
            free(idx32);
            END();
        }
}

Test(ops, scatter_add)
{
    rng_seed(26);
    const struct { int nd; int64_t base[3]; int axis; int64_t idx_dim; } cases[] = {
        { 2, { 4, 5 }, 0, 9 }, { 2, { 4, 5 }, 1, 7 }, { 3, { 2, 3, 4 }, 1, 5 }, { 1, { 6 }, 0, 13 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        BEGIN();
        int nd = cases[c].nd, ax = cases[c].axis;
        float *base, *src;
        cx_tensor *tb = rnd(cases[c].base, nd, -1, 1, &base);
        int64_t is[3];
        memcpy(is, cases[c].base, sizeof is);
        is[ax] = cases[c].idx_dim; /* more index rows than base rows: duplicates guaranteed */
        int64_t ni = ref_numel(is, nd), nb = ref_numel(cases[c].base, nd);
        cx_tensor *tsrc = rnd(is, nd, -1, 1, &src);
        int64_t *idx = malloc((size_t)ni * sizeof(int64_t));
        for (int64_t i = 0; i < ni; i++) idx[i] = rng_int(cases[c].base[ax]);
        cx_tensor *y = cx_scatter_add(tb, ax, ti64(idx, is, nd), tsrc);
        double ref[256];
        for (int64_t i = 0; i < nb; i++) ref[i] = base[i];
        int64_t st[3], mi[3];
        ref_strides(cases[c].base, nd, st);
        for (int64_t o = 0; o < ni; o++) {
            ref_unravel(o, is, nd, mi);
            mi[ax] = idx[o];
            int64_t off = 0;
            for (int d = 0; d < nd; d++) off += mi[d] * st[d];
            ref[off] += src[o];
        }
        char what[64];
        snprintf(what, sizeof what, "scatter_add case %zu axis %d", c, ax);
        expect_tensor(what, y, cases[c].base, nd, ref, TOL);
        free(base);
        free(src);
        free(idx);
        END();
    }
}

Test(ops, embedding)
{
    rng_seed(27);
    BEGIN();
    const int64_t sw[] = { 10, 4 }, si[] = { 2, 3 }, so[] = { 2, 3, 4 };
    float *w;
    cx_tensor *tw = rnd(sw, 2, -1, 1, &w);
    int64_t idx[6] = { 3, 0, 9, 3, 3, 7 };
    double ref[24];
    for (int i = 0; i < 6; i++)
        for (int d = 0; d < 4; d++) ref[i * 4 + d] = w[idx[i] * 4 + d];
    expect_tensor("embedding i64 (2,3)", cx_embedding(tw, ti64(idx, si, 2)), so, 3, ref, TOL);
    int32_t idx32[6];
    for (int i = 0; i < 6; i++) idx32[i] = (int32_t)idx[i];
    expect_tensor("embedding i32 (2,3)", cx_embedding(tw, ti32(idx32, si, 2)), so, 3, ref, TOL);
    /* 1-d and 0-d index */
    const int64_t s1[] = { 6 }, so1[] = { 6, 4 }, so0[] = { 4 };
    expect_tensor("embedding (6)", cx_embedding(tw, ti64(idx, s1, 1)), so1, 2, ref, TOL);
    expect_tensor("embedding ()", cx_embedding(tw, ti64(&idx[2], NULL, 0)), so0, 1, &ref[8], TOL);
    free(w);
    END();
}

Test(ops, one_hot)
{
    BEGIN();
    const int64_t si[] = { 2, 3 }, so[] = { 2, 3, 5 };
    int64_t idx[6] = { 0, 4, 2, 2, 1, 3 };
    cx_tensor *y = cx_one_hot(ti64(idx, si, 2), 5, CX_F32);
    double ref[30] = { 0 };
    for (int i = 0; i < 6; i++) ref[i * 5 + idx[i]] = 1.0;
    expect_tensor("one_hot f32", y, so, 3, ref, TOL);
    cx_tensor *yi = cx_one_hot(ti64(idx, si, 2), 5, CX_I64);
    check_shape("one_hot i64", yi, so, 3);
    cr_assert_eq(cx_dtype_of(yi), CX_I64);
    int64_t *got = fetch_i64("one_hot i64", yi);
    for (int i = 0; i < 30; i++) cr_assert_eq(got[i], (int64_t)ref[i], "one_hot i64[%d] = %lld", i, (long long)got[i]);
    free(got);
    END();
}

/* ======================================================================
 * composites
 * ====================================================================== */

static void ref_softmax_rows(const float *x, int64_t rows, int64_t n, bool logsm, double *out)
{
    for (int64_t r = 0; r < rows; r++) {
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < n; i++) m = fmax(m, x[r * n + i]);
        for (int64_t i = 0; i < n; i++) s += exp(x[r * n + i] - m);
        for (int64_t i = 0; i < n; i++)
            out[r * n + i] = logsm ? x[r * n + i] - m - log(s) : exp(x[r * n + i] - m) / s;
    }
}

Test(ops, softmax_log_softmax)
{
    rng_seed(28);
    BEGIN();
    const int64_t s[] = { 4, 6 };
    float *x = rand_f32(24, -4, 4);
    for (int i = 0; i < 6; i++) x[6 + i] = (float)(100.0 + 3.0 * i); /* overflow without max subtraction */
    cx_tensor *t = tf32(x, s, 2);
    double ref[24];
    ref_softmax_rows(x, 4, 6, false, ref);
    expect_tensor("softmax(-1)", cx_softmax(t, -1), s, 2, ref, TOL_T);
    expect_tensor("softmax(1)", cx_softmax(t, 1), s, 2, ref, TOL_T);
    ref_softmax_rows(x, 4, 6, true, ref);
    expect_tensor("log_softmax(-1)", cx_log_softmax(t, -1), s, 2, ref, TOL_T);
    /* axis 0: transpose the reference */
    float xt[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) xt[j * 4 + i] = x[i * 6 + j];
    double rt[24];
    ref_softmax_rows(xt, 6, 4, false, rt);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) ref[i * 6 + j] = rt[j * 4 + i];
    expect_tensor("softmax(0)", cx_softmax(t, 0), s, 2, ref, TOL_T);
    ref_softmax_rows(xt, 6, 4, true, rt);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) ref[i * 6 + j] = rt[j * 4 + i];
    expect_tensor("log_softmax(0)", cx_log_softmax(t, 0), s, 2, ref, TOL_T);
    free(x);
    END();
}

static void ref_layer_norm(const float *x, int64_t rows, int64_t n, const float *w, const float *b, double eps,
                           double *out)
{
    for (int64_t r = 0; r < rows; r++) {
        double m = 0, v = 0;
        for (int64_t i = 0; i < n; i++) m += x[r * n + i];
        m /= (double)n;
        for (int64_t i = 0; i < n; i++) v += (x[r * n + i] - m) * (x[r * n + i] - m);
        v /= (double)n;
        for (int64_t i = 0; i < n; i++) {
            double y = (x[r * n + i] - m) / sqrt(v + eps);
            out[r * n + i] = y * (w ? w[i] : 1.0) + (b ? b[i] : 0.0);
        }
    }
}

Test(ops, layer_norm)
{
    rng_seed(29);
    BEGIN();
    const int64_t s[] = { 4, 6 }, sw[] = { 6 };
    float *x, *w, *b;
    cx_tensor *t = rnd(s, 2, -3, 5, &x), *tw = rnd(sw, 1, 0.5, 1.5, &w), *tb = rnd(sw, 1, -1, 1, &b);
    double ref[60];
    ref_layer_norm(x, 4, 6, w, b, 1e-5, ref);
    expect_tensor("layer_norm(w, b)", cx_layer_norm(t, 1, tw, tb, 1e-5), s, 2, ref, TOL_T);
    ref_layer_norm(x, 4, 6, w, NULL, 1e-5, ref);
    expect_tensor("layer_norm(w)", cx_layer_norm(t, 1, tw, NULL, 1e-5), s, 2, ref, TOL_T);
    /* large eps shows up in the result */
    ref_layer_norm(x, 4, 6, NULL, NULL, 0.5, ref);
    expect_tensor("layer_norm(eps 0.5)", cx_layer_norm(t, 1, NULL, NULL, 0.5), s, 2, ref, TOL_T);
    /* normalize over the last two dims, no affine */
    const int64_t s3[] = { 2, 3, 5 }, s35[] = { 3, 5 };
    float *y, *w2;
    cx_tensor *t3 = rnd(s3, 3, -2, 2, &y), *tw2 = rnd(s35, 2, 0.5, 1.5, &w2);
    ref_layer_norm(y, 2, 15, NULL, NULL, 1e-5, ref);
    expect_tensor("layer_norm nnorm 2", cx_layer_norm(t3, 2, NULL, NULL, 1e-5), s3, 3, ref, TOL_T);
    ref_layer_norm(y, 2, 15, w2, NULL, 1e-5, ref);
    expect_tensor("layer_norm nnorm 2 (w)", cx_layer_norm(t3, 2, tw2, NULL, 1e-5), s3, 3, ref, TOL_T);
    free(x);
    free(w);
    free(b);
    free(y);
    free(w2);
    END();
}

/* ======================================================================
 * losses
 * ====================================================================== */

static bool ignore_active(int64_t ii) { return ii >= 0 || ii == -100; }

/* per-sample losses in `per`; returns the reduced value. */
static double ref_ce(const float *logits, const int64_t *tgt, int64_t N, int64_t C, bool logits_are_logp,
                     int64_t ignore, double ls, int red, double *per)
{
    double total = 0;
    int64_t cnt = 0;
    double *lp = dalloc(C);
    for (int64_t i = 0; i < N; i++) {
        if (logits_are_logp) {
            for (int64_t c = 0; c < C; c++) lp[c] = logits[i * C + c];
        } else {
            double m = -INFINITY, s = 0;
            for (int64_t c = 0; c < C; c++) m = fmax(m, logits[i * C + c]);
            for (int64_t c = 0; c < C; c++) s += exp(logits[i * C + c] - m);
            for (int64_t c = 0; c < C; c++) lp[c] = logits[i * C + c] - m - log(s);
        }
        if (ignore_active(ignore) && tgt[i] == ignore) {
            per[i] = 0;
            continue;
        }
        double smooth = 0;
        for (int64_t c = 0; c < C; c++) smooth -= lp[c];
        smooth /= (double)C;
        per[i] = (1.0 - ls) * -lp[tgt[i]] + ls * smooth;
        total += per[i];
        cnt++;
    }
    free(lp);
    if (red == CX_REDUCE_SUM) return total;
    return total / (double)cnt;
}

Test(ops, nll_loss)
{
    rng_seed(30);
    const int64_t N = 6, C = 5;
    const int64_t sl[] = { N, C }, st[] = { N };
    float *logp = rand_f32(N * C, -4, -0.1);
    int64_t tgt[6] = { 1, 4, 0, 2, 2, 3 };
    int64_t tgt_ign[6] = { 1, -100, 0, 2, -100, 3 };
    const struct { const int64_t *t; int64_t ignore; const char *name; } cases[] = {
        { tgt, -100, "no ignored targets" },
        { tgt_ign, -100, "ignore -100" },
        { tgt, 2, "ignore class 2" },
        { tgt, -1, "ignore_index -1 = none" },
    };
    for (size_t c = 0; c < 4; c++)
        for (int red = 0; red < 3; red++) {
            BEGIN();
            double per[6];
            double v = ref_ce(logp, cases[c].t, N, C, true, cases[c].ignore, 0.0, red, per);
            cx_tensor *y = cx_nll_loss(tf32(logp, sl, 2), ti64(cases[c].t, st, 1), (cx_reduction)red, cases[c].ignore);
            char what[96];
            snprintf(what, sizeof what, "nll_loss %s red %d", cases[c].name, red);
            if (red == CX_REDUCE_NONE) expect_tensor(what, y, st, 1, per, TOL);
            else expect_tensor(what, y, NULL, 0, &v, TOL);
            END();
        }
    free(logp);
}

Test(ops, cross_entropy)
{
    rng_seed(31);
    const int64_t N = 7, C = 4;
    const int64_t sl[] = { N, C }, st[] = { N };
    float *logits = rand_f32(N * C, -3, 3);
    int64_t tgt[7] = { 0, 3, 1, 1, 2, 3, 0 };
    int64_t tgt_ign[7] = { 0, -100, 1, 1, -100, 3, 0 };
    const struct { const int64_t *t; int64_t ignore; double ls; const char *name; } cases[] = {
        { tgt, -100, 0.0, "plain" },
        { tgt, -100, 0.1, "label_smoothing 0.1" },
        { tgt_ign, -100, 0.0, "ignore -100" },
        { tgt_ign, -100, 0.25, "ignore -100 + ls 0.25" },
        { tgt, 1, 0.1, "ignore class 1 + ls 0.1" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int red = 0; red < 3; red++) {
            BEGIN();
            double per[7];
            double v = ref_ce(logits, cases[c].t, N, C, false, cases[c].ignore, cases[c].ls, red, per);
            cx_tensor *y = cx_cross_entropy(tf32(logits, sl, 2), ti64(cases[c].t, st, 1), (cx_reduction)red,
                                            cases[c].ignore, cases[c].ls);
            char what[96];
            snprintf(what, sizeof what, "cross_entropy %s red %d", cases[c].name, red);
            if (red == CX_REDUCE_NONE) expect_tensor(what, y, st, 1, per, TOL_T);
            else expect_tensor(what, y, NULL, 0, &v, TOL_T);
            END();
        }
    /* i32 targets work too */
    BEGIN();
    int32_t t32[7];
    for (int i = 0; i < 7; i++) t32[i] = (int32_t)tgt[i];
    double per[7];
    double v = ref_ce(logits, tgt, N, C, false, -100, 0.0, CX_REDUCE_MEAN, per);
    expect_tensor("cross_entropy i32 targets", cx_cross_entropy(tf32(logits, sl, 2), ti32(t32, st, 1), CX_REDUCE_MEAN, -100, 0.0),
                  NULL, 0, &v, TOL_T);
    END();
    free(logits);
}

Test(ops, mse_loss)
{
    rng_seed(32);
    BEGIN();
    const int64_t s[] = { 3, 5 };
    float *a, *b;
    cx_tensor *ta = rnd(s, 2, -2, 2, &a), *tb = rnd(s, 2, -2, 2, &b);
    double per[15], sum = 0;
    for (int i = 0; i < 15; i++) {
        per[i] = ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        sum += per[i];
    }
    double mean = sum / 15.0;
    expect_tensor("mse none", cx_mse_loss(ta, tb, CX_REDUCE_NONE), s, 2, per, TOL);
    expect_tensor("mse sum", cx_mse_loss(ta, tb, CX_REDUCE_SUM), NULL, 0, &sum, TOL);
    expect_tensor("mse mean", cx_mse_loss(ta, tb, CX_REDUCE_MEAN), NULL, 0, &mean, TOL);
    free(a);
    free(b);
    END();
}

/* ======================================================================
 * casts
 * ====================================================================== */

Test(ops, cast_f32_bf16_round_to_nearest_even)
{
    BEGIN();
    /* bit patterns chosen around bf16 rounding boundaries */
    const uint32_t bits[] = {
        0x3F800000u, /* 1.0 exact */
        0x3F808000u, /* halfway between 0x3F80 and 0x3F81: to even 0x3F80 */
        0x3F818000u, /* halfway between 0x3F81 and 0x3F82: to even 0x3F82 */
        0x3F808001u, /* just above halfway: up */
        0x3F807FFFu, /* just below halfway: down */
        0xBF818000u, /* negative halfway: to even */
        0x40490FDBu, /* pi */
        0x00000000u, 0x80000000u, /* +-0 */
        0x7F7FFFFFu, /* max float: rounds to inf */
        0x3F7FFFFFu, /* just below 1: rounds up to 1 */
        0x00010000u, /* denormal */
    };
    const int n = (int)(sizeof bits / sizeof bits[0]);
    float x[16];
    for (int i = 0; i < n; i++) x[i] = f32_from_bits(bits[i]);
    const int64_t s[] = { n };
    cx_tensor *b = cx_cast(tf32(x, s, 1), CX_BF16);
    check_shape("cast bf16", b, s, 1);
    cr_assert_eq(cx_dtype_of(b), CX_BF16);
    uint16_t raw[16];
    cr_assert_eq(cx_to_host(b, raw, CX_BF16), CX_OK, "%s", cx_last_error());
    float back[16];
    cr_assert_eq(cx_to_host(b, back, CX_F32), CX_OK);
    for (int i = 0; i < n; i++) {
        uint16_t want = ref_f32_to_bf16(x[i]);
        cr_assert_eq(raw[i], want, "f32 0x%08X -> bf16 0x%04X, expected 0x%04X", bits[i], raw[i], want);
        float wf = ref_bf16_to_f32(want);
        cr_assert(memcmp(&back[i], &wf, 4) == 0, "bf16 0x%04X read as f32 %g, expected %g", want, back[i], wf);
    }
    /* back to f32 inside the graph is exact */
    cx_tensor *f = cx_cast(b, CX_F32);
    cr_assert_eq(cx_dtype_of(f), CX_F32);
    float back2[16];
    cr_assert_eq(cx_to_host(f, back2, CX_F32), CX_OK);
    for (int i = 0; i < n; i++) {
        float wf = ref_bf16_to_f32(ref_f32_to_bf16(x[i]));
        cr_assert(memcmp(&back2[i], &wf, 4) == 0, "cast(cast(x, bf16), f32)[%d] = %g, expected %g", i, back2[i], wf);
    }
    END();
}

Test(ops, bf16_arithmetic_rounds_result)
{
    rng_seed(33);
    BEGIN();
    const int64_t s[] = { 64 };
    float *a = rand_f32(64, -4, 4), *b = rand_f32(64, -4, 4);
    cx_tensor *ta = cx_cast(tf32(a, s, 1), CX_BF16), *tb = cx_cast(tf32(b, s, 1), CX_BF16);
    cx_tensor *y = cx_mul(ta, tb);
    cr_assert_eq(cx_dtype_of(y), CX_BF16, "bf16*bf16 -> %s", cx_dtype_name(cx_dtype_of(y)));
    uint16_t raw[64];
    cr_assert_eq(cx_to_host(y, raw, CX_BF16), CX_OK);
    for (int i = 0; i < 64; i++) {
        float fa = ref_bf16_to_f32(ref_f32_to_bf16(a[i])), fb = ref_bf16_to_f32(ref_f32_to_bf16(b[i]));
        uint16_t want = ref_f32_to_bf16(fa * fb);
        cr_assert_eq(raw[i], want, "bf16 %g*%g -> 0x%04X, expected 0x%04X", fa, fb, raw[i], want);
    }
    /* bf16 + f32 promotes to f32 */
    cx_tensor *z = cx_add(ta, tf32(b, s, 1));
    cr_assert_eq(cx_dtype_of(z), CX_F32, "bf16 + f32 -> %s", cx_dtype_name(cx_dtype_of(z)));
    free(a);
    free(b);
    END();
}

Test(ops, cast_int_and_bool)
{
    BEGIN();
    float x[10] = { 2.7f, -2.7f, 0.5f, -0.5f, 0.0f, 1e6f + 0.5f, -3.0f, 7.99f, -0.0f, 123456.75f };
    const int64_t s[] = { 10 };
    cx_tensor *t = tf32(x, s, 1);
    cx_tensor *i = cx_cast(t, CX_I32);
    cr_assert_eq(cx_dtype_of(i), CX_I32);
    int32_t gi[10];
    cr_assert_eq(cx_to_host(i, gi, CX_I32), CX_OK);
    for (int k = 0; k < 10; k++)
        cr_assert_eq(gi[k], (int32_t)x[k], "f32 %g -> i32 %d, expected truncation %d", x[k], gi[k], (int32_t)x[k]);
    cx_tensor *l = cx_cast(t, CX_I64);
    int64_t *gl = fetch_i64("f32->i64", l);
    for (int k = 0; k < 10; k++) cr_assert_eq(gl[k], (int64_t)x[k], "f32 %g -> i64 %lld", x[k], (long long)gl[k]);
    free(gl);
    cx_tensor *b = cx_cast(t, CX_BOOL);
    cr_assert_eq(cx_dtype_of(b), CX_BOOL);
    uint8_t gb[10];
    cr_assert_eq(cx_to_host(b, gb, CX_BOOL), CX_OK);
    for (int k = 0; k < 10; k++)
        cr_assert_eq(gb[k], x[k] != 0.0f ? 1 : 0, "f32 %g -> bool %d", x[k], gb[k]);
    /* bool -> f32, i32 -> f32, i32 -> bf16 */
    double rb[10], ri[10];
    for (int k = 0; k < 10; k++) {
        rb[k] = x[k] != 0.0f;
        ri[k] = (int32_t)x[k];
    }
    expect_tensor("bool->f32", cx_cast(b, CX_F32), s, 1, rb, 0);
    expect_tensor("i32->f32", cx_cast(i, CX_F32), s, 1, ri, 0);
    /* arithmetic on a bool cast: count of nonzeros */
    double cnt = 0;
    for (int k = 0; k < 10; k++) cnt += rb[k];
    expect_tensor("sum(cast(bool, f32))", cx_sum(cx_cast(b, CX_F32), NULL, 0, false), NULL, 0, &cnt, 0);
    /* u8 */
    float small[4] = { 0.0f, 1.9f, 200.5f, 255.0f };
    const int64_t s4[] = { 4 };
    cx_tensor *u = cx_cast(tf32(small, s4, 1), CX_U8);
    cr_assert_eq(cx_dtype_of(u), CX_U8);
    uint8_t gu[4];
    cr_assert_eq(cx_to_host(u, gu, CX_U8), CX_OK);
    const uint8_t wu[4] = { 0, 1, 200, 255 };
    for (int k = 0; k < 4; k++) cr_assert_eq(gu[k], wu[k], "f32 %g -> u8 %d, expected %d", small[k], gu[k], wu[k]);
    END();
}

/* ======================================================================
 * constants, leaves, introspection
 * ====================================================================== */

Test(ops, constants_and_leaves)
{
    BEGIN();
    const int64_t s[] = { 2, 3 };
    double r[6];
    for (int i = 0; i < 6; i++) r[i] = 2.5;
    expect_tensor("full 2.5", cx_full(s, 2, 2.5, CX_F32), s, 2, r, 0);
    for (int i = 0; i < 6; i++) r[i] = 0;
    expect_tensor("zeros", cx_zeros(s, 2, CX_F32), s, 2, r, 0);
    cx_tensor *o = cx_ones(s, 2, CX_I32);
    cr_assert_eq(cx_dtype_of(o), CX_I32);
    int64_t *oi = fetch_i64("ones i32", o);
    for (int i = 0; i < 6; i++) cr_assert_eq(oi[i], 1);
    free(oi);
    cx_tensor *sc = cx_scalar(-1.75, CX_F32);
    cr_assert_eq(cx_ndim(sc), 0);
    cr_assert_eq(cx_numel(sc), 1);
    cr_assert_float_eq(cx_item(sc), -1.75, 1e-12);
    cx_tensor *rs = cx_runtime_scalar(0.125, CX_F32);
    cr_assert_eq(cx_ndim(rs), 0);
    cr_assert_float_eq(cx_item(rs), 0.125, 1e-12);
    cr_assert_float_eq(cx_item(cx_mul(rs, cx_scalar(4.0, CX_F32))), 0.5, 1e-7);
    const int64_t s5[] = { 5 };
    double ar[5] = { 0, 1, 2, 3, 4 };
    expect_tensor("arange f32", cx_arange(5, CX_F32), s5, 1, ar, 0);
    cx_tensor *ai = cx_arange(5, CX_I64);
    cr_assert_eq(cx_dtype_of(ai), CX_I64);
    int64_t *aiv = fetch_i64("arange i64", ai);
    for (int i = 0; i < 5; i++) cr_assert_eq(aiv[i], i);
    free(aiv);
    /* constants broadcast in ops */
    float x[6] = { 1, 2, 3, 4, 5, 6 };
    for (int i = 0; i < 6; i++) r[i] = x[i] * 2.5 + 1;
    expect_tensor("x*full+1", cx_add(cx_mul(tf32(x, s, 2), cx_full(s, 2, 2.5, CX_F32)), cx_scalar(1, CX_F32)), s, 2, r,
                  TOL);
    /* cx_item of a 1-element non-scalar */
    const int64_t s111[] = { 1, 1, 1 };
    float v = 3.25f;
    cr_assert_float_eq(cx_item(tf32(&v, s111, 3)), 3.25, 1e-12);
    END();
}

Test(ops, introspection)
{
    cr_assert_eq(cx_dtype_size(CX_F32), 4);
    cr_assert_eq(cx_dtype_size(CX_BF16), 2);
    cr_assert_eq(cx_dtype_size(CX_I32), 4);
    cr_assert_eq(cx_dtype_size(CX_I64), 8);
    cr_assert_eq(cx_dtype_size(CX_U8), 1);
    cr_assert_eq(cx_dtype_size(CX_BOOL), 1);
    cr_assert(cx_dtype_is_float(CX_F32) && cx_dtype_is_float(CX_BF16));
    cr_assert(!cx_dtype_is_float(CX_I32) && !cx_dtype_is_float(CX_I64) && !cx_dtype_is_float(CX_BOOL));
    for (int d = 0; d < CX_DTYPE_COUNT; d++) cr_assert(cx_dtype_name((cx_dtype)d) && *cx_dtype_name((cx_dtype)d));
    cr_assert(strcmp(cx_dtype_name(CX_F32), cx_dtype_name(CX_BF16)) != 0);

    BEGIN();
    const int64_t s[] = { 2, 3, 4 };
    cx_tensor *t = cx_zeros(s, 3, CX_F32);
    cr_assert_eq(cx_ndim(t), 3);
    cr_assert_eq(cx_dim(t, 0), 2);
    cr_assert_eq(cx_dim(t, -1), 4);
    cr_assert_eq(cx_dim(t, -3), 2);
    cr_assert_eq(cx_numel(t), 24);
    cr_assert(!cx_is_persistent(t));
    cx_set_name(t, "activations");
    cr_assert_str_eq(cx_get_name(t), "activations");
    /* pending until read */
    float x[6] = { 1, 2, 3, 4, 5, 6 };
    const int64_t s2[] = { 2, 3 };
    cx_tensor *a = tf32(x, s2, 2);
    cr_assert(!cx_is_pending(a), "cx_from_host data should be materialized");
    cx_tensor *e = cx_exp(a);
    cr_assert(cx_is_pending(e), "an op result should be pending");
    END();
    /* persistence */
    cx_tensor *p = cx_persist(tf32(x, s2, 2));
    cr_assert(cx_is_persistent(p));
    /* alias shares the value and outlives the original handle */
    cx_tensor *q = cx_exp(p);
    cx_tensor *al = cx_alias(q);
    cx_free(q);
    double r[6];
    for (int i = 0; i < 6; i++) r[i] = exp(x[i]);
    expect_tensor("alias after free", al, s2, 2, r, TOL);
    cx_free(al);
    cx_free(p);
}

/* ======================================================================
 * RNG
 * ====================================================================== */

static void moments(const float *x, int64_t n, double *mean, double *var)
{
    double m = 0, v = 0;
    for (int64_t i = 0; i < n; i++) m += x[i];
    m /= (double)n;
    for (int64_t i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    *mean = m;
    *var = v / (double)(n - 1);
}

Test(ops, rng_statistics)
{
    const int64_t n = 100000;
    const int64_t s[] = { 100, 1000 };
    cx_manual_seed(1234);
    BEGIN();
    /* uniform [-1, 3) */
    float *u = fetch_f32("rand", cx_rand(s, 2, -1.0, 3.0, CX_F32));
    double m, v;
    moments(u, n, &m, &v);
    cr_assert(fabs(m - 1.0) < 0.02, "rand mean %g, expected 1 +- 0.02", m);
    cr_assert(fabs(v - 16.0 / 12.0) < 0.03, "rand var %g, expected 1.3333 +- 0.03", v);
    int hist[10] = { 0 };
    for (int64_t i = 0; i < n; i++) {
        cr_assert(u[i] >= -1.0f && u[i] < 3.0f, "rand value %g outside [-1, 3)", u[i]);
        int b = (int)((u[i] + 1.0) / 0.4);
        hist[b > 9 ? 9 : b]++;
    }
    for (int b = 0; b < 10; b++)
        cr_assert(abs(hist[b] - 10000) < 600, "rand histogram bin %d has %d of 100000 samples", b, hist[b]);
    /* neighbours are not correlated */
    double c = 0;
    for (int64_t i = 0; i + 1 < n; i++) c += (u[i] - m) * (u[i + 1] - m);
    c /= (double)(n - 1) * v;
    cr_assert(fabs(c) < 0.02, "rand lag-1 autocorrelation %g", c);
    free(u);
    /* normal(2, 0.5) */
    float *g = fetch_f32("randn", cx_randn(s, 2, 2.0, 0.5, CX_F32));
    moments(g, n, &m, &v);
    cr_assert(fabs(m - 2.0) < 0.01, "randn mean %g, expected 2 +- 0.01", m);
    cr_assert(fabs(v - 0.25) < 0.01, "randn var %g, expected 0.25 +- 0.01", v);
    int64_t within1 = 0;
    for (int64_t i = 0; i < n; i++) within1 += fabs(g[i] - 2.0) < 0.5;
    cr_assert(fabs((double)within1 / (double)n - 0.6827) < 0.01, "randn: %g within 1 sigma, expected 0.6827",
              (double)within1 / (double)n);
    free(g);
    /* bernoulli(0.3) */
    float *b = fetch_f32("bernoulli", cx_bernoulli(s, 2, 0.3, CX_F32));
    moments(b, n, &m, &v);
    for (int64_t i = 0; i < n; i++) cr_assert(b[i] == 0.0f || b[i] == 1.0f, "bernoulli value %g", b[i]);
    cr_assert(fabs(m - 0.3) < 0.01, "bernoulli mean %g, expected 0.3 +- 0.01", m);
    cr_assert(fabs(v - 0.21) < 0.01, "bernoulli var %g, expected 0.21 +- 0.01", v);
    free(b);
    END();
}

Test(ops, rng_reproducibility)
{
    const int64_t s[] = { 1000 };
    BEGIN();
    cx_manual_seed(42);
    cr_assert_eq(cx_get_rng_state().seed, 42);
    cx_rng_state st0 = cx_get_rng_state();
    float *a = fetch_f32("rand a", cx_rand(s, 1, 0, 1, CX_F32));
    cx_rng_state st1 = cx_get_rng_state();
    cr_assert(st1.offset != st0.offset, "the RNG offset did not advance after a draw");
    float *b = fetch_f32("rand b", cx_rand(s, 1, 0, 1, CX_F32));
    cx_manual_seed(42);
    float *a2 = fetch_f32("rand a again", cx_rand(s, 1, 0, 1, CX_F32));
    cx_manual_seed(43);
    float *c = fetch_f32("rand other seed", cx_rand(s, 1, 0, 1, CX_F32));
    cx_set_rng_state(st1);
    float *b2 = fetch_f32("rand b again", cx_rand(s, 1, 0, 1, CX_F32));
    int same_ab = 0, same_ac = 0;
    for (int i = 0; i < 1000; i++) {
        cr_assert_eq(a[i], a2[i], "same seed, element %d: %g vs %g", i, a[i], a2[i]);
        cr_assert_eq(b[i], b2[i], "restored state, element %d: %g vs %g", i, b[i], b2[i]);
        same_ab += a[i] == b[i];
        same_ac += a[i] == c[i];
    }
    cr_assert(same_ab < 10, "two draws at different offsets agree on %d of 1000 values", same_ab);
    cr_assert(same_ac < 10, "two seeds agree on %d of 1000 values", same_ac);
    /* randn and bernoulli are reproducible too */
    cx_manual_seed(7);
    float *n1 = fetch_f32("randn", cx_randn(s, 1, 0, 1, CX_F32));
    float *m1 = fetch_f32("bernoulli", cx_bernoulli(s, 1, 0.5, CX_F32));
    cx_manual_seed(7);
    float *n2 = fetch_f32("randn", cx_randn(s, 1, 0, 1, CX_F32));
    float *m2 = fetch_f32("bernoulli", cx_bernoulli(s, 1, 0.5, CX_F32));
    cr_assert(memcmp(n1, n2, sizeof(float) * 1000) == 0, "randn not reproducible");
    cr_assert(memcmp(m1, m2, sizeof(float) * 1000) == 0, "bernoulli not reproducible");
    free(a);
    free(b);
    free(a2);
    free(b2);
    free(c);
    free(n1);
    free(n2);
    free(m1);
    free(m2);
    END();
}

/* ======================================================================
 * collectives in a world of one
 * ====================================================================== */

Test(ops, collectives_world_of_one)
{
    rng_seed(34);
    BEGIN();
    const int64_t s[] = { 4, 6 };
    float *x;
    cx_tensor *t = rnd(s, 2, -1, 1, &x);
    double r[24], r2[24], rx[24];
    for (int i = 0; i < 24; i++) {
        r[i] = 0.5 * x[i];
        r2[i] = 2.0 * x[i];
        rx[i] = x[i];
    }
    expect_tensor("all_reduce sum *0.5", cx_all_reduce(t, CX_RED_SUM, 0.5, NULL, false), s, 2, r, TOL);
    expect_tensor("all_reduce mean", cx_all_reduce(t, CX_RED_MEAN, 1.0, NULL, true), s, 2, rx, TOL);
    expect_tensor("all_reduce max", cx_all_reduce(t, CX_RED_MAX, 1.0, NULL, false), s, 2, rx, TOL);
    expect_tensor("all_gather", cx_all_gather(t, 0, NULL, false), s, 2, rx, TOL);
    expect_tensor("reduce_scatter *2", cx_reduce_scatter(t, CX_RED_SUM, 2.0, 0, NULL, false), s, 2, r2, TOL);
    expect_tensor("all_to_all", cx_all_to_all(t, 0, 1, NULL, false), s, 2, rx, TOL);
    expect_tensor("broadcast", cx_broadcast(t, 0, NULL, false), s, 2, rx, TOL);
    int rk = 0;
    cx_replica_groups g = { 1, 1, &rk };
    expect_tensor("all_reduce explicit group", cx_all_reduce(t, CX_RED_SUM, 2.0, &g, false), s, 2, r2, TOL);
    free(x);
    END();
}

/* ======================================================================
 * more layouts: views feeding contractions, big reductions
 * ====================================================================== */

Test(ops, views_into_contractions)
{
    rng_seed(35);
    BEGIN();
    /* matmul with an expanded batch operand and a broadcast batch */
    const int64_t sa[] = { 1, 4, 6 }, se[] = { 3, 4, 6 }, sb[] = { 3, 6, 5 }, so[] = { 3, 4, 5 };
    float *a, *b;
    cx_tensor *ta = rnd(sa, 3, -1, 1, &a), *tb = rnd(sb, 3, -1, 1, &b);
    double ref[60];
    ref_matmul(a, sa, 3, b, sb, 3, ref);
    expect_tensor("matmul(expand(a), b)", cx_matmul(cx_expand(ta, se, 3), tb), so, 3, ref, TOL);
    expect_tensor("matmul((1,4,6), (3,6,5))", cx_matmul(ta, tb), so, 3, ref, TOL);
    /* gather from a transposed source */
    const int64_t s45[] = { 4, 5 }, si[] = { 3, 4 };
    float *x;
    cx_tensor *tx = rnd(s45, 2, -1, 1, &x);
    int64_t idx[12];
    for (int i = 0; i < 12; i++) idx[i] = rng_int(4);
    double rg[12];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) rg[i * 4 + j] = x[j * 5 + idx[i * 4 + j]]; /* xt[i'][j] = x[j][i'] */
    expect_tensor("gather(transpose(x), 0, idx)", cx_gather(cx_transpose(tx, 0, 1), 0, ti64(idx, si, 2)), si, 2, rg,
                  TOL);
    /* max pool of a permuted NHWC tensor */
    const int64_t nhwc[] = { 1, 4, 4, 2 }, sp[] = { 1, 2, 2, 2 };
    float *h;
    cx_tensor *th = rnd(nhwc, 4, -1, 1, &h);
    int perm[4] = { 0, 3, 1, 2 };
    double rp[8];
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) {
                double m = -INFINITY;
                for (int u = 0; u < 2; u++)
                    for (int v = 0; v < 2; v++) m = fmax(m, h[((2 * i + u) * 4 + (2 * j + v)) * 2 + c]);
                rp[(c * 2 + i) * 2 + j] = m;
            }
    expect_tensor("max_pool(permute(nhwc))", cx_max_pool2d(cx_permute(th, perm), 2, 2, 2, 2, 0, 0), sp, 4, rp, TOL);
    /* elementwise mix of three different views */
    const int64_t s34[] = { 3, 4 }, s43[] = { 4, 3 }, s1_4[] = { 1, 4 }, s38[] = { 3, 8 };
    float *p, *q, *r;
    cx_tensor *tp = rnd(s43, 2, -1, 1, &p), *tq = rnd(s1_4, 2, -1, 1, &q), *tr = rnd(s38, 2, -1, 1, &r);
    double rm[12];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) rm[i * 4 + j] = (double)p[j * 3 + i] * q[j] + r[i * 8 + 2 * j + 1];
    expect_tensor("transpose*expand+slice", cx_add(cx_mul(cx_transpose(tp, 0, 1), cx_expand(tq, s34, 2)),
                                                   cx_slice(tr, 1, 1, 8, 2)),
                  s34, 2, rm, TOL);
    free(a);
    free(b);
    free(x);
    free(h);
    free(p);
    free(q);
    free(r);
    END();
}

Test(ops, big_reductions_split_across_threads)
{
    rng_seed(36);
    const int64_t s[] = { 513, 7 };
    float *x = rand_f32(513 * 7, -1, 1);
    const bool m0[2] = { true, false }, m1[2] = { false, true };
    const int64_t s7[] = { 7 }, s513[] = { 513 };
    double ref[513];
    for (int kind = 0; kind < 3; kind++) {
        BEGIN();
        cx_tensor *t = tf32(x, s, 2);
        int ax0 = 0, ax1 = 1;
        cx_tensor *y0 = kind == 0 ? cx_sum(t, &ax0, 1, false) : kind == 1 ? cx_max(t, &ax0, 1, false) : cx_var(t, &ax0, 1, 1, false);
        cx_tensor *y1 = kind == 0 ? cx_sum(t, &ax1, 1, false) : kind == 1 ? cx_max(t, &ax1, 1, false) : cx_var(t, &ax1, 1, 1, false);
        int rk = kind == 2 ? R_VAR : kind;
        ref_reduce(x, s, 2, m0, rk, kind == 2, ref);
        expect_tensor(kind == 0 ? "sum axis 0" : kind == 1 ? "max axis 0" : "var axis 0", y0, s7, 1, ref, TOL);
        ref_reduce(x, s, 2, m1, rk, kind == 2, ref);
        expect_tensor(kind == 0 ? "sum axis 1" : kind == 1 ? "max axis 1" : "var axis 1", y1, s513, 1, ref, TOL);
        END();
    }
    /* argmax down a long column */
    BEGIN();
    float *d = distinct_f32(513 * 7, 0, 0.001);
    int64_t *got = fetch_i64("argmax axis 0", cx_argmax(tf32(d, s, 2), 0, false));
    for (int j = 0; j < 7; j++) {
        int64_t best = 0;
        for (int64_t i = 1; i < 513; i++)
            if (d[i * 7 + j] > d[best * 7 + j]) best = i;
        cr_assert_eq(got[j], best, "argmax axis 0 column %d: %lld, expected %lld", j, (long long)got[j], (long long)best);
    }
    free(got);
    free(d);
    END();
    free(x);
}

/* ======================================================================
 * other dtypes through the common ops
 * ====================================================================== */

static float bf(float x) { return ref_bf16_to_f32(ref_f32_to_bf16(x)); }

Test(ops, bf16_ops)
{
    rng_seed(37);
    BEGIN();
    const int64_t sa[] = { 5, 8 }, sb[] = { 8, 3 }, so[] = { 5, 3 }, s5[] = { 5 };
    float *a = rand_f32(40, -1, 1), *b = rand_f32(24, -1, 1);
    cx_tensor *ta = cx_cast(tf32(a, sa, 2), CX_BF16), *tb = cx_cast(tf32(b, sb, 2), CX_BF16);
    /* results are bf16 and close to the f32 computation on the rounded inputs */
    struct { const char *name; cx_tensor *t; int64_t n; const int64_t *shape; int nd; } r[4];
    r[0].name = "exp(bf16)";
    r[0].t = cx_exp(ta);
    r[1].name = "matmul(bf16, bf16)";
    r[1].t = cx_matmul(ta, tb);
    int ax1 = 1;
    r[2].name = "sum(bf16, axis 1)";
    r[2].t = cx_sum(ta, &ax1, 1, false);
    r[3].name = "softmax(bf16)";
    r[3].t = cx_softmax(ta, -1);
    double ref[4][40];
    for (int i = 0; i < 40; i++) ref[0][i] = exp(bf(a[i]));
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 3; j++) {
            double acc = 0;
            for (int k = 0; k < 8; k++) acc += (double)bf(a[i * 8 + k]) * bf(b[k * 3 + j]);
            ref[1][i * 3 + j] = acc;
        }
    for (int i = 0; i < 5; i++) {
        double acc = 0, m = -INFINITY, z = 0;
        for (int k = 0; k < 8; k++) {
            acc += bf(a[i * 8 + k]);
            m = fmax(m, bf(a[i * 8 + k]));
        }
        ref[2][i] = acc;
        for (int k = 0; k < 8; k++) z += exp(bf(a[i * 8 + k]) - m);
        for (int k = 0; k < 8; k++) ref[3][i * 8 + k] = exp(bf(a[i * 8 + k]) - m) / z;
    }
    const int64_t *shapes[4] = { sa, so, s5, sa };
    const int nds[4] = { 2, 2, 1, 2 };
    for (int k = 0; k < 4; k++) {
        check_shape(r[k].name, r[k].t, shapes[k], nds[k]);
        cr_assert_eq(cx_dtype_of(r[k].t), CX_BF16, "%s: dtype %s", r[k].name, cx_dtype_name(cx_dtype_of(r[k].t)));
        float *got = fetch_f32(r[k].name, r[k].t);
        /* bf16 has 8 significant bits: 2^-8 relative, plus accumulated error */
        check_close_d(r[k].name, got, ref[k], ref_numel(shapes[k], nds[k]), 2e-2);
        free(got);
    }
    free(a);
    free(b);
    END();
}

Test(ops, integer_ops)
{
    BEGIN();
    const int64_t s[] = { 2, 4 }, s2[] = { 2 };
    int32_t a[8] = { 3, -7, 12, 0, 5, 5, -2, 9 };
    int64_t l[8] = { 4000000000ll, -1, 7, 2, 3, 3000000000ll, -5, 0 };
    cx_tensor *ta = ti32(a, s, 2), *tl = ti64(l, s, 2);
    int ax1 = 1;
    int64_t *sum = fetch_i64("sum i32", cx_sum(ta, &ax1, 1, false));
    cr_assert_eq(sum[0], 8);
    cr_assert_eq(sum[1], 17);
    free(sum);
    cx_tensor *mx = cx_max(tl, &ax1, 1, false);
    check_shape("max i64", mx, s2, 1);
    cr_assert_eq(cx_dtype_of(mx), CX_I64);
    int64_t *m = fetch_i64("max i64", mx);
    cr_assert_eq(m[0], 4000000000ll, "max i64 row 0 = %lld", (long long)m[0]);
    cr_assert_eq(m[1], 3000000000ll, "max i64 row 1 = %lld", (long long)m[1]);
    free(m);
    int64_t *am = fetch_i64("argmax i32", cx_argmax(ta, 1, false));
    cr_assert_eq(am[0], 2);
    cr_assert_eq(am[1], 3);
    free(am);
    /* comparisons and where on integers */
    cx_tensor *w = cx_where(cx_lt(ta, cx_scalar(0, CX_I32)), cx_neg(ta), ta);
    cr_assert_eq(cx_dtype_of(w), CX_I32);
    int64_t *wv = fetch_i64("abs via where", w);
    for (int i = 0; i < 8; i++) cr_assert_eq(wv[i], a[i] < 0 ? -a[i] : a[i]);
    free(wv);
    int64_t *ab = fetch_i64("abs i64", cx_abs(tl));
    for (int i = 0; i < 8; i++) cr_assert_eq(ab[i], l[i] < 0 ? -l[i] : l[i], "abs i64[%d] = %lld", i, (long long)ab[i]);
    free(ab);
    /* i64 values beyond 2^53 survive a round trip and a reshape/transpose */
    int64_t big[2] = { (1ll << 60) + 1, -((1ll << 55) + 3) };
    int64_t *bb = fetch_i64("big i64", cx_transpose(cx_reshape(ti64(big, s2, 1), (const int64_t[]){ 2, 1 }, 2), 0, 1));
    cr_assert_eq(bb[0], big[0]);
    cr_assert_eq(bb[1], big[1]);
    free(bb);
    END();
}

/* ---- fused attention and layer norm against plain references ---------------------- */

/* softmax(scale q k^T) v per (b, h) in double; causal as the kernel's. */
static void ref_attention(double *out, const float *q, const float *k, const float *v, int64_t B, int64_t H,
                          int64_t T, int64_t S, int64_t D, bool causal, double scale)
{
    double *p = malloc(sizeof(double) * (size_t)S);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                const float *qi = q + ((b * H + h) * T + i) * D;
                int64_t vis = causal ? i + 1 + (S - T) : S;
                if (vis > S) vis = S;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < vis; j++) {
                    const float *kj = k + ((b * H + h) * S + j) * D;
                    double s = 0;
                    for (int64_t e = 0; e < D; e++) s += (double)qi[e] * kj[e];
                    p[j] = s * scale;
                    if (p[j] > mx) mx = p[j];
                }
                for (int64_t j = 0; j < vis; j++) { p[j] = exp(p[j] - mx); sum += p[j]; }
                double *o = out + ((b * H + h) * T + i) * D;
                for (int64_t e = 0; e < D; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < vis; j++) acc += p[j] * v[((b * H + h) * S + j) * D + e];
                    o[e] = vis > 0 ? acc / sum : 0;
                }
            }
    free(p);
}

static void attention_case(int64_t B, int64_t H, int64_t T, int64_t S, int64_t D, bool causal)
{
    int64_t sq[4] = { B, H, T, D }, sk[4] = { B, H, S, D };
    float *q = rand_f32(B * H * T * D, -1, 1), *k = rand_f32(B * H * S * D, -1, 1), *v = rand_f32(B * H * S * D, -1, 1);
    double *ref = malloc(sizeof(double) * (size_t)(B * H * T * D));
    double scale = 1.0 / sqrt((double)D);
    ref_attention(ref, q, k, v, B, H, T, S, D, causal, scale);
    cx_step_begin();
    cx_tensor *qt = cx_from_host(q, sq, 4, CX_F32), *kt = cx_from_host(k, sk, 4, CX_F32), *vt = cx_from_host(v, sk, 4, CX_F32);
    cx_tensor *o = cx_keep(cx_scaled_dot_product_attention(qt, kt, vt, causal, 0));
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    char what[96];
    snprintf(what, sizeof what, "attention B%lld H%lld T%lld S%lld D%lld %s", (long long)B, (long long)H, (long long)T,
             (long long)S, (long long)D, causal ? "causal" : "full");
    expect_tensor(what, o, sq, 4, ref, 2e-5);
    free(q); free(k); free(v); free(ref);
}

Test(ops, attention_fused_matches_the_plain_definition)
{
    rng_seed(701);
    attention_case(2, 3, 130, 130, 16, true);    /* three query and key tiles, ragged last */
    attention_case(1, 2, 70, 150, 8, false);     /* fewer queries than keys */
    attention_case(1, 1, 3, 7, 4, true);         /* causal with S > T: bottom-right aligned */
    attention_case(2, 1, 64, 64, 64, true);      /* exactly one tile */
}

Test(ops, attention_fused_equals_the_composite_path)
{
    /* the plain path (matmul, mask, softmax, matmul) is the reference the
     * fused kernel replaces */
    rng_seed(703);
    const int64_t B = 2, H = 2, T = 67, D = 8, s4[4] = { B, H, T, D };
    float *q = rand_f32(B * H * T * D, -1, 1), *k = rand_f32(B * H * T * D, -1, 1), *v = rand_f32(B * H * T * D, -1, 1);
    cx_step_begin();
    cx_tensor *qt = cx_from_host(q, s4, 4, CX_F32), *kt = cx_from_host(k, s4, 4, CX_F32), *vt = cx_from_host(v, s4, 4, CX_F32);
    cx_tensor *fused = cx_keep(cx_scaled_dot_product_attention(qt, kt, vt, true, 0));
    cx_tensor *scores = cx_mul_scalar(cx_matmul(qt, cx_transpose(kt, 2, 3)), 1.0 / sqrt((double)D));
    int64_t col[2] = { T, 1 }, row[2] = { 1, T };
    cx_tensor *ar = cx_arange(T, CX_I64);
    cx_tensor *allowed = cx_le(cx_reshape(ar, row, 2), cx_reshape(ar, col, 2));
    cx_tensor *att = cx_softmax(cx_where(allowed, scores, cx_full(NULL, 0, -1e30, CX_F32)), -1);
    cx_tensor *plain = cx_keep(cx_matmul(att, vt));
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    float *a = fetch_f32("fused", fused), *b = fetch_f32("plain", plain);
    double *bd = malloc(sizeof(double) * (size_t)(B * H * T * D));
    for (int64_t i = 0; i < B * H * T * D; i++) bd[i] = b[i];
    check_close_d("fused vs composite attention", a, bd, B * H * T * D, 2e-5);
    free(q); free(k); free(v); free(a); free(b); free(bd);
}

Test(ops, attention_never_writes_the_score_matrix)
{
    /* forward and backward of T = 512: the (B, H, T, T) scores would be
     * 4 MiB; no intermediate of the step may be that large */
    rng_seed(709);
    const int64_t B = 1, H = 4, T = 512, D = 16, s4[4] = { B, H, T, D };
    float *x = rand_f32(B * H * T * D, -1, 1);
    cx_tensor *p[3];
    for (int i = 0; i < 3; i++) p[i] = cx_requires_grad(cx_persist(cx_from_host(x, s4, 4, CX_F32)), true);
    cx_step_begin();
    cx_tensor *o = cx_scaled_dot_product_attention(p[0], p[1], p[2], true, 0);
    cr_assert_eq(cx_backward(cx_sum(o, NULL, 0, false)), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    cx_exec_info info = cx_last_exec_info();
    int64_t scores = B * H * T * T * (int64_t)sizeof(float);
    cr_assert_lt(info.arena_bytes, scores, "the step's arena holds %lld bytes: the %lld-byte scores were written",
                 (long long)info.arena_bytes, (long long)scores);
    for (int i = 0; i < 3; i++) cx_free(p[i]);
    free(x);
}

/* One step of an attention block whose q, k and v are slices of one
 * (B, T, 3C) projection, as the gpt's are; `grads` gets the projection's
 * gradient (NULL: q, k and v are leaves of their own, their gradients
 * concatenated on the host instead). @return the step's kernels. */
static int qkv_block_step(const float *x, const float *w, int64_t B, int64_t T, int64_t H, int64_t D, bool one_projection,
                          float *grads)
{
    const int64_t C = H * D, sx[3] = { B, T, 3 * C }, s4[4] = { B, T, H, D }, sw[4] = { B, H, T, D };
    const int perm[4] = { 0, 2, 1, 3 };
    cx_tensor *leaf[3] = { NULL, NULL, NULL }, *qkv[3];
    cx_tensor *proj = one_projection ? cx_requires_grad(cx_persist(cx_from_host(x, sx, 3, CX_F32)), true) : NULL;
    float *part = malloc(sizeof(float) * (size_t)(B * T * C));
    cr_assert(part);
    for (int i = 0; i < 3; i++) {
        if (!one_projection) {
            for (int64_t r = 0; r < B * T; r++) memcpy(part + r * C, x + r * 3 * C + i * C, sizeof(float) * (size_t)C);
            leaf[i] = cx_requires_grad(cx_persist(cx_from_host(part, s4, 4, CX_F32)), true);
        }
    }
    cx_step_begin();
    for (int i = 0; i < 3; i++) {
        cx_tensor *heads = one_projection ? cx_reshape(cx_slice(proj, 2, i * C, (i + 1) * C, 1), s4, 4) : leaf[i];
        qkv[i] = cx_permute(heads, perm);
    }
    cx_tensor *o = cx_scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], true, 0);
    cx_tensor *loss = cx_sum(cx_mul(o, cx_from_host(w, sw, 4, CX_F32)), NULL, 0, false);
    cr_assert_eq(cx_backward(loss), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    const int kernels = cx_last_exec_info().num_kernels;
    if (one_projection) {
        cr_assert_eq(cx_to_host(cx_grad(proj), grads, CX_F32), CX_OK, "%s", cx_last_error());
    } else {
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(cx_to_host(cx_grad(leaf[i]), part, CX_F32), CX_OK, "%s", cx_last_error());
            for (int64_t r = 0; r < B * T; r++) memcpy(grads + r * 3 * C + i * C, part + r * C, sizeof(float) * (size_t)C);
        }
    }
    for (int i = 0; i < 3; i++) if (leaf[i]) cx_free(leaf[i]);
    if (proj) cx_free(proj);
    free(part);
    return kernels;
}

/* The projection's gradient is the sum of three zero pads of the packed
 * backward's parts, which adds up as one concat (ops/elementwise.c), and
 * the backward writes that concat itself, its rows interleaved
 * (compile/codegen.c): the step is the attention and its backward (the
 * loss's gradient is w itself, no kernel). It was 6 kernels: 3 slice
 * copies and a padded sum over the whole (B, T, 3C) besides. Values as
 * from separate leaves. */
static void qkv_gradient_case(int64_t B, int64_t T, int64_t H, int64_t D)
{
    const int64_t n = B * T * 3 * H * D;
    float *x = rand_f32(n, -1, 1), *w = rand_f32(B * T * H * D, -1, 1);
    float *got = malloc(sizeof(float) * (size_t)n), *want = malloc(sizeof(float) * (size_t)n);
    cr_assert(got && want);
    const int one = qkv_block_step(x, w, B, T, H, D, true, got);
    cr_assert_eq(one, 2, "T %lld: the attention and its backward writing the projection's gradient expected; %d kernels",
                 (long long)T, one);
    qkv_block_step(x, w, B, T, H, D, false, want);
    for (int64_t i = 0; i < n; i++)
        cr_assert_float_eq(got[i], want[i], 1e-6f * (1.0f + fabsf(want[i])), "T %lld: d proj[%lld]: %g, from leaves %g",
                           (long long)T, (long long)i, (double)got[i], (double)want[i]);
    free(x); free(w); free(got); free(want);
}

Test(ops, attention_qkv_gradient_of_one_projection)
{
    rng_seed(727);
    qkv_gradient_case(2, 24, 2, 8);     /* the kernel's row-block route */
    qkv_gradient_case(1, 1030, 1, 4);   /* more keys than it takes: the tiled route */
}

/* Zero pads along one axis whose data are adjacent add up as their
 * concat; a gap between them keeps the sum (values either way). */
Test(ops, adjacent_zero_pads_add_up_as_a_concat)
{
    const float a[6] = { 1, 2, 3, 4, 5, 6 }, b[4] = { -1, -2, -3, -4 };
    const int64_t sa[2] = { 2, 3 }, sb[2] = { 2, 2 };
    for (int gap = 0; gap < 2; gap++) {
        cx_step_begin();
        cx_tensor *ta = cx_from_host(a, sa, 2, CX_F32), *tb = cx_from_host(b, sb, 2, CX_F32);
        int64_t lo_a[2] = { 0, 0 }, hi_a[2] = { 0, 2 + gap }, lo_b[2] = { 0, 3 + gap }, hi_b[2] = { 0, 0 };
        cx_tensor *pa = cx_pad(ta, lo_a, hi_a, 0.0), *pb = cx_pad(tb, lo_b, hi_b, 0.0);
        cx_tensor *sum = cx_keep(cx_add(pb, pa));
        char *ir = cx_ir_text(&sum, 1);
        cr_assert(ir);
        const bool cat = strstr(ir, " concat(") != NULL, add = strstr(ir, " add(") != NULL;
        cr_assert(gap ? add && !cat : cat && !add, "pads %s a gap: %s", gap ? "with" : "without", ir);
        free(ir);
        cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
        float *v = fetch_f32("sum of pads", sum);
        for (int r = 0; r < 2; r++)
            for (int c = 0; c < 5 + gap; c++) {
                float want = c < 3 ? a[r * 3 + c] : c >= 3 + gap ? b[r * 2 + c - 3 - gap] : 0.0f;
                cr_assert_eq(v[r * (5 + gap) + c], want, "gap %d [%d, %d]: %g, want %g", gap, r, c, (double)v[r * (5 + gap) + c],
                             (double)want);
            }
        free(v);
    }
}

Test(ops, layer_norm_fused_matches_the_definition)
{
    rng_seed(719);
    const int64_t R = 37, C = 96, sx[2] = { R, C }, sc[1] = { C };
    float *x = rand_f32(R * C, -3, 3), *w = rand_f32(C, 0.5, 1.5), *b = rand_f32(C, -1, 1);
    double *ref = malloc(sizeof(double) * (size_t)(R * C));
    for (int64_t r = 0; r < R; r++) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < C; c++) m += x[r * C + c];
        m /= C;
        for (int64_t c = 0; c < C; c++) v += (x[r * C + c] - m) * (x[r * C + c] - m);
        v /= C;
        for (int64_t c = 0; c < C; c++) ref[r * C + c] = (x[r * C + c] - m) / sqrt(v + 1e-5) * w[c] + b[c];
    }
    cx_step_begin();
    cx_tensor *y = cx_keep(cx_layer_norm(cx_from_host(x, sx, 2, CX_F32), 1, cx_from_host(w, sc, 1, CX_F32),
                                         cx_from_host(b, sc, 1, CX_F32), 1e-5));
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_last_exec_info().num_kernels, 1, "layer norm ran as %d kernels", cx_last_exec_info().num_kernels);
    expect_tensor("layer_norm", y, sx, 2, ref, 1e-5);
    free(x); free(w); free(b); free(ref);
}

/* The embedding gradient (a scatter-add of rows into repeated indices) has
 * the same bits whatever the thread count and from run to run. */
static float *embedding_grad(int threads, const float *w0, const int64_t *idx, int64_t V, int64_t Dm, int64_t N)
{
    cx_set_num_threads(threads);
    int64_t sw[2] = { V, Dm }, si[1] = { N };
    cx_tensor *w = cx_requires_grad(cx_persist(cx_from_host(w0, sw, 2, CX_F32)), true);
    cx_step_begin();
    cx_tensor *e = cx_embedding(w, cx_from_host(idx, si, 1, CX_I64));
    cx_tensor *loss = cx_sum(cx_mul(e, cx_tanh(e)), NULL, 0, false);
    cr_assert_eq(cx_backward(loss), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    float *g = fetch_f32("embedding grad", cx_grad(w));
    cx_free(w);
    return g;
}

Test(ops, embedding_backward_is_deterministic)
{
    rng_seed(727);
    const int64_t V = 17, Dm = 300, N = 4096;
    float *w0 = rand_f32(V * Dm, -1, 1);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)N);
    for (int64_t i = 0; i < N; i++) idx[i] = (int64_t)(rng_u64() % (uint64_t)V);
    int saved = cx_get_num_threads();
    float *a = embedding_grad(1, w0, idx, V, Dm, N), *b = embedding_grad(2, w0, idx, V, Dm, N),
          *c = embedding_grad(2, w0, idx, V, Dm, N);
    cx_set_num_threads(saved);
    cr_assert(memcmp(a, b, sizeof(float) * (size_t)(V * Dm)) == 0, "1 and 2 threads differ");
    cr_assert(memcmp(b, c, sizeof(float) * (size_t)(V * Dm)) == 0, "two runs differ");
    free(a); free(b); free(c); free(w0); free(idx);
}
