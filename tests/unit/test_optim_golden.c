/* SGD, Adam, AdamW: 10 steps on a fixed problem against PyTorch; gradient
 * clipping; LR schedules; optimizer state naming and errors. */
#include <criterion/criterion.h>

#include "../golden/golden.h"

static char g_msg[512];

#define CHECK(key, t, rtol)                                                   \
    do {                                                                      \
        const char *e_ = golden_check((key), (t), (rtol), g_msg, sizeof g_msg); \
        cr_expect(e_ == NULL, "%s", e_ ? e_ : "");                            \
    } while (0)

/* The problem of gen_golden.py: loss = mse(x W^T + b, y). */
typedef struct {
    cx_tensor *w, *b, *x, *y;
} problem;

static problem make_problem(void)
{
    problem p;
    int64_t ws[2] = { 5, 4 }, bs = 5, xs[2] = { 8, 4 }, ys[2] = { 8, 5 };
    p.w = golden_input("opt", "weight", ws, 2, golden_param_scale(ws, 2));
    p.b = golden_input("opt", "bias", &bs, 1, 0.5f);
    p.x = golden_input("opt", "x", xs, 2, 1.0f);
    p.y = golden_input("opt", "y", ys, 2, 1.0f);
    cx_requires_grad(p.w, true);
    cx_requires_grad(p.b, true);
    return p;
}

static void free_problem(problem *p)
{
    cx_zero_grad(p->w);
    cx_zero_grad(p->b);
    cx_free(p->w); cx_free(p->b); cx_free(p->x); cx_free(p->y);
}

static cx_tensor *problem_loss(problem *p)
{
    cx_tensor *pred = cx_add(cx_matmul(p->x, cx_transpose(p->w, 0, 1)), p->b);
    return cx_mse_loss(pred, p->y, CX_REDUCE_MEAN);
}

typedef cx_optimizer *(*make_opt)(const cx_named_tensor *ps, int n, const void *opts);

static cx_optimizer *mk_sgd(const cx_named_tensor *ps, int n, const void *o) { return cx_optim_sgd(ps, n, *(const cx_sgd_opts *)o); }
static cx_optimizer *mk_adam(const cx_named_tensor *ps, int n, const void *o) { return cx_optim_adam(ps, n, *(const cx_adam_opts *)o); }
static cx_optimizer *mk_adamw(const cx_named_tensor *ps, int n, const void *o) { return cx_optim_adamw(ps, n, *(const cx_adam_opts *)o); }

static void run_opt(const char *gcase, make_opt mk, const void *opts)
{
    problem p = make_problem();
    cx_named_tensor ps[2] = { { "weight", p.w }, { "bias", p.b } };
    cx_optimizer *opt = mk(ps, 2, opts);
    cr_assert(opt, "%s", cx_last_error());
    int64_t uncached0 = cx_counter_value("UncachedCompile");
    for (int i = 0; i < 10; i++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cr_assert(cx_backward(problem_loss(&p)) == CX_OK, "%s", cx_last_error());
        cr_assert(cx_optim_step(opt) == CX_OK, "%s", cx_last_error());
        cr_assert(cx_step_end() == CX_OK, "%s: step %d: %s", gcase, i, cx_last_error());
    }
    int64_t compiles = cx_counter_value("UncachedCompile") - uncached0;
    cr_expect(compiles <= 1, "%s: 10 steps compiled %lld times", gcase, (long long)compiles);
    cr_expect_eq(cx_optim_step_count(opt), 10);
    char key[128];
    snprintf(key, sizeof key, "%s/weight", gcase);
    CHECK(key, p.w, 1e-5);
    snprintf(key, sizeof key, "%s/bias", gcase);
    CHECK(key, p.b, 1e-5);
    cx_optim_free(opt);
    free_problem(&p);
}

Test(optim_golden, sgd)
{
    cx_sgd_opts o = cx_sgd_default_opts();
    o.lr = 0.1;
    run_opt("sgd", mk_sgd, &o);
}

Test(optim_golden, sgd_momentum_dampening_weight_decay)
{
    cx_sgd_opts o = cx_sgd_default_opts();
    o.lr = 0.05; o.momentum = 0.9; o.dampening = 0.1; o.weight_decay = 0.01;
    run_opt("sgd_momentum", mk_sgd, &o);
}

Test(optim_golden, sgd_nesterov)
{
    cx_sgd_opts o = cx_sgd_default_opts();
    o.lr = 0.05; o.momentum = 0.9; o.nesterov = true; o.weight_decay = 0.001;
    run_opt("sgd_nesterov", mk_sgd, &o);
}

Test(optim_golden, adam)
{
    cx_adam_opts o = cx_adam_default_opts();
    o.lr = 0.01;
    run_opt("adam", mk_adam, &o);
}

Test(optim_golden, adam_weight_decay_amsgrad)
{
    cx_adam_opts o = cx_adam_default_opts();
    o.lr = 0.02; o.weight_decay = 0.1; o.amsgrad = true;
    run_opt("adam_wd_amsgrad", mk_adam, &o);
}

Test(optim_golden, adamw)
{
    cx_adam_opts o = cx_adamw_default_opts();
    o.lr = 0.01; o.weight_decay = 0.05;
    run_opt("adamw", mk_adamw, &o);
}

Test(optim_golden, adamw_amsgrad)
{
    cx_adam_opts o = cx_adamw_default_opts();
    o.lr = 0.01; o.beta1 = 0.8; o.beta2 = 0.99; o.eps = 1e-6; o.weight_decay = 0.01; o.amsgrad = true;
    run_opt("adamw_amsgrad", mk_adamw, &o);
}

