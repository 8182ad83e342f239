/* train: the reference cxla trainer (MNIST / Fashion-MNIST classifiers).
 *
 * Read it top to bottom: flags, data, model, optimizer, then the loop. Each
 * training step is one lazy graph: forward, backward and the optimizer
 * update are recorded between the loader's step marks and compiled once.
 *
 * Exit codes: 0 success, 1 runtime error, 2 bad flag, 3 data set missing or
 * unreadable, 21 test accuracy below --target-accuracy.
 */
#include <cxla/cxla.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "models.h"

enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2, EXIT_DATA = 3, EXIT_BELOW_TARGET = 21 };

/* ---- flags ------------------------------------------------------------------ */

typedef struct {
    const char *model;        /* cnn, lenet, mlp */
    const char *data;         /* fashion-mnist, mnist, fake */
    const char *data_dir;     /* NULL: the data set's default */
    int epochs;
    long steps;               /* per epoch; 0: the whole epoch */
    long batch_size;
    double lr, momentum, weight_decay;
    const char *optimizer;    /* sgd, adam, adamw */
    long seed;
    long log_every;
    int threads;              /* 0: the library's default */
    double target_accuracy;   /* percent; 0: no target */
    long width;
    int depth;
    const char *parallel;     /* none, ddp, xm, fsdp */
    int zero;                 /* fsdp: 2 or 3 */
    bool nested;              /* fsdp: every Linear / Conv2d its own unit */
    long auto_wrap_min_params;
    bool grad_ckpt;
    const char *ckpt_dir;     /* NULL: no checkpoints */
    long ckpt_every;          /* steps between saves; 0: only at the end */
    const char *resume;       /* NULL, "auto" or a checkpoint prefix */
    bool metrics;             /* print the metrics report at the end */
    const char *trace_dir;    /* profiler output, NULL: off */
    const char *cache_dir;    /* persistent compile cache, NULL: off */
} config;

static config default_config(void)
{
    return (config){
        .model = "cnn", .data = "fashion-mnist", .data_dir = NULL, .epochs = 1, .steps = 0,
        .batch_size = 64, .lr = 0.01, .momentum = 0.5, .weight_decay = 0.0, .optimizer = "sgd",
        .seed = 1, .log_every = 100, .threads = 0, .target_accuracy = 0.0, .width = 128, .depth = 2, .parallel = "none",
        .zero = 3, .nested = false, .auto_wrap_min_params = 0, .grad_ckpt = false,
    };
}

static void usage(FILE *f)
{
    config d = default_config();
    fprintf(f,
            "usage: train [flags]\n"
            "  --model {cnn,lenet,mlp}           model (default %s)\n"
            "  --data {fashion-mnist,mnist,fake} data set (default %s)\n"
            "  --data-dir DIR                    IDX files (default %s for fashion-mnist,\n"
            "                                    %s for mnist)\n"
            "  --epochs N                        epochs (default %d)\n"
            "  --steps N                         steps per epoch, 0 = all (default %ld)\n"
            "  --batch-size N                    batch size (default %ld)\n"
            "  --lr X                            learning rate (default %g)\n"
            "  --momentum X                      SGD momentum (default %g)\n"
            "  --optimizer {sgd,adam,adamw}      optimizer (default %s)\n"
            "  --weight-decay X                  weight decay (default %g)\n"
            "  --seed N                          RNG seed for init and shuffling (default %ld)\n"
            "  --log-every N                     log the loss every N steps (default %ld)\n"
            "  --threads N                       compute threads, 0 = all cores (default %d)\n"
            "  --target-accuracy PCT             exit 21 if the final test accuracy is below (default %g = off)\n"
            "  --width N                         mlp hidden width (default %ld)\n"
            "  --depth N                         mlp hidden layers (default %d)\n"
            "  --parallel {none,ddp,xm,fsdp}     data parallelism over the ranks of xla-launch:\n"
            "                                    ddp = DistributedDataParallel, xm = xm.optimizer_step,\n"
            "                                    fsdp = fully sharded (default %s)\n"
            "  --zero {2,3}                      fsdp: ZeRO stage, 3 reshards after forward (default %d)\n"
            "  --nested                          fsdp: every Linear / Conv2d is its own unit\n"
            "  --auto-wrap-min-params N          fsdp: submodules with >= N parameters are units\n"
            "  --grad-ckpt                       rematerialize each unit's forward in backward\n"
            "  --metrics                         print the metrics report at the end (rank 0)\n"
            "  --trace DIR                       write a profiler trace to DIR/proc_<rank>/trace.json\n"
            "  --cache-dir DIR                   persistent compile cache (shared by the ranks)\n"
            "  --ckpt-dir DIR                    save checkpoints DIR/ckpt-step-<N> (HDF5, committed)\n"
            "  --ckpt-every N                    save every N steps (default 0 = only at the end)\n"
            "  --resume {auto,PREFIX}            resume from the latest committed checkpoint in\n"
            "                                    --ckpt-dir (auto; none = fresh start) or from PREFIX\n"
            "  --help                            this text\n"
            "exit codes: 0 ok, 1 runtime error, 2 bad flag, 3 data set missing or unreadable,\n"
            "            21 below --target-accuracy\n",
            d.model, d.data, CX_FASHION_MNIST_DIR, CX_MNIST_DIR, d.epochs, d.steps, d.batch_size, d.lr,
            d.momentum, d.optimizer, d.weight_decay, d.seed, d.log_every, d.threads, d.target_accuracy, d.width,
            d.depth, d.parallel, d.zero);
}

