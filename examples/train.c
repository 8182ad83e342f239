/* train: the reference cxla trainer (MNIST / Fashion-MNIST classifiers,
 * ResNets on fake data or image folders).
 *
 * Read it top to bottom: flags, data, model, optimizer, then the loop. Each
 * training step is one lazy graph: forward, backward and the optimizer
 * update are recorded between the loader's step marks and compiled once.
 * The seed's ImageNet recipe flags (lr schedule, eval interval, drop_last,
 * nested FSDP and checkpointing of the model's blocks) and the
 * learning-curve log live in recipe.c; `train plot --log-file F.jsonl
 * --out F.png|F.svg` draws that log.
 *
 * Exit codes: 0 success, 1 runtime error, 2 bad flag, 3 data set missing or
 * unreadable, 21 test accuracy below --target-accuracy, 75 preempted
 * (SIGTERM with --ckpt-dir: every rank saved at the same step).
 */
#include <cxla/cxla.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cx_cli.h"
#include "models.h"
#include "precision.h"
#include "resnet.h"
#include "recipe.h"
#include "train_data.h"

enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2, EXIT_DATA = 3, EXIT_BELOW_TARGET = 21, EXIT_PREEMPTED = 75 };

/* ---- flags ------------------------------------------------------------------ */

typedef struct {
    const char *model;        /* cnn, lenet, mlp, resnet18, resnet50 */
    const char *data;         /* fashion-mnist, mnist, fake */
    const char *data_dir;     /* NULL: the data set's default */
    int image_size;           /* fake: N x N, imagefolder: the crop; 0: the set's own (28; 224 for resnets, imagefolder) */
    int epochs;
    int64_t steps;            /* per epoch; 0: the whole epoch */
    int64_t batch_size;
    double lr, momentum, weight_decay;
    const char *optimizer;    /* sgd, adam, adamw */
    int64_t seed;
    int64_t log_every;
    int threads;              /* 0: the library's default */
    double target_accuracy;   /* percent; 0: no target */
    int64_t width;
    int depth;
    const char *parallel;     /* none, ddp, xm, fsdp, spmd */
    const char *grad_comm;    /* ddp, xm: f32 or bf16 */
    const char *precision_flag;
    bool precision_given;       /* --precision was on the command line */
    precision precision;
    int zero;                 /* fsdp: 2 or 3 */
    bool nested;              /* fsdp: every Linear / Conv2d its own unit */
    int64_t auto_wrap_min_params;   /* 0: not given */
    bool grad_ckpt;
    bool deferred_init;       /* build the parameters as recipes; fsdp makes only each rank's shard */
    const char *ckpt_dir;     /* NULL: no checkpoints */
    int64_t ckpt_every;       /* steps between saves; 0: only at the end */
    const char *resume;       /* NULL, "auto" or a checkpoint prefix */
    bool metrics;             /* print the metrics report at the end */
    bool log_all_ranks;       /* every rank prints its own loss and epoch lines */
    const char *trace_dir;    /* profiler output, NULL: off */
    const char *cache_dir;    /* persistent compile cache, NULL: off */
    recipe_flags r;           /* the seed's ImageNet recipe flags (recipe.h) */
    int num_workers;          /* loader threads decoding in parallel (imagefolder) */
    int loader_prefetch;      /* host batches gathered ahead (with workers) */
    int device_prefetch;      /* batches uploaded ahead */
    const char *bad_images;   /* imagefolder: skip or stop */
} config;

static const char *const k_models[] = { "cnn", "lenet", "mlp", "resnet18", "resnet50", NULL };
static const char *const k_datas[] = { "fashion-mnist", "mnist", "fake", "imagefolder", NULL };
static const char *const k_optims[] = { "sgd", "adam", "adamw", NULL };
static const char *const k_parallels[] = { "none", "ddp", "xm", "fsdp", "spmd", NULL };
static const char *const k_grad_comms[] = { "f32", "bf16", NULL };
static const char *const k_bad_images[] = { "skip", "stop", NULL };

/* The defaults, then the flags given. The table is also the --help text.
 * @return a cli_result (help printed, or one error line printed). */
