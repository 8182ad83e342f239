/* gpt: a byte-level GPT language model, from a text file to samples.
 *
 *   gpt train  [--data FILE] [--steps N] [--parallel none|ddp|fsdp|spmd|fsdpv2] ...   train
 *   gpt eval   --ckpt PREFIX [--data FILE]                                 print "val loss: X"
 *   gpt sample --ckpt PREFIX --prompt TEXT --tokens N [--temperature T] [--top-k K] [--seed S]
 *   gpt plot   --log-file F.jsonl --out F.png|F.svg                        train and val loss curves (gnuplot)
 *
 * Read it top to bottom: flags, corpus, model and optimizer, the training
 * loop (each step one lazy graph: forward, backward, clip, AdamW, recorded
 * between the loader's step marks), evaluation, sampling, plotting. The
 * corpus is the King James Bible of Debian's bible-kjv package unless
 * --data names another text file; its bytes are the tokens. A checkpoint
 * holds the model's config as its metadata (cx_ckpt_read_meta), so eval,
 * sample and --resume need no model flags.
 *
 * Under xla-launch rank 0 prints the progress (--log-all-ranks: every
 * rank its own), all of it on stdout so that a rank's lines keep their
 * order, and train ends with "val loss: X" and a summary line.
 *
 * Exit codes: 0 success, 1 runtime error, 2 bad flag, 3 data or checkpoint
 * missing or unreadable, 75 preempted (SIGTERM with --ckpt-dir: every rank
 * saved at the same step; --resume auto continues from there).
 */
#include <cxla/cxla.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cx_cli.h"
#include "learning_curve.h"
#include "precision.h"

enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2, EXIT_DATA = 3, EXIT_PREEMPTED = 75 };

#define VAL_WINDOWS 64      /* the val loss: 64 evenly spaced windows of val */
#define EVAL_BATCH 16
#define KJV_RANGE "Genesis 1:1-Revelation 22:21"

/* ---- flags ---------------------------------------------------------------------------- */

typedef struct {
    const char *cmd;
    const char *data;           /* NULL: the KJV corpus, made when missing */
    cx_gpt_config model;
    int64_t steps, batch_size, warmup, log_every, eval_every, ckpt_every, seed;
    int keep;                   /* checkpoints kept, 0 = all */
    double lr, min_lr, weight_decay, grad_clip;
    const char *parallel;       /* none, ddp, fsdp, spmd, fsdpv2 */
    const char *mesh;           /* spmd: "data=D,model=M"; fsdpv2: "fsdp=N,model=M" (NULL: the first = every rank) */
    const char *grad_comm;      /* ddp: f32 or bf16 */
    const char *precision_flag;
    bool precision_given;       /* --precision was on the command line */
    precision precision;
    char saved_precision[16];   /* the checkpoint's (adopt_model_meta), "" if unknown */
    int zero;
    int threads;
    const char *ckpt_dir, *resume, *log_file;
    const char *cache_dir;      /* persistent compile cache, NULL: off */
    bool log_all_ranks;
    bool shape_given[4];        /* --n-layer, --n-head, --n-embd, --block-size were given */
    bool flags_shape;           /* the checkpoint has no model config: the flags give it */
    const char *ckpt;           /* eval / sample */
    const char *prompt;
    int64_t tokens, top_k;
    double temperature;
    const char *out;            /* plot */
} config;

static const char *const k_parallels[] = { "none", "ddp", "fsdp", "spmd", "fsdpv2", NULL };
static const char *const k_grad_comms[] = { "f32", "bf16", NULL };

