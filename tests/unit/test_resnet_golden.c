/* ResNet-18 against torchvision 0.14 (values from
 * tests/golden/gen_golden_resnet.py; no torch needed here): two training
 * steps (cross entropy, SGD with momentum 0.9 and weight decay) from the
 * same generated weights, input and labels. Step 1: logits, loss, every
 * gradient (norm and samples), the BN running statistics and every
 * parameter after the update; step 2: the loss and every parameter after
 * an update that the momentum buffers take part in. Plus the layout that
 * torchvision's state dict and other helpers rely on.
 *
 * Tolerances. The reference is float64; cxla runs float32 with its own
 * summation orders (im2col GEMMs, blocked reductions). The generator runs
 * the same steps through torch's float32 CPU kernels and stores, per
 * tensor, how far they land from float64 (f32_dist): float32 rounding
 * amplified through 20 layers and the BNs' small batches (layer4 normalizes
 * over 4 x 2 x 2 values), from 1e-7 for the loss to 2.7e-3 for the
 * gradient of an early BN bias. Two float32 computations that are each d
 * from the exact values are up to about 2d apart, so each tensor must be
 * within TOL_FACTOR * d of float64 (relative L2 over its stored samples,
 * and its whole norm), with a floor of TOL_FLOOR (a few float32 ulps:
 * tensors whose d is at rounding level, such as the loss). Measured:
 * cxla's largest distance is 2.6 d (1 and 2 threads alike), so 4 leaves
 * room for other machines' summation orders. A wrong BatchNorm backward,
 * stride, padding or momentum moves these by O(1). */
#include <criterion/criterion.h>

#include "../golden/golden.h"
#include "../golden/golden_resnet_values.h"
#include "../../examples/resnet.c"

#define TOL_FACTOR 4.0
#define TOL_FLOOR 2e-6
#define LR 0.1
#define MOMENTUM 0.9
#define WD 1e-4

static const cx_golden_rn *find_rn(const char *key)
{
    for (int i = 0; i < CX_GOLDEN_RN_COUNT; i++)
        if (!strcmp(cx_golden_rn_table[i].key, key)) return &cx_golden_rn_table[i];
    return NULL;
}

/* gen_golden_resnet.py's weight_value, in the same float32 operations. */
static void weight_value(float *out, const char *name, const int64_t *shape, int ndim)
{
    char key[256];
    snprintf(key, sizeof key, "resnet18/%s", name);
    int64_t n = golden_numel(shape, ndim);
    size_t len = strlen(name);
    if (ndim == 4) {
        golden_vals(out, n, key, (float)sqrt(6.0 / (double)(shape[1] * shape[2] * shape[3])));
    } else if (!strncmp(name, "fc.", 3)) {
        golden_vals(out, n, key, (float)(1.0 / sqrt(512.0)));
    } else if (len > 7 && !strcmp(name + len - 7, ".weight")) {
        golden_vals(out, n, key, 0.2f);
        for (int64_t i = 0; i < n; i++) out[i] += 1.0f;
    } else {
        golden_vals(out, n, key, 0.1f);
    }
}

static void load_weights(cx_module *m)
{
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cr_assert(ps);
    for (int i = 0; i < n; i++) {
        cx_tensor *t = ps[i].tensor;
        float *buf = malloc((size_t)cx_numel(t) * sizeof *buf);
        cr_assert(buf);
        weight_value(buf, ps[i].name, cx_shape(t), cx_ndim(t));
        cr_assert_eq(cx_module_load(m, ps[i].name, buf, CX_F32), CX_OK, "%s: %s", ps[i].name, cx_last_error());
        free(buf);
    }
    free(ps);
}

/* t against the reference `key` (relative L2 of the samples, and the norm). */
static void check(const char *key, cx_tensor *t)
{
    const cx_golden_rn *g = find_rn(key);
    cr_assert(g, "no golden value %s", key);
    cr_assert(t, "%s: no tensor", key);
    cr_assert_eq(cx_numel(t), g->numel, "%s: %lld elements, torchvision has %lld", key, (long long)cx_numel(t),
                 (long long)g->numel);
    float *x = malloc((size_t)g->numel * sizeof *x);
    cr_assert(x);
    cr_assert_eq(cx_to_host(t, x, CX_F32), CX_OK, "%s: %s", key, cx_last_error());
    double d = 0, r = 0, norm = 0;
    for (int k = 0; k < g->nsamples; k++) {
        double got = x[(int64_t)k * g->stride], ref = g->v[k];
        d += (got - ref) * (got - ref);
        r += ref * ref;
    }
    for (int64_t i = 0; i < g->numel; i++) norm += (double)x[i] * x[i];
    norm = sqrt(norm);
    double tol = TOL_FACTOR * g->f32_dist + TOL_FLOOR, rel = sqrt(d / (r > 0 ? r : 1e-300));
    double rel_norm = fabs(norm - g->l2) / (g->l2 > 0 ? g->l2 : 1e-300);
    cr_expect(rel <= tol, "%s: samples %.3g from torchvision (relative L2), tolerance %.3g (torch f32: %.3g)", key, rel,
              tol, g->f32_dist);
    cr_expect(rel_norm <= tol, "%s: norm %.9g, torchvision %.9g (%.3g relative), tolerance %.3g", key, norm, g->l2,
              rel_norm, tol);
    free(x);
}