static cli_result parse_flags(config *c, int argc, char **argv)
{
    *c = (config){
        .model = "cnn", .data = "fashion-mnist", .epochs = 1, .batch_size = 64, .lr = 0.01, .momentum = 0.5,
        .optimizer = "sgd", .seed = 1, .log_every = 100, .width = 128, .depth = 2, .parallel = "none", .zero = 3,
        .grad_comm = "f32", .precision_flag = "f32", .r = recipe_default_flags(), .num_workers = 2,
        .loader_prefetch = 4, .device_prefetch = 2, .bad_images = "skip",
    };
    const cli_flag flags[] = {
        { .name = "model", .kind = CLI_CHOICE, .dest = &c->model, .choices = k_models, .help = "model" },
        { .name = "data", .kind = CLI_CHOICE, .dest = &c->data, .choices = k_datas, .help = "data set" },
        { .name = "data-dir", .kind = CLI_STRING, .dest = &c->data_dir, .metavar = "DIR",
          .help = "IDX files (default " CX_FASHION_MNIST_DIR "\nfor fashion-mnist, " CX_MNIST_DIR " for mnist);\n"
                  "imagefolder: ROOT with ROOT/train and ROOT/val" },
        { .name = "image-size", .kind = CLI_INT, .dest = &c->image_size, .min = 8, .max = 4096,
          .help = "fake data: N x N images (default 28; for the resnets\n3 x 224 x 224, 1000 classes); imagefolder: the\n"
                  "crop (default 224)" },
        { .name = "num-workers", .kind = CLI_INT, .dest = &c->num_workers, .min = 0, .max = 256,
          .help = "imagefolder: loader threads decoding in parallel" },
        { .name = "loader-prefetch-size", .kind = CLI_INT, .dest = &c->loader_prefetch, .min = 1, .max = 1024,
          .help = "host batches decoded ahead (with --num-workers)" },
        { .name = "device-prefetch-size", .kind = CLI_INT, .dest = &c->device_prefetch, .min = 1, .max = 1024,
          .help = "batches uploaded ahead of the step" },
        { .name = "bad-images", .kind = CLI_CHOICE, .dest = &c->bad_images, .choices = k_bad_images,
          .help = "imagefolder: a corrupt or truncated image is named\nand skipped (counted), or stops the run (exit 1)" },
        { .name = "epochs", .kind = CLI_INT, .dest = &c->epochs, .min = 1, .max = 1000000, .help = "epochs" },
        { .name = "steps", .kind = CLI_I64, .dest = &c->steps, .min = 0, .max = 0x1p40, .help = "steps per epoch, 0 = all" },
        { .name = "batch-size", .kind = CLI_I64, .dest = &c->batch_size, .min = 1, .max = 0x1p20, .help = "images per step on each rank: the global\n"
          "batch is N x ranks (spmd: N is the global batch)" },
        { .name = "lr", .kind = CLI_DOUBLE, .dest = &c->lr, .min = 0, .max = INFINITY, .help = "learning rate" },
        { .name = "momentum", .kind = CLI_DOUBLE, .dest = &c->momentum, .min = 0, .max = INFINITY,
          .help = "SGD momentum" },
        { .name = "optimizer", .kind = CLI_CHOICE, .dest = &c->optimizer, .choices = k_optims, .help = "optimizer" },
        { .name = "weight-decay", .kind = CLI_DOUBLE, .dest = &c->weight_decay, .min = 0, .max = INFINITY,
          .help = "weight decay" },
        { .name = "seed", .kind = CLI_I64, .dest = &c->seed, .min = 0, .max = 0x1p62,
          .help = "RNG seed for init and shuffling" },
        { .name = "log-every", .kind = CLI_I64, .dest = &c->log_every, .min = 1, .max = 0x1p40,
          .help = "log the loss every N steps" },
        { .name = "threads", .kind = CLI_INT, .dest = &c->threads, .min = 0, .max = 4096,
          .help = "compute threads, 0 = all cores" },
        { .name = "target-accuracy", .kind = CLI_DOUBLE, .dest = &c->target_accuracy, .metavar = "PCT", .min = 0,
          .max = INFINITY, .help = "exit 21 if the final test accuracy is below, 0 = off" },
        { .name = "width", .kind = CLI_I64, .dest = &c->width, .min = 1, .max = 0x1p20, .help = "mlp hidden width" },
        { .name = "depth", .kind = CLI_INT, .dest = &c->depth, .min = 0, .max = 1000, .help = "mlp hidden layers" },
        { .name = "parallel", .kind = CLI_CHOICE, .dest = &c->parallel, .choices = k_parallels, .given = &c->r.parallel_given,
          .help = "data parallelism over the ranks of xla-launch:\n"
                  "ddp = DistributedDataParallel, xm = xm.optimizer_step,\nfsdp = fully sharded, "
                  "spmd = the seed's mnist_xla.py\nshardings (cnn; an even number of ranks)" },
        { .name = "grad-comm", .kind = CLI_CHOICE, .dest = &c->grad_comm, .choices = k_grad_comms,
          .help = "ddp, xm: gradients all-reduced as they are, or\nas bf16 summed in f32 (bf16_compress_hook)" },
        { .name = "precision", .kind = CLI_STRING, .dest = &c->precision_flag, .metavar = "P", .given = &c->precision_given,
          .help = PRECISION_HELP },
        { .name = "zero", .kind = CLI_INT, .dest = &c->zero, .metavar = "{2,3}", .min = 2, .max = 3,
          .help = "fsdp: ZeRO stage, 3 reshards after forward" },
        { .name = "nested", .kind = CLI_BOOL, .dest = &c->nested, .help = "fsdp: every Linear / Conv2d is its own unit" },
        { .name = "auto-wrap-min-params", .kind = CLI_I64, .dest = &c->auto_wrap_min_params, .min = 1, .max = 0x1p40,
          .help = "fsdp: submodules with >= N parameters are units" },
        { .name = "deferred-init", .kind = CLI_BOOL, .dest = &c->deferred_init,
          .help = "build the model without memory (PyTorch's meta\ndevice); fsdp generates each rank's shard only,\n"
                  "bit-identical to the whole init" },
        { .name = "grad-ckpt", .kind = CLI_BOOL, .dest = &c->grad_ckpt,
          .help = "rematerialize each unit's forward in backward" },
        { .name = "metrics", .kind = CLI_BOOL, .dest = &c->metrics,
          .help = "print the metrics report at the end (rank 0)" },
        { .name = "log-all-ranks", .kind = CLI_BOOL, .dest = &c->log_all_ranks,
          .help = "every rank prints its own losses and epoch line\n(speeds on this rank); default: rank 0, global" },
        { .name = "trace", .kind = CLI_STRING, .dest = &c->trace_dir, .metavar = "DIR",
          .help = "write a profiler trace to DIR/proc_<rank>/trace.json" },
        { .name = "cache-dir", .kind = CLI_STRING, .dest = &c->cache_dir, .metavar = "DIR",
          .help = "persistent compile cache (shared by the ranks)" },
        { .name = "ckpt-dir", .kind = CLI_STRING, .dest = &c->ckpt_dir, .metavar = "DIR",
          .help = "save checkpoints DIR/ckpt-step-<N> (HDF5, committed)" },
        { .name = "ckpt-every", .kind = CLI_I64, .dest = &c->ckpt_every, .min = 0, .max = 0x1p40,
          .help = "save every N steps, 0 = only at the end" },
        { .name = "resume", .kind = CLI_STRING, .dest = &c->resume, .metavar = "{auto,PREFIX,FILE.h5}",
          .help = "resume from the latest committed checkpoint in\n"
                  "--ckpt-dir (auto; none = fresh start), from PREFIX,\n"
                  "or from a consolidated FILE.h5 (any world size)" },
        { .name = "log-file", .kind = CLI_STRING, .dest = &c->r.log_file, .metavar = "F.jsonl",
          .help = "one JSON object per logged step and per evaluation\n(train plot draws it)" },
        /* the seed's test_train_mp_imagenet(_fsdp).py, spelled as it is (recipe.h) */
        { .name = "num_warmup_epochs", .kind = CLI_DOUBLE, .dest = &c->r.warmup_epochs, .metavar = "E", .min = 0,
          .max = 1e6, .given = &c->r.schedule_given[0],
          .help = "the lr ramps up linearly over E epochs, then is divided\n"
                  "by D every K epochs (WarmupAndExponentialDecayScheduler;\non when any of the three is given)" },
        { .name = "lr_scheduler_divide_every_n_epochs", .kind = CLI_INT, .dest = &c->r.divide_every, .metavar = "K",
          .min = 1, .max = 1000000, .given = &c->r.schedule_given[1], .help = "see --num_warmup_epochs" },
        { .name = "lr_scheduler_divisor", .kind = CLI_INT, .dest = &c->r.divisor, .metavar = "D", .min = 1,
          .max = 1000000, .given = &c->r.schedule_given[2], .help = "see --num_warmup_epochs" },
        { .name = "test_set_batch_size", .kind = CLI_I64, .dest = &c->r.test_batch_size, .min = 1, .max = 0x1p20,
          .help = "images per evaluation step on each rank\n(default: --batch-size)" },
        { .name = "eval_interval", .kind = CLI_INT, .dest = &c->r.eval_interval, .min = 1, .max = 1000000,
          .help = "evaluate every N epochs and after the last" },
        { .name = "drop_last", .kind = CLI_BOOL, .dest = &c->r.drop_last,
          .help = "drop the last incomplete batch (train and test) and\ncut the split to a multiple of the ranks" },
        { .name = "use_nested_fsdp", .kind = CLI_BOOL, .dest = &c->r.use_nested_fsdp,
          .help = "--parallel fsdp with the model's blocks as units\n(resnets: the residual blocks; cnn, lenet, mlp:\nevery Linear / Conv2d)" },
        { .name = "use_gradient_checkpointing", .kind = CLI_BOOL, .dest = &c->r.use_gradient_checkpointing,
          .help = "rematerialize the model's blocks in backward\n(any --parallel, nested FSDP units or not)" },
        { .name = "pjrt_distributed", .kind = CLI_BOOL,
          .help = "accepted as the seed's launch lines pass it: the ranks\n"
                  "come from xla-launch, mpirun or srun; the runtime is\nalways the distributed one" },
        { .name = "num_epochs", .synonym_of = "epochs" },
        { .name = "datadir", .synonym_of = "data-dir" },
        { .name = "fake_data", .synonym_of = "data", .preset = "fake" },
        { .name = "log_steps", .synonym_of = "log-every" },
    };
    const cli_spec spec = {
        .prog = "train",
        .args = "[flags]  |  train plot --log-file F.jsonl --out F.png|F.svg",
        .summary = "The reference cxla trainer (MNIST / Fashion-MNIST classifiers, ResNets on fake\n"
                   "data or image folders); run it through xla-launch for several ranks.",
        .epilog = "exit codes: 0 ok, 1 runtime error, 2 bad flag, 3 data set missing or unreadable,\n"
                  "            21 below --target-accuracy, 75 preempted (SIGTERM or Ctrl-C; saved in --ckpt-dir)",
        .flags = flags,
        .nflags = (int)(sizeof flags / sizeof *flags),
    };
    return cli_parse(&spec, argc, argv, NULL);
}

