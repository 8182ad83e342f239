/* The rounds, the alternation, the medians and the JSON lines that every
 * cxla-bench subcommand shares (bench.h says how a run is laid out). */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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

/* How many slices a round of cfg's is cut into: about BENCH_SLICE_S each
 * per side, at least 1, at most BENCH_MAX_SLICES; 1 when a unit is a whole
 * round or the round is one unit. */
static int round_slices(const bench_cfg *cfg, const bench_side *sides, int n)
{
    for (int i = 0; i < n; i++)
        if (sides[i].whole_round) return 1;
    if (cfg->min_time <= 0) return 1;
    int k = (int)(cfg->min_time / BENCH_SLICE_S + 0.5);
    return k < 1 ? 1 : k > BENCH_MAX_SLICES ? BENCH_MAX_SLICES : k;
}

/* Runs `unit` until its seconds reach `target` (at least one unit in all,
 * so a side whose unit outlasts the round still counts). Every rank takes
 * the same decisions through cfg->agree. false if a unit failed. */
static bool run_until(const bench_cfg *cfg, double (*unit)(void *), void *ctx, double target, double *total,
                      long *units)
{
    for (;;) {
        bool enough = *units > 0 && *total >= target;
        if (cfg->agree) enough = cfg->agree(enough);
        if (enough) return true;
        double sec = unit(ctx);
        if (sec < 0) return false;
        *total += sec;
        (*units)++;
    }
}

double bench_repeat(const bench_cfg *cfg, double (*unit)(void *), void *ctx)
{
    double total = 0;
    long units = 0;
    return run_until(cfg, unit, ctx, cfg->min_time, &total, &units) ? total / (double)units : -1;
}

/* Side s's turn in slice `slice`: its units up to `target` seconds in all,
 * or, for a whole-round side, its one run in the first slice. */
static bool take_turn(const bench_cfg *cfg, const bench_side *s, int slice, double target, double *total, long *units)
{
    if (!s->whole_round) return run_until(cfg, s->unit, s->ctx, target, total, units);
    if (slice > 0) return true;
    *total = s->whole_round(s->ctx, cfg);
    *units = 1;
    return *total >= 0;
}

bool bench_round(const bench_cfg *cfg, int round, const bench_side *sides, int n, double *sec)
{
    if (n > BENCH_MAX_SIDES) return false;
    int slices = round_slices(cfg, sides, n);
    double total[BENCH_MAX_SIDES] = { 0 };
    long units[BENCH_MAX_SIDES] = { 0 };
    for (int slice = 0; slice < slices; slice++) {
        /* A B, B A, A B, ...: each side in turn first, across slices and rounds */
        bool reverse = (round * slices + slice) % 2;
        double target = cfg->min_time * (slice + 1) / slices;
        for (int k = 0; k < n; k++) {
            int i = reverse ? n - 1 - k : k;
            if (!take_turn(cfg, &sides[i], slice, target, &total[i], &units[i])) return false;
        }
    }
    for (int i = 0; i < n; i++) sec[i] = total[i] / (double)units[i];
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

void bench_emit(const char *name, const char *unit, bench_better better, const bench_series *s)
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
    printf(", \"better\": \"%s\"", better == BENCH_HIGHER ? "higher" : "lower");
    printf(", \"rounds\": %d", s->n);
    put_num("ratio_min", nq ? q[0] : NAN, "%.4f");
    put_num("ratio_max", nq ? q[nq - 1] : NAN, "%.4f");
    printf("}\n");
    fflush(stdout);
}
