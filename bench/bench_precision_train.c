/* cxla-bench precision's training figures: bf16-mixed training (autocast
 * around the forward, f32 master weights) against f32, the same steps timed
 * in the same rounds: the gpt program's default model and batch, and the
 * seed cnn at batch 64; and the gpt step's peak device memory, bf16-mixed
 * against f32. Rows of bench_precision.c's g_figures. */
#include "bench.h"

#include <cxla/cxla.h>

#include <stdio.h>
#include <stdlib.h>

/* Peak device memory of two steps, the executables and the arena of
 * anything else (the trainer's own f32 warm-up included) released first:
 * the arena only grows, so it would keep the larger plan's size. */
static int64_t gpt_peak(cx_gpt_config c, int64_t batch, bool bf16)
{
    bench_gpt_trainer *t = bench_gpt_trainer_new(c, batch, BENCH_GPT_ONE, NULL);
    bool ok = t && bench_gpt_trainer_set_autocast(t, bf16);
    cx_cache_clear();
    ok = ok && bench_gpt_trainer_step(t) >= 0;
    cx_memory_reset_peak();
    int64_t peak = ok && bench_gpt_trainer_step(t) >= 0 && bench_gpt_trainer_step(t) >= 0 ? cx_memory_peak() : -1;
    bench_gpt_trainer_free(t);
    cx_cache_clear();
    return peak;
}

/* f32 and bf16-mixed sides of one model, in the same rounds; series[i]
 * gets items/s of bf16-mixed against f32. */
static bool time_pair(const bench_cfg *cfg, bench_side f32, bench_side bf16, double items, bench_series *s)
{
    bench_side sides[2] = { f32, bf16 };
    for (int r = 0; r < cfg->rounds; r++) {
        double sec[2];
        if (!bench_round(cfg, r, sides, 2, sec)) return false;
        bench_add(s, items / sec[1], items / sec[0]);
    }
    return true;
}

int bench_precision_gpt(const bench_cfg *cfg)
{
    cx_gpt_config c = cx_gpt_default_config();
    const int64_t batch = 16; /* the gpt program's default */
    bench_series mem = { 0 }, speed = { 0 };
    int64_t p32 = gpt_peak(c, batch, false), p16 = p32 >= 0 ? gpt_peak(c, batch, true) : -1;
    if (p16 < 0) return 1;
    bench_add(&mem, (double)p16, (double)p32);
    bench_gpt_trainer *a = bench_gpt_trainer_new(c, batch, BENCH_GPT_ONE, NULL);
    bench_gpt_trainer *b = a ? bench_gpt_trainer_new(c, batch, BENCH_GPT_ONE, NULL) : NULL;
    bool ok = b && bench_gpt_trainer_set_autocast(b, true) &&
              time_pair(cfg, (bench_side){ .unit = bench_gpt_trainer_step, .ctx = a },
                        (bench_side){ .unit = bench_gpt_trainer_step, .ctx = b }, (double)(batch * c.block_size), &speed);
    bench_gpt_trainer_free(a);
    bench_gpt_trainer_free(b);
    if (!ok) return 1;
    bench_emit("gpt_bf16_tokens_per_s", "tokens/s (ref: f32)", BENCH_HIGHER, &speed);
    bench_emit("gpt_bf16_peak_bytes", "bytes (ref: f32)", BENCH_LOWER, &mem);
    return 0;
}

int bench_precision_cnn(const bench_cfg *cfg)
{
    bench_series speed = { 0 };
    cx_manual_seed(1);
    bench_trainer *a = bench_trainer_new(bench_cnn(), 64, false);
    cx_manual_seed(1);
    bench_trainer *b = a ? bench_trainer_new(bench_cnn(), 64, false) : NULL;
    bool ok = b && bench_trainer_set_autocast(b, true) &&
              time_pair(cfg, (bench_side){ .unit = bench_trainer_step, .ctx = a },
                        (bench_side){ .unit = bench_trainer_step, .ctx = b }, 64.0, &speed);
    bench_trainer_free(a);
    bench_trainer_free(b);
    if (!ok) return 1;
    bench_emit("cnn_bf16_images_per_s", "images/s (ref: f32)", BENCH_HIGHER, &speed);
    return 0;
}

