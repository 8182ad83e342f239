/* The seed cnn and the tiny GPT under autocast against PyTorch 1.13's
 * torch.autocast("cpu", torch.bfloat16) with f32 parameters
 * (tests/golden/gen_golden_autocast.py): the loss and every gradient.
 *
 * The two sides round at different places: torch 1.13's CPU lists keep
 * log-softmax, softmax and layer norm in bf16 when their input is bf16,
 * where cxla (like torch's CUDA lists and later CPU ones) computes them in
 * f32, and torch's attention is matmul / softmax / matmul in bf16 where
 * cxla's is one kernel on bf16 inputs. Each rounding to bf16 is a relative
 * error of at most u = 2^-9, so the two agree to a few u, not bit for bit:
 *  - loss: within 2^-7 = 4u relative (torch's cnn loss is itself a mean of
 *    bf16-rounded log-probabilities, off from f32 by up to u);
 *  - gradients (and the GPT's logits): a weight's gradient sums products
 *    whose operands were each rounded (activations, the bf16 gradient
 *    flowing back, the weight's bf16 copy), a few u per product, partly
 *    cancelling. As the relative L2 distance over the stored samples,
 *    torch-autocast sits 0.2-10 % from the float64 reference (the cnn's
 *    conv1 gradient 10 %). cxla's native bf16 kernels (f32 sums in another
 *    order, one rounding per output, bf16 gradients through conv) are
 *    about as far from f64, but in other directions: 6-9 % from
 *    torch-autocast on the cnn's convolutions. Two estimates each e from
 *    the exact value are up to about 2e apart, so a gradient must be
 *    within max(GRAD_TOL, 2 * torch-autocast's own distance to f64) of
 *    torch-autocast, and no further from f64 than torch-autocast is, with
 *    half of it again and 1 % as room (ACC_FACTOR, ACC_SLACK): as
 *    accurate as PyTorch's autocast, not bit-equal to it.
 * And every gradient must differ from the float64 reference by more than
 * an f32 run does (1e-4 relative), or autocast silently off would pass the
 * GPT (whose near-uniform initial logits make its loss insensitive). */
#include <criterion/criterion.h>

#include "../golden/golden.h"
#include "../golden/golden_autocast_values.h"
#include "../../examples/models.c"

#define LOSS_RTOL 0x1p-7
#define GRAD_TOL 0.04
#define ACC_FACTOR 1.5
#define ACC_SLACK 0.01
#define F32_FLOOR 1e-4

static const cx_golden *find_ac(const char *key)
{
    for (int i = 0; i < CX_GOLDEN_AUTOCAST_COUNT; i++)
        if (!strcmp(cx_golden_autocast_table[i].key, key)) return &cx_golden_autocast_table[i];
    return NULL;
}

