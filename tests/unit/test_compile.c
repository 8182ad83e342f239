/* Compile, cache, run: one compile per distinct step, runtime scalars and
 * RNG state that never recompile, fusion, arena packing, in-place aliasing
 * of cx_assign, partial execution on reads, interning, pinned collectives,
 * and the step/transfer counters. */
#include "ref.h"

static int64_t counter(const char *name) { return cx_counter_value(name); }

static int64_t metric_count(const char *name)
{
    cx_metric_stats s;
    memset(&s, 0, sizeof s);
    return cx_metric_data(name, &s) ? s.total_samples : 0;
}

static void step_end_ok(const char *what)
{
    cx_status st = cx_step_end();
    cr_assert_eq(st, CX_OK, "%s: cx_step_end -> %d (%s)", what, (int)st, cx_last_error());
}

typedef struct {
    int64_t uncached, cached;
} compiles;

static compiles snap(void)
{
    compiles c = { counter("UncachedCompile"), counter("CachedCompile") };
    return c;
}

static void expect_compiles(const char *what, compiles before, int64_t du, int64_t dc)
{
    compiles now = snap();
    cr_assert_eq(now.uncached - before.uncached, du, "%s: UncachedCompile +%lld, expected +%lld", what,
                 (long long)(now.uncached - before.uncached), (long long)du);
    cr_assert_eq(now.cached - before.cached, dc, "%s: CachedCompile +%lld, expected +%lld", what,
                 (long long)(now.cached - before.cached), (long long)dc);
}

/* ======================================================================
 * (a) one compile per distinct training step
 * ====================================================================== */

#define IN 8
#define HID 16
#define OUT 4

typedef struct {
    cx_tensor *p[4]; /* w1 (IN,HID), b1 (HID), w2 (HID,OUT), b2 (OUT) */
} mlp;

static void mlp_init(mlp *m)
{
    const int64_t s[4][2] = { { IN, HID }, { HID, 0 }, { HID, OUT }, { OUT, 0 } };
    const int nd[4] = { 2, 1, 2, 1 };
    for (int i = 0; i < 4; i++) {
        float *d = rand_f32(ref_numel(s[i], nd[i]), -0.5, 0.5);
        m->p[i] = cx_requires_grad(cx_persist(tf32(d, s[i], nd[i])), true);
        free(d);
    }
}

static float *read_all(cx_tensor *t) { return fetch_f32("read", t); }

/* One SGD step on a fresh random batch; returns the dropout mask (kept)
 * through *mask_out when non-NULL. */
static double train_step(mlp *m, int64_t B, double lr, cx_tensor **mask_out)
{
    cx_step_begin();
    for (int i = 0; i < 4; i++) cx_zero_grad(m->p[i]);
    const int64_t sx[] = { B, IN }, sy[] = { B, OUT }, sh[] = { B, HID };
    float *x = rand_f32(B * IN, -1, 1), *y = rand_f32(B * OUT, -1, 1);
    cx_tensor *tx = tf32(x, sx, 2), *ty = tf32(y, sy, 2);
    free(x);
    free(y);
    cx_tensor *h = cx_relu(cx_add(cx_matmul(tx, m->p[0]), m->p[1]));
    cx_tensor *mask = cx_bernoulli(sh, 2, 0.8, CX_F32);
    h = cx_mul(cx_mul(h, mask), cx_scalar(1.25, CX_F32));
    cx_tensor *out = cx_add(cx_matmul(h, m->p[2]), m->p[3]);
    cx_tensor *loss = cx_mse_loss(out, ty, CX_REDUCE_MEAN);
    cr_assert_eq(cx_backward(loss), CX_OK, "backward: %s", cx_last_error());
    cx_tensor *lrt = cx_runtime_scalar(lr, CX_F32);
    for (int i = 0; i < 4; i++) {
        cx_tensor *g = cx_grad(m->p[i]);
        cr_assert(g != NULL, "param %d has no grad after backward", i);
        cr_assert_eq(cx_assign(m->p[i], cx_sub(m->p[i], cx_mul(lrt, g))), CX_OK, "assign: %s", cx_last_error());
    }
    cx_keep(loss);
    cx_keep(mask); /* always an output: the graph is the same whether or not the caller wants it */
    step_end_ok("train_step");
    /* a kept handle only survives into the next step: persist the masks the
     * caller wants to compare after later steps */
    cr_assert(!cx_is_pending(loss), "loss still pending after cx_step_end");
    cr_assert(!cx_is_pending(mask), "kept mask still pending after cx_step_end");
    if (mask_out) *mask_out = cx_persist(mask);
    else cx_free(mask);
    double v = cx_item(loss);
    cx_free(loss);
    cr_assert(isfinite(v), "loss is %g", v);
    return v;
}