static cli_result parse_flags(config *c, int argc, char **argv)
{
    int n_layer = 4, n_head = 4;
    int64_t n_embd = 256, block = 128;
    *c = (config){ .steps = 600, .batch_size = 16, .warmup = 50, .log_every = 10, .seed = 1, .lr = 1e-3,
                   .min_lr = 1e-4, .weight_decay = 0.1, .grad_clip = 1.0, .parallel = "none", .grad_comm = "f32", .precision_flag = "f32", .zero = 3,
                   .tokens = 200, .temperature = 1.0 };
    const cli_flag flags[] = {
        { .name = "data", .kind = CLI_STRING, .dest = &c->data, .metavar = "FILE",
          .help = "text corpus, bytes are tokens (default: the KJV Bible,\nmade from bible-kjv when missing)" },
        { .name = "n-layer", .kind = CLI_INT, .dest = &n_layer, .min = 1, .max = 1000, .help = "transformer blocks",
          .given = &c->shape_given[0] },
        { .name = "n-head", .kind = CLI_INT, .dest = &n_head, .min = 1, .max = 1024, .help = "attention heads",
          .given = &c->shape_given[1] },
        { .name = "n-embd", .kind = CLI_I64, .dest = &n_embd, .min = 1, .max = 65536, .help = "embedding width",
          .given = &c->shape_given[2] },
        { .name = "block-size", .kind = CLI_I64, .dest = &block, .min = 1, .max = 65536, .help = "context length",
          .given = &c->shape_given[3] },
        { .name = "steps", .kind = CLI_I64, .dest = &c->steps, .min = 1, .max = 0x1p40, .help = "training steps" },
        { .name = "batch-size", .kind = CLI_I64, .dest = &c->batch_size, .min = 1, .max = 0x1p20,
          .help = "the global batch: all ranks together, each rank\ntaking batch-size / ranks (a multiple of the ranks)" },
        { .name = "lr", .kind = CLI_DOUBLE, .dest = &c->lr, .min = 0, .max = 10, .help = "peak learning rate" },
        { .name = "min-lr", .kind = CLI_DOUBLE, .dest = &c->min_lr, .min = 0, .max = 10,
          .help = "learning rate at the last step (cosine)" },
        { .name = "warmup", .kind = CLI_I64, .dest = &c->warmup, .min = 0, .max = 0x1p40, .help = "linear warm-up steps" },
        { .name = "weight-decay", .kind = CLI_DOUBLE, .dest = &c->weight_decay, .min = 0, .max = 10,
          .help = "AdamW weight decay of 2-D weights" },
        { .name = "grad-clip", .kind = CLI_DOUBLE, .dest = &c->grad_clip, .min = 0, .max = INFINITY,
          .help = "gradient-norm clip, 0 = off" },
        { .name = "seed", .kind = CLI_I64, .dest = &c->seed, .min = 0, .max = 0x1p62, .help = "RNG seed" },
        { .name = "threads", .kind = CLI_INT, .dest = &c->threads, .min = 0, .max = 4096,
          .help = "compute threads, 0 = all cores" },
        { .name = "parallel", .kind = CLI_CHOICE, .dest = &c->parallel, .choices = k_parallels,
          .help = "data parallelism over xla-launch's ranks\n(spmd: the compiler partitions; see --mesh;\nfsdpv2: FSDP through SPMD, wrapped per block)" },
        { .name = "mesh", .kind = CLI_STRING, .dest = &c->mesh, .metavar = "data=D,model=M|fsdp=N,model=M",
          .help = "spmd: data=D,model=M; the batch splits over data,\nthe blocks over model (tensor parallelism)\n"
                  "fsdpv2: fsdp=N,model=M; the parameters and the batch\nsplit over fsdp; model > 1 only replicates (no tensor\n"
                  "parallelism under fsdpv2 yet)\n(default: data or fsdp = every rank, model = 1)" },
        { .name = "zero", .kind = CLI_INT, .dest = &c->zero, .metavar = "{2,3}", .min = 2, .max = 3,
          .help = "fsdp: ZeRO stage" },
        { .name = "grad-comm", .kind = CLI_CHOICE, .dest = &c->grad_comm, .choices = k_grad_comms,
          .help = "ddp: gradients all-reduced as they are, or as\nbf16 summed in f32 (bf16_compress_hook)" },
        { .name = "precision", .kind = CLI_STRING, .dest = &c->precision_flag, .metavar = "P", .given = &c->precision_given,
          .help = "train, eval, sample: " PRECISION_HELP },
        { .name = "log-every", .kind = CLI_I64, .dest = &c->log_every, .min = 1, .max = 0x1p40,
          .help = "log the loss every N steps" },
        { .name = "eval-every", .kind = CLI_I64, .dest = &c->eval_every, .min = 0, .max = 0x1p40,
          .help = "measure the val loss every N steps, 0 = at the end" },
        { .name = "log-all-ranks", .kind = CLI_BOOL, .dest = &c->log_all_ranks,
          .help = "train: every rank prints its own loss lines (its\nshare of the batch); default: rank 0 the global progress" },
        { .name = "log-file", .kind = CLI_STRING, .dest = &c->log_file, .metavar = "F.jsonl",
          .help = "train: one JSON object per logged step; plot: read it" },
        { .name = "cache-dir", .kind = CLI_STRING, .dest = &c->cache_dir, .metavar = "DIR",
          .help = "persistent compile cache (shared by the ranks)" },
        { .name = "ckpt-dir", .kind = CLI_STRING, .dest = &c->ckpt_dir, .metavar = "DIR",
          .help = "save checkpoints DIR/ckpt-step-<N>" },
        { .name = "ckpt-every", .kind = CLI_I64, .dest = &c->ckpt_every, .min = 0, .max = 0x1p40,
          .help = "save every N steps, 0 = at the end" },
        { .name = "keep", .kind = CLI_INT, .dest = &c->keep, .metavar = "N", .min = 0, .max = 1 << 20,
          .help = "keep the newest N committed checkpoints, 0 = all" },
        { .name = "resume", .kind = CLI_STRING, .dest = &c->resume, .metavar = "{auto,PREFIX}",
          .help = "resume from the latest checkpoint in --ckpt-dir or PREFIX" },
        { .name = "ckpt", .kind = CLI_STRING, .dest = &c->ckpt, .metavar = "PREFIX",
          .help = "eval, sample: the checkpoint (a prefix or a consolidated .h5);\nthe model's shape comes from it" },
        { .name = "prompt", .kind = CLI_STRING, .dest = &c->prompt, .metavar = "TEXT",
          .help = "sample: the start (default: a newline); the text printed\nis UTF-8, an invalid byte sequence shown as U+FFFD" },
        { .name = "tokens", .kind = CLI_I64, .dest = &c->tokens, .min = 1, .max = 0x1p30,
          .help = "sample: tokens to generate" },
        { .name = "temperature", .kind = CLI_DOUBLE, .dest = &c->temperature, .min = 1e-6, .max = 100,
          .help = "sample: logits are divided by it" },
        { .name = "top-k", .kind = CLI_I64, .dest = &c->top_k, .min = 0, .max = 0x1p30,
          .help = "sample: keep the k likeliest tokens, 0 = all" },
        { .name = "out", .kind = CLI_STRING, .dest = &c->out, .metavar = "F.png|F.svg", .help = "plot: the picture" },
    };
    const cli_spec spec = {
        .prog = "gpt",
        .args = "{train,eval,sample,plot} [flags]",
        .summary = "A byte-level GPT on a text corpus (default: the KJV Bible). train runs under xla-launch\n"
                   "like the train program; eval and sample read a checkpoint; plot draws the log file's loss\n"
                   "curves with gnuplot. eval and sample read the model's shape from the checkpoint (model flags\n"
                   "given anyway must agree with it).",
        .epilog = "exit codes: 0 ok, 1 runtime error, 2 bad flag, 3 data or checkpoint missing or unreadable,\n"
                  "            75 preempted (SIGTERM or Ctrl-C; saved in --ckpt-dir)",
        .flags = flags,
        .nflags = (int)(sizeof flags / sizeof *flags),
        .positionals = true,
    };
    /* gpt COMMAND [flags]: the command takes the program name's place */
    static const char *const cmds[] = { "train", "eval", "sample", "plot" };
    bool has_cmd = argc > 1 && argv[1][0] != '-';
    for (int i = 0; has_cmd && i < 4; i++)
        if (!strcmp(argv[1], cmds[i])) c->cmd = cmds[i];
    int first = argc;
    cli_result r = has_cmd ? cli_parse(&spec, argc - 1, argv + 1, &first) : cli_parse(&spec, argc, argv, &first);
    if (r != CLI_OK) return r;
    if (!c->cmd || first != (has_cmd ? argc - 1 : argc)) {
        fprintf(stderr, "gpt: want one command, train, eval, sample or plot, then flags%s%s (see gpt --help)\n",
                has_cmd ? "; got " : "", has_cmd ? argv[1] : "");
        return CLI_ERROR;
    }
    if (!c->prompt) c->prompt = "\n";
    c->model = (cx_gpt_config){ CX_STRUCT_SIZE(cx_gpt_config), .vocab_size = 256, .block_size = block, .n_layer = n_layer, .n_head = n_head,
                                .n_embd = n_embd };
    bool needs_ckpt = !strcmp(c->cmd, "eval") || !strcmp(c->cmd, "sample");
    const char *missing = needs_ckpt && !c->ckpt ? "--ckpt" : !strcmp(c->cmd, "plot") && !c->log_file ? "--log-file"
                          : !strcmp(c->cmd, "plot") && !c->out ? "--out" : NULL;
    if (missing) {
        fprintf(stderr, "gpt %s: %s is required (see gpt --help)\n", c->cmd, missing);
        return CLI_ERROR;
    }
    return CLI_OK;
}

/* ---- the model's shape from a checkpoint ------------------------------------------------------ */

/* The model's config as gpt stores it in its checkpoints' metadata
 * (cx_ckpt_manager_opts.meta), nanoGPT's model_args as key=value pairs.
 * Not a tensor: the model must be built before a checkpoint can load into
 * it, and the state dict stays PyTorch's (a consolidated file loads into
 * nanoGPT's module with strict=True). */
static void model_meta(const cx_gpt_config *g, precision p, char *out, size_t cap)
{
    snprintf(out, cap, "vocab_size=%lld block_size=%lld n_layer=%d n_head=%d n_embd=%lld precision=%s",
             (long long)g->vocab_size, (long long)g->block_size, g->n_layer, g->n_head, (long long)g->n_embd,
             precision_name(p));
}


/* Parses model_meta's string into v (vocab_size, block_size, n_layer,
 * n_head, n_embd; any order, unknown keys skipped) and the saving run's
 * --precision into prec ("" when absent: saved before gpt wrote it).
 * @return the name of a key missing or not a positive integer, or NULL
 * when all five are there. */
static const char *parse_model_meta(const char *meta, int64_t v[5], char *prec, size_t prec_cap)
{
    static const char *const keys[5] = { "vocab_size", "block_size", "n_layer", "n_head", "n_embd" };
    bool seen[5] = { false };
    if (prec_cap) prec[0] = '\0';
    for (const char *p = meta; *p;) {
        size_t len = strcspn(p, " ");
        const char *eq = memchr(p, '=', len);
        if (eq && eq - p == 9 && !strncmp(p, "precision", 9))
            snprintf(prec, prec_cap, "%.*s", (int)(p + len - eq - 1), eq + 1);
        for (int k = 0; eq && k < 5; k++) {
            if ((size_t)(eq - p) != strlen(keys[k]) || strncmp(p, keys[k], strlen(keys[k]))) continue;
            char *e;
            long long x = strtoll(eq + 1, &e, 10);
            seen[k] = e == p + len && e > eq + 1 && x > 0 && x <= 1 << 30;
            v[k] = x;
        }
        p += len + strspn(p + len, " ");
    }
    for (int k = 0; k < 5; k++)
        if (!seen[k]) return keys[k];
    return NULL;
}

