/* cxla-bench ckpt: checkpoint save/load bandwidth against raw sequential
 * write/read of the same disk in the same run, and consolidate_ckpts' peak
 * memory against the largest tensor. Files go to $CX_BENCH_DIR (or /tmp);
 * reads are cold: pages are dropped (fsync + POSIX_FADV_DONTNEED) first. */
#include "bench.h"

#include <cxla/cxla.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define NT 5                      /* tensors of 2^25 floats: 640 MiB */
#define TN ((int64_t)1 << 25)

static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    fsync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* Raw sequential write (with fsync) and cold read of `bytes`: GB/s. */
static void raw_bandwidth(const char *path, size_t bytes, double *w, double *r)
{
    size_t chunk = 64 << 20;
    char *buf = malloc(chunk);
    memset(buf, 7, chunk);
    double t0 = bench_now();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t done = 0; done < bytes; done += chunk)
        if (write(fd, buf, chunk) < 0) break;
    fsync(fd);
    close(fd);
    *w = (double)bytes / (bench_now() - t0) / 1e9;
    drop_cache(path);
    t0 = bench_now();
    fd = open(path, O_RDONLY);
    while (read(fd, buf, chunk) > 0) {}
    close(fd);
    *r = (double)bytes / (bench_now() - t0) / 1e9;
    unlink(path);
    free(buf);
}

static cx_module *big_model(void)
{
    cx_module *m[NT];
    for (int i = 0; i < NT; i++) m[i] = cx_nn_linear(1 << 12, 1 << 13, false);   /* 2^25 floats each */
    return cx_nn_sequential(m, NT);
}

int bench_ckpt(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("CX_BENCH_DIR") ? getenv("CX_BENCH_DIR") : "/tmp";
    char prefix[512], path[600], raw[600], sharded[600];
    snprintf(prefix, sizeof prefix, "%s/cx_bench_ckpt_%d", dir, (int)getpid());
    snprintf(sharded, sizeof sharded, "%s_sh4", prefix);
    snprintf(raw, sizeof raw, "%s.raw", prefix);
    snprintf(path, sizeof path, "%s_rank-0-of-1.h5", prefix);
    cx_manual_seed(1);
    cx_module *m = big_model();
    size_t bytes = (size_t)NT * TN * 4;

    /* this disk's speed swings between runs: raw, save and load alternate
     * over 3 rounds and each figure is a median */
    enum { ROUNDS = 3 };
    double rws[ROUNDS], rrs[ROUNDS], saves[ROUNDS], loads[ROUNDS];
    for (int round = 0; round < ROUNDS; round++) {
        raw_bandwidth(raw, bytes, &rws[round], &rrs[round]);
        double t0 = bench_now();
        if (cx_ckpt_save(prefix, cx_ckpt_model_single(m), NULL, NULL) != CX_OK) {
            fprintf(stderr, "bench ckpt: %s\n", cx_last_error());
            return 1;
        }
        saves[round] = (double)bytes / (bench_now() - t0) / 1e9;
        drop_cache(path);
        t0 = bench_now();
        if (cx_ckpt_load(prefix, cx_ckpt_model_single(m), NULL, NULL) != CX_OK) {
            fprintf(stderr, "bench ckpt: %s\n", cx_last_error());
            return 1;
        }
        loads[round] = (double)bytes / (bench_now() - t0) / 1e9;
    }
    double rw = bench_median(rws, ROUNDS), rr = bench_median(rrs, ROUNDS);
    double save = bench_median(saves, ROUNDS), load = bench_median(loads, ROUNDS);
    fprintf(stderr, "ckpt: %.0f MiB model, raw write %.2f GB/s, raw read %.2f GB/s (medians of %d)\n",
            (double)bytes / (1 << 20), rw, rr, ROUNDS);
    bench_emit("ckpt_save_gbps", save, "GB/s", rw);
    bench_emit("ckpt_load_gbps", load, "GB/s", rr);

    /* 4-way sharded, then consolidated in a child whose peak RSS we read;
     * the model is freed first so the child does not inherit it */
    cx_ckpt_consolidate_opts co = cx_ckpt_consolidate_default_opts();
    if (cx_ckpt_reshard(prefix, sharded, 4, co) != CX_OK) {
        fprintf(stderr, "bench ckpt: %s\n", cx_last_error());
        return 1;
    }
    cx_module_free(m);
    long base_kb = 0, peak_kb = 0;
    for (int pass = 0; pass < 2; pass++) {
        pid_t pid = fork();
        if (pid == 0) {
            char out[700];
            snprintf(out, sizeof out, "%s_consolidated.h5", sharded);
            int rc = pass ? cx_ckpt_consolidate(sharded, out, co) != CX_OK : 0;
            _exit(rc);
        }
        int st;
        struct rusage ru;
        wait4(pid, &st, 0, &ru);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) {
            fprintf(stderr, "bench ckpt: consolidation failed\n");
            return 1;
        }
        if (pass) peak_kb = ru.ru_maxrss;
        else base_kb = ru.ru_maxrss;
    }
    fprintf(stderr, "ckpt: consolidate child peak RSS %ld KiB, idle child %ld KiB\n", peak_kb, base_kb);
    bench_emit("ckpt_consolidate_peak_bytes", (double)(peak_kb - base_kb) * 1024, "bytes", (double)TN * 4);

    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -f %s_* %s.commit %s.commit", prefix, prefix, sharded);
    if (system(cmd) != 0) fprintf(stderr, "bench ckpt: cleanup failed\n");
    return 0;
}