/* ---- data ------------------------------------------------------------------- */

static bool is_resnet(const config *c) { return !strncmp(c->model, "resnet", 6); }

/* Fake data's classes: ImageNet's for a resnet, MNIST's otherwise. */
static int fake_classes(const config *c) { return is_resnet(c) ? 1000 : 10; }

/* Fake data for a resnet is ImageNet-shaped, as the seed's --fake_data:
 * 3 x N x N (N = 224 unless --image-size), 1000 classes. Its test split is
 * one batch per rank: on random labels accuracy is chance whatever its
 * size, and a resnet50's forward at 224 costs ~8 GFLOP an image. */
static void fake_shape(const config *c, cx_fake_data_opts *f, bool train)
{
    bool imagenet = is_resnet(c);
    int n = c->image_size ? c->image_size : imagenet ? 224 : 28;
    f->channels = imagenet ? 3 : 1;
    f->height = f->width = n;
    f->num_classes = fake_classes(c);
    f->size = train ? 60000 : imagenet ? c->r.test_batch_size * cx_world_size() : 10000;
}

/* @return the split, or exits 3 naming the missing file. */
static cx_dataset *load_split(const config *c, bool train)
{
    cx_dataset *ds = NULL;
    cx_status st;
    if (!strcmp(c->data, "fake")) {
        cx_fake_data_opts f = cx_fake_data_default_opts();
        fake_shape(c, &f, train);
        f.seed = (uint64_t)c->seed + (train ? 0 : 1);
        st = cx_fake_data(f, &ds);
    } else if (!strcmp(c->data, "imagefolder")) {
        st = train_data_imagefolder(c->data_dir, train, c->image_size, (uint64_t)c->seed, !strcmp(c->bad_images, "stop"), &ds);
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

/* The image sets (MNIST, Fashion-MNIST, fake) have 10 classes, fake data
 * for a resnet 1000, an image folder its own; a resnet takes the set's
 * channels. */
static cx_module *build_model(const config *c, const cx_dataset *ds)
{
    const cx_field *img = cx_dataset_field(ds, cx_dataset_field_index(ds, CX_FIELD_IMAGES));   // (C, H, W)
    int classes = cx_imagefolder_num_classes(ds) ? cx_imagefolder_num_classes(ds)
                : !strcmp(c->data, "fake") ? fake_classes(c) : 10;
    if (!strcmp(c->model, "resnet18")) return model_resnet18((int)img->shape[0], classes, false);
    if (!strcmp(c->model, "resnet50")) return model_resnet50((int)img->shape[0], classes, false);
    if (!strcmp(c->model, "cnn")) return model_cnn();
    if (!strcmp(c->model, "lenet")) return model_lenet();
    return model_mlp(img->shape[0] * img->shape[1] * img->shape[2], c->width, c->depth, classes);
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
    double lr;
    int64_t step;        /* optimizer steps done, this one included */
} pending_log;

/* Where an epoch is, for its progress lines. */
typedef struct {
    int epoch;
    int64_t per_epoch;   /* steps an epoch runs: --steps, or the whole split */
    int64_t first;       /* the step this process started the epoch at (a resume skips some) */
    int64_t steps;       /* steps done in the epoch, the skipped ones included */
    int64_t images;      /* images this rank trained in the epoch */
    double t0;
} progress;

/* The whole run, for the last line. */
static struct {
    int64_t steps, images;   /* this process's run; images over all ranks */
    double train_s, t0;
    recipe_schedule sched;   /* the lr of every step */
    FILE *log;               /* --log-file (rank 0) */
} g_run;

/* Ranks that each read their own images: an SPMD batch is one global batch. */
static int64_t feeders(void) { return cx_is_spmd() ? 1 : cx_world_size(); }

static bool speaks(const config *c) { return c->log_all_ranks || cx_global_ordinal() == 0; }

/* "1:05" or "2:03:04". */
static void format_eta(char *out, size_t cap, double s)
{
    long t = s > 0 && s < 1e9 ? (long)(s + 0.5) : 0;
    if (t >= 3600) snprintf(out, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(out, cap, "%ld:%02ld", t / 60, t % 60);
}

/* Rank 0 speaks for the job: images of all ranks, the fraction of the
 * epoch actually run (--steps), the time left of the whole run. */
static void flush_log(pending_log *p, const config *c, const progress *pr, int64_t dataset_size)
{
    if (!p->loss) return;
    double loss = cx_item(p->loss);   /* on every rank: the same reads, whoever prints */
    cx_free(p->loss);
    p->loss = NULL;
    if (!speaks(c)) return;
    int64_t k = c->log_all_ranks ? 1 : feeders();
    int64_t total = c->steps ? pr->per_epoch * c->batch_size * feeders() : dataset_size;
    double dt = now_s() - pr->t0, done = (double)(pr->steps - pr->first);
    double left = (double)(pr->per_epoch - pr->steps + (int64_t)(c->epochs - pr->epoch) * pr->per_epoch);
    char eta[32];
    format_eta(eta, sizeof eta, done > 0 ? left * dt / done : 0);
    recipe_log_step(g_run.log, p->step, pr->epoch, loss, p->lr, dt > 0 ? (double)(pr->images * feeders()) / dt : 0.0);
    printf("Train Epoch: %d [%lld/%lld (%.0f%%)]\tLoss: %.6f  (%.1f images/s%s, ETA %s)\n", pr->epoch,
           (long long)(p->batch * c->batch_size * feeders()), (long long)total,
           100.0 * (double)p->batch / (double)pr->per_epoch, loss, dt > 0 ? (double)(pr->images * k) / dt : 0.0,
           c->log_all_ranks && cx_world_size() > 1 ? " on this rank" : "", eta);
    fflush(stdout);
}

/* One epoch. The loader marks the steps: each cx_loader_next ends the
 * previous step (compile-or-hit, run) and begins the next. @return status. */
/* How one step's gradients are averaged over the ranks. */
typedef struct {
    cx_ddp *ddp;      /* --parallel ddp */
    bool xm;          /* --parallel xm: cx_optimizer_step */
    cx_grad_comm grad_comm;   /* --grad-comm, for ddp and xm */
    cx_fsdp *fsdp;    /* --parallel fsdp: the module's forward hooks gather, autograd reduce-scatters */
    cx_mesh *conv_mesh;   /* --parallel spmd: the input's mesh; every rank feeds the global batch */
} parallel_mode;

/* ---- checkpoints ------------------------------------------------------------------ */

/* What a checkpoint saves for this run's wrapping (FSDP: the wrapper's
 * shards and metadata; DDP/xm: the replicated module, from rank 0; SPMD:
 * each rank's shards of the module, loaded into the shardings spmd_setup
 * marked). */
static cx_ckpt_model ckpt_model_of(const config *c, const parallel_mode *par, cx_module *model)
{
    if (par->fsdp) return cx_ckpt_model_fsdp(par->fsdp, c->zero != 2);
    if (par->conv_mesh) return cx_ckpt_model_spmd(model);
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
    cx_ckpt_manager *mgr;                    /* --ckpt-dir: preemption (SIGTERM) */
    bool preempted;
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
    if (c->ckpt_dir && !(g_ckpt.mgr = cx_ckpt_manager_new(c->ckpt_dir, cx_ckpt_manager_default_opts()))) {
        fprintf(stderr, "train: --ckpt-dir: %s\n", cx_last_error());
        return CX_ERR_IO;
    }
    if (!c->resume) return CX_OK;
    char prefix[4096];
    if (!strcmp(c->resume, "auto")) {
        if (cx_ckpt_latest(c->ckpt_dir, prefix, sizeof prefix) != CX_OK) {
            if (cx_global_ordinal() == 0) printf("train: notice: no committed checkpoint in %s, starting fresh\n", c->ckpt_dir);
            return CX_OK;
        }
    } else {
        snprintf(prefix, sizeof prefix, "%s", c->resume);
    }
    cx_ckpt_extra ex;
    /* a consolidated file (consolidate_ckpts' output) loads into any
     * wrapping; under FSDP each rank reads only its shard's ranges */
    size_t len = strlen(prefix);
    bool consolidated = len > 3 && !strcmp(prefix + len - 3, ".h5");
    cx_status st = consolidated ? cx_ckpt_load_full(prefix, g_ckpt.model, opt, &ex) : cx_ckpt_load(prefix, g_ckpt.model, opt, &ex);
    if (st != CX_OK) {
        fprintf(stderr, "train: cannot resume --model %s: %s\n", c->model, cx_last_error());
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
    int64_t step = cx_optim_step_count(g_ckpt.opt);
    /* every rank learns of a SIGTERM at the same step, saves it and stops */
    g_ckpt.preempted = g_ckpt.mgr && cx_ckpt_manager_reached_preemption(g_ckpt.mgr, step);
    bool interval = c->ckpt_dir && c->ckpt_every > 0 && step % c->ckpt_every == 0;
    if (!interval && !g_ckpt.preempted) return CX_OK;
    cx_status st = cx_loader_end_step(loader);
    if (st == CX_OK) st = ckpt_save_now(epoch, cx_loader_position(loader));
    if (st == CX_OK && g_ckpt.preempted && cx_global_ordinal() == 0)
        printf("train: preempted: saved step %lld in %s; rerun with --resume auto\n", (long long)step, c->ckpt_dir);
    return st;
}

/* The save at the end of training (unless that step is saved already):
 * the next epoch, from its start. */
static cx_status ckpt_final_save(int epochs)
{
    if (!g_ckpt.c->ckpt_dir || g_ckpt.last_saved == cx_optim_step_count(g_ckpt.opt)) return CX_OK;
    return ckpt_save_now(epochs + 1, 0);
}

/* Steps an epoch runs: --steps, or the whole split. */
static int64_t steps_per_epoch(const config *c, const cx_loader *loader)
{
    int64_t n = cx_loader_len(loader);
    return c->steps > 0 && c->steps < n ? c->steps : n;
}

/* "Epoch 1: ..." from rank 0 for all ranks, or from each rank for itself. */
static void epoch_line(const config *c, const progress *pr, double dt)
{
    if (!speaks(c)) return;
    int64_t k = c->log_all_ranks ? 1 : feeders(), images = pr->images * k;
    char where[48] = "";
    if (cx_world_size() > 1)
        snprintf(where, sizeof where, c->log_all_ranks ? " on this rank" : " on %d ranks", cx_world_size());
    printf("Epoch %d: %lld steps, %lld images in %.1f s (%.1f images/s%s), peak device memory %.1f MB\n", pr->epoch,
           (long long)(pr->steps - pr->first), (long long)images, dt, dt > 0 ? (double)images / dt : 0.0, where,
           (double)cx_memory_peak() / 1e6);
    fflush(stdout);
}

static cx_status train_epoch(const config *c, int epoch, cx_module *model, cx_optimizer *opt, cx_loader *loader,
                             int64_t dataset_size, const parallel_mode *par)
{
    cx_module_train(model, true);
    progress pr = { .epoch = epoch, .per_epoch = steps_per_epoch(c, loader), .t0 = now_s() };
    pr.first = pr.steps = ckpt_start_epoch(loader, epoch, c->batch_size);
    pending_log log = { .loss = NULL };
    cx_batch b;
    while (pr.steps < pr.per_epoch && cx_loader_next(loader, &b) == CX_LOADER_BATCH) {
        flush_log(&log, c, &pr, dataset_size);
        cx_optim_zero_grad(opt);
        if (g_run.sched.on)   /* a runtime scalar: no recompile */
            cx_optim_set_lr(opt, recipe_lr_at(&g_run.sched, cx_optim_step_count(opt)));
        cx_tensor *x = cx_batch_field(&b, CX_FIELD_IMAGES), *y = cx_batch_field(&b, CX_FIELD_LABELS);
        precision_forward_begin(c->precision);
        cx_tensor *logp = par->ddp ? cx_ddp_forward(par->ddp, x)   // (B, classes)
                                   : cx_module_forward(model, x);
        if (is_resnet(c)) logp = cx_log_softmax(logp, 1);   /* the resnets give logits, as torchvision's */
        cx_tensor *loss = cx_nll_loss(logp, y, CX_REDUCE_MEAN, -100);
        precision_forward_end(c->precision);
        cx_status st = par->ddp ? cx_ddp_backward(par->ddp, loss) : par->fsdp ? cx_fsdp_backward(par->fsdp, loss) : cx_backward(loss);
        if (st == CX_OK) st = par->xm ? cx_optimizer_step_as(opt, par->grad_comm) : cx_optim_step(opt);
        if (st != CX_OK) {
            fprintf(stderr, "train: step %lld: %s\n", (long long)b.index, cx_last_error());
            cx_loader_end_step(loader);
            return st;
        }
        if (b.index % c->log_every == 0)
            log = (pending_log){ cx_keep(loss), b.index, cx_optim_get_lr(opt), cx_optim_step_count(opt) };
        pr.images += b.size;
        pr.steps++;
        g_run.steps++;
        g_run.images += b.size * feeders();
        if (ckpt_after_step(loader, epoch) != CX_OK) return CX_ERR_IO;
        if (g_ckpt.preempted) return CX_OK;
    }
    cx_loader_end_step(loader);
    if (cx_loader_error(loader) != CX_OK) {
        fprintf(stderr, "train: epoch %d: %s\n", epoch, cx_last_error());
        cx_free(log.loss);
        return cx_loader_error(loader);
    }
    flush_log(&log, c, &pr, dataset_size);
    double dt = now_s() - pr.t0;
    g_run.train_s += dt;
    epoch_line(c, &pr, dt);
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
/* the run's --precision: evaluation runs as training does */
static precision g_precision;

/* Correct predictions and images of the loader's split (this rank's share) into counts[0], counts[1]. */
static void count_correct(cx_module *model, cx_loader *loader, double counts[2])
{
    cx_module_train(model, false);
    cx_loader_set_epoch(loader, 0, 0);
    cx_tensor *correct = cx_zeros(NULL, 0, CX_I64);
    cx_sync_tensors(&correct, 1);
    int64_t seen = 0;
    cx_no_grad_begin();
    cx_batch b;
    while (cx_loader_next(loader, &b) == CX_LOADER_BATCH) {
        precision_forward_begin(g_precision);
        cx_tensor *pred = cx_argmax(cx_module_forward(model, cx_batch_field(&b, CX_FIELD_IMAGES)), 1, false);   // (B) i64
        precision_forward_end(g_precision);
        cx_tensor *hits = cx_sum(cx_cast(cx_eq(pred, cx_batch_field(&b, CX_FIELD_LABELS)), CX_I64), NULL, 0, false);
        cx_assign(correct, cx_add(correct, hits));
        seen += b.size;
    }
    cx_no_grad_end();
    counts[0] = cx_item(correct);
    counts[1] = (double)seen;
    cx_free(correct);
}

/* @return the accuracy in percent (NaN if the ranks' reduction failed) and *images, the images evaluated. */
static double evaluate_on(cx_module *model, cx_loader *loader, bool all_ranks, int64_t *images)
{
    /* every rank evaluates its shard of the test set: average over ranks */
    double local[2], total[2] = { 0, 0 };
    count_correct(model, loader, local);
    if (!all_ranks) memcpy(total, local, sizeof total);
    else if (cx_mesh_reduce("test_accuracy", local, 2, sum_reduce, total) != CX_OK) return NAN;
    *images = (int64_t)total[1];
    return total[1] > 0 ? 100.0 * total[0] / total[1] : 0.0;
}

/* SPMD ranks all evaluate the whole test set as one program. */
static double evaluate(cx_module *model, cx_loader *loader, int64_t *images)
{
    return evaluate_on(model, loader, !cx_is_spmd(), images);
}

/* The seed's mnist_xla.py: meshes (N/2, 2, 1, 1) and (N/2, 2), the conv
 * weights split over data, fc1 over data, fc2 over data x model. @return
 * the input's mesh, or NULL with the reason printed. */
static cx_mesh *spmd_setup(const config *c, cx_module *model)
{
    int world = cx_world_size();
    if (strcmp(c->model, "cnn") || world % 2) {
        fprintf(stderr, "train: --parallel spmd runs the seed's cnn on an even number of ranks (got --model %s on %d rank(s))\n",
                c->model, world);
        return NULL;
    }
    cx_use_spmd();
    int conv_shape[4] = { world / 2, 2, 1, 1 }, linear_shape[2] = { world / 2, 2 };
    const char *conv_axes[4] = { "data", "dim1", "dim2", "dim3" }, *linear_axes[2] = { "data", "model" };
    cx_mesh *conv_mesh = cx_mesh_new(NULL, 4, conv_shape, conv_axes);
    cx_mesh *linear_mesh = conv_mesh ? cx_mesh_new(NULL, 2, linear_shape, linear_axes) : NULL;
    if (!linear_mesh) { fprintf(stderr, "train: spmd: %s\n", cx_last_error()); return NULL; }
    cx_spec_entry n = CX_SPEC_NONE, data = CX_SPEC_NAME("data"), mdl = CX_SPEC_NAME("model");
    struct { const char *name; cx_mesh *mesh; cx_spec_entry spec[4]; int nd; } plan[] = {
        { "conv1.weight", conv_mesh, { data, n, n, n }, 4 }, { "conv2.weight", conv_mesh, { data, n, n, n }, 4 },
        { "fc1.weight", linear_mesh, { data, n }, 2 },       { "fc2.weight", linear_mesh, { data, mdl }, 2 },
    };
    int np;
    cx_named_tensor *params = cx_module_parameters(model, &np);
    for (size_t k = 0; params && k < sizeof plan / sizeof *plan; k++) {
        cx_tensor *t = NULL;
        for (int i = 0; i < np; i++) if (!strcmp(params[i].name, plan[k].name)) t = params[i].tensor;
        if (!t || cx_mark_sharding(t, plan[k].mesh, plan[k].spec, plan[k].nd) != CX_OK) {
            fprintf(stderr, "train: spmd: %s: %s\n", plan[k].name, t ? cx_last_error() : "no such parameter");
            free(params);
            return NULL;
        }
    }
    free(params);
    return conv_mesh;
}

/* The resumed epoch's steps are all in the checkpoint. */
static bool resumed_epoch_done(const config *c, int epoch, const cx_loader *loader)
{
    if (epoch != g_ckpt.resume_epoch || g_ckpt.resume_position == 0) return false;
    /* a last, short batch leaves the position short of a multiple */
    int64_t taken = (g_ckpt.resume_position + c->batch_size - 1) / c->batch_size;
    if (taken < steps_per_epoch(c, loader)) return false;
    g_ckpt.resume_position = 0;
    return true;
}

/* A resume with nothing left to train says so and stops (without it, an
 * epoch of 0 images ran and the test set was evaluated again). */
static bool resumed_at_end(const config *c, const cx_loader *loader)
{
    if (!g_ckpt.last_prefix[0]) return false;
    bool end = g_ckpt.resume_epoch > c->epochs;
    if (!end && g_ckpt.resume_epoch == c->epochs && g_ckpt.resume_position > 0) {
        int64_t taken = (g_ckpt.resume_position + c->batch_size - 1) / c->batch_size;
        end = taken >= steps_per_epoch(c, loader);
    }
    if (end && cx_global_ordinal() == 0) {
        char steps[48] = "";
        if (c->steps) snprintf(steps, sizeof steps, ", --steps %lld", (long long)c->steps);
        printf("train: checkpoint %s is already at the end of training (step %lld; --epochs %d%s): nothing left to "
               "do; raise --epochs%s to go on\n", g_ckpt.last_prefix, (long long)g_ckpt.last_saved, c->epochs, steps,
               c->steps ? " or --steps" : "");
        fflush(stdout);
    }
    return end;
}

/* One line for the whole job: rank 0, the images of all ranks. */
static void summary_line(const config *c, double acc)
{
    if (cx_global_ordinal() != 0) return;
    char where[4200] = "no checkpoint (no --ckpt-dir)";
    if (c->ckpt_dir && g_ckpt.last_prefix[0]) snprintf(where, sizeof where, "checkpoint %s", g_ckpt.last_prefix);
    char accs[48] = "not evaluated";
    if (!isnan(acc)) snprintf(accs, sizeof accs, "%.2f%%", acc);
    printf("Done: %lld steps in %.1f s, %.1f images/s over %d rank(s); test accuracy %s; %s\n", (long long)g_run.steps,
           now_s() - g_run.t0, g_run.train_s > 0 ? (double)g_run.images / g_run.train_s : 0.0, cx_world_size(), accs,
           where);
    fflush(stdout);
}

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
    if (c->deferred_init) {
        /* a model built deferred need not fit one process: consolidating
         * streamed it, reloading it whole could not */
        printf("Checkpoint consolidated into %s (not reloaded into one process: --deferred-init)\n", out);
        return 0;
    }
    cx_module *full = build_model(c, train_set);
    if (!full || cx_ckpt_load_full(out, cx_ckpt_model_single(full), NULL, NULL) != CX_OK) {
        fprintf(stderr, "train: reloading %s: %s\n", out, cx_last_error());
        cx_module_free(full);
        return EXIT_RUNTIME;
    }
    double total[2] = { 0, 0 };
    bool ok = true;
    /* the images the ranks evaluated: each rank's share, padded or (--drop_last) cut as it was */
    int ranks = cx_world_size();
    for (int r = 0; ok && r < ranks; r++) {
        cx_sampler_opts so = cx_sampler_default_opts();
        so.shuffle = false;
        so.rank = r;
        so.world_size = ranks;
        so.drop_last = c->r.drop_last;
        cx_sampler *sampler = cx_sampler_new(cx_dataset_size(test_set), so);
        cx_loader_opts lo = cx_loader_default_opts();
        lo.batch_size = c->r.test_batch_size;
        lo.drop_last = c->r.drop_last;
        cx_loader *loader = sampler ? cx_loader_new(test_set, sampler, lo) : NULL;
        double counts[2];
        if ((ok = loader != NULL)) count_correct(full, loader, counts);
        if (ok) { total[0] += counts[0]; total[1] += counts[1]; }
        cx_loader_free(loader);
        cx_sampler_free(sampler);
    }
    cx_module_free(full);
    if (!ok) {
        fprintf(stderr, "train: evaluating %s: %s\n", out, cx_last_error());
        return EXIT_RUNTIME;
    }
    double acc = total[1] > 0 ? 100.0 * total[0] / total[1] : 0.0;
    printf("Checkpoint consolidated, Accuracy=%.2f (sharded model: %.2f)\n", acc, sharded_acc);
    fflush(stdout);
    if (fabs(acc - sharded_acc) > 1e-9) {
        fprintf(stderr, "train: the consolidated model's accuracy %.2f%% differs from the sharded model's %.2f%%\n", acc,
                sharded_acc);
        return EXIT_RUNTIME;
    }
    return 0;
}

/* ---- main ------------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "plot")) return recipe_plot_main(argc - 1, argv + 1);
    if (cx_dist_init(&argc, &argv) != CX_OK) {
        fprintf(stderr, "train: cannot start the distributed runtime: %s\n", cx_last_error());
        return EXIT_RUNTIME;
    }
    config c;
    cli_result parsed = parse_flags(&c, argc, argv);
    if (parsed != CLI_OK) {
        cx_dist_finalize();
        return parsed == CLI_HELP ? 0 : EXIT_USAGE;
    }
    int rank = cx_global_ordinal(), world = cx_world_size();
    if (recipe_check(&c.r, c.model, &c.parallel, c.nested, c.auto_wrap_min_params, c.grad_ckpt) != 0) {
        cx_dist_finalize();
        return EXIT_USAGE;
    }
    if (!c.r.test_batch_size) c.r.test_batch_size = c.batch_size;
    if (strcmp(c.grad_comm, "f32") && strcmp(c.parallel, "ddp") && strcmp(c.parallel, "xm")) {
        if (rank == 0) fprintf(stderr, "train: --grad-comm %s applies to --parallel ddp or xm, not %s\n", c.grad_comm, c.parallel);
        cx_dist_finalize();
        return EXIT_USAGE;
    }
    bool fixed_28 = !strcmp(c.model, "cnn") || !strcmp(c.model, "lenet");
    bool any_size = !strcmp(c.data, "fake") || !strcmp(c.data, "imagefolder");
    bool folder = !strcmp(c.data, "imagefolder");
    if (folder && (fixed_28 || !c.data_dir)) {
        if (rank == 0 && fixed_28)
            fprintf(stderr, "train: --model %s takes 1 x 28 x 28 images; an image folder gives 3 x S x S (use mlp or a "
                    "resnet)\n", c.model);
        else if (rank == 0)
            fprintf(stderr, "train: --data imagefolder needs --data-dir ROOT (ROOT/train/<class>/*.jpg and "
                    "ROOT/val/<class>/...)\n");
        cx_dist_finalize();
        return EXIT_USAGE;
    }
    if (c.image_size && c.image_size != 28 && (!any_size || fixed_28)) {
        if (rank == 0)
            fprintf(stderr, "train: --image-size %d: %s %s takes 28 x 28 images (other sizes: --data fake or imagefolder "
                    "with mlp or a resnet)\n",
                    c.image_size, fixed_28 ? "--model" : "--data", fixed_28 ? c.model : c.data);
        cx_dist_finalize();
        return EXIT_USAGE;
    }
    if (precision_setup("train", c.precision_flag, c.precision_given, &c.precision) != 0) {
        cx_dist_finalize();
        return EXIT_USAGE;
    }
    g_precision = c.precision;
    if (c.resume && !strcmp(c.resume, "auto") && !c.ckpt_dir) {
        if (rank == 0) fprintf(stderr, "train: --resume auto needs --ckpt-dir (the directory to take the latest checkpoint from)\n");
        cx_dist_finalize();
        return EXIT_USAGE;
    }
    /* without a launcher (xla-launch, mpirun, srun --mpi=pmix) "ddp" meant
     * several ranks that nobody started */
    const char *launcher = "none";
    cx_job_place(NULL, NULL, NULL, NULL, &launcher, NULL, 0);
    if (world == 1 && strcmp(c.parallel, "none") && strcmp(c.parallel, "spmd") && !strcmp(launcher, "none"))
        fprintf(stderr, "train: notice: --parallel %s without xla-launch runs on 1 rank; for N ranks run "
                "xla-launch --nproc N train ...\n", c.parallel);
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
    if (folder && train_data_check_classes(c.data_dir, train_set, test_set) != 0) {
        cx_dataset_free(train_set);
        cx_dataset_free(test_set);
        cx_dist_finalize();
        return EXIT_DATA;
    }

    cx_memory_reset_peak();
    if (c.deferred_init) cx_deferred_init_begin();
    cx_module *model = build_model(&c, train_set);
    if (c.deferred_init) cx_deferred_init_end();
    /* only FSDP shards a deferred model; everything else holds it whole */
    if (model && c.deferred_init && strcmp(c.parallel, "fsdp") && cx_module_materialize(model) != CX_OK) {
        fprintf(stderr, "train: %s\n", cx_last_error());
        return EXIT_RUNTIME;
    }
    if (!model) {
        fprintf(stderr, "train: cannot build model %s: %s\n", c.model, cx_last_error());
        return EXIT_RUNTIME;
    }
    int64_t num_params = cx_module_num_params(model);

    /* data parallelism: every rank starts from rank 0's weights */
    parallel_mode par = { .grad_comm = !strcmp(c.grad_comm, "bf16") ? CX_GRAD_COMM_BF16 : CX_GRAD_COMM_F32 };
    if (!strcmp(c.parallel, "fsdp")) {
        cx_fsdp_opts fo = cx_fsdp_default_opts();
        static const char *const unit_types[] = { "Linear", "Conv2d" };
        fo.reshard_after_forward = c.zero == 3;
        fo.auto_wrap_min_params = c.auto_wrap_min_params;
        if (c.nested) { fo.auto_wrap_types = unit_types; fo.n_auto_wrap_types = 2; }
        if (c.r.use_nested_fsdp) fo.auto_wrap_types = recipe_block_types(c.model, &fo.n_auto_wrap_types);
        fo.grad_ckpt = c.grad_ckpt;
        /* bf16-mixed: parameters gathered in bf16, gradients reduce-scattered in f32 */
        if (c.precision == PRECISION_BF16_MIXED) fo.compute_dtype = CX_BF16;
        par.fsdp = cx_fsdp_wrap(model, fo);
        if (!par.fsdp) {
            fprintf(stderr, "train: %s\n", cx_last_error());
            return EXIT_RUNTIME;
        }
    } else if (!strcmp(c.parallel, "spmd")) {
        if (!(par.conv_mesh = spmd_setup(&c, model))) return EXIT_USAGE;
    } else if (!strcmp(c.parallel, "ddp")) {
        cx_ddp_opts dopts = cx_ddp_default_opts();
        dopts.grad_comm = par.grad_comm;
        par.ddp = cx_ddp_wrap(model, dopts);
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
    if (rank == 0)
        printf("model %s: %lld parameters (%.1f MB); %.1f MB peak on rank 0 while building%s\n", c.model,
               (long long)num_params, (double)num_params * 4 / 1e6, (double)cx_memory_peak() / 1e6,
               par.fsdp ? " and sharding" : "");
    if (c.grad_ckpt && !par.fsdp) {
        /* every child of the top Sequential recomputes its forward in backward */
        for (int i = 0; i < cx_module_num_children(model); i++) cx_checkpoint_module(cx_module_child(model, i));
    }
    /* after wrapping: under FSDP a block's region opens after its unit's gather, as the unit's own grad_ckpt */
    int n_types, n_ckpt = 0;
    const char *const *block_types = recipe_block_types(c.model, &n_types);
    if (c.r.use_gradient_checkpointing && (n_ckpt = recipe_checkpoint_blocks(model, block_types, n_types)) < 0) {
        fprintf(stderr, "train: --use_gradient_checkpointing: %s\n", cx_last_error());
        return EXIT_RUNTIME;
    }
    if (rank == 0) recipe_print_blocks(&c.r, c.model, par.fsdp, n_ckpt);
    cx_optimizer *opt = build_optimizer(&c, model, par.fsdp);
    if (!opt) {
        fprintf(stderr, "train: cannot build the optimizer: %s\n", cx_last_error());
        return EXIT_RUNTIME;
    }
    if (rank == 0)
        printf("model %s: %lld parameters; optimizer %s lr %g; data %s, %lld train / %lld test images; "
               "%d rank(s), parallel %s%s\n", c.model, (long long)num_params, cx_optim_name(opt), c.lr,
               c.data, (long long)cx_dataset_size(train_set), (long long)cx_dataset_size(test_set), world, c.parallel,
               precision_banner(c.precision));
    fflush(stdout);   /* before any error line of the setup below */

    cx_sampler_opts so = cx_sampler_default_opts();
    so.seed = (uint64_t)c.seed;
    so.rank = par.conv_mesh ? 0 : rank;              /* spmd: every rank passes the same global batch */
    so.world_size = par.conv_mesh ? 1 : world;
    so.drop_last = c.r.drop_last;
    cx_sampler *train_sampler = cx_sampler_new(cx_dataset_size(train_set), so);
    so.shuffle = false;
    cx_sampler *test_sampler = cx_sampler_new(cx_dataset_size(test_set), so);
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = c.batch_size;
    lo.drop_last = c.r.drop_last;
    lo.num_workers = c.num_workers;
    lo.host_prefetch = c.loader_prefetch;
    lo.prefetch = c.device_prefetch;
    /* spmd: x (N, 1, 28, 28) over data x dim1 (the channel padded), as the seed
     * marks it; each rank reads and uploads only its rows */
    cx_spec_entry input_spec[4] = { CX_SPEC_NAME("data"), CX_SPEC_NAME("dim1"), CX_SPEC_NONE, CX_SPEC_NONE };
    if (par.conv_mesh) { lo.input_mesh = par.conv_mesh; lo.input_spec = input_spec; lo.input_nspec = 4; }
    cx_loader *train_loader = train_sampler ? cx_loader_new(train_set, train_sampler, lo) : NULL;
    lo.batch_size = c.r.test_batch_size;
    cx_loader *test_loader = test_sampler ? cx_loader_new(test_set, test_sampler, lo) : NULL;
    if (!train_loader || !test_loader) {
        fprintf(stderr, "train: cannot start the data loaders: %s\n", cx_last_error());
        return EXIT_RUNTIME;
    }

    int rc = 0;
    double acc = NAN;
    g_run.t0 = now_s();
    if (ckpt_setup(&c, &par, model, opt) != CX_OK) rc = EXIT_RUNTIME;
    g_run.sched = recipe_schedule_of(&c.r, c.lr, steps_per_epoch(&c, train_loader));
    bool log_failed;
    g_run.log = recipe_log_open(&c.r, g_ckpt.last_prefix[0] ? g_ckpt.last_saved : -1, &log_failed);
    if (log_failed) rc = EXIT_RUNTIME;
    bool done = rc == 0 && resumed_at_end(&c, train_loader);
    for (int epoch = (int)g_ckpt.resume_epoch; epoch <= c.epochs && rc == 0 && !done; epoch++) {
        if (resumed_epoch_done(&c, epoch, train_loader)) continue;   /* its last step is in the checkpoint */
        if (train_epoch(&c, epoch, model, opt, train_loader, cx_dataset_size(train_set), &par) != CX_OK) {
            rc = EXIT_RUNTIME;
            break;
        }
        if (g_ckpt.preempted) {
            rc = EXIT_PREEMPTED;
            break;
        }
        if (epoch % c.r.eval_interval && epoch != c.epochs) continue;   /* the seed's --eval_interval */
        int64_t images;
        acc = evaluate(model, test_loader, &images);
        if (cx_loader_error(test_loader) != CX_OK || isnan(acc)) {
            fprintf(stderr, "train: evaluation failed: %s\n", cx_last_error());
            rc = EXIT_RUNTIME;
            break;
        }
        if (rank == 0) printf("Test accuracy: %.2f%%\n", acc);
        fflush(stdout);
        recipe_log_eval(g_run.log, cx_optim_step_count(opt), epoch, acc, images);
    }
    if (rc == 0 && !done && ckpt_final_save(c.epochs) != CX_OK) rc = EXIT_RUNTIME;
    if (rc == 0 && !done && par.fsdp && c.ckpt_dir && g_ckpt.last_prefix[0])
        rc = consolidate_and_check(&c, train_set, test_set, acc);
    if (rc == 0 && !done) summary_line(&c, acc);
    if (rc == 0 && !done && c.target_accuracy > 0 && acc < c.target_accuracy) {
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

    if (g_run.log) fclose(g_run.log);
    train_data_report("train", train_set, c.log_all_ranks);
    train_data_report("val", test_set, c.log_all_ranks);
    cx_ckpt_manager_free(g_ckpt.mgr);
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