/* One-line error and exit 2, for every flag problem. */
static void bad_flag(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "train: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, " (see train --help)\n");
    exit(EXIT_USAGE);
}

static long parse_long(const char *flag, const char *v, long lo, long hi)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        char range[64];
        snprintf(range, sizeof range, "an integer in [%ld, %ld]", lo, hi);
        fprintf(stderr, "train: %s: expected %s, got '%s' (see train --help)\n", flag, range, v);
        exit(EXIT_USAGE);
    }
    return x;
}

static double parse_double(const char *flag, const char *v, double lo)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < lo) {
        fprintf(stderr, "train: %s: expected a number >= %g, got '%s' (see train --help)\n", flag, lo, v);
        exit(EXIT_USAGE);
    }
    return x;
}

static const char *parse_choice(const char *flag, const char *v, const char *const *choices)
{
    for (int i = 0; choices[i]; i++)
        if (!strcmp(v, choices[i])) return choices[i];
    bad_flag("%s: unknown value '%s'", flag, v);
    return NULL;
}

static config parse_args(int argc, char **argv)
{
    static const char *const models[] = { "cnn", "lenet", "mlp", NULL };
    static const char *const datas[] = { "fashion-mnist", "mnist", "fake", NULL };
    static const char *const optims[] = { "sgd", "adam", "adamw", NULL };
    static const char *const parallels[] = { "none", "ddp", "xm", "fsdp", NULL };
    config c = default_config();
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0) bad_flag("unexpected argument '%s'%s", arg, "");
        /* switches without a value */
        if (!strcmp(arg, "--nested")) { c.nested = true; continue; }
        if (!strcmp(arg, "--grad-ckpt")) { c.grad_ckpt = true; continue; }
        if (!strcmp(arg, "--metrics")) { c.metrics = true; continue; }
        /* --flag=value or --flag value */
        char name[64];
        const char *eq = strchr(arg, '=');
        const char *v;
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (len >= sizeof name) bad_flag("unknown flag '%s'%s", arg, "");
        memcpy(name, arg, len);
        name[len] = '\0';
        if (eq) v = eq + 1;
        else if (i + 1 < argc) v = argv[++i];
        else { bad_flag("%s needs a value%s", name, ""); v = NULL; }

        if (!strcmp(name, "--model")) c.model = parse_choice(name, v, models);
        else if (!strcmp(name, "--data")) c.data = parse_choice(name, v, datas);
        else if (!strcmp(name, "--data-dir")) c.data_dir = v;
        else if (!strcmp(name, "--epochs")) c.epochs = (int)parse_long(name, v, 1, 1000000);
        else if (!strcmp(name, "--steps")) c.steps = parse_long(name, v, 0, 1L << 40);
        else if (!strcmp(name, "--batch-size")) c.batch_size = parse_long(name, v, 1, 1L << 20);
        else if (!strcmp(name, "--lr")) c.lr = parse_double(name, v, 0.0);
        else if (!strcmp(name, "--momentum")) c.momentum = parse_double(name, v, 0.0);
        else if (!strcmp(name, "--optimizer")) c.optimizer = parse_choice(name, v, optims);
        else if (!strcmp(name, "--weight-decay")) c.weight_decay = parse_double(name, v, 0.0);
        else if (!strcmp(name, "--seed")) c.seed = parse_long(name, v, 0, 1L << 62);
        else if (!strcmp(name, "--log-every")) c.log_every = parse_long(name, v, 1, 1L << 40);
        else if (!strcmp(name, "--threads")) c.threads = (int)parse_long(name, v, 0, 4096);
        else if (!strcmp(name, "--target-accuracy")) c.target_accuracy = parse_double(name, v, 0.0);
        else if (!strcmp(name, "--width")) c.width = parse_long(name, v, 1, 1L << 20);
        else if (!strcmp(name, "--depth")) c.depth = (int)parse_long(name, v, 0, 1000);
        else if (!strcmp(name, "--parallel")) c.parallel = parse_choice(name, v, parallels);
        else if (!strcmp(name, "--ckpt-dir")) c.ckpt_dir = v;
        else if (!strcmp(name, "--ckpt-every")) c.ckpt_every = parse_long(name, v, 0, 1L << 40);
        else if (!strcmp(name, "--resume")) c.resume = v;
        else if (!strcmp(name, "--zero")) c.zero = (int)parse_long(name, v, 2, 3);
        else if (!strcmp(name, "--auto-wrap-min-params")) c.auto_wrap_min_params = parse_long(name, v, 1, 1L << 40);
        else if (!strcmp(name, "--trace")) c.trace_dir = v;
        else if (!strcmp(name, "--cache-dir")) c.cache_dir = v;
        else bad_flag("unknown flag '%s'%s", name, "");
    }
    return c;
}