Test(compile, same_step_compiles_once)
{
    rng_seed(200);
    cx_manual_seed(1);
    mlp m;
    mlp_init(&m);
    compiles c0 = snap();
    for (int s = 0; s < 3; s++) train_step(&m, 8, 0.1, NULL);
    expect_compiles("3 identical steps", c0, 1, 2);

    /* a new batch size is a new graph */
    compiles c1 = snap();
    train_step(&m, 16, 0.1, NULL);
    expect_compiles("new batch size", c1, 1, 0);

    /* a new learning rate is a runtime scalar: no compile; and the new
     * value is really used: p_new = p_old - lr * grad */
    float *old[4];
    for (int i = 0; i < 4; i++) {
        cr_assert(!cx_is_pending(m.p[i]), "param %d still pending after cx_step_end", i);
        old[i] = read_all(m.p[i]);
    }
    compiles c2 = snap();
    train_step(&m, 8, 0.05, NULL);
    expect_compiles("new learning rate", c2, 0, 1);
    const int64_t n[4] = { IN * HID, HID, HID * OUT, OUT };
    for (int i = 0; i < 4; i++) {
        cr_assert(!cx_is_pending(m.p[i]), "param %d still pending after cx_step_end", i);
        cr_assert(cx_grad(m.p[i]) && !cx_is_pending(cx_grad(m.p[i])), "grad %d still pending after cx_step_end", i);
        float *nw = read_all(m.p[i]), *g = read_all(cx_grad(m.p[i]));
        double gnorm = 0;
        for (int64_t k = 0; k < n[i]; k++) {
            double want = (double)old[i][k] - 0.05 * (double)g[k];
            gnorm += fabs(g[k]);
            cr_assert(fabs(nw[k] - want) <= 1e-6 * fmax(1, fabs(want)),
                      "param %d[%lld]: %.9g, expected old %.9g - 0.05 * grad %.9g = %.9g", i, (long long)k, nw[k],
                      old[i][k], g[k], want);
        }
        cr_assert(gnorm > 0, "param %d: zero gradient", i);
        free(nw);
        free(g);
        free(old[i]);
    }

    /* a new seed with dropout in the step: no compile, and the masks follow
     * the seed */
    cx_tensor *m1, *m2, *m3;
    compiles c3 = snap();
    cx_manual_seed(999);
    train_step(&m, 8, 0.1, &m1);
    train_step(&m, 8, 0.1, &m2);
    cx_manual_seed(999);
    train_step(&m, 8, 0.1, &m3);
    expect_compiles("new seed / offsets", c3, 0, 3);
    cr_assert(!cx_is_pending(m1) && !cx_is_pending(m2) && !cx_is_pending(m3), "kept masks became pending again");
    float *k1 = read_all(m1), *k2 = read_all(m2), *k3 = read_all(m3);
    int diff12 = 0, ones = 0;
    for (int i = 0; i < 8 * HID; i++) {
        cr_assert(k1[i] == k3[i], "same seed, different dropout mask at %d", i);
        diff12 += k1[i] != k2[i];
        ones += k1[i] == 1.0f;
    }
    cr_assert(diff12 > 0, "consecutive steps drew identical dropout masks (offset not advancing at run time)");
    cr_assert(ones > 0 && ones < 8 * HID, "degenerate dropout mask");
    free(k1);
    free(k2);
    free(k3);
    cx_free(m1);
    cx_free(m2);
    cx_free(m3);
    for (int i = 0; i < 4; i++) cx_free(m.p[i]);
}

Test(compile, runtime_scalar_vs_constant)
{
    const int64_t s[] = { 5 };
    float x[5] = { 1, 2, 3, 4, 5 };
    cx_tensor *t = cx_persist(tf32(x, s, 1));
    compiles c0 = snap();
    for (int k = 1; k <= 3; k++) {
        cx_step_begin();
        cx_tensor *y = cx_keep(cx_mul(t, cx_runtime_scalar((double)k, CX_F32)));
        step_end_ok("runtime scalar");
        float *v = read_all(y);
        for (int i = 0; i < 5; i++)
            cr_assert_eq(v[i], x[i] * (float)k, "runtime scalar %d: y[%d] = %g (stale value baked in?)", k, i, v[i]);
        free(v);
        cx_free(y);
    }
    expect_compiles("runtime scalar 1,2,3", c0, 1, 2);
    /* a constant is part of the graph: a new value recompiles */
    compiles c1 = snap();
    for (int k = 1; k <= 2; k++) {
        cx_step_begin();
        cx_tensor *y = cx_keep(cx_mul(t, cx_full(s, 1, (double)k + 0.5, CX_F32)));
        step_end_ok("constant");
        float *v = read_all(y);
        for (int i = 0; i < 5; i++) cr_assert_eq(v[i], x[i] * (float)(k + 0.5), "constant %d: y[%d] = %g", k, i, v[i]);
        free(v);
        cx_free(y);
    }
    expect_compiles("constants 1.5, 2.5", c1, 2, 0);
    /* nothing pending: nothing to compile */
    compiles c2 = snap();
    cr_assert_eq(cx_sync(), CX_OK);
    expect_compiles("empty sync", c2, 0, 0);
    /* clearing the cache forces a recompile of a known graph */
    compiles c3 = snap();
    cx_cache_clear();
    cx_step_begin();
    cx_keep(cx_mul(t, cx_runtime_scalar(7.0, CX_F32)));
    step_end_ok("after cache clear");
    expect_compiles("after cx_cache_clear", c3, 1, 0);
    cx_free(t);
}

/* A cache hit must run on the new inputs (and a reused arena must not leak
 * values between runs). */
Test(compile, cached_executable_uses_new_inputs)
{
    rng_seed(205);
    const int64_t s[] = { 6, 9 }, sw[] = { 9, 5 }, so[] = { 6, 5 };
    compiles c0 = snap();
    for (int run = 0; run < 3; run++) {
        float *x = rand_f32(54, -1, 1), *w = rand_f32(45, -1, 1);
        cx_step_begin();
        cx_tensor *y = cx_keep(cx_softmax(cx_mul_scalar(cx_matmul(cx_tanh(tf32(x, s, 2)), tf32(w, sw, 2)), 2.0), -1));
        step_end_ok("cached run");
        double ref[30];
        for (int i = 0; i < 6; i++) {
            double row[5], m = -INFINITY, z = 0;
            for (int j = 0; j < 5; j++) {
                double acc = 0;
                for (int k = 0; k < 9; k++) acc += tanh((double)x[i * 9 + k]) * w[k * 5 + j];
                row[j] = 2.0 * acc;
                m = fmax(m, row[j]);
            }
            for (int j = 0; j < 5; j++) z += exp(row[j] - m);
            for (int j = 0; j < 5; j++) ref[i * 5 + j] = exp(row[j] - m) / z;
        }
        char what[32];
        snprintf(what, sizeof what, "run %d", run);
        check_shape(what, y, so, 2);
        float *v = read_all(y);
        check_close_d(what, v, ref, 30, 1e-5);
        free(v);
        cx_free(y);
        free(x);
        free(w);
    }
    expect_compiles("same graph, new data", c0, 1, 2);
}

/* ======================================================================
 * (b) elementwise chains fuse into one kernel
 * ====================================================================== */