/* ||x - ref|| / ||ref|| over the entry's stored samples */
static double rel_l2(const cx_golden *g, const float *x, int64_t n)
{
    cr_assert_eq(g->numel, n, "%s: %lld elements, golden has %lld", g->key, (long long)n, (long long)g->numel);
    double d = 0, r = 0;
    for (int k = 0; k < g->nsamples; k++) {
        double ref = g->v[k], got = x[(int64_t)k * g->stride];
        d += (got - ref) * (got - ref);
        r += ref * ref;
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* t against torch-autocast ("<ac>/<what>") and the f64 reference ("<ref>/<what>") */
static void check(const char *ac, const char *ref, const char *what, cx_tensor *t, bool is_loss)
{
    char kac[256], kref[256];
    snprintf(kac, sizeof kac, "%s/%s", ac, what);
    snprintf(kref, sizeof kref, "%s/%s", ref, what);
    const cx_golden *gac = find_ac(kac), *gref = golden_find(kref);
    cr_assert(gac && gref, "no golden values for %s / %s", kac, kref);
    cr_assert(t, "%s: no tensor", kac);
    int64_t n = cx_numel(t);
    float *x = malloc((size_t)n * sizeof *x);
    cr_assert(x);
    cr_assert_eq(cx_to_host(t, x, CX_F32), CX_OK, "%s: %s", kac, cx_last_error());
    double to_torch = rel_l2(gac, x, n), to_f64 = rel_l2(gref, x, n);
    double torch_to_f64 = 0;
    {
        double d = 0, r = 0;
        for (int k = 0; k < gac->nsamples && k < gref->nsamples; k++) {
            d += (gac->v[k] - gref->v[k]) * (gac->v[k] - gref->v[k]);
            r += gref->v[k] * gref->v[k];
        }
        torch_to_f64 = r > 0 ? sqrt(d / r) : 0;
    }
    double tol = is_loss ? LOSS_RTOL : fmax(GRAD_TOL, 2.0 * torch_to_f64);
    cr_expect(to_torch <= tol, "%s: %.3g from torch-autocast (tolerance %.3g); torch-autocast is %.3g from f64, cxla %.3g",
              kac, to_torch, tol, torch_to_f64, to_f64);
    cr_expect(is_loss || to_f64 <= ACC_FACTOR * torch_to_f64 + ACC_SLACK,
              "%s: %.3g from the f64 reference, less accurate than torch-autocast (%.3g)", kac, to_f64, torch_to_f64);
    cr_expect(is_loss || to_f64 > F32_FLOOR, "%s: %.3g from the f64 reference, as close as f32: autocast did not engage", kac, to_f64);
    cr_log_info("%s: %.4f from torch-autocast, %.4f from f64 (torch-autocast %.4f)", kac, to_torch, to_f64, torch_to_f64);
    free(x);
}

static void check_params(cx_module *m, const char *ac, const char *ref)
{
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cr_assert(ps, "%s", cx_last_error());
    for (int i = 0; i < n; i++) {
        char what[200];
        snprintf(what, sizeof what, "grad/%s", ps[i].name);
        cx_tensor *g = cx_grad(ps[i].tensor);
        cr_expect(g && cx_dtype_of(g) == CX_F32, "%s: the gradient of an f32 parameter is f32", ps[i].name);
        check(ac, ref, what, g, false);
    }
    free(ps);
}

Test(autocast_golden, cnn)
{
    cx_module *m = model_cnn();
    cr_assert(m, "%s", cx_last_error());
    cr_assert(golden_load_params(m, "cnn"), "%s", cx_last_error());
    int64_t xs[4] = { 4, 1, 28, 28 }, ts = 4, t[4];
    cx_tensor *x = golden_input("cnn", "x", xs, 4, 1.0f);
    golden_ints(t, 4, "cnn/t", 10);
    cx_tensor *tt = cx_from_host(t, &ts, 1, CX_I64);
    cx_step_begin();
    cr_assert_eq(cx_autocast_begin(CX_BF16), CX_OK);
    cx_tensor *loss = cx_keep(cx_nll_loss(cx_module_forward(m, x), tt, CX_REDUCE_MEAN, -100));
    cr_assert_eq(cx_autocast_end(), CX_OK);
    cr_assert_eq(cx_backward(loss), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    check("cnn_bf16", "cnn", "loss", loss, true);
    check_params(m, "cnn_bf16", "cnn");
    cx_free(loss);
    cx_free(x);
    cx_free(tt);
    cx_module_free(m);
}

static cx_tensor *tokens(const char *key)
{
    int64_t v[2 * 16], shape[2] = { 2, 16 };
    golden_ints(v, 2 * 16, key, 256);
    return cx_from_host(v, shape, 2, CX_I64);
}

Test(autocast_golden, gpt)
{
    cx_gpt_config c = { CX_STRUCT_SIZE(cx_gpt_config), .vocab_size = 256, .block_size = 16, .n_layer = 2, .n_head = 2,
                        .n_embd = 32 };
    cx_module *m = cx_nn_gpt(c);
    cr_assert(m, "%s", cx_last_error());
    cr_assert(golden_load_params(m, "gpt"), "%s", cx_last_error());
    cx_tensor *in[2] = { tokens("gpt/idx"), tokens("gpt/targets") }, *out[2] = { 0 };
    cx_step_begin();
    cr_assert_eq(cx_autocast_begin(CX_BF16), CX_OK);
    cr_assert_eq(cx_module_forward_many(m, in, 2, out, 2), 2, "%s", cx_last_error());
    cr_assert_eq(cx_autocast_end(), CX_OK);
    cr_expect_eq(cx_dtype_of(out[0]), CX_BF16, "the tied lm_head's logits are a bf16 matmul's");
    cr_expect_eq(cx_dtype_of(out[1]), CX_F32, "the loss is f32");
    cx_keep(out[0]);
    cx_keep(out[1]);
    cr_assert_eq(cx_backward(out[1]), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    check("gpt_bf16", "gpt", "loss", out[1], true);
    check("gpt_bf16", "gpt", "logits", out[0], false);
    check_params(m, "gpt_bf16", "gpt");
    cx_free(out[0]);
    cx_free(out[1]);
    cx_free(in[0]);
    cx_free(in[1]);
    cx_module_free(m);
}
