/* Finite-difference checks of every differentiable op, and the autograd
 * API (zero_grad, accumulation, no-grad regions, detach, remat).
 *
 * Analytical: x = requires_grad(persist(from_host)), loss = sum(f(x) * W)
 * with fixed random W, cx_backward, step end (sync), cx_grad(x).
 * Numerical: central differences on freshly built graphs (non-grad inputs),
 * f's output read back and weighted by W in double on the host. */
#include "ref.h"

#define MAXIN 4

typedef struct {
    int nd;
    int64_t shape[CX_MAX_DIMS];
    cx_dtype dt;
    const void *data; /* float* for f32 */
    bool grad;
} gin;

typedef cx_tensor *(*gfn)(cx_tensor *const *in, const void *ctx);

typedef struct {
    double eps, rtol, atol;
    int max_check;  /* elements checked per input (all when numel <= max_check) */
} gopts;

static const gopts DEF = { 1e-2, 2e-2, 2e-3, 30 };

static gin G(int nd, const int64_t *shape, const float *data)
{
    gin g = { .nd = nd, .dt = CX_F32, .data = data, .grad = true };
    if (nd) memcpy(g.shape, shape, (size_t)nd * sizeof(int64_t));
    return g;
}

static gin C(int nd, const int64_t *shape, const void *data, cx_dtype dt)
{
    gin g = { .nd = nd, .dt = dt, .data = data, .grad = false };
    if (nd) memcpy(g.shape, shape, (size_t)nd * sizeof(int64_t));
    return g;
}

static cx_tensor *mk(const gin *g, const void *data)
{
    static int64_t dummy[1];
    cx_tensor *t = cx_from_host(data ? data : (const void *)dummy, g->shape, g->nd, g->dt);
    cr_assert(t && !cx_tensor_error(t), "cx_from_host: %s", t ? cx_tensor_error(t) : "NULL");
    return t;
}

static void step_end_ok(const char *what)
{
    cx_status st = cx_step_end();
    cr_assert_eq(st, CX_OK, "%s: cx_step_end -> %d (%s)", what, (int)st, cx_last_error());
}

/* Weighted sum of f's output, evaluated with input `pi` replaced by `pdata`. */
static double eval_loss(gfn f, const void *ctx, const gin *ins, int nin, int pi, const float *pdata, const float *W,
                        int64_t nout)
{
    cx_step_begin();
    cx_tensor *t[MAXIN];
    for (int i = 0; i < nin; i++) t[i] = mk(&ins[i], i == pi ? (const void *)pdata : ins[i].data);
    cx_tensor *out = f(t, ctx);
    cr_assert(out && !cx_tensor_error(out), "forward poisoned: %s", out ? cx_tensor_error(out) : "NULL");
    cr_assert_eq(cx_numel(out), nout);
    cx_keep(out);
    step_end_ok("numerical forward");
    float *o = fetch_f32("numerical forward", out);
    cx_free(out);
    double s = 0;
    for (int64_t k = 0; k < nout; k++) s += (double)o[k] * W[k];
    free(o);
    return s;
}

/* Runs the check: analytical gradients of sum(f(ins) * W) against central
 * differences, for up to o.max_check elements of every grad input. */
static void gradcheck_opts(const char *name, gfn f, const void *ctx, const gin *ins, int nin, gopts o)
{
    cr_assert(nin <= MAXIN);
    /* persistent leaves */
    cx_tensor *P[MAXIN] = { 0 };
    for (int i = 0; i < nin; i++)
        if (ins[i].grad) {
            P[i] = cx_requires_grad(cx_persist(mk(&ins[i], ins[i].data)), true);
            cr_assert(cx_get_requires_grad(P[i]), "%s: requires_grad not set", name);
            cr_assert(cx_grad(P[i]) == NULL, "%s: fresh leaf already has a grad", name);
        }
    /* analytical */
    cx_step_begin();
    cx_tensor *t[MAXIN];
    for (int i = 0; i < nin; i++) t[i] = ins[i].grad ? P[i] : mk(&ins[i], ins[i].data);
    cx_tensor *out = f(t, ctx);
    cr_assert(out && !cx_tensor_error(out), "%s: forward poisoned: %s", name, out ? cx_tensor_error(out) : "NULL");
    int64_t nout = cx_numel(out);
    int ond = cx_ndim(out);
    int64_t oshape[CX_MAX_DIMS];
    memcpy(oshape, cx_shape(out), (size_t)ond * sizeof(int64_t));
    uint64_t saved = ref_rng_state;
    rng_seed(0xfeed);
    float *W = rand_f32(nout, -1, 1);
    ref_rng_state = saved;
    cx_tensor *wt = cx_from_host(W, oshape, ond, CX_F32);
    cx_tensor *loss = cx_sum(cx_mul(out, wt), NULL, 0, false);
    cr_assert(loss && !cx_tensor_error(loss), "%s: loss poisoned", name);
    cx_status st = cx_backward(loss);
    cr_assert_eq(st, CX_OK, "%s: cx_backward -> %d (%s)", name, (int)st, cx_last_error());
    step_end_ok(name);

    for (int i = 0; i < nin; i++) {
        if (!ins[i].grad) continue;
        cx_tensor *g = cx_grad(P[i]);
        char what[160];
        snprintf(what, sizeof what, "%s: grad of input %d", name, i);
        cr_assert(g != NULL, "%s is NULL after backward", what);
        check_shape(what, g, ins[i].shape, ins[i].nd);
        cr_assert(!cx_is_pending(g), "%s still pending after the step", what);
        float *ga = fetch_f32(what, g);
        int64_t n = ref_numel(ins[i].shape, ins[i].nd);
        float *pert = malloc((size_t)n * sizeof(float));
        memcpy(pert, ins[i].data, (size_t)n * sizeof(float));
        const float *x0 = ins[i].data;
        int nchk = n <= o.max_check ? (int)n : o.max_check;
        for (int c = 0; c < nchk; c++) {
            int64_t j = n <= o.max_check ? c : (int64_t)((uint64_t)(c * 7919 + 13) % (uint64_t)n);
            float xp = (float)(x0[j] + o.eps), xm = (float)(x0[j] - o.eps);
            pert[j] = xp;
            double lp = eval_loss(f, ctx, ins, nin, i, pert, W, nout);
            pert[j] = xm;
            double lm = eval_loss(f, ctx, ins, nin, i, pert, W, nout);
            pert[j] = x0[j];
            double num = (lp - lm) / ((double)xp - (double)xm);
            double an = ga[j];
            double lim = o.rtol * fmax(fabs(an), fabs(num)) + o.atol;
            cr_assert(fabs(an - num) <= lim, "%s, element %lld (x=%g): analytical %.6g, numerical %.6g", what,
                      (long long)j, (double)x0[j], an, num);
        }
        free(pert);
        free(ga);
    }
    for (int i = 0; i < nin; i++) cx_free(P[i]);
    free(W);
}

static void gradcheck(const char *name, gfn f, const void *ctx, const gin *ins, int nin)
{
    gradcheck_opts(name, f, ctx, ins, nin, DEF);
}

/* ======================================================================
 * elementwise unary
 * ====================================================================== */

typedef struct {
    const char *name;
    cx_tensor *(*op)(cx_tensor *);
    double lo, hi;
    bool away0;
} ucase;