Test(compile, fused_elementwise_one_kernel)
{
    rng_seed(201);
    const int64_t n = 1 << 20;
    const int64_t s[] = { n };
    float *a = rand_f32(n, -1, 1), *b = rand_f32(n, -1, 1), *c = rand_f32(n, -1, 1);
    cx_tensor *ta = tf32(a, s, 1), *tb = tf32(b, s, 1), *tc = tf32(c, s, 1);
    cx_tensor *ab = cx_mul(ta, tb), *abc = cx_add(ab, tc);
    cx_tensor *y = cx_relu(abc);
    cx_free(ab);
    cx_free(abc);
    cr_assert_eq(cx_sync_tensors(&y, 1), CX_OK, "%s", cx_last_error());
    cx_exec_info info = cx_last_exec_info();
    cr_log_info("relu(a*b+c) over 1M: num_kernels %d, num_nodes %d, arena %lld, intermediates %lld", info.num_kernels,
                info.num_nodes, (long long)info.arena_bytes, (long long)info.intermediate_bytes);
    cr_assert_eq(info.num_kernels, 1, "relu(a*b+c) ran as %d kernels, expected 1 fused kernel", info.num_kernels);
    cr_assert_eq(info.num_outputs, 1, "num_outputs %d", info.num_outputs);
    cr_assert_eq(info.num_inputs, 3, "num_inputs %d", info.num_inputs);
    cr_assert(!cx_is_pending(y));
    float *v = read_all(y);
    for (int64_t i = 0; i < n; i += 997) {
        float want = a[i] * b[i] + c[i];
        want = want > 0 ? want : 0;
        cr_assert(fabsf(v[i] - want) <= 1e-6f, "y[%lld] = %g, expected %g", (long long)i, v[i], want);
    }
    free(v);
    free(a);
    free(b);
    free(c);
}

/* ======================================================================
 * (c) the arena packs intermediates
 * ====================================================================== */

Test(compile, arena_smaller_than_intermediates)
{
    rng_seed(202);
    const int L = 10;
    const int64_t B = 32, W = 128;
    cx_tensor *w[10], *b[10];
    const int64_t sw[] = { W, W }, sb[] = { W };
    for (int l = 0; l < L; l++) {
        float *d = rand_f32(W * W, -0.15, 0.15), *e = rand_f32(W, -0.1, 0.1);
        w[l] = cx_requires_grad(cx_persist(tf32(d, sw, 2)), true);
        b[l] = cx_requires_grad(cx_persist(tf32(e, sb, 1)), true);
        free(d);
        free(e);
    }
    const int64_t sx[] = { B, W };
    float *x = rand_f32(B * W, -1, 1), *y = rand_f32(B * W, -1, 1);
    cx_step_begin();
    cx_tensor *h = tf32(x, sx, 2);
    for (int l = 0; l < L; l++) h = cx_relu(cx_add(cx_matmul(h, w[l]), b[l]));
    cx_tensor *loss = cx_keep(cx_mse_loss(h, tf32(y, sx, 2), CX_REDUCE_MEAN));
    cr_assert_eq(cx_backward(loss), CX_OK, "%s", cx_last_error());
    cx_tensor *lr = cx_runtime_scalar(0.01, CX_F32);
    for (int l = 0; l < L; l++) {
        cr_assert_eq(cx_assign(w[l], cx_sub(w[l], cx_mul(lr, cx_grad(w[l])))), CX_OK);
        cr_assert_eq(cx_assign(b[l], cx_sub(b[l], cx_mul(lr, cx_grad(b[l])))), CX_OK);
    }
    step_end_ok("10-layer step");
    cx_exec_info info = cx_last_exec_info();
    cr_log_info("10-layer MLP step: arena %lld bytes, intermediates %lld bytes (arena is %.1f%%, saves %lld bytes), "
                "%d kernels, %d nodes, %d inputs, %d outputs, %d aliased",
                (long long)info.arena_bytes, (long long)info.intermediate_bytes,
                info.intermediate_bytes ? 100.0 * (double)info.arena_bytes / (double)info.intermediate_bytes : 0.0,
                (long long)(info.intermediate_bytes - info.arena_bytes), info.num_kernels, info.num_nodes,
                info.num_inputs, info.num_outputs, info.num_aliased);
    /* at least the 10 activations (B x W floats each) are intermediates */
    cr_assert(info.intermediate_bytes >= (int64_t)L * B * W * 4, "intermediate_bytes %lld is implausibly small",
              (long long)info.intermediate_bytes);
    cr_assert(info.arena_bytes > 0, "arena_bytes %lld", (long long)info.arena_bytes);
    cr_assert(info.arena_bytes < info.intermediate_bytes, "arena %lld bytes is not smaller than the intermediates (%lld)",
              (long long)info.arena_bytes, (long long)info.intermediate_bytes);
    cr_assert(info.num_aliased >= 2 * L, "num_aliased %d: parameter updates should write in place", info.num_aliased);
    cr_assert(isfinite(cx_item(loss)));
    cx_free(loss);
    free(x);
    free(y);
    for (int l = 0; l < L; l++) {
        cx_free(w[l]);
        cx_free(b[l]);
    }
}

/* ======================================================================
 * (d) cx_assign writes over the dead old buffer
 * ====================================================================== */

