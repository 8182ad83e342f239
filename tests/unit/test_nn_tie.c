/* Tied parameters: one tensor under two names (GPT's lm_head.weight =
 * wte.weight). Listed once; its gradient is the sum of both uses; the
 * optimizer steps it once; the tie survives a checkpoint round trip. */
#include <criterion/criterion.h>

#include <cxla/cxla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define V 11
#define C 5

typedef struct {
    int emb, head;
} tied_lm;

/* logits = head(emb(x)): (B, T) -> (B, T, V) */
static cx_tensor *lm_forward(cx_module *m, cx_tensor *x)
{
    const tied_lm *t = cx_module_impl(m);
    cx_tensor *h = cx_module_forward(cx_module_child(m, t->emb), x);
    cx_tensor *y = cx_module_forward(cx_module_child(m, t->head), h);
    cx_drop(h);
    return y;
}

static const cx_module_type lm_type = { CX_STRUCT_SIZE(cx_module_type), .name = "TiedLM", .forward = lm_forward, .free = free };

static cx_module *make_lm(bool tie)
{
    cx_manual_seed(3);
    tied_lm *t = malloc(sizeof *t);
    cx_module *m = cx_module_new(&lm_type, t);
    cr_assert(m);
    t->emb = cx_module_add_child(m, "emb", cx_nn_embedding(V, C));
    t->head = cx_module_add_child(m, "head", cx_nn_linear(C, V, false));
    /* the same values either way: head starts as a copy of emb */
    float w[V * C];
    cr_assert(cx_to_host(cx_module_get(m, "emb.weight"), w, CX_F32) == CX_OK);
    if (tie) cr_assert(cx_module_tie(m, "head.weight", "emb.weight") == CX_OK, "%s", cx_last_error());
    else cr_assert(cx_module_load(m, "head.weight", w, CX_F32) == CX_OK);
    return m;
}

static cx_tensor *tokens(void)
{
    int64_t v[6] = { 1, 4, 4, 9, 0, 10 }, shape[2] = { 2, 3 };
    return cx_from_host(v, shape, 2, CX_I64);
}

static void backward_on(cx_module *m, cx_tensor *x)
{
    cx_step_begin();
    cx_tensor *y = cx_module_forward(m, x);
    /* a loss that weighs every logit differently */
    cx_tensor *w = cx_arange(cx_numel(y), CX_F32);
    int64_t shape[3] = { 2, 3, V };
    cx_tensor *loss = cx_sum(cx_mul(y, cx_tanh(cx_add_scalar(cx_mul_scalar(cx_reshape(w, shape, 3), 0.37), -2.0))), NULL, 0, false);
    cr_assert(cx_backward(loss) == CX_OK, "%s", cx_last_error());
    cr_assert(cx_step_end() == CX_OK, "%s", cx_last_error());
}

Test(tie, gradient_is_the_sum_of_both_uses)
{
    cx_module *tied = make_lm(true), *untied = make_lm(false);
    cx_tensor *x = tokens();
    backward_on(tied, x);
    backward_on(untied, x);
    float g[V * C], ge[V * C], gh[V * C];
    cr_assert(cx_to_host(cx_grad(cx_module_get(tied, "emb.weight")), g, CX_F32) == CX_OK);
    cr_assert(cx_to_host(cx_grad(cx_module_get(untied, "emb.weight")), ge, CX_F32) == CX_OK);
    cr_assert(cx_to_host(cx_grad(cx_module_get(untied, "head.weight")), gh, CX_F32) == CX_OK);
    double worst = 0, head_part = 0;
    for (int i = 0; i < V * C; i++) {
        worst = fmax(worst, fabs(g[i] - (ge[i] + gh[i])));
        head_part = fmax(head_part, fabs(gh[i]));
    }
    cr_expect(head_part > 1e-3, "the head's use contributes");
    cr_expect(worst <= 1e-5, "tied gradient differs from the sum of both uses by %g", worst);
    cr_expect(cx_grad(cx_module_get(tied, "head.weight")) == cx_grad(cx_module_get(tied, "emb.weight")));
    cx_free(x);
    cx_module_free(tied);
    cx_module_free(untied);
}

Test(tie, listed_once_and_stepped_once)
{
    cx_module *m = make_lm(true);
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cr_assert_eq(n, 1);
    cr_expect_str_eq(ps[0].name, "emb.weight");
    cr_expect_eq(cx_module_num_params(m), V * C);
    char *sig = cx_module_signature(m);
    cr_expect(sig && strstr(sig, "tie head.weight=emb.weight;"), "%s", sig ? sig : "");
    free(sig);
    /* the optimizer refuses the tensor twice: it would be stepped twice */
    cx_named_tensor twice[2] = { ps[0], { "head.weight", ps[0].tensor } };
    cr_expect_null(cx_optim_sgd(twice, 2, cx_sgd_default_opts()));
    cr_expect(strstr(cx_last_error(), "is the same tensor as emb.weight") != NULL, "%s", cx_last_error());
    free(ps);
    cx_module_free(m);
}

Test(tie, survives_a_checkpoint_round_trip)
{
    cx_module *m = make_lm(true);
    cx_tensor *x = tokens();
    backward_on(m, x);   /* some state, then a change of value */
    float w[V * C];
    cr_assert(cx_to_host(cx_module_get(m, "emb.weight"), w, CX_F32) == CX_OK);
    for (int i = 0; i < V * C; i++) w[i] += 0.25f;
    cr_assert(cx_module_load(m, "emb.weight", w, CX_F32) == CX_OK);
    char dir[] = "/tmp/cx_tie_XXXXXX";
    cr_assert(mkdtemp(dir));
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s/ckpt", dir);
    cr_assert(cx_ckpt_save(prefix, cx_ckpt_model_single(m), NULL, NULL) == CX_OK, "%s", cx_last_error());
    cx_module *back = make_lm(true);
    cr_assert(cx_ckpt_load(prefix, cx_ckpt_model_single(back), NULL, NULL) == CX_OK, "%s", cx_last_error());
    float got[V * C];
    cr_assert(cx_to_host(cx_module_get(back, "head.weight"), got, CX_F32) == CX_OK);
    for (int i = 0; i < V * C; i++) cr_expect_float_eq(got[i], w[i], 0.0f);
    cr_expect(cx_module_get(back, "head.weight") == cx_module_get(back, "emb.weight"));
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
    cx_free(x);
    cx_module_free(m);
    cx_module_free(back);
}