static cx_tensor *gelu_e(cx_tensor *a) { return cx_gelu(a, false); }
static cx_tensor *gelu_t(cx_tensor *a) { return cx_gelu(a, true); }
static cx_tensor *pow25(cx_tensor *a) { return cx_pow_scalar(a, 2.5); }
static cx_tensor *mul3(cx_tensor *a) { return cx_mul_scalar(a, -3.0); }
static cx_tensor *add3(cx_tensor *a) { return cx_add_scalar(a, 3.0); }

static cx_tensor *f_unary(cx_tensor *const *in, const void *ctx)
{
    return ((const ucase *)ctx)->op(in[0]);
}

Test(grad, unary)
{
    const ucase cases[] = {
        { "neg", cx_neg, -2, 2, false },       { "exp", cx_exp, -2, 2, false },
        { "log", cx_log, 0.5, 3, false },      { "sqrt", cx_sqrt, 0.5, 3, false },
        { "rsqrt", cx_rsqrt, 0.5, 3, false },  { "tanh", cx_tanh, -2, 2, false },
        { "erf", cx_erf, -2, 2, false },       { "abs", cx_abs, 0.1, 2, true },
        { "sign", cx_sign, 0.1, 2, true },     { "relu", cx_relu, 0.1, 2, true },
        { "sigmoid", cx_sigmoid, -3, 3, false }, { "silu", cx_silu, -3, 3, false },
        { "gelu_erf", gelu_e, -3, 3, false },  { "gelu_tanh", gelu_t, -3, 3, false },
        { "pow_scalar 2.5", pow25, 0.5, 2, false }, { "mul_scalar", mul3, -2, 2, false },
        { "add_scalar", add3, -2, 2, false },
    };
    rng_seed(100);
    const int64_t s[] = { 3, 7 };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float *x = cases[c].away0 ? rand_f32_away0(21, cases[c].lo, cases[c].hi) : rand_f32(21, cases[c].lo, cases[c].hi);
        gin in[1] = { G(2, s, x) };
        gradcheck(cases[c].name, f_unary, &cases[c], in, 1);
        free(x);
    }
}

/* The same tensor used several times: contributions accumulate. */
static cx_tensor *f_fanout(cx_tensor *const *in, const void *ctx)
{
    (void)ctx;
    cx_tensor *x = in[0];
    return cx_add(cx_mul(x, x), cx_mul(cx_exp(x), cx_tanh(x)));
}

Test(grad, fanout)
{
    rng_seed(101);
    const int64_t s[] = { 11 };
    float *x = rand_f32(11, -1.5, 1.5);
    gin in[1] = { G(1, s, x) };
    gradcheck("x*x + exp(x)*tanh(x)", f_fanout, NULL, in, 1);
    free(x);
}

/* Cast through bf16 and back: the gradient is the upstream gradient cast. */
Test(grad, cast_passes_gradient)
{
    rng_seed(102);
    const int64_t s[] = { 16 };
    float *x = rand_f32(16, -2, 2), *w = rand_f32(16, -1, 1);
    cx_tensor *p = cx_requires_grad(cx_persist(tf32(x, s, 1)), true);
    cx_step_begin();
    cx_tensor *y = cx_cast(cx_cast(p, CX_BF16), CX_F32);
    cr_assert_eq(cx_backward(cx_sum(cx_mul(y, tf32(w, s, 1)), NULL, 0, false)), CX_OK, "%s", cx_last_error());
    step_end_ok("cast");
    cr_assert(cx_grad(p) != NULL);
    float *g = fetch_f32("grad through cast", cx_grad(p));
    for (int i = 0; i < 16; i++)
        cr_assert(fabs(g[i] - w[i]) <= 1e-2 * fabs(w[i]) + 1e-6, "grad through cast [%d] = %g, expected ~%g", i, g[i],
                  w[i]);
    free(g);
    free(x);
    free(w);
    cx_free(p);
}

/* ======================================================================
 * elementwise binary, broadcasting, where
 * ====================================================================== */

typedef struct {
    const char *name;
    cx_tensor *(*op)(cx_tensor *, cx_tensor *);
    int kind; /* 0 any, 1 div, 2 pow, 3 max/min */
} bcase;

static cx_tensor *f_binary(cx_tensor *const *in, const void *ctx)
{
    return ((const bcase *)ctx)->op(in[0], in[1]);
}

Test(grad, binary_broadcast)
{
    const bcase cases[] = {
        { "add", cx_add, 0 }, { "sub", cx_sub, 0 }, { "mul", cx_mul, 0 }, { "div", cx_div, 1 },
        { "pow", cx_pow, 2 }, { "maximum", cx_maximum, 3 }, { "minimum", cx_minimum, 3 },
    };
    const struct { int na, nb; int64_t a[3], b[3]; } shapes[] = {
        { 3, 2, { 3, 1, 5 }, { 4, 1 } },
        { 2, 2, { 3, 4 }, { 3, 4 } },
        { 0, 2, { 0 }, { 2, 3 } },
        { 2, 1, { 2, 3 }, { 3 } },
    };
    rng_seed(103);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int64_t na = ref_numel(shapes[s].a, shapes[s].na), nb = ref_numel(shapes[s].b, shapes[s].nb);
            float *a, *b;
            if (cases[c].kind == 1) {
                a = rand_f32(na, -2, 2);
                b = rand_f32_away0(nb, 0.5, 2);
            } else if (cases[c].kind == 2) {
                a = rand_f32(na, 0.5, 2);
                b = rand_f32(nb, -1.5, 1.5);
            } else if (cases[c].kind == 3) {
                /* a on a 0.1 grid, b on the grid shifted by 0.05: never within 0.05 */
                a = distinct_f32(na, -1.0, 0.1);
                b = distinct_f32(nb, -0.95, 0.1);
            } else {
                a = rand_f32(na, -2, 2);
                b = rand_f32(nb, -2, 2);
            }
            gin in[2] = { G(shapes[s].na, shapes[s].a, a), G(shapes[s].nb, shapes[s].b, b) };
            char name[256], s1[48], s2[48];
            snprintf(name, sizeof name, "%s %s %s", cases[c].name, ref_shape_str(shapes[s].a, shapes[s].na, s1, 48),
                     ref_shape_str(shapes[s].b, shapes[s].nb, s2, 48));
            gopts o = DEF;
            if (cases[c].kind == 3) o.eps = 5e-3;
            gradcheck_opts(name, f_binary, &cases[c], in, 2, o);
            free(a);
            free(b);
        }
}

static cx_tensor *f_where(cx_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return cx_where(in[0], in[1], in[2]);
}

Test(grad, where)
{
    rng_seed(104);
    const int64_t sc[] = { 3, 1 }, sa[] = { 1, 4 }, sb[] = { 3, 4 };
    bool cond[3] = { true, false, true };
    float *a = rand_f32(4, -1, 1), *b = rand_f32(12, -1, 1);
    gin in[3] = { C(2, sc, cond, CX_BOOL), G(2, sa, a), G(2, sb, b) };
    gradcheck("where", f_where, NULL, in, 3);
    free(a);
    free(b);
}

/* ======================================================================
 * movement
 * ====================================================================== */

typedef struct {
    int kind;
    int perm[4];
    int64_t shape[4];
    int nd;
    int axis;
    int64_t start, end, step;
    int64_t lo[4], hi[4];
    double value;
} mv;