Test(compile, assign_does_not_double_memory)
{
    const int64_t n = 16 * 1024 * 1024; /* 64 MiB of f32 */
    const int64_t bytes = n * 4;
    const int64_t s[] = { n };
    float *h = malloc((size_t)bytes);
    cr_assert(h != NULL);
    for (int64_t i = 0; i < n; i++) h[i] = (float)((i % 1000) - 500) * 0.001f;
    cx_tensor *p = cx_requires_grad(cx_persist(tf32(h, s, 1)), true);
    /* grad = 2p, materialized */
    cx_step_begin();
    cr_assert_eq(cx_backward(cx_sum(cx_mul(p, p), NULL, 0, false)), CX_OK, "%s", cx_last_error());
    step_end_ok("backward");
    cx_tensor *g = cx_grad(p);
    cr_assert(g != NULL && !cx_is_pending(g));

    int64_t before = cx_memory_in_use();
    cr_assert(before >= 2 * bytes, "memory in use %lld < p + grad (%lld)", (long long)before, (long long)(2 * bytes));
    cx_memory_reset_peak();
    cx_tensor *lr = cx_runtime_scalar(0.25, CX_F32);
    cx_tensor *t1 = cx_mul(lr, g);
    cx_tensor *t2 = cx_sub(p, t1);
    cr_assert_eq(cx_assign(p, t2), CX_OK, "%s", cx_last_error());
    cx_free(t1);
    cx_free(t2);
    cx_free(lr);
    cr_assert_eq(cx_sync(), CX_OK, "%s", cx_last_error());
    int64_t peak = cx_memory_peak();
    cx_exec_info info = cx_last_exec_info();
    cr_log_info("assign of a 64 MiB parameter: in use before %lld, peak %lld (+%lld), num_aliased %d, arena %lld",
                (long long)before, (long long)peak, (long long)(peak - before), info.num_aliased,
                (long long)info.arena_bytes);
    cr_assert(peak - before < bytes / 2, "peak rose by %lld bytes during an in-place update of a %lld-byte parameter",
              (long long)(peak - before), (long long)bytes);
    cr_assert(info.num_aliased >= 1, "num_aliased %d", info.num_aliased);
    cr_assert(!cx_is_pending(p));
    float *v = read_all(p);
    for (int64_t i = 0; i < n; i += 4099) {
        float want = h[i] - 0.25f * (2.0f * h[i]);
        cr_assert(fabsf(v[i] - want) <= 1e-6f, "p[%lld] = %g, expected %g", (long long)i, v[i], want);
    }
    free(v);
    free(h);
    cx_free(p);
}

/* In-place writes must not corrupt values that still read the old buffer. */
Test(compile, assign_hazards)
{
    const int64_t s[] = { 4, 4 };
    float x[16];
    for (int i = 0; i < 16; i++) x[i] = (float)i;
    cx_tensor *p = cx_persist(tf32(x, s, 2));
    /* (1) a value recorded before the assign reads the old p */
    cx_step_begin();
    cx_tensor *before = cx_keep(cx_mul_scalar(p, 10.0));
    cx_tensor *old = cx_keep(cx_alias(p));
    cx_tensor *oldt = cx_keep(cx_transpose(p, 0, 1)); /* a view of the old buffer */
    cr_assert_eq(cx_assign(p, cx_add_scalar(p, 1.0)), CX_OK);
    /* reading p now sees the pending new value */
    cx_tensor *after = cx_keep(cx_mul_scalar(p, 100.0));
    step_end_ok("assign hazards 1");
    float *vb = read_all(before), *vo = read_all(old), *vp = read_all(p), *va = read_all(after);
    for (int i = 0; i < 16; i++) {
        cr_assert_eq(vb[i], 10.0f * x[i], "value computed from the old p: [%d] = %g, expected %g", i, vb[i], 10 * x[i]);
        cr_assert_eq(vo[i], x[i], "alias of the old p: [%d] = %g, expected %g (its buffer was overwritten)", i, vo[i],
                     x[i]);
        cr_assert_eq(vp[i], x[i] + 1.0f, "p[%d] = %g, expected %g", i, vp[i], x[i] + 1);
        cr_assert_eq(va[i], 100.0f * (x[i] + 1.0f), "value computed after the assign: [%d] = %g", i, va[i]);
    }
    float *vot = read_all(oldt);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            cr_assert_eq(vot[i * 4 + j], x[j * 4 + i], "transposed view of the old p: [%d][%d] = %g, expected %g", i, j,
                         vot[i * 4 + j], x[j * 4 + i]);
    free(vot);
    free(vb);
    free(vo);
    free(vp);
    free(va);
    cx_free(before);
    cx_free(after);
    /* the old value stays intact across later in-place updates of p */
    cx_persist(old);
    cx_persist(oldt);
    cr_assert_eq(cx_assign(p, cx_mul_scalar(p, 0.0)), CX_OK);
    cr_assert_eq(cx_sync(), CX_OK);
    vo = read_all(old);
    vot = read_all(oldt);
    for (int i = 0; i < 16; i++) {
        cr_assert_eq(vo[i], x[i], "old alias changed by a later assign: [%d] = %g", i, vo[i]);
        cr_assert_eq(vot[(i % 4) * 4 + i / 4], x[i], "old view changed by a later assign");
    }
    free(vo);
    free(vot);
    cx_free(old);
    cx_free(oldt);
    cr_assert_eq(cx_assign(p, cx_add_scalar(tf32(x, s, 2), 1.0)), CX_OK);
    /* (2) the new value is a permuted / shifted view of the old one */
    cr_assert_eq(cx_assign(p, cx_transpose(p, 0, 1)), CX_OK);
    cr_assert_eq(cx_sync(), CX_OK, "%s", cx_last_error());
    float *vt = read_all(p);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            cr_assert_eq(vt[i * 4 + j], x[j * 4 + i] + 1.0f, "assign(p, p^T): p[%d][%d] = %g, expected %g", i, j,
                         vt[i * 4 + j], x[j * 4 + i] + 1);
    free(vt);
    const int64_t lo[] = { 0, 1 }, hi[] = { 0, 0 };
    cx_tensor *sl = cx_slice(p, 1, 0, 3, 1);
    cx_tensor *sh = cx_pad(sl, lo, hi, -1.0); /* shift right by one column */
    cr_assert_eq(cx_assign(p, sh), CX_OK);
    cx_free(sl);
    cx_free(sh);
    cr_assert_eq(cx_sync(), CX_OK, "%s", cx_last_error());
    float *vs = read_all(p);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            float want = j == 0 ? -1.0f : x[(j - 1) * 4 + i] + 1.0f;
            cr_assert_eq(vs[i * 4 + j], want, "assign(p, shift(p)): p[%d][%d] = %g, expected %g", i, j, vs[i * 4 + j],
                         want);
        }
    free(vs);
    /* (3) two assigns in one step compose */
    float *v0 = read_all(p);
    cx_step_begin();
    cr_assert_eq(cx_assign(p, cx_add_scalar(p, 1.0)), CX_OK);
    cr_assert_eq(cx_assign(p, cx_mul_scalar(p, 2.0)), CX_OK);
    step_end_ok("two assigns");
    float *v1 = read_all(p);
    for (int i = 0; i < 16; i++) cr_assert_eq(v1[i], (v0[i] + 1.0f) * 2.0f, "two assigns: [%d] = %g", i, v1[i]);
    free(v0);
    free(v1);
    cx_free(p);
}