/* Takes the model's shape from checkpoint `src`'s metadata; a model flag
 * given anyway must agree. A checkpoint without metadata (saved before gpt
 * wrote it) keeps the flags' shape. @return 0, EXIT_USAGE or EXIT_DATA
 * after one line. */
static int adopt_model_meta(config *c, const char *src)
{
    char *meta = cx_ckpt_read_meta(src);
    if (!meta || !*meta) {
        c->flags_shape = meta != NULL;   /* unreadable: the load says why */
        free(meta);
        return 0;
    }
    int64_t v[5];
    const char *bad = parse_model_meta(meta, v, c->saved_precision, sizeof c->saved_precision);
    if (bad) {
        if (cx_global_ordinal() == 0)
            fprintf(stderr, "gpt %s: %s: the checkpoint's metadata \"%s\" has no valid %s (not saved by gpt?)\n",
                    c->cmd, src, meta, bad);
        free(meta);
        return EXIT_DATA;
    }
    free(meta);
    static const char *const names[4] = { "n-layer", "n-head", "n-embd", "block-size" };
    int64_t flags[4] = { c->model.n_layer, c->model.n_head, c->model.n_embd, c->model.block_size };
    int64_t saved[4] = { v[2], v[3], v[4], v[1] };
    for (int i = 0; i < 4; i++) {
        if (c->shape_given[i] && flags[i] != saved[i]) {
            if (cx_global_ordinal() == 0)
                fprintf(stderr, "gpt %s: --%s %lld disagrees with the checkpoint's %lld (%s)\n", c->cmd, names[i],
                        (long long)flags[i], (long long)saved[i], src);
            return EXIT_USAGE;
        }
    }
    c->model.vocab_size = v[0];
    c->model.block_size = v[1];
    c->model.n_layer = (int)v[2];
    c->model.n_head = (int)v[3];
    c->model.n_embd = v[4];
    return 0;
}

/* ---- the corpus --------------------------------------------------------------------------- */

/* The default corpus: $XDG_CACHE_HOME/cxla (or ~/.cache/cxla, or /tmp)/kjv.txt. */
static void default_corpus_path(char *out, size_t cap)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(out, cap, "%s/cxla/kjv.txt", xdg);
    else if (home && *home) snprintf(out, cap, "%s/.cache/cxla/kjv.txt", home);
    else snprintf(out, cap, "/tmp/cxla-kjv.txt");
}

/* Writes the KJV text with bible-kjv's `bible` (one verse per line) to a
 * temporary file renamed into place, so a failed run never leaves half a
 * corpus behind. @return 0, or an exit code after one line on stderr. */
static int make_kjv(const char *path)
{
    char dir[4096], tmp[4200], cmd[8800];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
        if (system(cmd) != 0) {
            fprintf(stderr, "gpt: cannot create %s for the corpus\n", dir);
            return EXIT_DATA;
        }
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    snprintf(cmd, sizeof cmd, "bible -f '" KJV_RANGE "' > '%s' 2>/dev/null", tmp);
    int st = system(cmd);
    struct stat sb;
    if (st != 0 || stat(tmp, &sb) != 0 || sb.st_size < 1000000 || rename(tmp, path) != 0) {
        unlink(tmp);
        fprintf(stderr, "gpt: no corpus at %s and `bible` (Debian package bible-kjv) could not make it: install it "
                        "(scripts/install-deps.sh) or pass --data FILE\n", path);
        return EXIT_DATA;
    }
    printf("gpt: wrote the KJV corpus to %s (%lld bytes)\n", path, (long long)sb.st_size);
    return 0;
}

/* The corpus path: --data, or the KJV made on first use (by rank 0; the
 * others wait for it at a barrier). @return 0 or an exit code. */
static int corpus_path(const config *c, char *out, size_t cap)
{
    if (c->data) {
        snprintf(out, cap, "%s", c->data);
        return 0;
    }
    default_corpus_path(out, cap);
    int rc = 0;
    if (cx_global_ordinal() == 0 && access(out, R_OK) != 0) rc = make_kjv(out);
    if (cx_world_size() > 1 && cx_barrier() != CX_OK) rc = EXIT_RUNTIME;
    return rc;
}

/* A text data set of the corpus: training windows, or the val split's
 * evaluation windows. @return CX_OK or the error (message set). */
static cx_status open_split(const config *c, const char *path, bool val, cx_dataset **out)
{
    cx_text_opts o = cx_text_default_opts();
    o.path = path;
    o.block = c->model.block_size;
    o.train_fraction = 0.9;
    o.val = val;
    o.seed = (uint64_t)c->seed;
    o.eval_windows = val ? VAL_WINDOWS : 0;
    return cx_text_open(o, out);
}

/* ---- model and optimizer ---------------------------------------------------------------------- */

typedef struct {
    cx_module *model;
    cx_ddp *ddp;
    cx_fsdp *fsdp;
    cx_spmd_fsdp *fsdpv2;
    cx_optimizer *opt;
    cx_named_tensor *params;   /* what the optimizer steps (FSDP: flat shards) */
    int nparams;
    cx_tensor **decay_masks;   /* FSDP: which shard elements are 2-D weights */
    int nmasks;
    cx_ckpt_manager *ckpts;    /* --ckpt-dir: interval, --keep, preemption */
    precision precision;       /* bf16-mixed: the forward under autocast */
} trainer;

static void trainer_free(trainer *t)
{
    cx_ckpt_manager_free(t->ckpts);
    cx_optim_free(t->opt);
    free(t->params);
    for (int i = 0; i < t->nmasks; i++) cx_free(t->decay_masks[i]);
    free(t->decay_masks);
    cx_ddp_free(t->ddp);
    cx_fsdp_free(t->fsdp);
    cx_spmd_fsdp_free(t->fsdpv2);
    cx_module_free(t->model);
    *t = (trainer){ 0 };   /* freed twice (a failed build, then the caller's cleanup): nothing */
}

/* FSDP's units are the blocks (transformer_auto_wrap_policy); wte, wpe,
 * ln_f and the tied lm_head stay in the root unit. */