/* ---- data ------------------------------------------------------------------- */

/* @return the split, or exits 3 naming the missing file. */
static cx_dataset *load_split(const config *c, bool train)
{
    cx_dataset *ds = NULL;
    cx_status st;
    if (!strcmp(c->data, "fake")) {
        cx_fake_data_opts f = cx_fake_data_default_opts();
        f.size = train ? 60000 : 10000;
        f.seed = (uint64_t)c->seed + (train ? 0 : 1);
        st = cx_fake_data(f, &ds);
    } else {
        cx_mnist_opts o = cx_mnist_default_opts();
        o.kind = !strcmp(c->data, "mnist") ? CX_DATASET_MNIST : CX_DATASET_FASHION_MNIST;
        o.dir = c->data_dir;
        o.train = train;
        st = cx_mnist_load(o, &ds);
    }
    if (st != CX_OK) {
        fprintf(stderr, "train: %s\n", cx_last_error());
        exit(st == CX_ERR_OOM ? EXIT_RUNTIME : EXIT_DATA);
    }
    return ds;
}

/* ---- model and optimizer ---------------------------------------------------------- */

static cx_module *build_model(const config *c, const cx_dataset *ds)
{
    int64_t chw[3];
    cx_dataset_image_shape(ds, chw);
    if (!strcmp(c->model, "cnn")) return model_cnn();
    if (!strcmp(c->model, "lenet")) return model_lenet();
    return model_mlp(chw[0] * chw[1] * chw[2], c->width, c->depth, cx_dataset_num_classes(ds));
}