Test(compile, memory_returns_to_baseline)
{
    int64_t base = cx_memory_in_use();
    rng_seed(206);
    const int64_t sw[] = { 64, 64 }, sx[] = { 32, 64 };
    float *w = rand_f32(4096, -0.1, 0.1), *x = rand_f32(2048, -1, 1);
    cx_tensor *p = cx_requires_grad(cx_persist(tf32(w, sw, 2)), true);
    int64_t use[4], arena = 0;
    for (int k = 0; k < 4; k++) {
        cx_step_begin();
        cx_zero_grad(p);
        cx_tensor *l = cx_mean(cx_tanh(cx_matmul(tf32(x, sx, 2), p)), NULL, 0, false);
        cr_assert_eq(cx_backward(l), CX_OK);
        cr_assert_eq(cx_assign(p, cx_sub(p, cx_mul_scalar(cx_grad(p), 0.1))), CX_OK);
        step_end_ok("memory step");
        use[k] = cx_memory_in_use();
        int64_t a = cx_last_exec_info().arena_bytes;
        arena = a > arena ? a : arena;
    }
    cr_log_info("memory in use after steps: %lld %lld %lld %lld (baseline %lld, arena %lld)", (long long)use[0],
                (long long)use[1], (long long)use[2], (long long)use[3], (long long)base, (long long)arena);
    /* parameter + grad are live; nothing grows from step to step */
    cr_assert(use[3] >= base + 2 * 4096 * 4, "in use %lld: parameter and grad not counted", (long long)use[3]);
    cr_assert(use[1] == use[2] && use[2] == use[3], "device memory grows from step to step: %lld, %lld, %lld",
              (long long)use[1], (long long)use[2], (long long)use[3]);
    cx_free(p); /* also frees its grad */
    cx_cache_clear();
    int64_t after = cx_memory_in_use();
    cr_log_info("after freeing everything: %lld", (long long)after);
    /* at most the (reusable) arena workspace remains */
    cr_assert(after - base <= arena, "device memory leaked: %lld bytes in use after freeing everything (baseline %lld, "
              "arena %lld)", (long long)after, (long long)base, (long long)arena);
    free(w);
    free(x);
}

Test(compile, nested_steps_and_partial_sync)
{
    const int64_t s[] = { 3 };
    float x[3] = { 1, 2, 3 };
    cx_step_begin();
    cx_tensor *outer = cx_mul_scalar(tf32(x, s, 1), 2.0);
    cx_step_begin();
    cx_tensor *inner = cx_keep(cx_add(outer, tf32(x, s, 1)));
    cx_tensor *tmp = cx_exp(outer);
    (void)tmp;
    cr_assert_eq(cx_step_end(), CX_OK, "inner step: %s", cx_last_error());
    /* the outer step's handle survives the inner step's end */
    cr_assert(cx_tensor_error(outer) == NULL);
    float *vi = read_all(inner), *vo = read_all(outer);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(vi[i], 3 * x[i]);
        cr_assert_eq(vo[i], 2 * x[i]);
    }
    free(vi);
    free(vo);
    /* cx_sync_tensors materializes only what it is given */
    cx_tensor *a = cx_sqrt(tf32(x, s, 1)), *b = cx_log(tf32(x, s, 1));
    cr_assert(cx_is_pending(a) && cx_is_pending(b));
    cr_assert_eq(cx_sync_tensors(&a, 1), CX_OK);
    cr_assert(!cx_is_pending(a), "the synced tensor is still pending");
    cr_assert(cx_is_pending(b), "cx_sync_tensors(a) also materialized b");
    cr_assert_eq(cx_step_end(), CX_OK);
}

/* ======================================================================
 * (e) reading a pending tensor runs only what it needs
 * ====================================================================== */

static void branches(const float *x, int64_t n, cx_tensor **A, cx_tensor **B)
{
    const int64_t s[] = { n };
    cx_tensor *t = tf32(x, s, 1);
    cx_tensor *e = cx_exp(t);
    *A = cx_sum(e, NULL, 0, false);
    cx_tensor *q = cx_mul(cx_tanh(t), t);
    cx_tensor *r = cx_add(q, cx_sqrt(cx_abs(t)));
    *B = cx_sum(cx_mul(r, r), NULL, 0, false);
}

Test(compile, read_runs_only_the_needed_subgraph)
{
    rng_seed(203);
    const int64_t n = 1000;
    float *x = rand_f32(n, -1, 1);
    double ra = 0, rb = 0;
    for (int64_t i = 0; i < n; i++) {
        ra += exp(x[i]);
        double r = tanh(x[i]) * x[i] + sqrt(fabs(x[i]));
        rb += r * r;
    }
    /* whole graph */
    cx_step_begin();
    cx_tensor *A, *B;
    branches(x, n, &A, &B);
    cx_keep(A);
    cx_keep(B);
    step_end_ok("both branches");
    int whole = cx_last_exec_info().num_nodes;
    cx_free(A);
    cx_free(B);
    /* just one branch */
    cx_step_begin();
    branches(x, n, &A, &B);
    cx_keep(B);
    int64_t t0 = metric_count("TransferFromDeviceTime");
    double va = cx_item(A);
    int64_t t1 = metric_count("TransferFromDeviceTime");
    cx_exec_info info = cx_last_exec_info();
    cr_log_info("whole graph %d nodes; reading one branch ran %d nodes", whole, info.num_nodes);
    cr_assert_eq(t1 - t0, 1, "TransferFromDeviceTime +%lld, expected +1", (long long)(t1 - t0));
    cr_assert(fabs(va - ra) <= 1e-5 * fabs(ra), "A = %.9g, expected %.9g", va, ra);
    cr_assert(info.num_nodes < whole, "reading A executed %d nodes, the whole graph has %d", info.num_nodes, whole);
    cr_assert(cx_is_pending(B), "the other branch was executed by a read of A");
    step_end_ok("one branch");
    cr_assert(!cx_is_pending(B));
    double vb = cx_item(B);
    cr_assert(fabs(vb - rb) <= 1e-5 * fabs(rb), "B = %.9g, expected %.9g", vb, rb);
    cx_free(B);
    free(x);
}