static cx_status wrap(const config *c, trainer *t)
{
    if (!strcmp(c->parallel, "ddp")) {
        cx_ddp_opts o = cx_ddp_default_opts();
        o.grad_comm = !strcmp(c->grad_comm, "bf16") ? CX_GRAD_COMM_BF16 : CX_GRAD_COMM_F32;
        t->ddp = cx_ddp_wrap(t->model, o);
        return t->ddp ? CX_OK : CX_ERR_ARG;
    }
    if (!strcmp(c->parallel, "fsdp")) {
        static const char *const units[] = { "Block" };
        cx_fsdp_opts fo = cx_fsdp_default_opts();
        fo.reshard_after_forward = c->zero == 3;
        fo.auto_wrap_types = units;
        fo.n_auto_wrap_types = 1;
        /* bf16-mixed: parameters gathered in bf16, gradients reduce-scattered in f32 */
        if (c->precision == PRECISION_BF16_MIXED) fo.compute_dtype = CX_BF16;
        t->fsdp = cx_fsdp_wrap(t->model, fo);
        return t->fsdp ? CX_OK : CX_ERR_ARG;
    }
    cx_status st = cx_world_size() > 1 ? cx_broadcast_master_params(t->model) : CX_OK;
    if (st == CX_OK && !strcmp(c->parallel, "fsdpv2")) {
        /* the seed's FSDPv2 with transformer_auto_wrap_policy on the blocks;
         * the logits of (logits, loss) shard on the batch by default */
        static const char *const blocks[] = { "Block" };
        cx_spmd_fsdp_opts fo = cx_spmd_fsdp_default_opts();
        fo.auto_wrap_types = blocks;
        fo.n_auto_wrap_types = 1;
        t->fsdpv2 = cx_spmd_fsdp_wrap_opts(t->model, cx_get_global_mesh(), fo);
        return t->fsdpv2 ? CX_OK : CX_ERR_ARG;
    }
    /* spmd with a model axis: Megatron's tensor parallelism, by annotations */
    const cx_mesh *mesh = cx_is_spmd() ? cx_get_global_mesh() : NULL;
    int shape[2] = { 1, 1 };
    if (st == CX_OK && mesh && cx_mesh_shape(mesh, shape) == 2 && shape[1] > 1) st = cx_gpt_tensor_parallel(t->model, mesh, "model");
    return st;
}

/* AdamW, betas (0.9, 0.99), eps 1e-8; weight decay on 2-D weights only:
 * two groups by ndim, or under FSDP one group over the flat shards whose
 * decay masks pick the 2-D weights' elements. */
static cx_status build_optimizer(const config *c, trainer *t)
{
    t->params = t->fsdp ? cx_fsdp_parameters(t->fsdp, &t->nparams) : cx_module_parameters(t->model, &t->nparams);
    if (!t->params) return CX_ERR_OOM;
    cx_adam_opts o = cx_adamw_default_opts();
    o.lr = c->lr;
    o.beta1 = 0.9;
    o.beta2 = 0.99;
    o.eps = 1e-8;
    cx_param_group groups[2] = { { CX_STRUCT_SIZE(cx_param_group) } };
    if (t->fsdp) {
        if (!(t->decay_masks = cx_fsdp_decay_masks(t->fsdp, 2, &t->nmasks))) return CX_ERR_OOM;
        groups[0] = cx_param_group_of(t->params, t->nparams, c->weight_decay);
        groups[0].decay_masks = t->decay_masks;
        t->opt = cx_optim_adamw_groups(groups, 1, o);
        return t->opt ? CX_OK : CX_ERR_ARG;
    }
    cx_named_tensor *scratch = malloc(sizeof *scratch * (size_t)t->nparams);
    if (scratch && cx_param_groups_by_ndim(t->params, t->nparams, c->weight_decay, scratch, groups) == 2)
        t->opt = cx_optim_adamw_groups(groups, 2, o);
    free(scratch);
    return t->opt ? CX_OK : CX_ERR_ARG;
}

/* @return 0 or an exit code after one line on stderr. */
static int build_trainer(const config *c, trainer *t, bool train)
{
    *t = (trainer){ .precision = c->precision };
    cx_manual_seed((uint64_t)c->seed);
    t->model = cx_nn_gpt(c->model);
    if (!t->model || (train && wrap(c, t) != CX_OK) || (train && build_optimizer(c, t) != CX_OK)) {
        fprintf(stderr, "gpt: cannot build the model: %s\n", cx_last_error());
        trainer_free(t);
        return EXIT_RUNTIME;
    }
    return 0;
}

/* The recipe's schedule: linear warm-up from lr / warmup to lr over the
 * first `warmup` steps, then cosine down to min_lr at the last step. */
static double lr_at(const config *c, int64_t step)
{
    if (step < c->warmup) return c->lr * (double)(step + 1) / (double)c->warmup;
    int64_t span = c->steps - 1 - c->warmup;
    double progress = span > 0 ? (double)(step - c->warmup) / (double)span : 1.0;
    if (progress > 1.0) progress = 1.0;
    return c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(M_PI * progress));
}

/* ---- evaluation ------------------------------------------------------------------------------------- */

/* The mean cross-entropy over the val split's evaluation windows. Every
 * rank evaluates all of them (FSDP's forward needs every rank anyway).
 * @return the loss, or NAN after printing why. */
static double val_loss(trainer *t, cx_dataset *val)
{
    cx_sampler_opts so = cx_sampler_default_opts();
    so.shuffle = false;
    cx_sampler *sampler = cx_sampler_new(cx_dataset_size(val), so);
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = EVAL_BATCH;
    cx_loader *loader = sampler ? cx_loader_new(val, sampler, lo) : NULL;
    if (!loader) {
        fprintf(stderr, "gpt: val loader: %s\n", cx_last_error());
        cx_sampler_free(sampler);
        return NAN;
    }
    cx_module_train(t->model, false);
    cx_no_grad_begin();
    cx_tensor *total = cx_persist(cx_zeros(NULL, 0, CX_F32));
    cx_sync_tensors(&total, 1);
    int64_t windows = 0;
    cx_batch b;
    while (cx_loader_next(loader, &b) == CX_LOADER_BATCH) {
        cx_tensor *in[2] = { cx_batch_field(&b, CX_FIELD_X), cx_batch_field(&b, CX_FIELD_Y) }, *out[2] = { 0 };
        precision_forward_begin(t->precision);
        if (t->fsdp) cx_fsdp_forward_many(t->fsdp, in, 2, out, 2);
        else cx_module_forward_many(t->model, in, 2, out, 2);
        precision_forward_end(t->precision);
        /* a batch's mean times its size: the windows' mean at the end */
        cx_assign(total, cx_add(total, cx_mul_scalar(out[1], (double)b.size)));
        windows += b.size;
    }
    cx_no_grad_end();
    cx_module_train(t->model, true);
    double loss = cx_loader_error(loader) == CX_OK && windows > 0 ? cx_item(total) / (double)windows : NAN;
    if (isnan(loss)) fprintf(stderr, "gpt: val loss: %s\n", cx_last_error());
    cx_free(total);
    cx_loader_free(loader);
    cx_sampler_free(sampler);
    return loss;
}

/* ---- logging ---------------------------------------------------------------------------------------- */

typedef struct {
    FILE *jsonl;
    bool tty;
    double t_last;
    int64_t step_last;
    cx_tensor *loss;        /* kept past its step, read once the step has run */
    int64_t loss_step;
    double loss_lr;
    double last_loss;       /* the last one printed, for the summary */
} logger;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Prints the pending loss: rank 0 the run's progress (global tokens/s,
 * share of --steps, ETA), as one rewritten line on a terminal, plain lines
 * otherwise, and a JSON line in the log file; with --log-all-ranks every
 * rank its own loss and throughput instead. */