/* Over the model's parameters, or FSDP's flat shards. */
static cx_optimizer *build_optimizer(const config *c, cx_module *model, cx_fsdp *fsdp)
{
    int n;
    cx_named_tensor *params = fsdp ? cx_fsdp_parameters(fsdp, &n) : cx_module_parameters(model, &n);
    if (!params) return NULL;
    cx_optimizer *opt;
    if (!strcmp(c->optimizer, "sgd")) {
        cx_sgd_opts o = cx_sgd_default_opts();
        o.lr = c->lr;
        o.momentum = c->momentum;
        o.weight_decay = c->weight_decay;
        opt = cx_optim_sgd(params, n, o);
    } else {
        bool w = !strcmp(c->optimizer, "adamw");
        cx_adam_opts o = w ? cx_adamw_default_opts() : cx_adam_default_opts();
        o.lr = c->lr;
        o.weight_decay = c->weight_decay;
        opt = w ? cx_optim_adamw(params, n, o) : cx_optim_adam(params, n, o);
    }
    free(params);
    return opt;
}

/* ---- training -------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A loss kept past its step, printed once that step has run (reading it
 * earlier would execute part of the graph twice). */
typedef struct {
    cx_tensor *loss;
    int64_t batch;
} pending_log;

static void flush_log(pending_log *p, int epoch, int64_t batch_size, int64_t dataset_size, int64_t batches)
{
    if (!p->loss) return;
    /* samples seen by all ranks together, as the single-process log counts them */
    printf("Train Epoch: %d [%lld/%lld (%.0f%%)]\tLoss: %.6f\n", epoch, (long long)(p->batch * batch_size * cx_world_size()),
           (long long)dataset_size, 100.0 * (double)p->batch / (double)batches, cx_item(p->loss));
    fflush(stdout);
    cx_free(p->loss);
    p->loss = NULL;
}

/* One epoch. The loader marks the steps: each cx_loader_next ends the
 * previous step (compile-or-hit, run) and begins the next. @return status. */
/* How one step's gradients are averaged over the ranks. */
typedef struct {
    cx_ddp *ddp;      /* --parallel ddp */
    bool xm;          /* --parallel xm: cx_optimizer_step */
    cx_fsdp *fsdp;    /* --parallel fsdp: the module's forward hooks gather, autograd reduce-scatters */
} parallel_mode;

/* ---- checkpoints ------------------------------------------------------------------ */

/* What a checkpoint saves for this run's wrapping (FSDP: the wrapper's
 * shards and metadata; DDP/xm: the replicated module, from rank 0). */
static cx_ckpt_model ckpt_model_of(const config *c, const parallel_mode *par, cx_module *model)
{
    if (par->fsdp) return cx_ckpt_model_fsdp(par->fsdp, c->zero != 2);
    if (par->ddp) return cx_ckpt_model_ddp(cx_ddp_module(par->ddp));
    if (par->xm) return cx_ckpt_model_ddp(model);
    return cx_ckpt_model_single(model);
}

static struct {
    const config *c;
    cx_ckpt_model model;
    cx_optimizer *opt;
    int64_t resume_epoch, resume_position;   /* where a resumed run continues */
    int64_t last_saved;                      /* step of the last save (-1: none) */
    char last_prefix[4096];                  /* its prefix */
} g_ckpt = { .resume_epoch = 1, .last_saved = -1 };

static cx_status ckpt_save_now(int64_t epoch, int64_t position)
{
    int64_t step = cx_optim_step_count(g_ckpt.opt);
    char prefix[4096];
    snprintf(prefix, sizeof prefix, "%s/ckpt-step-%lld", g_ckpt.c->ckpt_dir, (long long)step);
    cx_ckpt_extra ex = { step, epoch, position };
    cx_status st = cx_ckpt_save(prefix, g_ckpt.model, g_ckpt.opt, &ex);
    if (st != CX_OK) fprintf(stderr, "train: checkpoint save failed: %s\n", cx_last_error());
    else if (cx_global_ordinal() == 0) printf("Saved checkpoint %s\n", prefix);
    fflush(stdout);
    g_ckpt.last_saved = step;
    snprintf(g_ckpt.last_prefix, sizeof g_ckpt.last_prefix, "%s", prefix);
    return st;
}