enum { M_PERMUTE, M_TRANSPOSE, M_RESHAPE, M_EXPAND, M_SLICE, M_PAD, M_FLATTEN, M_UNSQ_SQ, M_CHAIN };

static cx_tensor *f_move(cx_tensor *const *in, const void *ctx)
{
    const mv *m = ctx;
    cx_tensor *x = in[0];
    switch (m->kind) {
    case M_PERMUTE: return cx_permute(x, m->perm);
    case M_TRANSPOSE: return cx_transpose(x, m->perm[0], m->perm[1]);
    case M_RESHAPE: return cx_reshape(x, m->shape, m->nd);
    case M_EXPAND: return cx_expand(x, m->shape, m->nd);
    case M_SLICE: return cx_slice(x, m->axis, m->start, m->end, m->step);
    case M_PAD: return cx_pad(x, m->lo, m->hi, m->value);
    case M_FLATTEN: return cx_flatten(x, m->perm[0], m->perm[1]);
    case M_UNSQ_SQ: return cx_exp(cx_squeeze(cx_unsqueeze(x, m->axis), m->axis));
    default: {
        /* permute -> stepped slice -> pad -> expand-like broadcast multiply */
        cx_tensor *p = cx_permute(x, m->perm);
        cx_tensor *s = cx_slice(p, m->axis, m->start, m->end, m->step);
        cx_tensor *q = cx_pad(s, m->lo, m->hi, m->value);
        return cx_mul(q, cx_tanh(q));
    }
    }
}

Test(grad, movement)
{
    rng_seed(105);
    const int64_t s3[] = { 2, 3, 4 }, s31[] = { 3, 1 }, s57[] = { 5, 7 };
    float *x = rand_f32(24, -2, 2), *y = rand_f32(3, -2, 2), *z = rand_f32(35, -2, 2);
    mv m;
    gin in3[1] = { G(3, s3, x) }, in1[1] = { G(2, s31, y) }, in57[1] = { G(2, s57, z) };

    m = (mv){ .kind = M_PERMUTE, .perm = { 2, 0, 1 } };
    gradcheck("permute(2,0,1)", f_move, &m, in3, 1);
    m = (mv){ .kind = M_TRANSPOSE, .perm = { 0, -1 } };
    gradcheck("transpose(0,-1)", f_move, &m, in3, 1);
    m = (mv){ .kind = M_RESHAPE, .shape = { 4, -1 }, .nd = 2 };
    gradcheck("reshape(4,-1)", f_move, &m, in3, 1);
    m = (mv){ .kind = M_EXPAND, .shape = { 2, 3, 4 }, .nd = 3 };
    gradcheck("expand (3,1)->(2,3,4)", f_move, &m, in1, 1);
    m = (mv){ .kind = M_SLICE, .axis = 1, .start = 1, .end = 7, .step = 2 };
    gradcheck("slice axis 1 1:7:2", f_move, &m, in57, 1);
    m = (mv){ .kind = M_SLICE, .axis = 0, .start = 1, .end = 100, .step = 3 };
    gradcheck("slice axis 0 1:100:3", f_move, &m, in57, 1);
    m = (mv){ .kind = M_PAD, .lo = { 1, 0 }, .hi = { 2, 3 }, .value = 0.5 };
    gradcheck("pad", f_move, &m, in57, 1);
    m = (mv){ .kind = M_FLATTEN, .perm = { 1, 2 } };
    gradcheck("flatten(1,2)", f_move, &m, in3, 1);
    m = (mv){ .kind = M_UNSQ_SQ, .axis = 1 };
    gradcheck("squeeze(unsqueeze)", f_move, &m, in3, 1);
    m = (mv){ .kind = M_CHAIN, .perm = { 1, 2, 0 }, .axis = 1, .start = 0, .end = 4, .step = 2, .lo = { 1, 0, 1 },
              .hi = { 0, 1, 0 }, .value = 0.25 };
    gradcheck("pad(slice(permute))", f_move, &m, in3, 1);
    /* rank 6: the stepped slice's gradient pads with interior padding on
     * the last dims, whose attributes sit at indices 16 and 17 */
    const int64_t s6[] = { 1, 2, 1, 2, 3, 5 };
    float *x6 = rand_f32(60, -2, 2);
    gin in6[1] = { G(6, s6, x6) };
    m = (mv){ .kind = M_SLICE, .axis = 5, .start = 0, .end = 5, .step = 2 };
    gradcheck("rank-6 slice axis 5 0:5:2", f_move, &m, in6, 1);
    m = (mv){ .kind = M_SLICE, .axis = 4, .start = 1, .end = 3, .step = 2 };
    gradcheck("rank-6 slice axis 4 1:3:2", f_move, &m, in6, 1);
    free(x6);
    free(x);
    free(y);
    free(z);
}

static cx_tensor *f_concat(cx_tensor *const *in, const void *ctx)
{
    cx_tensor *ts[3] = { in[0], in[1], in[2] };
    return cx_concat(ts, 3, *(const int *)ctx);
}

Test(grad, concat)
{
    rng_seed(106);
    const int64_t a[] = { 2, 3 }, b[] = { 2, 1 }, c[] = { 2, 4 };
    float *x = rand_f32(6, -1, 1), *y = rand_f32(2, -1, 1), *z = rand_f32(8, -1, 1);
    gin in[3] = { G(2, a, x), G(2, b, y), G(2, c, z) };
    int axis = 1;
    gradcheck("concat axis 1", f_concat, &axis, in, 3);
    const int64_t a0[] = { 3, 2 }, b0[] = { 1, 2 }, c0[] = { 4, 2 };
    gin in0[3] = { G(2, a0, x), G(2, b0, y), G(2, c0, z) };
    axis = -2;
    gradcheck("concat axis -2", f_concat, &axis, in0, 3);
    free(x);
    free(y);
    free(z);
}

/* ======================================================================
 * reductions
 * ====================================================================== */

typedef struct {
    int kind; /* 0 sum 1 max 2 mean 3 var 4 logsumexp */
    int naxes;
    int axes[3];
    int corr;
    bool keep;
} rcase;

static cx_tensor *f_reduce(cx_tensor *const *in, const void *ctx)
{
    const rcase *r = ctx;
    switch (r->kind) {
    case 0: return cx_sum(in[0], r->axes, r->naxes, r->keep);
    case 1: return cx_max(in[0], r->axes, r->naxes, r->keep);
    case 2: return cx_mean(in[0], r->axes, r->naxes, r->keep);
    case 3: return cx_var(in[0], r->axes, r->naxes, r->corr, r->keep);
    default: return cx_logsumexp(in[0], r->axes[0], r->keep);
    }
}

Test(grad, reductions)
{
    rng_seed(107);
    const int64_t s[] = { 3, 4, 5 };
    float *x = distinct_f32(60, -3, 0.1); /* distinct: max has a unique argmax */
    const rcase cases[] = {
        { 0, 0, { 0 }, 0, false }, { 0, 1, { 1 }, 0, true },  { 0, 2, { 0, 2 }, 0, false },
        { 1, 0, { 0 }, 0, false }, { 1, 1, { -1 }, 0, false }, { 1, 2, { 0, 1 }, 0, true },
        { 2, 0, { 0 }, 0, false }, { 2, 2, { 1, 2 }, 0, true }, { 3, 1, { 2 }, 0, false },
        { 3, 1, { 2 }, 1, true },  { 3, 2, { 0, 2 }, 1, false }, { 3, 0, { 0 }, 0, false },
        { 4, 1, { 2 }, 0, false }, { 4, 1, { 0 }, 0, true },
    };
    const char *kn[] = { "sum", "max", "mean", "var", "logsumexp" };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gin in[1] = { G(3, s, x) };
        char name[160];
        snprintf(name, sizeof name, "%s axes[%d]={%d,%d} corr %d keep %d", kn[cases[c].kind], cases[c].naxes,
                 cases[c].axes[0], cases[c].axes[1], cases[c].corr, cases[c].keep);
        gopts o = DEF;
        if (cases[c].kind == 1) o.eps = 5e-3;
        gradcheck_opts(name, f_reduce, &cases[c], in, 1, o);
    }
    free(x);
}

