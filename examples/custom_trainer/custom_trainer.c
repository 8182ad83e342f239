/* custom_trainer: your own training loop on top of an installed cxla.
 *
 * Shows the pieces a trainer composes: a custom module type (an MLP of
 * library layers plus a parameter of its own), AdamW with a warm-up + cosine
 * schedule, gradient clipping on the device, a loader without step marks
 * (the loop marks steps itself), and an accuracy check.
 *
 *   custom_trainer [--data fake|fashion-mnist] [--steps N]
 */
#include <cxla/cxla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a custom module: flatten -> fc1 -> ReLU -> fc2, times a learned
 * temperature, -> log_softmax. Children are library layers; the temperature
 * is a parameter of its own. */

typedef struct {
    int fc1, fc2;      /* child slots */
    int temperature;   /* parameter slot */
} mlp;

static cx_tensor *mlp_forward(cx_module *m, cx_tensor *x)   // x (B, 1, 28, 28)
{
    const mlp *p = cx_module_impl(m);
    x = cx_flatten(x, 1, -1);                                             // (B, 784)
    x = cx_relu(cx_module_forward(cx_module_child(m, p->fc1), x));       // (B, H)
    x = cx_module_forward(cx_module_child(m, p->fc2), x);                // (B, 10)
    x = cx_mul(x, cx_module_param(m, p->temperature));
    return cx_log_softmax(x, 1);
}

static const cx_module_type mlp_type = { CX_STRUCT_SIZE(cx_module_type), .name = "TinyMlp", .forward = mlp_forward, .free = free };

static cx_module *mlp_new(int64_t in, int64_t hidden, int64_t out)
{
    mlp *p = malloc(sizeof *p);
    if (!p) return NULL;
    cx_module *m = cx_module_new(&mlp_type, p);
    if (!m) return NULL;
    int64_t one = 1;
    p->fc1 = cx_module_add_child(m, "fc1", cx_nn_linear(in, hidden, true));
    p->fc2 = cx_module_add_child(m, "fc2", cx_nn_linear(hidden, out, true));
    p->temperature = cx_module_register_parameter(m, "temperature", cx_ones(&one, 1, CX_F32));
    if (p->fc1 < 0 || p->fc2 < 0 || p->temperature < 0) { cx_module_free(m); return NULL; }
    return m;
}

/* ---- data ---------------------------------------------------------------------- */

static cx_dataset *load(bool fake, bool train)
{
    cx_dataset *ds = NULL;
    cx_status st;
    if (fake) {
        cx_fake_data_opts f = cx_fake_data_default_opts();
        f.size = train ? 4096 : 1024;
        f.seed = train ? 1 : 2;
        st = cx_fake_data(f, &ds);
    } else {
        cx_mnist_opts o = cx_mnist_default_opts();
        o.train = train;
        st = cx_mnist_load(o, &ds);
    }
    if (st != CX_OK) {
        fprintf(stderr, "custom_trainer: %s\n", cx_last_error());
        exit(3);
    }
    return ds;
}