/* ======================================================================
 * (f) interning and pinned collectives
 * ====================================================================== */

static cx_tensor *vec(float base, int n)
{
    float d[16];
    for (int i = 0; i < n; i++) d[i] = base + (float)i;
    const int64_t s[] = { n };
    return tf32(d, s, 1);
}

Test(compile, interning_same_op_same_node)
{
    /* baseline: one add */
    cx_tensor *a0 = vec(0, 8), *b0 = vec(100, 8);
    cx_tensor *d = cx_add(a0, b0);
    cr_assert_eq(cx_sync_tensors(&d, 1), CX_OK);
    int one_add = cx_last_exec_info().num_nodes;
    /* the same add twice */
    cx_tensor *a = vec(1, 8), *b = vec(50, 8);
    cx_tensor *c[2] = { cx_add(a, b), cx_add(a, b) };
    cr_assert_eq(cx_sync_tensors(c, 2), CX_OK);
    int twice = cx_last_exec_info().num_nodes;
    /* control: two different ops do count twice */
    cx_tensor *e = vec(2, 8), *f = vec(30, 8);
    cx_tensor *k[2] = { cx_add(e, f), cx_sub(e, f) };
    cr_assert_eq(cx_sync_tensors(k, 2), CX_OK);
    int two_ops = cx_last_exec_info().num_nodes;
    cr_log_info("nodes: one add %d, same add twice %d, add+sub %d", one_add, twice, two_ops);
    cr_assert_eq(twice, one_add, "cx_add(a,b) twice traced %d nodes, one add traces %d: not interned", twice, one_add);
    cr_assert_eq(two_ops, one_add + 1, "add+sub traced %d nodes, expected %d", two_ops, one_add + 1);
    float *v0 = read_all(c[0]), *v1 = read_all(c[1]);
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(v0[i], 51.0f + 2.0f * (float)i);
        cr_assert_eq(v1[i], v0[i]);
    }
    free(v0);
    free(v1);
}

static int collective_nodes(bool pin, int *kernels, float base)
{
    cx_tensor *x = vec(base, 8);
    cx_tensor *r[2] = { cx_all_reduce(x, CX_RED_SUM, 1.0, NULL, pin), cx_all_reduce(x, CX_RED_SUM, 1.0, NULL, pin) };
    cr_assert(!cx_tensor_error(r[0]) && !cx_tensor_error(r[1]));
    cr_assert_eq(cx_sync_tensors(r, 2), CX_OK, "%s", cx_last_error());
    cx_exec_info info = cx_last_exec_info();
    *kernels = info.num_kernels;
    for (int k = 0; k < 2; k++) {
        float *v = read_all(r[k]);
        for (int i = 0; i < 8; i++) cr_assert_eq(v[i], base + (float)i, "all_reduce (world of one) changed the value");
        free(v);
        cx_free(r[k]);
    }
    cx_free(x);
    return info.num_nodes;
}

Test(compile, pinned_collectives_not_merged)
{
    int ku, kp;
    int nu = collective_nodes(false, &ku, 0);
    int np = collective_nodes(true, &kp, 10);
    cr_log_info("two all_reduces: unpinned %d nodes / %d kernels, pinned %d nodes / %d kernels", nu, ku, np, kp);
    cr_assert(np > nu, "two pinned all_reduces traced %d nodes, unpinned %d: pinned ones were merged", np, nu);
    cr_assert(kp >= ku, "pinned collectives ran fewer kernels (%d) than merged ones (%d)", kp, ku);
}

/* ======================================================================
 * (g) counters
 * ====================================================================== */

Test(compile, step_and_transfer_counters)
{
    int64_t ms0 = counter("MarkStep");
    int64_t td0 = metric_count("TransferToDeviceTime");
    const int64_t s[] = { 4 };
    float x[4] = { 1, 2, 3, 4 };
    for (int k = 0; k < 3; k++) {
        cx_step_begin();
        cx_tensor *t = tf32(x, s, 1);
        cx_keep(cx_exp(t));
        step_end_ok("counter step");
    }
    cr_assert_eq(counter("MarkStep") - ms0, 3, "MarkStep +%lld after 3 steps", (long long)(counter("MarkStep") - ms0));
    int64_t td1 = metric_count("TransferToDeviceTime");
    cr_assert_eq(td1 - td0, 3, "TransferToDeviceTime +%lld after 3 cx_from_host", (long long)(td1 - td0));
    cx_tensor *extra[2] = { tf32(x, s, 1), tf32(x, s, 1) };
    cr_assert_eq(metric_count("TransferToDeviceTime") - td1, 2);
    cx_free(extra[0]);
    cx_free(extra[1]);
    /* a compile was timed */
    cx_metric_stats cs;
    cr_assert(cx_metric_data("CompileTime", &cs), "no CompileTime samples after compiling");
    cr_assert(cs.total_samples >= 1 && cs.accumulator >= 0);
    /* user counters and metrics, and clearing */
    cx_counter_add("MyCounter", 5);
    cx_counter_add("MyCounter", 2);
    cr_assert_eq(counter("MyCounter"), 7);
    cr_assert_eq(counter("NeverCounted"), 0);
    cx_metric_add("MyMetric", 2.0);
    cx_metric_add("MyMetric", 6.0);
    cx_metric_stats ms;
    cr_assert(cx_metric_data("MyMetric", &ms));
    cr_assert_eq(ms.total_samples, 2);
    cr_assert_float_eq(ms.accumulator, 8.0, 1e-12);
    cr_assert_float_eq(ms.min, 2.0, 1e-12);
    cr_assert_float_eq(ms.max, 6.0, 1e-12);
    cr_assert_float_eq(ms.last, 6.0, 1e-12);
    cr_assert(!cx_metric_data("NoSuchMetric", &ms));
    cx_metrics_clear();
    cr_assert_eq(counter("MyCounter"), 0);
    cr_assert(!cx_metric_data("MyMetric", &ms));
}

