/* The rounds, the alternation, the medians and the JSON lines that every
 * cxla-bench subcommand shares (bench.h says how a run is laid out). */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double bench_repeat(const bench_cfg *cfg, double (*unit)(void *), void *ctx)
{
    double total = 0;
    long units = 0;
    for (;;) {
        double s = unit(ctx);
        if (s < 0) return -1;
        total += s;
        units++;
        bool enough = total >= cfg->min_time;
        if (cfg->agree) enough = cfg->agree(enough);
        if (enough) break;
    }
    return total / (double)units;
}

bool bench_round(const bench_cfg *cfg, int round, const bench_side *sides, int n, double *sec)
{
    for (int k = 0; k < n; k++) {
        int i = round % 2 ? n - 1 - k : k;
        const bench_side *s = &sides[i];
        sec[i] = s->whole_round ? s->whole_round(s->ctx, cfg) : bench_repeat(cfg, s->unit, s->ctx);
        if (sec[i] < 0) return false;
    }
    return true;
}

void bench_add(bench_series *s, double value, double ref)
{
    if (s->n == BENCH_MAX_ROUNDS) return;   /* --rounds is capped at this */
    s->value[s->n] = value;
    s->ref[s->n] = ref;
    s->n++;
}

/* JSON has no inf or nan */
static void put_num(const char *key, double v, const char *fmt)
{
    printf(", \"%s\": ", key);
    if (isfinite(v)) printf(fmt, v);
    else printf("null");
}

void bench_emit(const char *name, const char *unit, const bench_series *s)
{
    double v[BENCH_MAX_ROUNDS], r[BENCH_MAX_ROUNDS], q[BENCH_MAX_ROUNDS];
    int nq = 0;
    for (int i = 0; i < s->n; i++) {
        v[i] = s->value[i];
        r[i] = s->ref[i];
        double x = s->value[i] / s->ref[i];
        if (isfinite(x)) q[nq++] = x;   /* a zero reference has no ratio */
    }
    double value = s->n ? bench_median(v, s->n) : NAN, ref = s->n ? bench_median(r, s->n) : NAN;
    double ratio = nq ? bench_median(q, nq) : NAN;
    printf("{\"bench\": \"%s\"", name);
    put_num("value", value, "%.6g");
    printf(", \"unit\": \"%s\"", unit);
    put_num("ref", ref, "%.6g");
    put_num("ratio", ratio, "%.4f");
    printf(", \"rounds\": %d", s->n);
    put_num("ratio_min", nq ? q[0] : NAN, "%.4f");
    put_num("ratio_max", nq ? q[nq - 1] : NAN, "%.4f");
    printf("}\n");
    fflush(stdout);
}

int bench_common_flags(bench_cfg *cfg, cli_flag *out)
{
    out[0] = (cli_flag){ .name = "rounds", .kind = CLI_INT, .dest = &cfg->rounds,
                         .help = "rounds; each times every side in turn (default 5, ckpt 11)", .min = 1,
                         .max = BENCH_MAX_ROUNDS };
    out[1] = (cli_flag){ .name = "min-time", .kind = CLI_DOUBLE, .dest = &cfg->min_time, .metavar = "SECONDS",
                         .help = "time each side for at least this long per round (0: one unit of work)",
                         .min = 0, .max = 3600 };
    return 2;
}

int bench_parse(const char *sub, int argc, char **argv, const cli_flag *extra, int nextra, bench_cfg *cfg)
{
    cli_flag flags[16];
    int n = bench_common_flags(cfg, flags);
    for (int i = 0; i < nextra && n < (int)(sizeof flags / sizeof *flags); i++) flags[n++] = extra[i];
    char prog[64];
    snprintf(prog, sizeof prog, "cxla-bench %s", sub);
    cli_spec spec = { .prog = prog, .args = "[flags]", .summary = bench_summary(sub), .flags = flags, .nflags = n };
    switch (cli_parse(&spec, argc, argv, NULL)) {
    case CLI_OK:
        if (cfg->rounds == 0) cfg->rounds = bench_default_rounds(sub);
        return -1;
    case CLI_HELP: return 0;
    default: return 2;
    }
}

bool bench_in_launched_rank(void)
{
    /* mpirun's (Open MPI, PMIx, Hydra) and xla-launch's own, which it
     * exports to every rank */
    static const char *const vars[] = { "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "XLA_LAUNCH_RESTART_COUNT" };
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return true;
    return false;
}