Test(optim_golden, clip_grad_norm_on_device)
{
    problem p = make_problem();
    cx_step_begin();
    cr_assert(cx_backward(problem_loss(&p)) == CX_OK);
    cx_metric_stats m0 = { 0 }, m1 = { 0 };
    cx_metric_data("TransferFromDeviceTime", &m0);
    int64_t runs0 = cx_counter_value("CachedCompile") + cx_counter_value("UncachedCompile");
    cx_tensor *ps[2] = { p.w, p.b };
    cx_tensor *norm = cx_keep(cx_clip_grad_norm(ps, 2, 0.5));
    cr_expect(cx_is_pending(norm), "the norm stays lazy");
    cx_metric_data("TransferFromDeviceTime", &m1);
    cr_expect_eq(m1.total_samples, m0.total_samples, "clipping read nothing back");
    cr_expect_eq(cx_counter_value("CachedCompile") + cx_counter_value("UncachedCompile"), runs0,
                 "clipping ran nothing");
    cr_assert(cx_step_end() == CX_OK, "%s", cx_last_error());
    CHECK("clip/norm", norm, 1e-5);
    CHECK("clip/grad/weight", cx_grad(p.w), 1e-5);
    CHECK("clip/grad/bias", cx_grad(p.b), 1e-5);
    cx_free(norm);
    free_problem(&p);
    cr_expect(cx_tensor_error(cx_clip_grad_norm(ps, 0, -1.0)) != NULL);
}

static void check_schedule(const char *gcase, const cx_lr_schedule *s)
{
    char key[64];
    snprintf(key, sizeof key, "%s/lr", gcase);
    double lr[12];
    for (int t = 0; t < 12; t++) lr[t] = cx_lr_at(s, t);
    const char *e = golden_compare(key, lr, 12, 1e-9, g_msg, sizeof g_msg);
    cr_expect(e == NULL, "%s", e ? e : "");
}

Test(optim_golden, lr_schedules)
{
    cx_lr_schedule s = cx_lr_schedule_default_opts();
    s.base_lr = 0.1;
    s.kind = CX_LR_STEP; s.step_size = 3; s.gamma = 0.5;
    check_schedule("sched_step", &s);
    s.kind = CX_LR_COSINE; s.total_steps = 10; s.min_lr = 0.001;
    check_schedule("sched_cosine", &s);
    s.total_steps = 8; s.min_lr = 0.0; s.warmup_steps = 4; s.warmup_start_factor = 0.25;
    check_schedule("sched_warmup_cosine", &s);
    cx_lr_schedule c = cx_lr_schedule_default_opts();
    cr_expect_eq(cx_lr_at(&c, 1000), 0.01);
}

Test(optim, state_is_named_per_parameter)
{
    problem p = make_problem();
    cx_named_tensor ps[2] = { { "fc.weight", p.w }, { "fc.bias", p.b } };
    cx_optimizer *adam = cx_optim_adam(ps, 2, cx_adam_default_opts());
    int n;
    cx_named_tensor *st = cx_optim_state(adam, &n);
    cr_assert_eq(n, 6);
    cr_expect_str_eq(st[0].name, "fc.weight.exp_avg");
    cr_expect_str_eq(st[1].name, "fc.weight.exp_avg_sq");
    cr_expect_str_eq(st[2].name, "fc.weight.step");
    cr_expect_str_eq(st[5].name, "fc.bias.step");
    for (int i = 0; i < n; i++) {
        cr_expect(cx_is_persistent(st[i].tensor));
        cr_expect(!cx_is_pending(st[i].tensor), "state starts materialized");
    }
    free(st);
    cx_optimizer *sgd = cx_optim_sgd(ps, 2, (cx_sgd_opts){ CX_STRUCT_SIZE(cx_sgd_opts), .lr = 0.1, .momentum = 0.9 });
    st = cx_optim_state(sgd, &n);
    cr_assert_eq(n, 2);
    cr_expect_str_eq(st[1].name, "fc.bias.momentum_buffer");
    free(st);
    cx_named_tensor *pp = cx_optim_params(sgd, &n);
    cr_expect_eq(n, 2);
    cr_expect_str_eq(pp[0].name, "fc.weight");
    free(pp);

    /* zero_grad sets gradients to none; a parameter without one is skipped. */
    cx_step_begin();
    cx_backward(problem_loss(&p));
    cr_assert(cx_step_end() == CX_OK);
    cr_expect(cx_grad(p.w) != NULL);
    cx_optim_zero_grad(sgd);
    cr_expect(cx_grad(p.w) == NULL && cx_grad(p.b) == NULL);
    float before[5], after[5];
    cx_to_host(p.b, before, CX_F32);
    cx_step_begin();
    cr_expect(cx_optim_step(sgd) == CX_OK);
    cr_assert(cx_step_end() == CX_OK);
    cx_to_host(p.b, after, CX_F32);
    cr_expect(memcmp(before, after, sizeof before) == 0);
    cx_optim_free(sgd);
    cx_optim_free(adam);
    cx_optim_free(NULL);
    free_problem(&p);
}

Test(optim, bad_hyper_parameters)
{
    problem p = make_problem();
    cx_named_tensor ps[1] = { { "w", p.w } };
    cx_sgd_opts s = cx_sgd_default_opts();
    s.nesterov = true;
    cr_expect(cx_optim_sgd(ps, 1, s) == NULL);
    cr_expect(strstr(cx_last_error(), "nesterov") != NULL, "%s", cx_last_error());
    cx_adam_opts a = cx_adam_default_opts();
    a.beta2 = 1.0;
    cr_expect(cx_optim_adam(ps, 1, a) == NULL);
    cr_expect(strstr(cx_last_error(), "Adam") != NULL, "%s", cx_last_error());
    free_problem(&p);
}