Test(compile, threads_setting)
{
    /* ctest runs with CX_NUM_THREADS=2 */
    const char *env = getenv("CX_NUM_THREADS");
    if (env) cr_assert_eq(cx_get_num_threads(), atoi(env), "CX_NUM_THREADS=%s but %d threads", env, cx_get_num_threads());
    cx_set_num_threads(1);
    cr_assert_eq(cx_get_num_threads(), 1);
    /* results do not depend on the thread count */
    rng_seed(204);
    const int64_t s[] = { 64, 64 };
    float *a = rand_f32(4096, -1, 1);
    cx_tensor *t = cx_persist(tf32(a, s, 2));
    float *r[2];
    for (int k = 0; k < 2; k++) {
        cx_set_num_threads(k ? 3 : 1);
        cx_step_begin();
        cx_tensor *y = cx_keep(cx_softmax(cx_matmul(t, t), -1));
        step_end_ok("threads");
        r[k] = read_all(y);
        cx_free(y);
    }
    for (int i = 0; i < 4096; i++)
        cr_assert(fabsf(r[0][i] - r[1][i]) <= 1e-6f * fmaxf(1.0f, fabsf(r[0][i])), "1 vs 3 threads differ at %d", i);
    free(r[0]);
    free(r[1]);
    free(a);
    cx_free(t);
}

/* A sum over the leading axis (a bias gradient) is each column's rows
 * added in order in double, whatever the thread count: read in place or
 * computed by a prologue (x * x) alike. 1001 rows and 300 columns leave a
 * partial block of columns, however many the threads split them into. */
Test(compile, column_sums_add_rows_in_order)
{
    const int64_t R = 1001, C = 300, xs[2] = { R, C };
    rng_seed(91);
    float *x = rand_f32(R * C, -2, 2);
    cx_tensor *X = cx_persist(tf32(x, xs, 2));
    const int saved = cx_get_num_threads();
    for (int sq = 0; sq < 2; sq++)
        for (int th = 1; th <= 3; th += 2) {
            cx_set_num_threads(th);
            cx_step_begin();
            cx_tensor *s = cx_keep(cx_sum(sq ? cx_mul(X, X) : X, (const int[]){ 0 }, 1, false));
            step_end_ok("column sum");
            float *got = read_all(s);
            for (int64_t c = 0; c < C; c++) {
                double acc = 0;
                for (int64_t r = 0; r < R; r++) acc += sq ? (double)(x[r * C + c] * x[r * C + c]) : (double)x[r * C + c];
                float want = (float)acc;
                cr_assert(memcmp(&got[c], &want, sizeof want) == 0, "%s, %d threads, column %lld: %.9g, want %.9g",
                          sq ? "x*x" : "x", th, (long long)c, (double)got[c], (double)want);
            }
            free(got);
            cx_free(s);
        }
    cx_set_num_threads(saved);
    free(x);
    cx_free(X);
}

/* A bf16 sum over the leading axis (autocast's bias gradient) takes the
 * same column route: each column's rows added in order in double, then
 * rounded (through f32) to bf16, for a bf16 tensor read from memory and
 * for an f32 one cast to bf16 in the sum's prologue, with 1 and 3
 * threads. Column 0 starts 1, 0, 2^60, -2^60: in row order the 1 is lost
 * (0), while the row-wise route's eight partial sums keep it (1). */
Test(compile, bf16_column_sums_add_rows_in_order)
{
    const int64_t R = 1001, C = 300, xs[2] = { R, C };
    rng_seed(92);
    float *x = rand_f32(R * C, -2, 2);
    const float first[4] = { 1.0f, 0.0f, 0x1p60f, -0x1p60f };
    for (int r = 0; r < 4; r++) x[r * C] = first[r];
    for (int64_t r = 4; r < R; r++) x[r * C] = 0.0f;
    cx_tensor *X = cx_persist(tf32(x, xs, 2));
    cx_step_begin();
    cx_tensor *Xb = cx_persist(cx_cast(X, CX_BF16));
    step_end_ok("bf16 copy");
    const int saved = cx_get_num_threads();
    for (int in_memory = 0; in_memory < 2; in_memory++)
        for (int th = 1; th <= 3; th += 2) {
            cx_set_num_threads(th);
            cx_step_begin();
            cx_tensor *s = cx_keep(cx_sum(in_memory ? Xb : cx_cast(X, CX_BF16), (const int[]){ 0 }, 1, false));
            step_end_ok("bf16 column sum");
            cr_assert_eq(cx_dtype_of(s), CX_BF16);
            float *got = read_all(s);
            for (int64_t c = 0; c < C; c++) {
                double acc = 0;
                for (int64_t r = 0; r < R; r++) acc += (double)cx_bf16_to_f32(cx_f32_to_bf16(x[r * C + c]));
                float want = cx_bf16_to_f32(cx_f32_to_bf16((float)acc));
                cr_assert(memcmp(&got[c], &want, sizeof want) == 0, "%s, %d threads, column %lld: %.9g, want %.9g",
                          in_memory ? "bf16 tensor" : "cast", th, (long long)c, (double)got[c], (double)want);
            }
            free(got);
            cx_free(s);
        }
    cx_set_num_threads(saved);
    free(x);
    cx_free(Xb);
    cx_free(X);
}

/* A gradient bucket (DDP): each gradient is copied into the bucket right
 * after it is computed, and the all-reduce runs in place over the bucket.
 * The arena then holds the bucket and one gradient, not every gradient
 * plus the bucket plus a second buffer for the reduced result. */