/* Loads --resume (auto: the latest committed checkpoint, or a fresh start
 * with a notice). @return CX_OK or the load's error. */
static cx_status ckpt_setup(const config *c, const parallel_mode *par, cx_module *model, cx_optimizer *opt)
{
    g_ckpt.c = c;
    g_ckpt.model = ckpt_model_of(c, par, model);
    g_ckpt.opt = opt;
    if (c->ckpt_dir && mkdir(c->ckpt_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "train: cannot create --ckpt-dir %s: %s\n", c->ckpt_dir, strerror(errno));
        return CX_ERR_IO;
    }
    if (!c->resume) return CX_OK;
    char prefix[4096];
    if (!strcmp(c->resume, "auto")) {
        if (!c->ckpt_dir || cx_ckpt_latest(c->ckpt_dir, prefix, sizeof prefix) != CX_OK) {
            if (cx_global_ordinal() == 0)
                printf("train: notice: no committed checkpoint in %s, starting fresh\n",
                       c->ckpt_dir ? c->ckpt_dir : "(no --ckpt-dir)");
            return CX_OK;
        }
    } else {
        snprintf(prefix, sizeof prefix, "%s", c->resume);
    }
    cx_ckpt_extra ex;
    if (cx_ckpt_load(prefix, g_ckpt.model, opt, &ex) != CX_OK) {
        fprintf(stderr, "train: cannot resume: %s\n", cx_last_error());
        return CX_ERR_IO;
    }
    g_ckpt.resume_epoch = ex.epoch > 0 ? ex.epoch : 1;
    g_ckpt.resume_position = ex.sampler_position;
    g_ckpt.last_saved = ex.step;
    snprintf(g_ckpt.last_prefix, sizeof g_ckpt.last_prefix, "%s", prefix);
    if (cx_global_ordinal() == 0)
        printf("Resumed from %s: step %lld, epoch %lld, sample %lld\n", prefix, (long long)ex.step, (long long)ex.epoch,
               (long long)ex.sampler_position);
    return CX_OK;
}

/* Starts an epoch where a resumed run left it. @return steps already done in it. */
static int64_t ckpt_start_epoch(cx_loader *loader, int epoch, int64_t batch_size)
{
    int64_t pos = epoch == g_ckpt.resume_epoch ? g_ckpt.resume_position : 0;
    if (cx_loader_set_epoch(loader, epoch, pos) != CX_OK) {
        pos = 0;
        cx_loader_set_epoch(loader, epoch, 0);
    }
    g_ckpt.resume_position = 0;
    return pos / batch_size;
}

/* After a step: saves every --ckpt-every steps (ending the step first, so
 * the saved state is the step's result). */
static cx_status ckpt_after_step(cx_loader *loader, int epoch)
{
    const config *c = g_ckpt.c;
    if (!c->ckpt_dir || c->ckpt_every <= 0 || cx_optim_step_count(g_ckpt.opt) % c->ckpt_every) return CX_OK;
    cx_status st = cx_loader_end_step(loader);
    return st != CX_OK ? st : ckpt_save_now(epoch, cx_loader_position(loader));
}

/* The save at the end of training (unless that step is saved already):
 * the next epoch, from its start. */
static cx_status ckpt_final_save(int epochs)
{
    if (!g_ckpt.c->ckpt_dir || g_ckpt.last_saved == cx_optim_step_count(g_ckpt.opt)) return CX_OK;
    return ckpt_save_now(epochs + 1, 0);
}