int main(int argc, char **argv)
{
    bool fake = false;
    long steps = 200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc) {
            fake = !strcmp(argv[++i], "fake");
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            steps = strtol(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "custom_trainer: unknown argument '%s' (flags: --data fake|fashion-mnist, --steps N)\n",
                    argv[i]);
            return 2;
        }
    }
    cx_manual_seed(7);
    cx_dataset *train = load(fake, true), *test = load(fake, false);

    cx_module *model = mlp_new(784, 64, 10);
    int n;
    cx_named_tensor *params = model ? cx_module_parameters(model, &n) : NULL;
    cx_adam_opts ao = cx_adamw_default_opts();
    cx_optimizer *opt = params ? cx_optim_adamw(params, n, ao) : NULL;
    free(params);
    if (!opt) {
        fprintf(stderr, "custom_trainer: %s\n", cx_last_error());
        return 1;
    }
    cx_lr_schedule sched = cx_lr_schedule_default_opts();
    sched.kind = CX_LR_COSINE;
    sched.base_lr = 2e-3;
    sched.warmup_steps = steps / 10;
    sched.total_steps = steps - sched.warmup_steps;

    cx_sampler *sampler = cx_sampler_new(cx_dataset_size(train), cx_sampler_default_opts());
    cx_loader_opts lo = cx_loader_default_opts();
    lo.mark_step = false;          /* this loop marks its own steps */
    lo.drop_last = true;
    cx_loader *loader = cx_loader_new(train, sampler, lo);
    if (!loader) { fprintf(stderr, "custom_trainer: %s\n", cx_last_error()); return 1; }

    long step = 0;
    double last_loss = NAN;
    for (int64_t epoch = 0; step < steps; epoch++) {
        cx_loader_set_epoch(loader, epoch, 0);
        cx_batch b;
        cx_loader_result got = CX_LOADER_END;
        while (step < steps && (got = cx_loader_next(loader, &b)) == CX_LOADER_BATCH) {
            cx_optim_set_lr(opt, cx_lr_at(&sched, step));
            cx_step_begin();
            cx_optim_zero_grad(opt);
            cx_tensor *loss = cx_nll_loss(cx_module_forward(model, cx_batch_field(&b, CX_FIELD_IMAGES)), cx_batch_field(&b, CX_FIELD_LABELS), CX_REDUCE_MEAN, -100);
            cx_backward(loss);
            cx_optim_clip_grad_norm(opt, 1.0);
            cx_optim_step(opt);
            bool log = step % 50 == 0 || step == steps - 1;
            if (log) cx_keep(loss);
            if (cx_step_end() != CX_OK) { fprintf(stderr, "custom_trainer: %s\n", cx_last_error()); return 1; }
            if (log) {
                last_loss = cx_item(loss);
                printf("step %ld lr %.5f loss %.4f\n", step, cx_optim_get_lr(opt), last_loss);
                cx_free(loss);
            }
            step++;
        }
        if (got == CX_LOADER_ERROR) { fprintf(stderr, "custom_trainer: %s\n", cx_last_error()); return 1; }
    }

    /* Accuracy on the test split, counted on the device. */
    cx_sampler_opts so = cx_sampler_default_opts();
    so.shuffle = false;
    cx_sampler *ts = cx_sampler_new(cx_dataset_size(test), so);
    cx_loader *tl = cx_loader_new(test, ts, cx_loader_default_opts());   /* marks steps */
    cx_tensor *correct = cx_zeros(NULL, 0, CX_I64);
    cx_sync_tensors(&correct, 1);
    cx_module_train(model, false);
    cx_no_grad_begin();
    cx_batch b;
    cx_loader_result got;
    while ((got = cx_loader_next(tl, &b)) == CX_LOADER_BATCH) {
        cx_tensor *pred = cx_argmax(cx_module_forward(model, cx_batch_field(&b, CX_FIELD_IMAGES)), 1, false);
        cx_assign(correct, cx_add(correct, cx_sum(cx_cast(cx_eq(pred, cx_batch_field(&b, CX_FIELD_LABELS)), CX_I64), NULL, 0, false)));
    }
    cx_no_grad_end();
    if (got == CX_LOADER_ERROR) { fprintf(stderr, "custom_trainer: evaluation: %s\n", cx_last_error()); return 1; }
    printf("test accuracy %.2f%% after %ld steps, final loss %.4f\n",
           100.0 * cx_item(correct) / (double)cx_dataset_size(test), step, last_loss);

    cx_free(correct);
    cx_loader_free(tl);
    cx_sampler_free(ts);
    cx_loader_free(loader);
    cx_sampler_free(sampler);
    cx_optim_free(opt);
    cx_module_free(model);
    cx_dataset_free(train);
    cx_dataset_free(test);
    return isfinite(last_loss) ? 0 : 1;
}