Test(compile, gradient_bucket_in_place)
{
    rng_seed(206);
    enum { G = 4 };
    const int64_t M = 128, K = 64, N = 512, sa[2] = { M, K }, sb[2] = { K, N }, all = -1;
    cx_tensor *a[G], *b[G];
    for (int i = 0; i < G; i++) {
        float *da = rand_f32(M * K, -1, 1), *db = rand_f32(K * N, -1, 1);
        a[i] = cx_persist(tf32(da, sa, 2));
        b[i] = cx_persist(tf32(db, sb, 2));
        free(da);
        free(db);
    }
    cx_step_begin();
    cx_tensor *flat[G];
    for (int i = 0; i < G; i++) flat[i] = cx_reshape(cx_matmul(a[i], b[i]), &all, 1);
    cx_tensor *bucket = cx_concat(flat, G, 0);
    cx_tensor *red = cx_keep(cx_mul_scalar(cx_all_reduce(bucket, CX_RED_SUM, 0.5, NULL, true), 2.0));
    step_end_ok("bucket");
    cx_exec_info info = cx_last_exec_info();
    const int64_t grad = M * N * 4, bucket_bytes = G * grad;
    cr_log_info("bucket step: arena %lld bytes, intermediates %lld, bucket %lld", (long long)info.arena_bytes,
                (long long)info.intermediate_bytes, (long long)bucket_bytes);
    cr_assert(info.arena_bytes <= bucket_bytes + grad, "arena %lld bytes for a %lld-byte bucket of %lld-byte gradients",
              (long long)info.arena_bytes, (long long)bucket_bytes, (long long)grad);
    /* world of one, scale 0.5 then x2: the bucket itself */
    float *r = read_all(red);
    for (int i = 0; i < G; i++) {
        cx_step_begin();
        cx_tensor *g = cx_keep(cx_matmul(a[i], b[i]));
        step_end_ok("one gradient");
        float *gh = read_all(g);
        for (int64_t q = 0; q < M * N; q++)
            cr_assert(fabsf(r[i * M * N + q] - gh[q]) <= 1e-5f * (1 + fabsf(gh[q])), "bucket[%d][%lld]", i, (long long)q);
        free(gh);
        cx_free(g);
    }
    free(r);
    for (int i = 0; i < G; i++) { cx_free(a[i]); cx_free(b[i]); }
}

/* A conv epilogue that adds a bias along dim 1 of some other split of the
 * output's elements (here (N*H, O, W)) is not the conv's own bias: it
 * must run as written, not be folded into the conv kernel as bias[o]. */
Test(compile, conv_epilogue_fold_only_its_own_bias)
{
    const int64_t N = 2, C = 8, O = 8, H = 5, W = 3;
    const int64_t xs[4] = { N, C, H, W }, ws[4] = { O, C, 3, 3 }, bs[3] = { 1, O, 1 }, rs[3] = { N * H, O, W };
    float *x = malloc(sizeof(float) * (size_t)(N * C * H * W)), *w = malloc(sizeof(float) * (size_t)(O * C * 9));
    float b[8];
    cr_assert(x && w);
    for (int64_t i = 0; i < N * C * H * W; i++) x[i] = (float)((i * 37) % 11) - 5;
    for (int64_t i = 0; i < O * C * 9; i++) w[i] = (float)((i * 13) % 7) - 3;
    for (int i = 0; i < O; i++) b[i] = 100.0f * (float)(i + 1);
    cx_tensor *X = cx_persist(cx_from_host(x, xs, 4, CX_F32)), *Wt = cx_persist(cx_from_host(w, ws, 4, CX_F32));
    cx_tensor *B = cx_persist(cx_from_host(b, bs, 3, CX_F32));
    cx_step_begin();
    cx_tensor *y = cx_keep(cx_conv2d(X, Wt, NULL, 1, 1, 1, 1, 1, 1, 1));
    step_end_ok("conv");
    float *yh = read_all(y);
    cx_free(y);
    cx_step_begin();
    cx_tensor *z = cx_keep(cx_add(cx_reshape(cx_conv2d(X, Wt, NULL, 1, 1, 1, 1, 1, 1, 1), rs, 3), B));
    step_end_ok("conv, reshape, + bias");
    float *zh = read_all(z);
    for (int64_t e = 0; e < N * O * H * W; e++) {
        float want = yh[e] + b[(e / W) % O];
        cr_assert(fabsf(zh[e] - want) <= 1e-4f * (1 + fabsf(want)), "element %lld: got %g, want %g", (long long)e,
                  (double)zh[e], (double)want);
    }
    free(x); free(w); free(yh); free(zh);
    cx_free(X); cx_free(Wt); cx_free(B); cx_free(z);
}

/* Algebraic identities fold at record time: x * 1 + 0 is x itself (no
 * node, no kernel), while detach keeps its own gradient-free node. */
Test(compile, algebraic_identities)
{
    float h[4] = { 1, -2, 3, -4 };
    const int64_t s4[] = { 4 };
    cx_tensor *x = cx_from_host(h, s4, 1, CX_F32);
    cx_tensor *one = cx_scalar(1.0, CX_F32), *zero = cx_scalar(0.0, CX_F32);
    cx_tensor *y = cx_sub(cx_div(cx_add(cx_mul(one, x), zero), one), zero);
    cr_assert(!cx_is_pending(y), "x * 1 + 0 / 1 - 0 recorded a graph instead of folding to x");
    cx_tensor *two = cx_scalar(2.0, CX_F32);
    cx_tensor *z = cx_mul(x, two);
    cr_assert(cx_is_pending(z), "x * 2 must not fold");
    cx_tensor *w = cx_requires_grad(cx_persist(cx_from_host(h, s4, 1, CX_F32)), true);
    cx_tensor *d = cx_detach(w);
    cr_assert(cx_is_pending(d), "detach of a grad-carrying tensor must be its own node");
    cx_tensor *loss = cx_sum(cx_mul(d, w), NULL, 0, false);
    cr_assert_eq(cx_backward(loss), CX_OK, "%s", cx_last_error());
    float g[4];
    cr_assert_eq(cx_to_host(cx_grad(w), g, CX_F32), CX_OK);
    for (int i = 0; i < 4; i++) cr_assert_float_eq(g[i], h[i], 1e-6, "d(sum(detach(w) * w))/dw = w, got %g", g[i]);
}