static void log_flush(logger *g, const config *c, double val)
{
    if (!g->loss && isnan(val)) return;
    int rank = cx_global_ordinal();
    double now = now_s(), tok_s = (double)(g->loss_step + 1 - g->step_last) * (double)c->batch_size *
                                  (double)c->model.block_size / (now - g->t_last);
    double loss = g->loss ? cx_item(g->loss) : NAN;
    int64_t step = g->loss_step + 1;
    double eta = (double)(c->steps - step) * (double)c->batch_size * (double)c->model.block_size / tok_s;
    int pct = (int)(100 * step / c->steps), em = (int)(eta / 60), es = (int)fmod(eta, 60);
    if (g->loss) g->last_loss = loss;
    if (g->loss && c->log_all_ranks) {
        /* spmd: every rank runs the whole global batch */
        double mine = cx_is_spmd() ? tok_s : tok_s / cx_world_size();
        printf("step %lld/%lld (%d%%): loss %.4f, lr %.2e, %.0f tokens/s on this rank, ETA %dm%02ds\n", (long long)step,
               (long long)c->steps, pct, loss, g->loss_lr, mine, em, es);
    } else if (g->loss && rank == 0 && g->tty) {
        printf("\rstep %lld/%lld (%d%%) | loss %.4f | lr %.2e | %.0f tokens/s | ETA %dm%02ds   ", (long long)step,
               (long long)c->steps, pct, loss, g->loss_lr, tok_s, em, es);
    } else if (g->loss && rank == 0) {
        printf("step %lld/%lld (%d%%): loss %.4f, lr %.2e, %.0f tokens/s, ETA %dm%02ds\n", (long long)step,
               (long long)c->steps, pct, loss, g->loss_lr, tok_s, em, es);
    }
    if (rank == 0) {
        if (!isnan(val)) printf("%sstep %lld: val loss %.4f\n", g->tty ? "\n" : "", (long long)step, val);
        if (g->jsonl) {
            fprintf(g->jsonl, "{\"step\": %lld", (long long)step);
            /* a non-finite number is null (val's NaN means none this step) */
            char l[48], v[48];
            if (g->loss)
                fprintf(g->jsonl, ", \"loss\": %s, \"lr\": %.6g, \"tokens_per_s\": %.1f", lc_json_num(l, sizeof l, "%.6f", loss),
                        g->loss_lr, isfinite(tok_s) ? tok_s : 0.0);
            if (!isnan(val)) fprintf(g->jsonl, ", \"val_loss\": %s", lc_json_num(v, sizeof v, "%.6f", val));
            fprintf(g->jsonl, "}\n");
            fflush(g->jsonl);
        }
    }
    fflush(stdout);
    if (g->loss) {
        g->t_last = now;
        g->step_last = step;
    }
    cx_free(g->loss);
    g->loss = NULL;
}

/* ---- checkpoints ------------------------------------------------------------------------------------- */

static cx_ckpt_model ckpt_model(const trainer *t, const config *c)
{
    if (t->fsdp) return cx_ckpt_model_fsdp(t->fsdp, c->zero == 3);
    if (t->ddp) return cx_ckpt_model_ddp(cx_ddp_module(t->ddp));
    if (cx_is_spmd()) return cx_ckpt_model_spmd(t->model);   /* each rank writes its shards */
    return cx_world_size() > 1 ? cx_ckpt_model_ddp(t->model) : cx_ckpt_model_single(t->model);
}

static cx_status save(const config *c, trainer *t, int64_t step, int64_t epoch, int64_t position)
{
    char prefix[4096];
    cx_ckpt_manager_prefix(t->ckpts, step, prefix, sizeof prefix);
    cx_ckpt_extra ex = { step, epoch, position };
    cx_status st = cx_ckpt_manager_save(t->ckpts, step, ckpt_model(t, c), t->opt, &ex);
    if (st != CX_OK) fprintf(stderr, "gpt: checkpoint save failed: %s\n", cx_last_error());
    else if (cx_global_ordinal() == 0) printf("%sgpt: saved %s\n", isatty(1) ? "\n" : "", prefix);   /* past a \r progress line */
    return st;
}

/* --resume: auto (the latest committed checkpoint in --ckpt-dir, if any) or
 * a prefix. @return false when there is none to resume from. */
static bool resume_prefix(const config *c, char *out, size_t cap)
{
    if (!c->resume) return false;
    if (strcmp(c->resume, "auto")) {
        snprintf(out, cap, "%s", c->resume);
        return true;
    }
    return c->ckpt_dir && cx_ckpt_latest(c->ckpt_dir, out, cap) == CX_OK;
}

/* Loads --resume's checkpoint. @return 0 or an exit code; *ex the saved
 * step and position. */
static int resume(const config *c, trainer *t, cx_ckpt_extra *ex)
{
    *ex = (cx_ckpt_extra){ 0, 1, 0 };
    if (c->ckpt_dir) {
        cx_ckpt_manager_opts mo = cx_ckpt_manager_default_opts();
        mo.save_interval = c->ckpt_every;
        mo.max_to_keep = c->keep;
        char meta[256];
        model_meta(&c->model, c->precision, meta, sizeof meta);
        mo.meta = meta;   /* every save: eval, sample and --resume read the shape back */
        if (!(t->ckpts = cx_ckpt_manager_new(c->ckpt_dir, mo))) {
            fprintf(stderr, "gpt: --ckpt-dir: %s\n", cx_last_error());
            return EXIT_RUNTIME;
        }
    }
    char prefix[4096];
    if (!resume_prefix(c, prefix, sizeof prefix)) {
        if (c->resume && cx_global_ordinal() == 0) printf("gpt: notice: no committed checkpoint, starting fresh\n");
        return 0;
    }
    if (cx_ckpt_load(prefix, ckpt_model(t, c), t->opt, ex) != CX_OK) {
        fprintf(stderr, "gpt: cannot resume: %s%s\n", cx_last_error(),
                c->flags_shape ? " (the checkpoint has no model config: give train's model flags)" : "");
        return EXIT_DATA;
    }
    if (cx_global_ordinal() == 0) printf("gpt: resumed from %s at step %lld\n", prefix, (long long)ex->step);
    return 0;
}

/* ---- training ---------------------------------------------------------------------------------------- */

/* One step on batch b: forward, backward (DDP: bucketed all-reduce; FSDP:
 * reduce-scatter), clip, AdamW at this step's rate. @return the loss. */
static cx_tensor *train_step(const config *c, trainer *t, const cx_batch *b, int64_t step)
{
    cx_optim_zero_grad(t->opt);
    cx_tensor *in[2] = { cx_batch_field(b, CX_FIELD_X), cx_batch_field(b, CX_FIELD_Y) }, *out[2] = { 0 };
    precision_forward_begin(c->precision);
    int n = t->fsdp   ? cx_fsdp_forward_many(t->fsdp, in, 2, out, 2)
          : t->ddp    ? cx_ddp_forward_many(t->ddp, in, 2, out, 2)
          : t->fsdpv2 ? cx_spmd_fsdp_forward_many(t->fsdpv2, in, 2, out, 2)
                      : cx_module_forward_many(t->model, in, 2, out, 2);
    precision_forward_end(c->precision);
    if (n != 2) return cx_poisoned("gpt: forward: %s", cx_last_error());
    cx_tensor *loss = out[1];   // () mean cross-entropy
    cx_status st = t->fsdp ? cx_fsdp_backward(t->fsdp, loss) : t->ddp ? cx_ddp_backward(t->ddp, loss) : cx_backward(loss);
    if (st == CX_OK && c->grad_clip > 0) {
        if (t->fsdp) cx_fsdp_clip_grad_norm(t->fsdp, c->grad_clip);
        else {
            cx_tensor **ps = malloc(sizeof *ps * (size_t)t->nparams);
            if (!ps) return cx_poisoned("gpt: out of memory");
            for (int i = 0; i < t->nparams; i++) ps[i] = t->params[i].tensor;
            cx_clip_grad_norm(ps, t->nparams, c->grad_clip);
            free(ps);
        }
    }
    cx_optim_set_lr(t->opt, lr_at(c, step));
    /* several ranks without a wrapper all-reduce in the optimizer step (xm); under SPMD the partitioner does */
    bool xm_step = cx_world_size() > 1 && !t->ddp && !t->fsdp && !cx_is_spmd();
    if (st == CX_OK) st = xm_step ? cx_optimizer_step(t->opt) : cx_optim_step(t->opt);
    return st == CX_OK ? loss : cx_poisoned("gpt: step %lld: %s", (long long)step, cx_last_error());
}

