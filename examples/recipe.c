/* The seed's ImageNet recipe flags (see recipe.h). */
#include "recipe.h"

#include "cx_cli.h"
#include "learning_curve.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

recipe_flags recipe_default_flags(void)
{
    return (recipe_flags){ .warmup_epochs = 0.9, .divide_every = 20, .divisor = 5, .eval_interval = 1 };
}

/* ---- blocks ------------------------------------------------------------------------------ */

/* A model's blocks: FSDP's nested units and the checkpointed modules. */
static const struct {
    const char *model;
    const char *types[2];
} k_blocks[] = {
    { "cnn", { "Linear", "Conv2d" } },
    { "lenet", { "Linear", "Conv2d" } },
    { "mlp", { "Linear", "Conv2d" } },
    { "resnet18", { "BasicBlock" } },
    { "resnet50", { "Bottleneck" } },
};

const char *const *recipe_block_types(const char *model, int *n)
{
    for (size_t i = 0; i < sizeof k_blocks / sizeof *k_blocks; i++) {
        if (strcmp(k_blocks[i].model, model)) continue;
        *n = k_blocks[i].types[1] ? 2 : 1;
        return k_blocks[i].types;
    }
    *n = 0;
    return NULL;
}

static bool listed(const char *name, const char *const *types, int n)
{
    for (int i = 0; i < n; i++) if (!strcmp(name, types[i])) return true;
    return false;
}

int recipe_checkpoint_blocks(cx_module *m, const char *const *types, int n)
{
    if (listed(cx_module_type_name(m), types, n)) return cx_checkpoint_module(m) == CX_OK ? 1 : -1;
    int found = 0;
    for (int i = 0; i < cx_module_num_children(m); i++) {
        int k = recipe_checkpoint_blocks(cx_module_child(m, i), types, n);
        if (k < 0) return -1;
        found += k;
    }
    return found;
}

void recipe_print_blocks(const recipe_flags *r, const char *model, const cx_fsdp *fsdp, int checkpointed)
{
    if (!r->use_nested_fsdp && !r->use_gradient_checkpointing) return;
    int n, units = 0;
    const char *const *types = recipe_block_types(model, &n);
    if (fsdp) cx_fsdp_shard_metadata(fsdp, &units);
    char wrapped[48] = "";
    if (fsdp) snprintf(wrapped, sizeof wrapped, "%d FSDP units, ", units);
    printf("blocks of %s (%s%s%s): %s%d checkpointed\n", model, types[0], n > 1 ? ", " : "", n > 1 ? types[1] : "",
           wrapped, checkpointed);
    fflush(stdout);
}

/* ---- flags that go together ---------------------------------------------------------------- */

/* One line on rank 0. @return 2, the usage exit code. */
__attribute__((format(printf, 1, 2))) static int usage(const char *fmt, ...)
{
    if (cx_global_ordinal() != 0) return 2;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "train: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see train --help)\n");
    va_end(ap);
    return 2;
}

int recipe_check(recipe_flags *r, const char *model, const char **parallel, bool nested, int64_t auto_wrap_min_params,
                 bool grad_ckpt)
{
    if (r->use_nested_fsdp) {
        /* the seed's script is FSDP's: the flag alone means FSDP */
        if (r->parallel_given && strcmp(*parallel, "fsdp"))
            return usage("--use_nested_fsdp wraps the model's blocks as FSDP units: it goes with --parallel fsdp "
                         "(or alone), not --parallel %s", *parallel);
        *parallel = "fsdp";
        if (nested || auto_wrap_min_params)
            return usage("--use_nested_fsdp makes the model's blocks the units: drop %s",
                         nested ? "--nested" : "--auto-wrap-min-params");
    }
    if (r->use_gradient_checkpointing && grad_ckpt)
        return usage("--use_gradient_checkpointing (the model's blocks) and --grad-ckpt (each unit, or each child of "
                     "the model) are two policies: give one");
    int n;
    if ((r->use_nested_fsdp || r->use_gradient_checkpointing) && !recipe_block_types(model, &n))
        return usage("%s: no block types are known for --model %s", r->use_nested_fsdp ? "--use_nested_fsdp"
                     : "--use_gradient_checkpointing", model);
    return 0;
}

/* ---- the learning rate ------------------------------------------------------------------------ */

recipe_schedule recipe_schedule_of(const recipe_flags *r, double lr, int64_t steps_per_epoch)
{
    bool on = r->schedule_given[0] || r->schedule_given[1] || r->schedule_given[2];
    return (recipe_schedule){ .on = on, .lr = lr, .warmup_epochs = r->warmup_epochs, .divide_every = r->divide_every,
                              .divisor = r->divisor, .steps_per_epoch = steps_per_epoch > 0 ? steps_per_epoch : 1, .at = -1 };
}

/* The rate the seed's scheduler computes at its step count n: a linear
 * ramp while n's whole epoch is below ceil(E), then the peak divided by D
 * every K whole epochs (epochs counted from 0). The operations in
 * Python's order, so that the values agree to the bit. */
static double rate_at(const recipe_schedule *s, int64_t n)
{
    int64_t epoch = n / s->steps_per_epoch;
    if ((double)epoch < ceil(s->warmup_epochs)) {
        double ramp = s->lr * (((double)n + 1.0) / (s->warmup_epochs * (double)s->steps_per_epoch));
        return ramp < s->lr ? ramp : s->lr;
    }
    return s->lr / pow((double)s->divisor, (double)(epoch / s->divide_every));
}

/* One scheduler.step(): the count always advances, but the optimizer's
 * rate changes (to the rate of the new count) only when the rate of the
 * old count differs from the last one that did by 1e-6 or more. */