static cx_status train_epoch(const config *c, int epoch, cx_module *model, cx_optimizer *opt, cx_loader *loader,
                             int64_t dataset_size, const parallel_mode *par)
{
    cx_module_train(model, true);
    int64_t batches = cx_loader_len(loader), images = 0, steps = ckpt_start_epoch(loader, epoch, c->batch_size);
    pending_log log = { NULL, 0 };
    double t0 = now_s();
    cx_batch b;
    while (cx_loader_next(loader, &b)) {
        flush_log(&log, epoch, c->batch_size, dataset_size, batches);
        cx_optim_zero_grad(opt);
        cx_tensor *logp = par->ddp ? cx_ddp_forward(par->ddp, b.images)   // (B, 10)
                                   : cx_module_forward(model, b.images);
        cx_tensor *loss = cx_nll_loss(logp, b.labels, CX_REDUCE_MEAN, -100);
        cx_status st = par->ddp ? cx_ddp_backward(par->ddp, loss) : cx_backward(loss);
        if (st == CX_OK) st = par->xm ? cx_optimizer_step(opt) : cx_optim_step(opt);
        if (st != CX_OK) {
            fprintf(stderr, "train: step %lld: %s\n", (long long)b.index, cx_last_error());
            cx_loader_end_step(loader);
            return st;
        }
        if (b.index % c->log_every == 0) log = (pending_log){ cx_keep(loss), b.index };
        images += b.size;
        if (ckpt_after_step(loader, epoch) != CX_OK) return CX_ERR_IO;
        if (++steps == c->steps) {
            cx_loader_end_step(loader);
            break;
        }
    }
    if (cx_loader_error(loader) != CX_OK) {
        fprintf(stderr, "train: epoch %d: %s\n", epoch, cx_last_error());
        cx_free(log.loss);
        return cx_loader_error(loader);
    }
    flush_log(&log, epoch, c->batch_size, dataset_size, batches);
    double dt = now_s() - t0;
    printf("Epoch %d: %lld steps, %lld images in %.1f s (%.1f images/s%s), peak device memory %.1f MB\n", epoch,
           (long long)steps, (long long)images, dt, (double)images / dt, cx_world_size() > 1 ? " on this rank" : "",
           (double)cx_memory_peak() / 1e6);
    fflush(stdout);
    return CX_OK;
}

static void sum_reduce(const double *all, int world, int n, double *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = 0;
        for (int r = 0; r < world; r++) out[i] += all[r * n + i];
    }
}

/* Accuracy in percent over a whole split. Correct predictions are summed on
 * the device into one persistent counter, read once at the end. */
static double evaluate_on(cx_module *model, cx_loader *loader, bool all_ranks)
{
    cx_module_train(model, false);
    cx_loader_set_epoch(loader, 0, 0);
    cx_tensor *correct = cx_zeros(NULL, 0, CX_I64);
    cx_sync_tensors(&correct, 1);
    int64_t seen = 0;
    cx_no_grad_begin();
    cx_batch b;
    while (cx_loader_next(loader, &b)) {
        cx_tensor *pred = cx_argmax(cx_module_forward(model, b.images), 1, false);   // (B) i64
        cx_tensor *hits = cx_sum(cx_cast(cx_eq(pred, b.labels), CX_I64), NULL, 0, false);
        cx_assign(correct, cx_add(correct, hits));
        seen += b.size;
    }
    cx_no_grad_end();
    /* every rank evaluates its shard of the test set: average over ranks */
    double local[2] = { cx_item(correct), (double)seen }, total[2] = { 0, 0 };
    cx_free(correct);
    if (!all_ranks) return local[1] > 0 ? 100.0 * local[0] / local[1] : 0.0;
    if (cx_mesh_reduce("test_accuracy", local, 2, sum_reduce, total) != CX_OK) return NAN;
    return total[1] > 0 ? 100.0 * total[0] / total[1] : 0.0;
}

static double evaluate(cx_module *model, cx_loader *loader) { return evaluate_on(model, loader, true); }

/* As PyTorch/XLA's FSDP test: rank 0 stitches the last (sharded)
 * checkpoint into one file, loads it into an unwrapped model, evaluates the
 * whole test set and checks the accuracy equals the sharded model's. */