/* Checks every parameter (and with `buffers`, running_mean / running_var)
 * against "<prefix>/<name>". */
static void check_all(cx_module *m, const char *prefix, bool grads, bool buffers)
{
    int n;
    cx_named_tensor *ts = buffers ? cx_module_buffers(m, &n) : cx_module_parameters(m, &n);
    cr_assert(ts);
    for (int i = 0; i < n; i++) {
        if (strstr(ts[i].name, "num_batches_tracked")) {
            int64_t v = -1;
            cr_assert_eq(cx_to_host(ts[i].tensor, &v, CX_I64), CX_OK);
            cr_expect_eq(v, 1, "%s: %lld after one step", ts[i].name, (long long)v);
            continue;
        }
        char key[256];
        snprintf(key, sizeof key, "%s/%s", prefix, ts[i].name);
        check(key, grads ? cx_grad(ts[i].tensor) : ts[i].tensor);
    }
    free(ts);
}

/* One step: forward, cross entropy, backward, SGD. @return the kept loss. */
static cx_tensor *train_step(cx_module *m, cx_optimizer *opt, cx_tensor *x, cx_tensor *y, cx_tensor **logits)
{
    cx_step_begin();
    cx_optim_zero_grad(opt);
    cx_tensor *out = cx_module_forward(m, x);   // (4, 10) logits
    cx_tensor *loss = cx_nll_loss(cx_log_softmax(out, 1), y, CX_REDUCE_MEAN, -100);
    cr_assert_eq(cx_backward(loss), CX_OK, "backward: %s", cx_last_error());
    cr_assert_eq(cx_optim_step(opt), CX_OK, "optimizer: %s", cx_last_error());
    if (logits) *logits = cx_keep(out);
    cx_keep(loss);
    cr_assert_eq(cx_step_end(), CX_OK, "step: %s", cx_last_error());
    return loss;
}

Test(resnet_golden, two_sgd_steps_match_torchvision, .timeout = 120)
{
    cx_module *m = model_resnet18(3, 10, false);
    cr_assert(m, "%s", cx_last_error());
    load_weights(m);
    int64_t xs[4] = { 4, 3, 64, 64 }, ys = 4, labels[4];
    cx_tensor *x = golden_input("resnet18", "x", xs, 4, 1.0f);
    golden_ints(labels, 4, "resnet18/t", 10);
    cx_tensor *y = cx_from_host(labels, &ys, 1, CX_I64);
    int np;
    cx_named_tensor *ps = cx_module_parameters(m, &np);
    cx_sgd_opts so = cx_sgd_default_opts();
    so.lr = LR;
    so.momentum = MOMENTUM;
    so.weight_decay = WD;
    cx_optimizer *opt = cx_optim_sgd(ps, np, so);
    free(ps);
    cr_assert(opt, "%s", cx_last_error());

    cx_tensor *logits = NULL, *loss = train_step(m, opt, x, y, &logits);
    check("logits", logits);
    check("loss", loss);
    check_all(m, "grad", true, false);
    check_all(m, "step1", false, true);
    check_all(m, "step1", false, false);
    cx_free(logits);
    cx_free(loss);

    loss = train_step(m, opt, x, y, NULL);
    check("loss2", loss);
    check_all(m, "step2", false, false);
    cx_free(loss);
    cx_optim_free(opt);
    cx_free(x);
    cx_free(y);
    cx_module_free(m);
}

/* What torchvision's state dict and the other helpers (FSDP nesting by type
 * name, checkpointing of the blocks) rely on. */