static void sched_step(recipe_schedule *s)
{
    double now = rate_at(s, s->count);
    s->count++;
    if (fabs(now - s->previous) >= 1e-6) {
        s->current = rate_at(s, s->count);
        s->previous = now;
    }
}

/* Step by step as the seed's scheduler goes: it steps once when it is
 * made (so step 0 runs at the rate of count 1, the ramp starting at
 * 2 / (E x steps per epoch) of the peak), then after every optimizer step;
 * a division thus takes effect on the first step of its epoch, one step
 * after the count crossed it. */
double recipe_lr_at(recipe_schedule *s, int64_t step)
{
    if (!s->on) return s->lr;
    if (s->at < 0 || step < s->at) {
        s->count = 0;
        s->previous = -1;
        sched_step(s);
        s->at = 0;
    }
    for (; s->at < step; s->at++) sched_step(s);
    return s->current;
}

/* ---- the learning-curve log -------------------------------------------------------------------- */

/* Keeps the lines of `path` whose step is at most `last_step`, through a
 * temporary file renamed over it (a crash leaves the old log or the new,
 * never half of one). A line's step is the optimizer steps done when it
 * was written: an evaluation at the step of the checkpoint is of an epoch
 * the resumed run does not train again. @return 0, or -1 after one line. */
static int log_keep_through(const char *path, int64_t last_step)
{
    FILE *in = fopen(path, "r");
    if (!in) {
        if (errno == ENOENT) return 0;   /* nothing logged yet: the resumed run starts the file */
        fprintf(stderr, "train: cannot read --log-file %s to resume it: %s\n", path, strerror(errno));
        return -1;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
    int fd = mkstemp(tmp);
    FILE *out = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!out) {
        fprintf(stderr, "train: cannot rewrite --log-file %s to resume it: %s\n", path, strerror(errno));
        if (fd >= 0) { close(fd); unlink(tmp); }
        fclose(in);
        return -1;
    }
    char line[4096];
    bool ok = true;
    while (fgets(line, sizeof line, in)) {
        const char *s = strstr(line, "\"step\":");
        /* a line cut short by the run that died is not kept */
        if (!s || !strchr(line, '\n') || atoll(s + 7) > last_step) continue;
        ok = ok && fputs(line, out) >= 0;
    }
    ok = !ferror(in) && ok;
    fclose(in);
    ok = fclose(out) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "train: cannot rewrite --log-file %s to resume it: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

FILE *recipe_log_open(const recipe_flags *r, int64_t resumed_step, bool *failed)
{
    *failed = false;
    if (!r->log_file) return NULL;
    FILE *f = NULL;
    if (cx_global_ordinal() == 0 && (resumed_step < 0 || log_keep_through(r->log_file, resumed_step) == 0) &&
        !(f = fopen(r->log_file, resumed_step >= 0 ? "a" : "w")))
        fprintf(stderr, "train: cannot write --log-file %s: %s\n", r->log_file, strerror(errno));
    /* every rank stops, not rank 0 alone (the others would wait for it in the first step) */
    double mine = cx_global_ordinal() == 0 && !f, any = 0;
    if (cx_mesh_reduce("log_file", &mine, 1, NULL, &any) != CX_OK || any > 0) {
        if (f) fclose(f);
        *failed = true;
        return NULL;
    }
    return f;
}

void recipe_log_step(FILE *f, int64_t step, int epoch, double loss, double lr, double images_per_s)
{
    if (!f) return;
    char l[48], r[48], v[48];
    fprintf(f, "{\"step\": %lld, \"epoch\": %d, \"loss\": %s, \"lr\": %s, \"images_per_s\": %s}\n", (long long)step,
            epoch, lc_json_num(l, sizeof l, "%.6f", loss), lc_json_num(r, sizeof r, "%.9g", lr),
            lc_json_num(v, sizeof v, "%.1f", images_per_s));
    fflush(f);
}

void recipe_log_eval(FILE *f, int64_t step, int epoch, double accuracy, int64_t images)
{
    if (!f) return;
    char a[48];
    fprintf(f, "{\"step\": %lld, \"epoch\": %d, \"test_accuracy\": %s, \"test_images\": %lld}\n", (long long)step,
            epoch, lc_json_num(a, sizeof a, "%.4f", accuracy), (long long)images);
    fflush(f);
}

int recipe_plot_main(int argc, char **argv)
{
    const char *log_file = NULL, *out = NULL;
    const cli_flag flags[] = {
        { .name = "log-file", .kind = CLI_STRING, .dest = &log_file, .metavar = "F.jsonl", .help = "train's --log-file" },
        { .name = "out", .kind = CLI_STRING, .dest = &out, .metavar = "F.png|F.svg", .help = "the picture" },
    };
    const cli_spec spec = { .prog = "train plot", .summary = "The training loss and the test accuracy against the step "
                            "(gnuplot).", .flags = flags, .nflags = 2 };
    cli_result r = cli_parse(&spec, argc, argv, NULL);
    if (r != CLI_OK) return r == CLI_HELP ? 0 : 2;
    if (!log_file || !out) {
        cli_error(&spec, "%s is required", !log_file ? "--log-file" : "--out");
        return 2;
    }
    static const lc_series curves[] = {
        { .key = "loss", .title = "train loss" },
        { .key = "test_accuracy", .title = "test accuracy", .points = true, .right_axis = true },
    };
    lc_plot_spec p = { .prog = "train plot", .log_file = log_file, .out = out, .ylabel = "loss",
                       .y2label = "test accuracy (%)", .series = curves, .nseries = 2 };
    return lc_plot(&p);
}
