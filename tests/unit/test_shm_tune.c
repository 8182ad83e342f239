/* The slot-write tuner (parallel/shm/shm_tune.h) on made-up timings: it
 * must time both ways, keep the cheaper, look at the other now and then,
 * and follow when the costs swap (the cores moved). */
#include <criterion/criterion.h>

#include "shm_tune.h"

/* Runs `calls` calls whose cost per byte is costs[way]; counts the ways taken. */
static void run(cx_shm_tuner *t, int calls, const double costs[2], int taken[2])
{
    for (int i = 0; i < calls; i++) {
        cx_shm_way w = cx_shm_tuner_pick(t);
        taken[w]++;
        cx_shm_tuner_record(t, w, costs[w] * 1e6, 1000000);
    }
}

Test(shm_tune, times_each_way_first)
{
    cx_shm_tuner t = { 0 };
    cx_shm_way first = cx_shm_tuner_pick(&t);
    cx_shm_tuner_record(&t, first, 1e-3, 1 << 20);
    cx_shm_way second = cx_shm_tuner_pick(&t);
    cr_expect_neq(first, second);
}

Test(shm_tune, keeps_the_cheaper_way_and_explores_rarely)
{
    cx_shm_tuner t = { 0 };
    const double streamed_cheaper[2] = { 2e-10, 1e-10 };
    int taken[2] = { 0, 0 };
    run(&t, 32 * CX_SHM_TUNE_EVERY, streamed_cheaper, taken);
    cr_expect_geq(taken[CX_SHM_STREAMED], 30 * CX_SHM_TUNE_EVERY, "streamed %d of %d", taken[CX_SHM_STREAMED],
                  32 * CX_SHM_TUNE_EVERY);
    cr_expect_geq(taken[CX_SHM_CACHED], 32, "the other way is looked at every %d calls", CX_SHM_TUNE_EVERY);
}

Test(shm_tune, follows_when_the_costs_swap)
{
    cx_shm_tuner t = { 0 };
    const double cached_cheaper[2] = { 1e-10, 3e-10 }, streamed_cheaper[2] = { 3e-10, 1e-10 };
    int before[2] = { 0, 0 }, after[2] = { 0, 0 };
    run(&t, 8 * CX_SHM_TUNE_EVERY, cached_cheaper, before);
    cr_expect_gt(before[CX_SHM_CACHED], 7 * CX_SHM_TUNE_EVERY);
    /* within two looks at the other way, it is the one taken */
    run(&t, 2 * CX_SHM_TUNE_EVERY, streamed_cheaper, (int[2]){ 0, 0 });
    run(&t, 8 * CX_SHM_TUNE_EVERY, streamed_cheaper, after);
    cr_expect_eq(after[CX_SHM_CACHED], 8, "only the looks at the other way: %d", after[CX_SHM_CACHED]);
}

Test(shm_tune, ignores_empty_and_untimed_calls)
{
    cx_shm_tuner t = { 0 };
    cx_shm_tuner_record(&t, CX_SHM_CACHED, 1e-3, 0);
    cx_shm_tuner_record(&t, CX_SHM_STREAMED, 0, 1 << 20);
    cr_expect_eq(t.cost[CX_SHM_CACHED], 0);
    cr_expect_eq(t.cost[CX_SHM_STREAMED], 0);
}

Test(shm_tune, compares_cost_per_byte_not_per_call)
{
    cx_shm_tuner t = { 0 };
    /* streamed takes twice as long, for four times the bytes */
    cx_shm_tuner_record(&t, cx_shm_tuner_pick(&t), 1e-3, 1000000);   /* cached: 1e-9 s/byte */
    cx_shm_tuner_record(&t, cx_shm_tuner_pick(&t), 2e-3, 4000000);   /* streamed: 5e-10 s/byte */
    cr_expect_eq(cx_shm_tuner_pick(&t), CX_SHM_STREAMED);
}

Test(shm_tune, one_slow_look_is_forgotten_at_the_next)
{
    cx_shm_tuner t = { 0 };
    const double streamed_cheaper[2] = { 2e-10, 1e-10 };
    int taken[2] = { 0, 0 };
    run(&t, CX_SHM_TUNE_EVERY, streamed_cheaper, taken);
    /* a look at cached that a descheduled rank made 100x slow */
    while (cx_shm_tuner_pick(&t) != CX_SHM_CACHED) cx_shm_tuner_record(&t, CX_SHM_STREAMED, 1e-4, 1000000);
    cx_shm_tuner_record(&t, CX_SHM_CACHED, 2e-2, 1000000);
    /* then the costs swap: cached is the cheaper way from here on */
    const double cached_cheaper[2] = { 1e-10, 3e-10 };
    int after[2] = { 0, 0 };
    run(&t, CX_SHM_TUNE_EVERY, cached_cheaper, (int[2]){ 0, 0 });   /* the next look */
    run(&t, 4 * CX_SHM_TUNE_EVERY, cached_cheaper, after);
    cr_expect_geq(after[CX_SHM_CACHED], 4 * CX_SHM_TUNE_EVERY - 4, "cached %d of %d after one good look",
                  after[CX_SHM_CACHED], 4 * CX_SHM_TUNE_EVERY);
}
