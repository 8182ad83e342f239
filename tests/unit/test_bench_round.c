/* cxla-bench's rounds (bench/bench.c) on made-up sides: the units report
 * fixed seconds, so what is checked is the schedule, not the clock. A round
 * must give every side at least min_time, cut into slices whose first side
 * alternates, follow the ranks' agreed decisions, and fall back to one
 * pass for whole-round sides. */
#include <criterion/criterion.h>

#include "bench.h"

#define LOG_MAX 4096

/* Which side ran each unit, in order. */
static int g_log[LOG_MAX], g_nlog;

typedef struct {
    int id;
    double sec;        /* what each unit reports */
    int fail_after;    /* units before one fails; 0: never */
    int runs;
} fake_side;

static double fake_unit(void *p)
{
    fake_side *f = p;
    if (g_nlog < LOG_MAX) g_log[g_nlog++] = f->id;
    f->runs++;
    if (f->fail_after && f->runs >= f->fail_after) return -1;
    return f->sec;
}

static double fake_whole_round(void *p, const bench_cfg *cfg)
{
    fake_side *f = p;
    if (g_nlog < LOG_MAX) g_log[g_nlog++] = f->id;
    f->runs++;
    (void)cfg;
    return f->sec;
}

/* The side that starts each stretch of the log (a change of side). */
static int stretch_starts(int *first, int max)
{
    int n = 0;
    for (int i = 0; i < g_nlog && n < max; i++)
        if (i == 0 || g_log[i] != g_log[i - 1]) first[n++] = g_log[i];
    return n;
}

/* Round `round` of two unit sides a and b, from an empty log. */
static bool run_two(fake_side *a, fake_side *b, double min_time, int round, double sec[2])
{
    g_nlog = 0;
    bench_side sides[2] = { { .unit = fake_unit, .ctx = a }, { .unit = fake_unit, .ctx = b } };
    bench_cfg cfg = { .rounds = round + 1, .min_time = min_time };
    return bench_round(&cfg, round, sides, 2, sec);
}

Test(bench_round, every_side_gets_min_time_in_alternating_slices)
{
    fake_side a = { .id = 0, .sec = 0.05 }, b = { .id = 1, .sec = 0.125 };
    double sec[2];
    cr_assert(run_two(&a, &b, 2.0, 0, sec));
    cr_expect_float_eq(sec[0], 0.05, 1e-12);
    cr_expect_float_eq(sec[1], 0.125, 1e-12);
    /* at least min_time each, and not a slice more */
    cr_expect_geq(a.runs * a.sec, 2.0 - 1e-9);
    cr_expect_leq(a.runs * a.sec, 2.0 + a.sec + 1e-9);
    cr_expect_geq(b.runs * b.sec, 2.0 - 1e-9);
    cr_expect_leq(b.runs * b.sec, 2.0 + b.sec + 1e-9);
    /* 2 s in slices of BENCH_SLICE_S: the sides take turns A B, B A, A B, ... */
    int slices = (int)(2.0 / BENCH_SLICE_S + 0.5), first[64];
    int n = stretch_starts(first, 64);
    cr_expect_eq(n, slices + 1, "%d stretches, want %d (A | B A | A B ... merged at the seams)", n, slices + 1);
    for (int i = 0; i < n; i++) cr_expect_eq(first[i], i % 2 == 0 ? 0 : 1, "stretch %d ran side %d", i, first[i]);
}

Test(bench_round, odd_rounds_start_with_the_other_side)
{
    fake_side a = { .id = 0, .sec = 0.05 }, b = { .id = 1, .sec = 0.05 };
    double sec[2];
    /* three slices: round 1 starts at slice 3 of the alternation, B first */
    cr_assert(run_two(&a, &b, 3 * BENCH_SLICE_S, 1, sec));
    cr_expect_eq(g_log[0], 1);
}

