/* cxla-bench ckpt: checkpoint save/load bandwidth against raw sequential
 * write/read of the same disk in the same rounds, and consolidate_ckpts'
 * peak memory against the largest tensor. Files go to $CX_BENCH_DIR (or
 * /tmp); reads are cold: pages are dropped (fsync + POSIX_FADV_DONTNEED)
 * before each, outside the timed part. */
#include "bench.h"

#include <cxla/cxla.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define NT 5                      /* tensors of 2^25 floats: 640 MiB */
#define TN ((int64_t)1 << 25)
#define CHUNK ((size_t)64 << 20)

static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    fsync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

typedef struct {
    const char *raw;      /* the raw file */
    const char *prefix;   /* the checkpoint */
    const char *h5;       /* its one file */
    cx_module *m;
    char *buf;            /* CHUNK bytes for the raw read */
    float *data;          /* the model's own values, which the raw write writes */
    size_t bytes;
} ckpt_ctx;

static double io_fail(const char *what, const char *path)
{
    fprintf(stderr, "cxla-bench ckpt: %s %s: %s\n", what, path, strerror(errno));
    return -1;
}

/* sequential write of the model's own bytes, with fsync, as a save does.
 * (The same bytes matter: a constant buffer, as this once wrote, is what a
 * compressing or deduplicating virtual disk stores fastest, and the
 * figure moved by 13-18 % between runs.) */
static double raw_write_unit(void *p)
{
    ckpt_ctx *c = p;
    double t0 = bench_now();
    int fd = open(c->raw, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return io_fail("cannot create", c->raw);
    for (size_t done = 0; done < c->bytes; done += CHUNK)
        if (write(fd, (const char *)c->data + done, CHUNK) != (ssize_t)CHUNK) {
            close(fd);
            return io_fail("cannot write", c->raw);
        }
    if (fsync(fd) != 0) { close(fd); return io_fail("cannot fsync", c->raw); }
    close(fd);
    return bench_now() - t0;
}

static double raw_read_unit(void *p)
{
    ckpt_ctx *c = p;
    drop_cache(c->raw);
    double t0 = bench_now();
    int fd = open(c->raw, O_RDONLY);
    if (fd < 0) return io_fail("cannot open", c->raw);
    ssize_t k;
    while ((k = read(fd, c->buf, CHUNK)) > 0) {}
    close(fd);
    if (k < 0) return io_fail("cannot read", c->raw);
    return bench_now() - t0;
}

static double save_unit(void *p)
{
    ckpt_ctx *c = p;
    double t0 = bench_now();
    if (cx_ckpt_save(c->prefix, cx_ckpt_model_single(c->m), NULL, NULL) != CX_OK) {
        fprintf(stderr, "cxla-bench ckpt: save: %s\n", cx_last_error());
        return -1;
    }
    return bench_now() - t0;
}

static double load_unit(void *p)
{
    ckpt_ctx *c = p;
    drop_cache(c->h5);
    double t0 = bench_now();
    if (cx_ckpt_load(c->prefix, cx_ckpt_model_single(c->m), NULL, NULL) != CX_OK) {
        fprintf(stderr, "cxla-bench ckpt: load: %s\n", cx_last_error());
        return -1;
    }
    return bench_now() - t0;
}

static cx_module *big_model(void)
{
    cx_module *m[NT];
    for (int i = 0; i < NT; i++) m[i] = cx_nn_linear(1 << 12, 1 << 13, false);   /* 2^25 floats each */
    return cx_nn_sequential(m, NT);
}

/* Peak RSS (KiB) of a forked child that consolidates `sharded` into `out`,
 * or, with out NULL, does nothing (the baseline a child starts from). */
static long child_peak_kb(const char *sharded, const char *out)
{
    if (out) unlink(out);
    pid_t pid = fork();
    if (pid == 0) _exit(out ? cx_ckpt_consolidate(sharded, out, cx_ckpt_consolidate_default_opts()) != CX_OK : 0);
    int st;
    struct rusage ru;
    if (pid < 0 || wait4(pid, &st, 0, &ru) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "cxla-bench ckpt: consolidation of %s failed\n", sharded);
        return -1;
    }
    return ru.ru_maxrss;
}