Test(resnet_golden, layout_as_torchvision)
{
    struct { cx_module *m; int64_t params; int entries; const char *block; } cases[2] = {
        { model_resnet18(3, 1000, false), 11689512, 122, "BasicBlock" },   /* torchvision's counts */
        { model_resnet50(3, 1000, false), 25557032, 320, "Bottleneck" },
    };
    for (int i = 0; i < 2; i++) {
        cx_module *m = cases[i].m;
        cr_assert(m, "%s", cx_last_error());
        cr_expect_str_eq(cx_module_type_name(m), "ResNet");
        cr_expect_eq(cx_module_num_params(m), cases[i].params);
        int n;
        free(cx_module_state_dict(m, &n));
        cr_expect_eq(n, cases[i].entries);
        cr_expect_str_eq(cx_module_type_name(cx_module_find(m, "layer2.0")), cases[i].block);
        cr_expect(cx_module_get(m, "layer2.0.downsample.0.weight") && cx_module_get(m, "layer2.0.downsample.1.running_var"));
        cr_expect(cx_module_get(m, "layer1.0.bn1.num_batches_tracked") != NULL);
        cr_expect(cx_module_get(m, "conv1.bias") == NULL && cx_module_get(m, "fc.bias") != NULL);
        cx_module_free(m);
    }
    /* the stride sits in the 3x3 of a Bottleneck */
    cx_module *r50 = model_resnet50(3, 10, false);
    cr_assert(r50);
    int64_t s1[4] = { 2, 3, 64, 64 };
    cx_step_begin();
    cx_tensor *out = cx_module_forward(cx_module_find(r50, "layer2.0.conv2"), cx_zeros((int64_t[]){ 2, 128, 16, 16 }, 4, CX_F32));
    cr_expect_eq(cx_dim(out, 2), 8);
    cx_tensor *logits = cx_module_forward(r50, cx_zeros(s1, 4, CX_F32));
    cr_expect(cx_ndim(logits) == 2 && cx_dim(logits, 0) == 2 && cx_dim(logits, 1) == 10);
    cr_expect_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    cx_module_free(r50);
}

/* Init: conv weights N(0, 2 / fan_out), BN 1 and 0, zero_init_residual
 * zeroes each block's last BN weight; a deferred build materializes to the
 * same values as an eager one from the same seed. */
Test(resnet_golden, init)
{
    cx_manual_seed(7);
    cx_module *a = model_resnet18(3, 10, true);
    cx_manual_seed(7);
    cx_deferred_init_begin();
    cx_module *b = model_resnet18(3, 10, true);
    cx_deferred_init_end();
    cr_assert(a && b, "%s", cx_last_error());
    cr_expect_gt(cx_module_num_deferred(b), 0);
    cr_assert_eq(cx_module_materialize(b), CX_OK, "%s", cx_last_error());
    int na, nb;
    cx_named_tensor *sa = cx_module_state_dict(a, &na), *sb = cx_module_state_dict(b, &nb);
    cr_assert(sa && sb && na == nb);
    for (int i = 0; i < na; i++) {
        cx_dtype dt = cx_dtype_of(sa[i].tensor);
        size_t bytes = (size_t)cx_numel(sa[i].tensor) * cx_dtype_size(dt);
        void *va = malloc(bytes ? bytes : 1), *vb = malloc(bytes ? bytes : 1);
        cr_assert(va && vb);
        cr_assert_eq(cx_to_host(sa[i].tensor, va, dt), CX_OK);
        cr_assert_eq(cx_to_host(sb[i].tensor, vb, dt), CX_OK);
        cr_expect(memcmp(va, vb, bytes) == 0, "%s: deferred build differs", sa[i].name);
        free(va);
        free(vb);
    }
    free(sa);
    free(sb);
    float w[64 * 3 * 49];
    cr_assert_eq(cx_to_host(cx_module_get(a, "conv1.weight"), w, CX_F32), CX_OK);
    double ss = 0;
    for (int i = 0; i < 64 * 3 * 49; i++) ss += (double)w[i] * w[i];
    double sd = sqrt(ss / (64 * 3 * 49)), want = sqrt(2.0 / (64 * 49));
    cr_expect(fabs(sd - want) < 0.05 * want, "conv1.weight std %.4g, want %.4g (kaiming fan_out)", sd, want);
    float g[512];
    cr_assert_eq(cx_to_host(cx_module_get(a, "layer4.1.bn2.weight"), g, CX_F32), CX_OK);
    cr_expect(g[0] == 0.0f && g[511] == 0.0f, "zero_init_residual");
    cr_assert_eq(cx_to_host(cx_module_get(a, "layer4.1.bn1.weight"), g, CX_F32), CX_OK);
    cr_expect(g[0] == 1.0f && g[511] == 1.0f);
    cx_module_free(a);
    cx_module_free(b);
}