typedef struct {
    cx_dataset *train, *val;
    cx_sampler *sampler;
    cx_loader *loader;
    cx_spec_entry input_spec[2];   /* spmd: (data, None); fsdpv2: (fsdp, None), the seed's input sharding */
} train_data;

/* --parallel spmd: the mesh (data, model) from --mesh; fsdpv2: (fsdp,
 * model). @return it, or NULL after printing why. */
static cx_mesh *spmd_mesh(const config *c)
{
    bool v2 = !strcmp(c->parallel, "fsdpv2");
    const char *first = v2 ? "fsdp" : "data", *form = v2 ? "fsdp=N,model=M" : "data=D,model=M";
    int world = cx_world_size(), data = world, model = 1, used = 0;
    char fmt[32];
    snprintf(fmt, sizeof fmt, "%s=%%d,model=%%d%%n", first);
    if (c->mesh && (sscanf(c->mesh, fmt, &data, &model, &used) != 2 || c->mesh[used] || data < 1 || model < 1)) {
        fprintf(stderr, "gpt: --mesh '%s' is not %s (--parallel %s)\n", c->mesh, form, c->parallel);
        return NULL;
    }
    if (data * model != world) {
        fprintf(stderr, "gpt: --mesh %s=%d,model=%d has %d devices but there are %d ranks\n", first, data, model, data * model, world);
        return NULL;
    }
    if (!v2 && c->model.n_head % model) {
        fprintf(stderr, "gpt: --mesh model=%d: %d heads do not split over %d ranks\n", model, c->model.n_head, model);
        return NULL;
    }
    cx_use_spmd();
    int shape[2] = { data, model };
    const char *axes[2] = { first, "model" };
    cx_mesh *m = cx_mesh_new(NULL, 2, shape, axes);
    if (!m) fprintf(stderr, "gpt: --mesh: %s\n", cx_last_error());
    cx_set_global_mesh(m);   /* wrap() splits the blocks over its model axis */
    return m;
}

static void train_data_free(train_data *d)
{
    cx_loader_free(d->loader);
    cx_sampler_free(d->sampler);
    cx_dataset_free(d->train);
    cx_dataset_free(d->val);
}

/* Windows for this rank: its share of the global batch. @return 0 or an exit code. */
static int open_data(const config *c, train_data *d)
{
    *d = (train_data){ 0 };
    char path[4096];
    int rc = corpus_path(c, path, sizeof path);
    if (rc) return rc;
    int world = cx_world_size();
    bool spmd = !strcmp(c->parallel, "spmd") || !strcmp(c->parallel, "fsdpv2");
    cx_mesh *mesh = spmd ? spmd_mesh(c) : NULL;
    if (spmd && !mesh) return EXIT_USAGE;
    if (c->mesh && !spmd) {
        fprintf(stderr, "gpt: --mesh applies to --parallel spmd and fsdpv2, not %s\n", c->parallel);
        return EXIT_USAGE;
    }
    if (strcmp(c->grad_comm, "f32") && strcmp(c->parallel, "ddp")) {
        fprintf(stderr, "gpt: --grad-comm %s applies to --parallel ddp, not %s\n", c->grad_comm, c->parallel);
        return EXIT_USAGE;
    }
    if (c->batch_size % world) {
        /* every rank fails alike; one line says it for all */
        long long b = c->batch_size, down = b - b % world, up = down + world;
        char nearest[64];
        if (down == 0 || up - b < b - down) snprintf(nearest, sizeof nearest, "%lld", up);
        else if (b - down < up - b) snprintf(nearest, sizeof nearest, "%lld", down);
        else snprintf(nearest, sizeof nearest, "%lld or %lld", down, up);
        if (cx_global_ordinal() == 0)
            fprintf(stderr, "gpt: --batch-size %lld does not split over %d ranks (it is the global batch); "
                            "the nearest that does: %s\n", b, world, nearest);
        return EXIT_USAGE;
    }
    if (open_split(c, path, false, &d->train) != CX_OK || open_split(c, path, true, &d->val) != CX_OK) {
        fprintf(stderr, "gpt: %s\n", cx_last_error());
        return EXIT_DATA;
    }
    /* spmd: every rank takes the global batch and reads only its rows */
    cx_sampler_opts so = cx_sampler_default_opts();
    so.seed = (uint64_t)c->seed;
    so.rank = spmd ? 0 : cx_global_ordinal();
    so.world_size = spmd ? 1 : world;
    so.drop_last = true;
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = spmd ? c->batch_size : c->batch_size / world;
    lo.drop_last = true;
    if (spmd) {
        d->input_spec[0] = CX_SPEC_NAME(!strcmp(c->parallel, "fsdpv2") ? "fsdp" : "data");
        d->input_spec[1] = CX_SPEC_NONE;
        lo.input_mesh = mesh;
        lo.input_spec = d->input_spec;
        lo.input_nspec = 2;
    }
    d->sampler = cx_sampler_new(cx_dataset_size(d->train), so);
    d->loader = d->sampler ? cx_loader_new(d->train, d->sampler, lo) : NULL;
    if (!d->loader) {
        fprintf(stderr, "gpt: data loader: %s\n", cx_last_error());
        return EXIT_RUNTIME;
    }
    return 0;
}

/* Evaluates and logs at `step` (1-based count of steps done). @return false on failure. */
static bool eval_and_log(const config *c, trainer *t, train_data *d, logger *g, int64_t done, double *last_val)
{
    log_flush(g, c, NAN);
    *last_val = val_loss(t, d->val);
    if (isnan(*last_val)) return false;
    g->loss_step = done - 1;
    log_flush(g, c, *last_val);
    return true;
}