Test(bench_round, a_unit_longer_than_a_slice_still_runs_once_per_round)
{
    fake_side a = { .id = 0, .sec = 5.0 }, b = { .id = 1, .sec = 0.01 };
    double sec[2];
    cr_assert(run_two(&a, &b, 2.0, 0, sec));
    cr_expect_eq(a.runs, 1);
    cr_expect_float_eq(sec[0], 5.0, 1e-12);
    cr_expect_float_eq(b.runs * b.sec, 2.0, 0.011);
}

Test(bench_round, min_time_zero_is_one_unit_each)
{
    fake_side a = { .id = 0, .sec = 0.5 }, b = { .id = 1, .sec = 0.5 };
    double sec[2];
    cr_assert(run_two(&a, &b, 0, 1, sec));
    cr_expect_eq(a.runs, 1);
    cr_expect_eq(b.runs, 1);
    cr_expect_eq(g_log[0], 1, "odd rounds go B A");
}

Test(bench_round, whole_round_sides_make_one_pass)
{
    g_nlog = 0;
    fake_side launch = { .id = 0, .sec = 0.3 }, local = { .id = 1, .sec = 0.1 };
    bench_side sides[2] = { { .whole_round = fake_whole_round, .ctx = &launch }, { .unit = fake_unit, .ctx = &local } };
    bench_cfg cfg = { .rounds = 1, .min_time = 2.0 };
    double sec[2];
    cr_assert(bench_round(&cfg, 0, sides, 2, sec));
    cr_expect_eq(launch.runs, 1);
    cr_expect_float_eq(local.runs * local.sec, 2.0, 0.11);
    int first[8];
    cr_expect_eq(stretch_starts(first, 8), 2, "one stretch per side");
}

/* A rank that is not rank 0: it follows a script of rank 0's decisions and
 * ignores its own. */
static const bool *g_script;
static int g_nscript, g_asked;

static bool scripted_agree(bool enough)
{
    (void)enough;
    int i = g_asked++;
    return i < g_nscript ? g_script[i] : true;
}

Test(bench_round, ranks_follow_the_agreed_decisions)
{
    g_nlog = 0;
    g_asked = 0;
    /* rank 0 wants 3 units in the first slice, then none: this rank's own
     * clock (0.001 s per unit) would want hundreds */
    static const bool decisions[] = { false, false, false, true };
    g_script = decisions;
    g_nscript = 4;
    fake_side a = { .id = 0, .sec = 0.001 };
    bench_side side = { .unit = fake_unit, .ctx = &a };
    bench_cfg cfg = { .rounds = 1, .min_time = 2.0, .agree = scripted_agree };
    double sec;
    cr_assert(bench_round(&cfg, 0, &side, 1, &sec));
    cr_expect_eq(a.runs, 3);
    cr_expect_eq(g_asked, 4 + (int)(2.0 / BENCH_SLICE_S + 0.5) - 1, "one decision per unit and one per slice end");
}

Test(bench_round, a_failing_unit_fails_the_round)
{
    fake_side a = { .id = 0, .sec = 0.05, .fail_after = 7 }, b = { .id = 1, .sec = 0.05 };
    double sec[2];
    cr_expect_not(run_two(&a, &b, 2.0, 0, sec));
    cr_expect_eq(a.runs, 7, "no unit after the failure");
}

Test(bench_round, too_many_sides_are_refused)
{
    fake_side a = { .id = 0, .sec = 0.05 };
    bench_side sides[BENCH_MAX_SIDES + 1];
    for (int i = 0; i <= BENCH_MAX_SIDES; i++) sides[i] = (bench_side){ .unit = fake_unit, .ctx = &a };
    bench_cfg cfg = { .rounds = 1, .min_time = 2.0 };
    double sec[BENCH_MAX_SIDES + 1];
    cr_expect_not(bench_round(&cfg, 0, sides, BENCH_MAX_SIDES + 1, sec));
}