int bench_ckpt(int argc, char **argv, bench_cfg cfg)
{
    int rc = bench_parse("ckpt", argc, argv, NULL, 0, &cfg);
    if (rc >= 0) return rc;
    const char *dir = getenv("CX_BENCH_DIR") ? getenv("CX_BENCH_DIR") : "/tmp";
    char prefix[512], h5[600], raw[600], sharded[600], out[700];
    snprintf(prefix, sizeof prefix, "%s/cx_bench_ckpt_%d", dir, (int)getpid());
    snprintf(sharded, sizeof sharded, "%s_sh4", prefix);
    snprintf(raw, sizeof raw, "%s.raw", prefix);
    snprintf(h5, sizeof h5, "%s_rank-0-of-1.h5", prefix);
    snprintf(out, sizeof out, "%s_consolidated.h5", sharded);
    cx_manual_seed(1);
    ckpt_ctx c = { raw, prefix, h5, big_model(), malloc(CHUNK), malloc((size_t)NT * TN * 4), (size_t)NT * TN * 4 };
    rc = 1;
    if (!c.m || !c.buf || !c.data) {
        fprintf(stderr, "cxla-bench ckpt: cannot build the %zu MiB model\n", c.bytes >> 20);
        goto out;
    }
    for (int i = 0; i < NT; i++) {
        char key[32];
        snprintf(key, sizeof key, "%d.weight", i);
        if (cx_to_host(cx_module_get(c.m, key), c.data + (size_t)i * TN, CX_F32) != CX_OK) {
            fprintf(stderr, "cxla-bench ckpt: reading %s: %s\n", key, cx_last_error());
            goto out;
        }
    }

    /* sides: raw write, save, raw read, load; in odd rounds load runs first
     * and the raw read before the raw write, so both files exist up front */
    if (raw_write_unit(&c) < 0 || save_unit(&c) < 0) goto out;
    bench_side sides[4] = { { .unit = raw_write_unit, .ctx = &c }, { .unit = save_unit, .ctx = &c },
                            { .unit = raw_read_unit, .ctx = &c }, { .unit = load_unit, .ctx = &c } };
    bench_series save = { 0 }, load = { 0 };
    double b = (double)c.bytes;
    for (int r = 0; r < cfg.rounds; r++) {
        double sec[4];
        if (!bench_round(&cfg, r, sides, 4, sec)) goto out;
        bench_add(&save, b / sec[1] / 1e9, b / sec[0] / 1e9);
        bench_add(&load, b / sec[3] / 1e9, b / sec[2] / 1e9);
    }
    fprintf(stderr, "ckpt: %.0f MiB model\n", b / (1 << 20));
    bench_emit("ckpt_save_gbps", "GB/s", BENCH_HIGHER, &save);
    bench_emit("ckpt_load_gbps", "GB/s", BENCH_HIGHER, &load);

    /* 4-way sharded, then consolidated in a child whose peak RSS we read,
     * once per round (a memory figure: nothing to repeat for min-time); the
     * model is freed first so the child does not inherit it */
    if (cx_ckpt_reshard(prefix, sharded, 4, cx_ckpt_consolidate_default_opts()) != CX_OK) {
        fprintf(stderr, "cxla-bench ckpt: reshard: %s\n", cx_last_error());
        goto out;
    }
    cx_module_free(c.m);
    c.m = NULL;
    bench_series cons = { 0 };
    for (int r = 0; r < cfg.rounds; r++) {
        long base_kb = child_peak_kb(sharded, NULL), peak_kb = child_peak_kb(sharded, out);
        if (base_kb < 0 || peak_kb < 0) goto out;
        bench_add(&cons, (double)(peak_kb - base_kb) * 1024, (double)TN * 4);
    }
    bench_emit("ckpt_consolidate_peak_bytes", "bytes", BENCH_LOWER, &cons);
    rc = 0;
out:
    cx_module_free(c.m);
    free(c.buf);
    free(c.data);
    unlink(raw);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -f '%s'_* '%s'.commit '%s'.commit", prefix, prefix, sharded);
    if (system(cmd) != 0) fprintf(stderr, "cxla-bench ckpt: cannot remove %s_*\n", prefix);
    return rc;
}