static int cmd_train(const config *c)
{
    train_data d;
    int rc = open_data(c, &d);
    trainer t = { 0 };
    if (!rc) rc = build_trainer(c, &t, true);
    cx_ckpt_extra ex;
    if (!rc) rc = resume(c, &t, &ex);
    if (rc) { train_data_free(&d); trainer_free(&t); return rc; }
    if (cx_global_ordinal() == 0)
        printf("gpt: %lld parameters, %d layers, %d heads, n_embd %lld, block %lld; %lld train / %lld val windows "
               "of this size per epoch; batch %lld over %d rank(s), parallel %s%s\n",
               (long long)cx_module_num_params(t.model), c->model.n_layer, c->model.n_head,
               (long long)c->model.n_embd, (long long)c->model.block_size, (long long)cx_dataset_size(d.train),
               (long long)cx_dataset_size(d.val), (long long)c->batch_size, cx_world_size(), c->parallel,
               precision_banner(c->precision));
    if (cx_global_ordinal() == 0 && c->warmup > c->steps)
        printf("gpt: warning: --warmup %lld is longer than --steps %lld: the learning rate peaks at %.2e, never "
               "reaching --lr %.2e\n", (long long)c->warmup, (long long)c->steps, lr_at(c, c->steps - 1), c->lr);
    logger g = { .tty = isatty(1), .t_last = now_s(), .step_last = ex.step, .last_loss = NAN };
    double t0 = g.t_last;
    if (c->log_file && cx_global_ordinal() == 0 && !(g.jsonl = fopen(c->log_file, ex.step ? "a" : "w"))) {
        fprintf(stderr, "gpt: cannot write --log-file %s: %s\n", c->log_file, strerror(errno));
        rc = EXIT_RUNTIME;
    }
    int64_t step = ex.step, epoch = ex.epoch > 0 ? ex.epoch : 1, saved = ex.step;
    double last_val = NAN;
    cx_loader_set_epoch(d.loader, epoch, ex.sampler_position);
    while (!rc && step < c->steps) {
        cx_batch b;
        cx_loader_result got = cx_loader_next(d.loader, &b);
        if (got != CX_LOADER_BATCH) {
            if (got == CX_LOADER_ERROR) { fprintf(stderr, "gpt: %s\n", cx_last_error()); rc = EXIT_RUNTIME; }
            else cx_loader_set_epoch(d.loader, ++epoch, 0);
            continue;
        }
        log_flush(&g, c, NAN);
        cx_tensor *loss = train_step(c, &t, &b, step);
        if (cx_tensor_error(loss)) { fprintf(stderr, "%s\n", cx_tensor_error(loss)); cx_loader_end_step(d.loader); rc = EXIT_RUNTIME; break; }
        step++;
        if (step % c->log_every == 0 || step == c->steps) {
            g.loss = cx_keep(loss);
            g.loss_step = step - 1;
            g.loss_lr = lr_at(c, step - 1);
        }
        bool eval_now = c->eval_every > 0 && step % c->eval_every == 0 && step < c->steps;
        bool preempted = t.ckpts && cx_ckpt_manager_reached_preemption(t.ckpts, step);   /* every rank alike */
        bool save_now = cx_ckpt_manager_should_save(t.ckpts, step) || preempted;
        if (eval_now || save_now) {
            if (cx_loader_end_step(d.loader) != CX_OK) { rc = EXIT_RUNTIME; break; }
            log_flush(&g, c, NAN);   /* this step's line before its checkpoint's */
            if (save_now && save(c, &t, step, epoch, cx_loader_position(d.loader)) != CX_OK) rc = EXIT_RUNTIME;
            if (save_now) saved = step;
            if (!rc && preempted) {
                if (cx_global_ordinal() == 0)
                    printf("gpt: preempted: saved step %lld in %s; rerun with --resume auto\n", (long long)step, c->ckpt_dir);
                rc = EXIT_PREEMPTED;
            }
            if (!rc && eval_now && !eval_and_log(c, &t, &d, &g, step, &last_val)) rc = EXIT_RUNTIME;
        }
    }
    if (!rc) cx_loader_end_step(d.loader);
    if (!rc && !eval_and_log(c, &t, &d, &g, step, &last_val)) rc = EXIT_RUNTIME;
    if (!rc && c->ckpt_dir && saved != step && save(c, &t, step, epoch, cx_loader_position(d.loader)) != CX_OK)
        rc = EXIT_RUNTIME;
    if (!rc && cx_global_ordinal() == 0) {
        printf("peak device memory: %.1f MB\n", (double)cx_memory_peak() / 1e6);
        printf("val loss: %.4f\n", last_val);
        double wall = now_s() - t0;
        char where[4096] = "";
        if (t.ckpts) cx_ckpt_manager_prefix(t.ckpts, step, where, sizeof where);
        printf("gpt: done: %lld steps in %.1f s, %.0f tokens/s, loss %.4f, val loss %.4f; %s%s\n",
               (long long)(step - ex.step), wall,
               (double)(step - ex.step) * (double)c->batch_size * (double)c->model.block_size / wall, g.last_loss,
               last_val, t.ckpts ? "checkpoint " : "no checkpoint (no --ckpt-dir)", where);
    }
    fflush(stdout);
    if (g.jsonl) fclose(g.jsonl);
    cx_free(g.loss);
    train_data_free(&d);
    trainer_free(&t);
    return rc;
}

/* ---- eval and sample: a model from a checkpoint ------------------------------------------------ */

/* A consolidated file (*.h5) or a checkpoint prefix. @return 0 or EXIT_DATA. */
static int load_model(const config *c, trainer *t)
{
    size_t n = strlen(c->ckpt);
    bool full = n > 3 && !strcmp(c->ckpt + n - 3, ".h5");
    cx_ckpt_opts o = cx_ckpt_default_opts();
    o.with_optimizer = false;
    cx_status st = full ? cx_ckpt_load_full(c->ckpt, cx_ckpt_model_single(t->model), NULL, NULL)
                        : cx_ckpt_load_opts(c->ckpt, cx_ckpt_model_single(t->model), NULL, NULL, o);
    if (st != CX_OK) {
        if (!c->flags_shape)
            fprintf(stderr, "gpt %s: cannot load --ckpt %s: %s\n", c->cmd, c->ckpt, cx_last_error());
        else   /* saved before checkpoints held the model's config: the flags give it */
            fprintf(stderr, "gpt %s: cannot load --ckpt %s (were the model flags train's?): %s\n", c->cmd, c->ckpt,
                    cx_last_error());
        return EXIT_DATA;
    }
    return 0;
}

static int cmd_eval(const config *c)
{
    char path[4096];
    trainer t;
    int rc = corpus_path(c, path, sizeof path);
    if (!rc) rc = build_trainer(c, &t, false);
    if (rc) return rc;
    cx_dataset *val = NULL;
    rc = load_model(c, &t);
    if (!rc && open_split(c, path, true, &val) != CX_OK) {
        fprintf(stderr, "gpt eval: %s\n", cx_last_error());
        rc = EXIT_DATA;
    }
    double loss = rc ? NAN : val_loss(&t, val);
    if (!rc && isnan(loss)) rc = EXIT_RUNTIME;
    if (!rc) printf("val loss: %.4f\n", loss);
    cx_dataset_free(val);
    trainer_free(&t);
    return rc;
}

/* splitmix64: the sampler's own RNG, so a seed gives the same text anywhere */
static double uniform01(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

/* Draws a token from logits / temperature, among the top_k likeliest (0: all). */
static int64_t draw(const float *logits, int64_t v, double temperature, int64_t top_k, uint64_t *rng)
{
    double kth = -INFINITY;
    if (top_k > 0 && top_k < v) {
        /* the k-th largest logit: the smallest one with fewer than k above it */
        kth = INFINITY;
        for (int64_t i = 0; i < v; i++) {
            int64_t above = 0;
            for (int64_t j = 0; j < v; j++) above += logits[j] > logits[i];
            if (above < top_k && logits[i] < kth) kth = logits[i];
        }
    }
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < v; i++) if (logits[i] >= kth && logits[i] > mx) mx = logits[i];
    for (int64_t i = 0; i < v; i++) if (logits[i] >= kth) sum += exp((logits[i] - mx) / temperature);
    double u = uniform01(rng) * sum;
    int64_t last = 0;
    for (int64_t i = 0; i < v; i++) {
        if (logits[i] < kth) continue;
        last = i;
        u -= exp((logits[i] - mx) / temperature);
        if (u <= 0) return i;
    }
    return last;
}

/* Next-token logits of a window (1, block) at position pos - 1: the window
 * is always `block` tokens (left-aligned, zero-padded; causal attention
 * never looks right), and the position is a runtime scalar, so every
 * token reuses one compiled graph. */
