/* cxla-bench SUBCOMMAND: reproducible benchmarks, one JSON object per line,
 * each figure with a reference measured in the same run. */
#include "bench.h"

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

void bench_emit(const char *name, double value, const char *unit, double ref)
{
    printf("{\"bench\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"ref\": %.6g, \"ratio\": %.4f}\n", name, value, unit,
           ref, ref != 0 ? value / ref : 0.0);
    fflush(stdout);
}

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} subcommand;

static const subcommand g_subcommands[] = {
    { "core", bench_core, "fused elementwise bandwidth, matmul GFLOP/s, cache-hit overhead" },
    { "ckpt", bench_ckpt, "checkpoint save/load GB/s vs raw disk, consolidation peak memory" },
    { "cache", bench_cache, "start-up with a warm vs cold persistent compile cache" },
    { "comm", bench_comm, "all-reduce bus bandwidth through the library vs MPI_Allreduce (under xla-launch)" },
    { "ddp", bench_ddp, "DDP cnn images/s on 2 ranks x 1 thread vs 1 rank x 2 threads; exposed comm" },
    { "fsdp", bench_fsdp, "ZeRO-2/3 vs DDP peak bytes and step time, 120M-param mlp, AdamW (under xla-launch)" },
    { "train", bench_train, "training images/s (cnn, mlp) vs the GEMM-bound limit, 1 and 2 threads" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: cxla-bench SUBCOMMAND [ARGS]\n\nsubcommands:\n");
    for (size_t i = 0; i < sizeof g_subcommands / sizeof *g_subcommands; i++)
        fprintf(f, "  %-8s %s\n", g_subcommands[i].name, g_subcommands[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof g_subcommands / sizeof *g_subcommands; i++)
        if (!strcmp(argv[1], g_subcommands[i].name)) return g_subcommands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "cxla-bench: unknown subcommand '%s' (try --help)\n", argv[1]);
    return 2;
}