static int consolidate_and_check(const config *c, const cx_dataset *train_set, cx_dataset *test_set, double sharded_acc)
{
    if (cx_global_ordinal() != 0) return 0;
    char out[sizeof g_ckpt.last_prefix + 32];
    snprintf(out, sizeof out, "%s_consolidated.h5", g_ckpt.last_prefix);
    if (cx_ckpt_consolidate(g_ckpt.last_prefix, out, cx_ckpt_consolidate_default_opts()) != CX_OK) {
        fprintf(stderr, "train: consolidating %s: %s\n", g_ckpt.last_prefix, cx_last_error());
        return EXIT_RUNTIME;
    }
    cx_module *full = build_model(c, train_set);
    cx_sampler_opts so = cx_sampler_default_opts();
    so.shuffle = false;
    cx_sampler *sampler = full ? cx_sampler_new(cx_dataset_size(test_set), so) : NULL;
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = c->batch_size;
    cx_loader *loader = sampler ? cx_loader_new(test_set, sampler, lo) : NULL;
    int rc = 0;
    if (!loader || cx_ckpt_load_full(out, cx_ckpt_model_single(full), NULL, NULL) != CX_OK) {
        fprintf(stderr, "train: reloading %s: %s\n", out, cx_last_error());
        rc = EXIT_RUNTIME;
    } else {
        double acc = evaluate_on(full, loader, false);
        printf("Checkpoint consolidated, Accuracy=%.2f (sharded model: %.2f)\n", acc, sharded_acc);
        fflush(stdout);
        if (fabs(acc - sharded_acc) > 1e-9) {
            fprintf(stderr, "train: the consolidated model's accuracy %.2f%% differs from the sharded model's %.2f%%\n", acc,
                    sharded_acc);
            rc = EXIT_RUNTIME;
        }
    }
    cx_loader_free(loader);
    cx_sampler_free(sampler);
    cx_module_free(full);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) {
        fprintf(stderr, "train: cannot start the distributed runtime: %s\n", cx_last_error());
        return EXIT_RUNTIME;
    }
    config c = parse_args(argc, argv);
    int rank = cx_global_ordinal(), world = cx_world_size();
    if (c.threads > 0) cx_set_num_threads(c.threads);
    cx_manual_seed((uint64_t)c.seed);
    /* the persistent cache must be set up before the first compile */
    if (c.cache_dir && cx_cache_init(c.cache_dir, false) != CX_OK) {
        fprintf(stderr, "train: --cache-dir: %s\n", cx_last_error());
        return EXIT_RUNTIME;
    }
    if (c.trace_dir && cx_trace_start(c.trace_dir) != CX_OK) {
        fprintf(stderr, "train: --trace: %s\n", cx_last_error());
        return EXIT_RUNTIME;
    }

    cx_dataset *train_set = load_split(&c, true);
    cx_dataset *test_set = load_split(&c, false);

    cx_module *model = build_model(&c, train_set);
    if (!model) {
        fprintf(stderr, "train: cannot build model %s: %s\n", c.model, cx_last_error());
        return EXIT_RUNTIME;
    }
    int64_t num_params = cx_module_num_params(model);

    /* data parallelism: every rank starts from rank 0's weights */
    parallel_mode par = { NULL, false, NULL };
    if (!strcmp(c.parallel, "fsdp")) {
        cx_fsdp_opts fo = cx_fsdp_default_opts();
        static const char *const unit_types[] = { "Linear", "Conv2d" };
        fo.reshard_after_forward = c.zero == 3;
        fo.auto_wrap_min_params = c.auto_wrap_min_params;
        if (c.nested) { fo.auto_wrap_types = unit_types; fo.n_auto_wrap_types = 2; }
        fo.grad_ckpt = c.grad_ckpt;
        par.fsdp = cx_fsdp_wrap(model, fo);
        if (!par.fsdp) {
            fprintf(stderr, "train: %s\n", cx_last_error());
            return EXIT_RUNTIME;
        }
    } else if (!strcmp(c.parallel, "ddp")) {
        par.ddp = cx_ddp_wrap(model, cx_ddp_default_opts());
        if (!par.ddp) {
            fprintf(stderr, "train: %s\n", cx_last_error());
            return EXIT_RUNTIME;
        }
    } else if (world > 1) {
        par.xm = !strcmp(c.parallel, "xm");
        if (cx_broadcast_master_params(model) != CX_OK) {
            fprintf(stderr, "train: %s\n", cx_last_error());
            return EXIT_RUNTIME;
        }
        if (!par.xm && rank == 0)
            fprintf(stderr, "train: notice: %d ranks with --parallel none train independent replicas\n", world);
    }
    if (c.grad_ckpt && !par.fsdp) {
        /* every child of the top Sequential recomputes its forward in backward */
        for (int i = 0; i < cx_module_num_children(model); i++) cx_checkpoint_module(cx_module_child(model, i));
    }
    cx_optimizer *opt = build_optimizer(&c, model, par.fsdp);
    if (!opt) {
        fprintf(stderr, "train: cannot build the optimizer: %s\n", cx_last_error());
        return EXIT_RUNTIME;
    }
    if (rank == 0)
        printf("model %s: %lld parameters; optimizer %s lr %g; data %s, %lld train / %lld test images; "
               "%d rank(s), parallel %s\n", c.model, (long long)num_params, cx_optim_name(opt), c.lr,
               c.data, (long long)cx_dataset_size(train_set), (long long)cx_dataset_size(test_set), world, c.parallel);

    cx_sampler_opts so = cx_sampler_default_opts();
    so.seed = (uint64_t)c.seed;
    so.rank = rank;
    so.world_size = world;
    cx_sampler *train_sampler = cx_sampler_new(cx_dataset_size(train_set), so);
    so.shuffle = false;
    cx_sampler *test_sampler = cx_sampler_new(cx_dataset_size(test_set), so);
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = c.batch_size;
    cx_loader *train_loader = train_sampler ? cx_loader_new(train_set, train_sampler, lo) : NULL;
    cx_loader *test_loader = test_sampler ? cx_loader_new(test_set, test_sampler, lo) : NULL;
    if (!train_loader || !test_loader) {
        fprintf(stderr, "train: cannot start the data loaders: %s\n", cx_last_error());
        return EXIT_RUNTIME;
    }

    int rc = 0;
    double acc = 0.0;
    if (ckpt_setup(&c, &par, model, opt) != CX_OK) rc = EXIT_RUNTIME;
    for (int epoch = (int)g_ckpt.resume_epoch; epoch <= c.epochs && rc == 0; epoch++) {
        if (train_epoch(&c, epoch, model, opt, train_loader, cx_dataset_size(train_set), &par) != CX_OK) {
            rc = EXIT_RUNTIME;
            break;
        }
        acc = evaluate(model, test_loader);
        if (cx_loader_error(test_loader) != CX_OK || isnan(acc)) {
            fprintf(stderr, "train: evaluation failed: %s\n", cx_last_error());
            rc = EXIT_RUNTIME;
            break;
        }
        if (rank == 0) printf("Test accuracy: %.2f%%\n", acc);
        fflush(stdout);
    }
    if (rc == 0 && ckpt_final_save(c.epochs) != CX_OK) rc = EXIT_RUNTIME;
    if (rc == 0 && par.fsdp && c.ckpt_dir && g_ckpt.last_prefix[0]) rc = consolidate_and_check(&c, train_set, test_set, acc);
    if (rc == 0 && c.target_accuracy > 0 && acc < c.target_accuracy) {
        fprintf(stderr, "train: test accuracy %.2f%% is below the target %.2f%%\n", acc, c.target_accuracy);
        rc = EXIT_BELOW_TARGET;
    }

    if (c.trace_dir && cx_trace_stop() != CX_OK) fprintf(stderr, "train: --trace: %s\n", cx_last_error());
    if (c.metrics && rank == 0) {
        char *report = cx_metrics_report();
        if (report) printf("%s", report);
        free(report);
        fflush(stdout);
    }

    cx_loader_free(train_loader);
    cx_loader_free(test_loader);
    cx_sampler_free(train_sampler);
    cx_sampler_free(test_sampler);
    cx_ddp_free(par.ddp);
    cx_optim_free(opt);
    cx_fsdp_free(par.fsdp);
    cx_module_free(model);
    cx_dataset_free(train_set);
    cx_dataset_free(test_set);
    cx_dist_finalize();
    return rc;
}