static cx_status next_logits(cx_module *m, precision p, const int64_t *window, int64_t block, int64_t pos, float *out,
                             int64_t v)
{
    int64_t shape[2] = { 1, block }, sel_shape[3] = { 1, block, 1 };
    cx_step_begin();
    cx_tensor *idx = cx_from_host(window, shape, 2, CX_I64);
    precision_forward_begin(p);
    cx_tensor *logits = cx_module_forward(m, idx);                                      // (1, T, V)
    precision_forward_end(p);
    cx_tensor *at = cx_eq(cx_arange(block, CX_I64), cx_runtime_scalar((double)(pos - 1), CX_I64));   // (T)
    cx_tensor *sel = cx_reshape(cx_cast(at, CX_F32), sel_shape, 3);                    // (1, T, 1)
    int axis = 1;
    cx_tensor *row = cx_keep(cx_sum(cx_mul(logits, sel), &axis, 1, false));             // (1, V)
    cx_status st = cx_step_end();
    if (st == CX_OK) st = cx_to_host(row, out, CX_F32);
    cx_free(row);
    (void)v;
    return st;
}

/* Tokens are bytes, and a small model draws byte sequences that are not
 * UTF-8: printed as they come they garble a terminal, so each maximal
 * invalid subpart becomes U+FFFD (as Python's errors="replace"), kept
 * across tokens since a character spans several. */
typedef struct {
    unsigned char buf[4];
    int n, need;
} utf8_out;

static void utf8_put(utf8_out *u, unsigned char b)
{
    static const char replacement[] = "\xEF\xBF\xBD";
    if (u->n > 0) {
        unsigned char lo = 0x80, hi = 0xBF, lead = u->buf[0];
        /* the second byte's range rules out overlongs, surrogates and > U+10FFFF */
        if (u->n == 1 && lead == 0xE0) lo = 0xA0;
        if (u->n == 1 && lead == 0xED) hi = 0x9F;
        if (u->n == 1 && lead == 0xF0) lo = 0x90;
        if (u->n == 1 && lead == 0xF4) hi = 0x8F;
        if (b >= lo && b <= hi) {
            u->buf[u->n++] = b;
            if (u->n == u->need) { fwrite(u->buf, 1, (size_t)u->n, stdout); u->n = 0; }
            return;
        }
        fputs(replacement, stdout);
        u->n = 0;   /* b starts afresh */
    }
    u->need = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (u->need == 1) putchar(b);
    else if (u->need == 0) fputs(replacement, stdout);
    else u->buf[u->n++] = b;
}

static void utf8_end(utf8_out *u)
{
    if (u->n > 0) fputs("\xEF\xBF\xBD", stdout);
    u->n = 0;
}

static int cmd_sample(const config *c)
{
    utf8_out u = { 0 };
    trainer t;
    int rc = build_trainer(c, &t, false);
    if (rc) return rc;
    rc = load_model(c, &t);
    int64_t block = c->model.block_size, v = c->model.vocab_size, n = (int64_t)strlen(c->prompt);
    int64_t *text = malloc(sizeof *text * (size_t)(n + c->tokens + 1)), *window = calloc((size_t)block, sizeof *window);
    float *logits = malloc(sizeof *logits * (size_t)v);
    if (!rc && (!text || !window || !logits)) { fprintf(stderr, "gpt sample: out of memory\n"); rc = EXIT_RUNTIME; }
    if (!rc && n == 0) { fprintf(stderr, "gpt sample: --prompt is empty\n"); rc = EXIT_USAGE; }
    cx_module_train(t.model, false);
    cx_no_grad_begin();
    uint64_t rng = (uint64_t)c->seed;
    int64_t compiles_after_first = 0;
    cx_metric_stats ms;
    for (int64_t i = 0; !rc && i < n; i++) text[i] = (unsigned char)c->prompt[i];
    for (int64_t i = 0; !rc && i < n; i++) utf8_put(&u, (unsigned char)c->prompt[i]);
    for (int64_t k = 0; !rc && k < c->tokens; k++) {
        int64_t len = n + k, start = len > block ? len - block : 0, pos = len - start;
        memset(window, 0, sizeof *window * (size_t)block);
        memcpy(window, text + start, sizeof *window * (size_t)pos);
        int64_t before = cx_metric_data("CompileTime", &ms) ? ms.total_samples : 0;
        if (next_logits(t.model, c->precision, window, block, pos, logits, v) != CX_OK) {
            fprintf(stderr, "gpt sample: %s\n", cx_last_error());
            rc = EXIT_RUNTIME;
            break;
        }
        if (k > 0) compiles_after_first += (cx_metric_data("CompileTime", &ms) ? ms.total_samples : 0) - before;
        text[len] = draw(logits, v, c->temperature, c->top_k, &rng);
        utf8_put(&u, (unsigned char)text[len]);
    }
    cx_no_grad_end();
    if (!rc) {
        utf8_end(&u);
        printf("\n");
        fprintf(stderr, "gpt sample: %lld tokens, %lld compiles after the first token\n", (long long)c->tokens,
                (long long)compiles_after_first);
    }
    free(text); free(window); free(logits);
    trainer_free(&t);
    return rc;
}

/* ---- plot -------------------------------------------------------------------------------------------- */

/* The train and val loss curves of the log file. @return 0 or an exit code. */
static int cmd_plot(const config *c)
{
    static const lc_series curves[] = { { .key = "loss", .title = "train" },
                                        { .key = "val_loss", .title = "val", .points = true } };
    lc_plot_spec p = { .prog = "gpt plot", .log_file = c->log_file, .out = c->out, .ylabel = "loss",
                       .series = curves, .nseries = 2 };
    return lc_plot(&p);
}

/* ---- main -------------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) {
        fprintf(stderr, "gpt: cannot start the distributed runtime: %s\n", cx_last_error());
        return EXIT_RUNTIME;
    }
    /* progress, checkpoint and summary lines all go to stdout, a line at a
     * time: under xla-launch stdout is a pipe (block-buffered by default)
     * read beside stderr's, and one stream keeps a rank's lines in order */
    setvbuf(stdout, NULL, _IOLBF, 0);
    config c;
    cli_result parsed = parse_flags(&c, argc, argv);
    int rc = parsed == CLI_HELP ? 0 : EXIT_USAGE;
    char prefix[4096];
    if (parsed == CLI_OK) {
        rc = 0;
        if (c.ckpt && strcmp(c.cmd, "train") && strcmp(c.cmd, "plot")) rc = adopt_model_meta(&c, c.ckpt);
        else if (!strcmp(c.cmd, "train") && resume_prefix(&c, prefix, sizeof prefix)) rc = adopt_model_meta(&c, prefix);
        /* the persistent cache must be set up before the first compile */
        if (!rc && c.cache_dir && cx_cache_init(c.cache_dir, false) != CX_OK) {
            fprintf(stderr, "gpt: --cache-dir %s: %s\n", c.cache_dir, cx_last_error());
            rc = EXIT_RUNTIME;
        }
    }
    if (parsed == CLI_OK && !rc && precision_setup("gpt", c.precision_flag, c.precision_given, &c.precision) != 0)
        rc = EXIT_USAGE;
    if (parsed == CLI_OK && !rc && c.saved_precision[0] && strcmp(c.saved_precision, precision_name(c.precision)) &&
        cx_global_ordinal() == 0)
        printf("gpt %s: notice: the checkpoint was saved by a --precision %s run, and this one runs %s (checkpoints "
               "hold f32 weights and optimizer state, so it loads either way)\n", c.cmd, c.saved_precision,
               precision_name(c.precision));
    if (parsed == CLI_OK && !rc) {
        if (c.threads > 0) cx_set_num_threads(c.threads);
        if (!strcmp(c.cmd, "train")) rc = cmd_train(&c);
        else if (!strcmp(c.cmd, "eval")) rc = cmd_eval(&c);
        else if (!strcmp(c.cmd, "sample")) rc = cmd_sample(&c);
        else rc = cmd_plot(&c);
    }
    cx_dist_finalize();
    return rc;
}