/* ======================================================================
 * matmul
 * ====================================================================== */

static cx_tensor *f_matmul(cx_tensor *const *in, const void *ctx)
{
    int mode = *(const int *)ctx;
    if (mode == 1) return cx_matmul(in[0], cx_transpose(in[1], -1, -2));
    if (mode == 2) return cx_matmul(cx_transpose(in[0], 0, 1), in[1]);
    return cx_matmul(in[0], in[1]);
}

Test(grad, matmul)
{
    rng_seed(108);
    const struct { int na, nb, mode; int64_t a[4], b[4]; const char *name; } cases[] = {
        { 2, 2, 0, { 4, 5 }, { 5, 3 }, "2-d" },
        { 4, 3, 0, { 2, 1, 3, 4 }, { 3, 4, 2 }, "batched broadcast (2,1,3,4)@(3,4,2)" },
        { 3, 2, 0, { 2, 3, 4 }, { 4, 2 }, "batched @ 2-d" },
        { 2, 2, 1, { 4, 5 }, { 3, 5 }, "a @ b^T" },
        { 3, 3, 1, { 2, 4, 5 }, { 2, 3, 5 }, "batched a @ b^T" },
        { 2, 2, 2, { 5, 4 }, { 5, 3 }, "a^T @ b" },
        { 1, 2, 0, { 5 }, { 5, 3 }, "1-d @ 2-d" },
        { 2, 1, 0, { 4, 5 }, { 5 }, "2-d @ 1-d" },
        { 1, 1, 0, { 5 }, { 5 }, "dot" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float *a = rand_f32(ref_numel(cases[c].a, cases[c].na), -1, 1);
        float *b = rand_f32(ref_numel(cases[c].b, cases[c].nb), -1, 1);
        gin in[2] = { G(cases[c].na, cases[c].a, a), G(cases[c].nb, cases[c].b, b) };
        char name[160];
        snprintf(name, sizeof name, "matmul %s", cases[c].name);
        gradcheck(name, f_matmul, &cases[c].mode, in, 2);
        free(a);
        free(b);
    }
}

/* ======================================================================
 * conv2d and pools
 * ====================================================================== */

typedef struct {
    int sh, sw, ph, pw, dh, dw, groups;
} convp;

static cx_tensor *f_conv(cx_tensor *const *in, const void *ctx)
{
    const convp *p = ctx;
    return cx_conv2d(in[0], in[1], in[2], p->sh, p->sw, p->ph, p->pw, p->dh, p->dw, p->groups);
}

static cx_tensor *f_conv_nobias(cx_tensor *const *in, const void *ctx)
{
    const convp *p = ctx;
    return cx_conv2d(in[0], in[1], NULL, p->sh, p->sw, p->ph, p->pw, p->dh, p->dw, p->groups);
}

Test(grad, conv2d)
{
    rng_seed(109);
    {
        /* stride (2,1), padding 1, groups 2, bias */
        const int64_t sx[] = { 2, 4, 6, 5 }, sw[] = { 4, 2, 3, 3 }, sb[] = { 4 };
        float *x = rand_f32(240, -1, 1), *w = rand_f32(72, -1, 1), *b = rand_f32(4, -1, 1);
        convp p = { 2, 1, 1, 1, 1, 1, 2 };
        gin in[3] = { G(4, sx, x), G(4, sw, w), G(1, sb, b) };
        gradcheck("conv2d s(2,1) p1 g2 bias", f_conv, &p, in, 3);
        free(x);
        free(w);
        free(b);
    }
    {
        /* dilation 2, padding 2, no bias */
        const int64_t sx[] = { 1, 3, 7, 7 }, sw[] = { 2, 3, 3, 3 };
        float *x = rand_f32(147, -1, 1), *w = rand_f32(54, -1, 1);
        convp p = { 1, 1, 2, 2, 2, 2, 1 };
        gin in[2] = { G(4, sx, x), G(4, sw, w) };
        gradcheck("conv2d d2 p2", f_conv_nobias, &p, in, 2);
        free(x);
        free(w);
    }
    {
        /* asymmetric kernel, stride (1,2), padding (0,1), depthwise */
        const int64_t sx[] = { 2, 3, 5, 6 }, sw[] = { 3, 1, 2, 3 }, sb[] = { 3 };
        float *x = rand_f32(180, -1, 1), *w = rand_f32(18, -1, 1), *b = rand_f32(3, -1, 1);
        convp p = { 1, 2, 0, 1, 1, 1, 3 };
        gin in[3] = { G(4, sx, x), G(4, sw, w), G(1, sb, b) };
        gradcheck("conv2d depthwise k(2,3) s(1,2) p(0,1)", f_conv, &p, in, 3);
        free(x);
        free(w);
        free(b);
    }
}

typedef struct {
    bool is_max;
    int kh, kw, sh, sw, ph, pw;
} poolp;

static cx_tensor *f_pool(cx_tensor *const *in, const void *ctx)
{
    const poolp *p = ctx;
    return p->is_max ? cx_max_pool2d(in[0], p->kh, p->kw, p->sh, p->sw, p->ph, p->pw)
                     : cx_avg_pool2d(in[0], p->kh, p->kw, p->sh, p->sw, p->ph, p->pw);
}

Test(grad, pools)
{
    rng_seed(110);
    const int64_t sx[] = { 2, 2, 7, 6 };
    float *x = distinct_f32(168, -4, 0.05);
    const poolp cases[] = {
        { true, 2, 2, 2, 2, 0, 0 }, { true, 3, 3, 2, 2, 1, 1 }, { true, 3, 2, 1, 1, 1, 0 },
        { false, 2, 2, 2, 2, 0, 0 }, { false, 3, 3, 2, 2, 1, 1 }, { false, 3, 2, 1, 2, 0, 1 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gin in[1] = { G(4, sx, x) };
        char name[160];
        snprintf(name, sizeof name, "%s_pool k(%d,%d) s(%d,%d) p(%d,%d)", cases[c].is_max ? "max" : "avg", cases[c].kh,
                 cases[c].kw, cases[c].sh, cases[c].sw, cases[c].ph, cases[c].pw);
        gopts o = DEF;
        o.eps = 5e-3;
        o.max_check = 40;
        gradcheck_opts(name, f_pool, &cases[c], in, 1, o);
    }
    free(x);
}

/* ======================================================================
 * gather / scatter_add / embedding
 * ====================================================================== */

static cx_tensor *f_gather(cx_tensor *const *in, const void *ctx)
{
    return cx_gather(in[0], *(const int *)ctx, in[1]);
}

static cx_tensor *f_scatter(cx_tensor *const *in, const void *ctx)
{
    return cx_scatter_add(in[0], *(const int *)ctx, in[1], in[2]);
}

static cx_tensor *f_embedding(cx_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return cx_embedding(in[0], in[1]);
}

Test(grad, gather_scatter_embedding)
{
    rng_seed(111);
    const int64_t ss[] = { 4, 5 }, si0[] = { 7, 5 }, si1[] = { 4, 3 };
    float *src = rand_f32(20, -1, 1);
    int64_t idx0[35], idx1[12];
    for (int i = 0; i < 35; i++) idx0[i] = rng_int(4); /* duplicates: grads accumulate */
    for (int i = 0; i < 12; i++) idx1[i] = rng_int(5);
    int ax0 = 0, ax1 = 1;
    gin g0[2] = { G(2, ss, src), C(2, si0, idx0, CX_I64) };
    gradcheck("gather axis 0", f_gather, &ax0, g0, 2);
    gin g1[2] = { G(2, ss, src), C(2, si1, idx1, CX_I64) };
    gradcheck("gather axis 1", f_gather, &ax1, g1, 2);

    float *base = rand_f32(20, -1, 1), *upd = rand_f32(35, -1, 1), *upd1 = rand_f32(12, -1, 1);
    gin s0[3] = { G(2, ss, base), C(2, si0, idx0, CX_I64), G(2, si0, upd) };
    gradcheck("scatter_add axis 0", f_scatter, &ax0, s0, 3);
    gin s1[3] = { G(2, ss, base), C(2, si1, idx1, CX_I64), G(2, si1, upd1) };
    gradcheck("scatter_add axis 1", f_scatter, &ax1, s1, 3);

    const int64_t sw[] = { 6, 3 }, sidx[] = { 2, 4 };
    float *w = rand_f32(18, -1, 1);
    int64_t eidx[8] = { 1, 5, 1, 0, 3, 1, 5, 2 };
    gin e[2] = { G(2, sw, w), C(2, sidx, eidx, CX_I64) };
    gradcheck("embedding", f_embedding, NULL, e, 2);
    free(src);
    free(base);
    free(upd);
    free(upd1);
    free(w);
}

/* ======================================================================
 * composites
 * ====================================================================== */

static cx_tensor *f_softmax(cx_tensor *const *in, const void *ctx)
{
    const int *p = ctx;
    return p[0] ? cx_log_softmax(in[0], p[1]) : cx_softmax(in[0], p[1]);
}

Test(grad, softmax_log_softmax)
{
    rng_seed(112);
    const int64_t s[] = { 3, 5 };
    float *x = rand_f32(15, -2, 2);
    gin in[1] = { G(2, s, x) };
    const int cases[4][2] = { { 0, -1 }, { 0, 0 }, { 1, -1 }, { 1, 0 } };
    for (int c = 0; c < 4; c++) {
        char name[64];
        snprintf(name, sizeof name, "%s axis %d", cases[c][0] ? "log_softmax" : "softmax", cases[c][1]);
        gradcheck(name, f_softmax, cases[c], in, 1);
    }
    free(x);
}

static cx_tensor *f_layer_norm(cx_tensor *const *in, const void *ctx)
{
    int nnorm = *(const int *)ctx;
    return cx_layer_norm(in[0], nnorm, in[1], in[2], 1e-5);
}

static cx_tensor *f_layer_norm_plain(cx_tensor *const *in, const void *ctx)
{
    int nnorm = *(const int *)ctx;
    return cx_layer_norm(in[0], nnorm, NULL, NULL, 1e-5);
}

Test(grad, layer_norm)
{
    rng_seed(113);
    const int64_t s[] = { 3, 6 }, sw[] = { 6 };
    float *x = rand_f32(18, -2, 2), *w = rand_f32(6, 0.5, 1.5), *b = rand_f32(6, -1, 1);
    int one = 1, two = 2;
    gin in[3] = { G(2, s, x), G(1, sw, w), G(1, sw, b) };
    gradcheck("layer_norm(w, b)", f_layer_norm, &one, in, 3);
    const int64_t s3[] = { 2, 2, 4 };
    float *y = rand_f32(16, -2, 2);
    gin in2[1] = { G(3, s3, y) };
    gradcheck("layer_norm nnorm 2", f_layer_norm_plain, &two, in2, 1);
    free(x);
    free(w);
    free(b);
    free(y);
}

typedef struct {
    int kind; /* 0 nll 1 ce 2 mse */
    cx_reduction red;
    int64_t ignore;
    double ls;
} losscase;

static cx_tensor *f_loss(cx_tensor *const *in, const void *ctx)
{
    const losscase *l = ctx;
    if (l->kind == 0) return cx_nll_loss(in[0], in[1], l->red, l->ignore);
    if (l->kind == 1) return cx_cross_entropy(in[0], in[1], l->red, l->ignore, l->ls);
    return cx_mse_loss(in[0], in[1], l->red);
}

Test(grad, losses)
{
    rng_seed(114);
    const int64_t s[] = { 5, 4 }, st[] = { 5 };
    float *x = rand_f32(20, -2, 2), *lp = rand_f32(20, -3, -0.2), *y = rand_f32(20, -2, 2);
    int64_t t[5] = { 0, 3, -100, 1, 3 }, t2[5] = { 0, 3, 2, 1, 2 };
    const losscase cases[] = {
        { 0, CX_REDUCE_MEAN, -100, 0 }, { 0, CX_REDUCE_SUM, -100, 0 }, { 0, CX_REDUCE_NONE, -100, 0 },
        { 1, CX_REDUCE_MEAN, -100, 0 }, { 1, CX_REDUCE_MEAN, -100, 0.1 }, { 1, CX_REDUCE_SUM, 2, 0.2 },
        { 1, CX_REDUCE_NONE, -100, 0.1 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t *tg = cases[c].ignore == 2 ? t2 : t;
        gin in[2] = { G(2, s, cases[c].kind == 0 ? lp : x), C(1, st, tg, CX_I64) };
        char name[160];
        snprintf(name, sizeof name, "%s red %d ignore %lld ls %g", cases[c].kind ? "cross_entropy" : "nll_loss",
                 (int)cases[c].red, (long long)cases[c].ignore, cases[c].ls);
        gradcheck(name, f_loss, &cases[c], in, 2);
    }
    const losscase mse[] = { { 2, CX_REDUCE_MEAN, 0, 0 }, { 2, CX_REDUCE_SUM, 0, 0 }, { 2, CX_REDUCE_NONE, 0, 0 } };
    for (int c = 0; c < 3; c++) {
        gin in[2] = { G(2, s, x), G(2, s, y) };
        char name[64];
        snprintf(name, sizeof name, "mse red %d", (int)mse[c].red);
        gradcheck(name, f_loss, &mse[c], in, 2);
    }
    free(x);
    free(lp);
    free(y);
}

/* A small network end to end: linear -> gelu -> linear -> cross entropy. */
static const int64_t mlp_targets[4] = { 2, 0, 1, 2 };

static cx_tensor *f_mlp_t(cx_tensor *const *in, const void *ctx)
{
    (void)ctx;
    const int64_t st[] = { 4 };
    cx_tensor *h = cx_gelu(cx_add(cx_matmul(in[0], in[1]), in[2]), false);
    return cx_cross_entropy(cx_matmul(h, in[3]), ti64(mlp_targets, st, 1), CX_REDUCE_MEAN, -100, 0.0);
}

Test(grad, small_mlp)
{
    rng_seed(115);
    const int64_t sx[] = { 4, 5 }, s1[] = { 5, 6 }, sb[] = { 6 }, s2[] = { 6, 3 };
    float *x = rand_f32(20, -1, 1), *w1 = rand_f32(30, -1, 1), *b1 = rand_f32(6, -0.5, 0.5), *w2 = rand_f32(18, -1, 1);
    gin in[4] = { C(2, sx, x, CX_F32), G(2, s1, w1), G(1, sb, b1), G(2, s2, w2) };
    gradcheck("mlp", f_mlp_t, NULL, in, 4);
    free(x);
    free(w1);
    free(b1);
    free(w2);
}

/* ======================================================================
 * autograd API
 * ====================================================================== */

static cx_tensor *leaf(const float *x, const int64_t *s, int nd)
{
    return cx_requires_grad(cx_persist(tf32(x, s, nd)), true);
}

static float *grad_of(const char *what, cx_tensor *p)
{
    cx_tensor *g = cx_grad(p);
    cr_assert(g != NULL, "%s: no grad", what);
    return fetch_f32(what, g);
}

/* loss = sum(x^3 * w): d/dx = 3 x^2 w */
static void backward_cube(cx_tensor *p, const float *w, const int64_t *s)
{
    cx_step_begin();
    cx_tensor *l = cx_sum(cx_mul(cx_pow_scalar(p, 3.0), tf32(w, s, 1)), NULL, 0, false);
    cr_assert_eq(cx_backward(l), CX_OK, "%s", cx_last_error());
    step_end_ok("backward_cube");
}

Test(grad, zero_grad_and_accumulation)
{
    rng_seed(116);
    const int64_t s[] = { 9 };
    float *x = rand_f32(9, -2, 2), *w = rand_f32(9, -1, 1);
    cx_tensor *p = leaf(x, s, 1);
    cr_assert(cx_grad(p) == NULL);
    backward_cube(p, w, s);
    float *g1 = grad_of("first backward", p);
    for (int i = 0; i < 9; i++) {
        double want = 3.0 * x[i] * x[i] * w[i];
        cr_assert(fabs(g1[i] - want) <= 1e-5 * fmax(1, fabs(want)), "grad[%d] = %g, expected %g", i, g1[i], want);
    }
    /* a second backward accumulates */
    backward_cube(p, w, s);
    float *g2 = grad_of("second backward", p);
    for (int i = 0; i < 9; i++)
        cr_assert(fabs(g2[i] - 2.0 * g1[i]) <= 1e-5 * fmax(1, fabs(g1[i])), "accumulated grad[%d] = %g, expected %g", i,
                  g2[i], 2.0 * g1[i]);
    /* zero_grad -> none, then a fresh backward starts from scratch */
    cx_zero_grad(p);
    cr_assert(cx_grad(p) == NULL, "cx_grad after cx_zero_grad is not NULL");
    backward_cube(p, w, s);
    float *g3 = grad_of("after zero_grad", p);
    for (int i = 0; i < 9; i++) cr_assert(fabs(g3[i] - g1[i]) <= 1e-6 * fmax(1, fabs(g1[i])), "grad[%d] = %g", i, g3[i]);
    /* two losses in one step accumulate too */
    cx_zero_grad(p);
    cx_step_begin();
    cx_tensor *wt = tf32(w, s, 1);
    cr_assert_eq(cx_backward(cx_sum(cx_mul(p, wt), NULL, 0, false)), CX_OK);
    cr_assert_eq(cx_backward(cx_sum(cx_mul(cx_mul(p, p), wt), NULL, 0, false)), CX_OK);
    step_end_ok("two losses");
    float *g4 = grad_of("two losses", p);
    for (int i = 0; i < 9; i++) {
        double want = w[i] + 2.0 * x[i] * w[i];
        cr_assert(fabs(g4[i] - want) <= 1e-5 * fmax(1, fabs(want)), "two-loss grad[%d] = %g, expected %g", i, g4[i],
                  want);
    }
    /* set_grad replaces, and backward accumulates onto it */
    float ones[9];
    for (int i = 0; i < 9; i++) ones[i] = 10.0f;
    cx_set_grad(p, tf32(ones, s, 1));
    backward_cube(p, w, s);
    float *g5 = grad_of("after set_grad", p);
    for (int i = 0; i < 9; i++)
        cr_assert(fabs(g5[i] - (10.0 + g1[i])) <= 1e-5 * fmax(1, fabs(g1[i]) + 10), "grad[%d] = %g, expected %g", i,
                  g5[i], 10.0 + g1[i]);
    cx_set_grad(p, NULL);
    cr_assert(cx_grad(p) == NULL, "cx_set_grad(NULL) did not clear");
    free(g1);
    free(g2);
    free(g3);
    free(g4);
    free(g5);
    free(x);
    free(w);
    cx_free(p);
}

Test(grad, backward_outside_a_step)
{
    /* The brief's literal pattern: no step, explicit cx_sync. */
    rng_seed(117);
    const int64_t s[] = { 6 };
    float *x = rand_f32(6, -2, 2), *w = rand_f32(6, -1, 1);
    cx_tensor *p = leaf(x, s, 1);
    cx_tensor *wt = tf32(w, s, 1);
    cx_tensor *e = cx_exp(p);
    cx_tensor *m = cx_mul(e, wt);
    cx_tensor *l = cx_sum(m, NULL, 0, false);
    cr_assert_eq(cx_backward(l), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_sync(), CX_OK, "%s", cx_last_error());
    cr_assert(!cx_is_pending(l), "the loss is still pending after cx_sync");
    float *g = grad_of("outside step", p);
    for (int i = 0; i < 6; i++) {
        double want = exp(x[i]) * w[i];
        cr_assert(fabs(g[i] - want) <= 1e-5 * fmax(1, fabs(want)), "grad[%d] = %g, expected %g", i, g[i], want);
    }
    free(g);
    cx_free(e);
    cx_free(m);
    cx_free(l);
    cx_free(wt);
    cx_free(p);
    free(x);
    free(w);
}

Test(grad, requires_grad_flags)
{
    const int64_t s[] = { 3 };
    float x[3] = { 1, 2, 3 };
    cx_tensor *a = leaf(x, s, 1);
    cx_tensor *b = cx_persist(tf32(x, s, 1)); /* no grad */
    cr_assert(cx_get_requires_grad(a));
    cr_assert(!cx_get_requires_grad(b));
    cx_step_begin();
    cr_assert_eq(cx_backward(cx_sum(cx_mul(a, b), NULL, 0, false)), CX_OK);
    step_end_ok("flags");
    cr_assert(cx_grad(a) != NULL);
    cr_assert(cx_grad(b) == NULL, "a tensor that does not require grad got one");
    float *g = grad_of("a", a);
    for (int i = 0; i < 3; i++) cr_assert_float_eq(g[i], x[i], 1e-6);
    free(g);
    /* turning it off stops accumulation into it */
    cx_requires_grad(a, false);
    cr_assert(!cx_get_requires_grad(a));
    cx_zero_grad(a);
    cx_step_begin();
    cx_tensor *l = cx_sum(cx_mul(a, cx_requires_grad(b, true)), NULL, 0, false);
    cr_assert_eq(cx_backward(l), CX_OK);
    step_end_ok("flags 2");
    cr_assert(cx_grad(a) == NULL, "grad accumulated into a leaf with requires_grad off");
    cr_assert(cx_grad(b) != NULL);
    cx_free(a);
    cx_free(b);
}

/* A leaf marked while still an op's pending result (a random init, a cast
 * not yet computed) is computed then, and gets its gradient; it had been
 * left with none, backward returning CX_OK. An op's result on tensors
 * that require grad is not a leaf: refused, with the line saying so. */
Test(grad, requires_grad_on_a_pending_tensor)
{
    const int64_t s[] = { 4 };
    float x[4] = { 1, -2, 3, 0.5f };
    cx_tensor *p = cx_persist(cx_mul_scalar(tf32(x, s, 1), 2.0));
    cr_assert(cx_is_pending(p));
    cr_assert_eq(cx_requires_grad(p, true), p);
    cr_assert(cx_get_requires_grad(p) && !cx_is_pending(p), "the pending leaf was not computed when marked");
    cx_tensor *w = cx_persist(tf32(x, s, 1));
    cx_step_begin();
    cr_assert_eq(cx_backward(cx_sum(cx_mul(p, w), NULL, 0, false)), CX_OK);
    step_end_ok("pending leaf");
    float *g = grad_of("p", p);
    for (int i = 0; i < 4; i++) cr_assert_float_eq(g[i], x[i], 1e-6);
    free(g);

    cx_tensor *y = cx_persist(cx_mul_scalar(p, 3.0));
    cx_clear_error();
    cr_assert_eq(cx_requires_grad(y, true), y);
    cr_assert(!cx_get_requires_grad(y), "an op's result on a leaf was marked as a leaf");
    cr_assert(strstr(cx_last_error(), "not a leaf"), "error: %s", cx_last_error());
    cx_free(y);
    cx_free(w);
    cx_free(p);
}

Test(grad, no_grad_and_detach)
{
    rng_seed(118);
    const int64_t s[] = { 7 };
    float *x = rand_f32(7, -2, 2);
    cx_tensor *p = leaf(x, s, 1);
    cr_assert(cx_grad_enabled());
    /* y = x*x recorded without grad: loss = sum(y * x) has grad y = x^2 */
    cx_step_begin();
    cx_no_grad_begin();
    cr_assert(!cx_grad_enabled());
    cx_no_grad_begin();
    cx_no_grad_end();
    cr_assert(!cx_grad_enabled(), "no-grad regions must nest");
    cx_tensor *y = cx_mul(p, p);
    cx_no_grad_end();
    cr_assert(cx_grad_enabled());
    cr_assert_eq(cx_backward(cx_sum(cx_mul(y, p), NULL, 0, false)), CX_OK, "%s", cx_last_error());
    step_end_ok("no_grad");
    float *g = grad_of("no_grad", p);
    for (int i = 0; i < 7; i++) {
        double want = (double)x[i] * x[i];
        cr_assert(fabs(g[i] - want) <= 1e-5 * fmax(1, want), "no_grad: grad[%d] = %g, expected x^2 = %g (3x^2 = %g)", i,
                  g[i], want, 3 * want);
    }
    free(g);
    /* detach: same result */
    cx_zero_grad(p);
    cx_step_begin();
    cr_assert_eq(cx_backward(cx_sum(cx_mul(cx_detach(cx_mul(p, p)), p), NULL, 0, false)), CX_OK);
    step_end_ok("detach");
    g = grad_of("detach", p);
    for (int i = 0; i < 7; i++) {
        double want = (double)x[i] * x[i];
        cr_assert(fabs(g[i] - want) <= 1e-5 * fmax(1, want), "detach: grad[%d] = %g, expected %g", i, g[i], want);
    }
    free(g);
    /* detach keeps the value */
    cx_step_begin();
    float *d = fetch_f32("detach value", cx_detach(cx_exp(p)));
    for (int i = 0; i < 7; i++) cr_assert(fabs(d[i] - exp(x[i])) <= 1e-5 * exp(x[i]));
    free(d);
    step_end_ok("detach value");
    /* a loss built entirely under no_grad gives p no gradient */
    cx_zero_grad(p);
    cx_step_begin();
    cx_no_grad_begin();
    cx_tensor *l = cx_sum(cx_mul(p, p), NULL, 0, false);
    cx_no_grad_end();
    (void)cx_backward(l); /* may report an error: nothing requires grad */
    step_end_ok("no_grad loss");
    cx_tensor *gg = cx_grad(p);
    if (gg) {
        float *z = fetch_f32("no_grad loss", gg);
        for (int i = 0; i < 7; i++) cr_assert_eq(z[i], 0.0f, "no_grad loss produced grad[%d] = %g", i, z[i]);
        free(z);
    }
    free(x);
    cx_free(p);
}

/* Gradient checkpointing: the same network with and without a remat
 * region gives the same gradients. */
static void remat_net(cx_tensor *x, cx_tensor *w1, cx_tensor *w2, cx_tensor *w3, bool remat)
{
    cx_tensor *h = cx_tanh(cx_matmul(x, w1));
    if (remat) cx_remat_begin();
    cx_tensor *h2 = cx_gelu(cx_matmul(h, w2), true);
    cx_tensor *h3 = cx_mul(h2, cx_sigmoid(h2));
    if (remat) cx_remat_end();
    cx_tensor *out = cx_matmul(h3, w3);
    cx_tensor *l = cx_mean(cx_mul(out, out), NULL, 0, false);
    cr_assert_eq(cx_backward(l), CX_OK, "%s", cx_last_error());
}

Test(grad, remat_matches)
{
    rng_seed(119);
    const int64_t sx[] = { 8, 6 }, s1[] = { 6, 10 }, s2[] = { 10, 10 }, s3[] = { 10, 4 };
    float *x = rand_f32(48, -1, 1), *a = rand_f32(60, -0.5, 0.5), *b = rand_f32(100, -0.5, 0.5),
          *c = rand_f32(40, -0.5, 0.5);
    float *g[2][3];
    int nodes[2];
    for (int r = 0; r < 2; r++) {
        cx_tensor *w1 = leaf(a, s1, 2), *w2 = leaf(b, s2, 2), *w3 = leaf(c, s3, 2);
        cx_step_begin();
        remat_net(tf32(x, sx, 2), w1, w2, w3, r == 1);
        step_end_ok(r ? "remat" : "plain");
        nodes[r] = cx_last_exec_info().num_nodes;
        g[r][0] = grad_of("w1", w1);
        g[r][1] = grad_of("w2", w2);
        g[r][2] = grad_of("w3", w3);
        cx_free(w1);
        cx_free(w2);
        cx_free(w3);
    }
    const int64_t n[3] = { 60, 100, 40 };
    double nz = 0;
    for (int k = 0; k < 3; k++)
        for (int64_t i = 0; i < n[k]; i++) {
            nz += fabs(g[0][k][i]);
            cr_assert(fabs(g[0][k][i] - g[1][k][i]) <= 1e-6 * fmax(1e-3, fabs(g[0][k][i])),
                      "w%d grad[%lld]: plain %.9g, remat %.9g", k + 1, (long long)i, g[0][k][i], g[1][k][i]);
        }
    cr_assert(nz > 1e-3, "degenerate: all gradients are zero");
    /* backward recomputes the region from a fresh copy: more traced nodes */
    cr_log_info("remat: plain graph %d nodes, remat graph %d nodes", nodes[0], nodes[1]);
    cr_assert(nodes[1] > nodes[0], "the remat graph has %d nodes, the plain one %d: nothing was rematerialized",
              nodes[1], nodes[0]);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 3; k++) free(g[r][k]);
    free(x);
    free(a);
    free(b);
    free(c);
}

static cx_tensor *f_remat(cx_tensor *const *in, const void *ctx)
{
    (void)ctx;
    cx_remat_begin();
    cx_tensor *h = cx_tanh(cx_matmul(in[0], in[1]));
    cx_remat_end();
    return cx_matmul(h, in[2]);
}

Test(grad, remat_finite_difference)
{
    rng_seed(120);
    const int64_t sx[] = { 3, 4 }, s1[] = { 4, 5 }, s2[] = { 5, 2 };
    float *x = rand_f32(12, -1, 1), *a = rand_f32(20, -1, 1), *b = rand_f32(10, -1, 1);
    gin in[3] = { G(2, sx, x), G(2, s1, a), G(2, s2, b) };
    gradcheck("remat region", f_remat, NULL, in, 3);
    free(x);
    free(a);
    free(b);
}

/* ======================================================================
 * more gradient paths
 * ====================================================================== */

static cx_tensor *f_gram(cx_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return cx_matmul(in[0], cx_transpose(in[0], 0, 1)); /* x and a view of x */
}

static cx_tensor *f_concat_self(cx_tensor *const *in, const void *ctx)
{
    (void)ctx;
    cx_tensor *ts[3] = { in[0], cx_exp(in[0]), in[0] };
    return cx_concat(ts, 3, 0);
}

static cx_tensor *f_int_path(cx_tensor *const *in, const void *ctx)
{
    (void)ctx;
    /* the integer path is not differentiable: it acts as a constant */
    return cx_mul(cx_cast(cx_cast(in[0], CX_I32), CX_F32), in[0]);
}

typedef struct {
    int kind;
} collp;

static cx_tensor *f_collective(cx_tensor *const *in, const void *ctx)
{
    switch (((const collp *)ctx)->kind) {
    case 0: return cx_all_reduce(in[0], CX_RED_SUM, 0.5, NULL, false);
    case 1: return cx_all_gather(in[0], 0, NULL, false);
    case 2: return cx_reduce_scatter(in[0], CX_RED_SUM, 2.0, 0, NULL, false);
    case 3: return cx_all_reduce(in[0], CX_RED_MEAN, 1.0, NULL, true);
    default: return cx_all_to_all(in[0], 0, 1, NULL, false);
    }
}

Test(grad, shared_views_and_paths)
{
    rng_seed(121);
    const int64_t s[] = { 3, 4 };
    float *x = rand_f32(12, -1, 1);
    gin in[1] = { G(2, s, x) };
    gradcheck("x @ x^T", f_gram, NULL, in, 1);
    gradcheck("concat(x, exp(x), x)", f_concat_self, NULL, in, 1);
    free(x);
    /* away from integers so that the truncation is locally constant */
    const int64_t s5[] = { 5 };
    float y[5] = { 1.5f, 2.7f, -0.5f, -2.25f, 0.3f };
    gin in5[1] = { G(1, s5, y) };
    gradcheck("cast(cast(x, i32), f32) * x", f_int_path, NULL, in5, 1);
}

Test(grad, collectives_world_of_one)
{
    rng_seed(122);
    const int64_t s[] = { 4, 3 };
    float *x = rand_f32(12, -1, 1);
    gin in[1] = { G(2, s, x) };
    const char *names[] = { "all_reduce sum *0.5", "all_gather", "reduce_scatter sum *2", "all_reduce mean (pinned)",
                            "all_to_all" }; /* broadcast has no VJP (as torch.distributed.broadcast) */
    for (int k = 0; k < 5; k++) {
        collp c = { k };
        gradcheck(names[k], f_collective, &c, in, 1);
    }
    free(x);
}

/* Shapes big enough that the implementation may switch algorithms
 * (im2col + sgemm, blocked matmul); a sample of elements is checked. */
Test(grad, larger_conv_and_matmul)
{
    rng_seed(123);
    {
        const int64_t sx[] = { 2, 8, 12, 12 }, sw[] = { 16, 8, 3, 3 }, sb[] = { 16 };
        float *x = rand_f32(2304, -1, 1), *w = rand_f32(1152, -0.5, 0.5), *b = rand_f32(16, -1, 1);
        convp p = { 1, 1, 1, 1, 1, 1, 1 };
        gin in[3] = { G(4, sx, x), G(4, sw, w), G(1, sb, b) };
        gopts o = DEF;
        o.max_check = 20;
        gradcheck_opts("conv2d (2,8,12,12) * (16,8,3,3)", f_conv, &p, in, 3, o);
        free(x);
        free(w);
        free(b);
    }
    {
        const int64_t sa[] = { 2, 33, 65 }, sb[] = { 65, 17 };
        float *a = rand_f32(2 * 33 * 65, -1, 1), *b = rand_f32(65 * 17, -1, 1);
        int mode = 0;
        gin in[2] = { G(3, sa, a), G(2, sb, b) };
        gopts o = DEF;
        o.max_check = 20;
        gradcheck_opts("matmul (2,33,65) @ (65,17)", f_matmul, &mode, in, 2, o);
        free(a);
        free(b);
    }
}

/* ======================================================================
 * fused attention and layer norm (their own kernels)
 * ====================================================================== */

typedef struct { bool causal; double scale; } attn_case;

static cx_tensor *f_attention(cx_tensor *const *in, const void *ctx)
{
    const attn_case *a = ctx;
    return cx_scaled_dot_product_attention(in[0], in[1], in[2], a->causal, a->scale);
}

Test(grad, attention_fused)
{
    rng_seed(211);
    /* (B, H, T, D); the second case has fewer queries than keys */
    const int64_t sq[] = { 2, 2, 5, 4 }, sk[] = { 2, 2, 5, 4 }, sq2[] = { 1, 3, 3, 4 }, sk2[] = { 1, 3, 6, 4 };
    float *q = rand_f32(80, -1.5, 1.5), *k = rand_f32(80, -1.5, 1.5), *v = rand_f32(80, -1.5, 1.5);
    gin in[3] = { G(4, sq, q), G(4, sk, k), G(4, sk, v) };
    attn_case c = { true, 0 };
    gradcheck("attention causal", f_attention, &c, in, 3);
    c = (attn_case){ false, 0.7 };
    gradcheck("attention full, scale 0.7", f_attention, &c, in, 3);
    gin in2[3] = { G(4, sq2, q), G(4, sk2, k), G(4, sk2, v) };
    c = (attn_case){ true, 0 };
    gradcheck("attention causal, 3 queries over 6 keys", f_attention, &c, in2, 3);
    free(q); free(k); free(v);
}

static cx_tensor *f_layer_norm_last(cx_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return cx_layer_norm(in[0], 1, in[1], in[2], 1e-5);
}

Test(grad, layer_norm_fused)
{
    rng_seed(223);
    const int64_t sx[] = { 3, 4, 6 }, sc[] = { 6 };
    float *x = rand_f32(72, -2, 2), *w = rand_f32(6, 0.5, 1.5), *b = rand_f32(6, -1, 1);
    gin in[3] = { G(3, sx, x), G(1, sc, w), G(1, sc, b) };
    gradcheck("layer_norm over the last dim", f_layer_norm_last, NULL, in, 3);
    free(x); free(w); free(b);
}
