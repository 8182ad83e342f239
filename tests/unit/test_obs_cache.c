/* The persistent compile cache: every run is a fresh child process (an
 * empty in-memory cache), sharing one cache directory. */
#include <criterion/criterion.h>

#include "test_obs_cnn.h"

#include <dirent.h>
#include <sys/stat.h>

typedef struct {
    int status;
    cx_status init;
    int64_t uncached, cached, hit, miss, bad, writes;
    obs_run run;
    char err[256];
} child_result;

typedef struct {
    const char *dir;
    bool readonly;
    const char *options;   /* NULL: default compile options */
} child_arg;

static void run_child(void *res, void *argp)
{
    child_result *r = res;
    const child_arg *a = argp;
    if (a->options) cx_set_compile_options(a->options);
    r->init = cx_cache_init(a->dir, a->readonly);
    if (r->init != CX_OK) { snprintf(r->err, sizeof r->err, "%s", cx_last_error()); return; }
    r->status = obs_train(20, &r->run);
    if (r->status != CX_OK) snprintf(r->err, sizeof r->err, "%s", cx_last_error());
    r->uncached = cx_counter_value("UncachedCompile");
    r->cached = cx_counter_value("CachedCompile");
    r->hit = cx_counter_value("PersistentCacheHit");
    r->miss = cx_counter_value("PersistentCacheMiss");
    r->bad = cx_counter_value("PersistentCacheDeserializeFailure");
    r->writes = cx_counter_value("PersistentCacheWrite");
}

static child_result run(const char *dir, bool readonly, const char *options)
{
    child_arg a = { dir, readonly, options };
    child_result r;
    int rc = obs_in_child(run_child, &a, &r, sizeof r);
    cr_assert_eq(rc, 0, "child failed (%d)", rc);
    cr_assert_eq(r.init, CX_OK, "cache_init: %s", r.err);
    cr_assert_eq(r.status, CX_OK, "training: %s", r.err);
    cr_assert_eq(r.run.steps, 20);
    return r;
}

static int count_entries(const char *dir, char *first, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".cxe")) {
            if (n == 0 && first) snprintf(first, cap, "%s/%s", dir, e->d_name);
            n++;
        }
    }
    closedir(d);
    return n;
}

static void make_dir(char *buf, size_t cap, const char *tag)
{
    snprintf(buf, cap, "/tmp/cx_obs_cache_%s_%d", tag, (int)getpid());
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", buf);
    cr_assert_eq(system(cmd), 0);
}

static void remove_dir(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

Test(obs_cache, warm_process_compiles_nothing)
{
    char dir[256];
    make_dir(dir, sizeof dir, "warm");
    child_result cold = run(dir, false, NULL);
    cr_expect_gt(cold.uncached, 0);
    cr_expect_eq(cold.hit, 0);
    cr_expect_eq(cold.miss, cold.uncached, "every real compile is a persistent miss");
    cr_expect_eq(cold.writes, cold.uncached);
    cr_expect_eq(count_entries(dir, NULL, 0), (int)cold.uncached);

    child_result warm = run(dir, false, NULL);
    cr_expect_eq(warm.uncached, 0, "the warm process compiled %lld graphs", (long long)warm.uncached);
    cr_expect_eq(warm.miss, 0);
    cr_expect_eq(warm.bad, 0);
    cr_expect_eq(warm.hit, cold.uncached);
    cr_expect_eq(warm.cached, cold.cached, "the in-memory cache works as before");
    for (int i = 0; i < 20; i++)
        cr_expect_eq(warm.run.losses[i], cold.run.losses[i], "step %d: %g vs %g", i, warm.run.losses[i], cold.run.losses[i]);
    remove_dir(dir);
}

Test(obs_cache, compile_option_change_misses)
{
    char dir[256];
    make_dir(dir, sizeof dir, "opts");
    child_result a = run(dir, false, NULL);
    child_result b = run(dir, false, "--xla_some_flag=1");
    cr_expect_eq(b.hit, 0, "an entry compiled under other options was used");
    cr_expect_eq(b.uncached, a.uncached);
    cr_expect_eq(b.miss, a.uncached);
    child_result c = run(dir, false, "--xla_some_flag=1");
    cr_expect_eq(c.uncached, 0);
    cr_expect_eq(c.hit, a.uncached);
    remove_dir(dir);
}

Test(obs_cache, corrupt_file_is_a_counted_miss)
{
    char dir[256], victim[512];
    make_dir(dir, sizeof dir, "corrupt");
    child_result a = run(dir, false, NULL);
    int n = count_entries(dir, victim, sizeof victim);
    cr_assert_gt(n, 0);
    /* flip bytes in the middle of one entry, truncate nothing */
    FILE *f = fopen(victim, "r+b");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    for (long at = 40; at < size; at += 97) {
        fseek(f, at, SEEK_SET);
        int c = fgetc(f);
        fseek(f, at, SEEK_SET);
        fputc(c ^ 0x5a, f);
    }
    fclose(f);
    child_result b = run(dir, false, NULL);
    cr_expect_eq(b.bad, 1);
    cr_expect_eq(b.miss, 1);
    cr_expect_eq(b.uncached, 1, "only the corrupt entry is compiled again");
    cr_expect_eq(b.hit, a.uncached - 1);
    for (int i = 0; i < 20; i++) cr_expect_eq(b.run.losses[i], a.run.losses[i]);
    /* the corrupt file was replaced by a good one */
    child_result c = run(dir, false, NULL);
    cr_expect_eq(c.bad, 0);
    cr_expect_eq(c.uncached, 0);

    /* a truncated file and garbage are misses too */
    f = fopen(victim, "r+b");
    cr_assert(f);
    cr_assert_eq(ftruncate(fileno(f), 20), 0);
    fclose(f);
    child_result d = run(dir, false, NULL);
    cr_expect_eq(d.bad, 1);
    f = fopen(victim, "wb");
    cr_assert(f);
    for (int i = 0; i < 5000; i++) fputc((i * 7919) & 0xff, f);
    fclose(f);
    child_result e = run(dir, false, NULL);
    cr_expect_eq(e.bad, 1);
    cr_expect_eq(e.uncached, 1);
    remove_dir(dir);
}

Test(obs_cache, readonly_never_writes)
{
    char dir[256];
    make_dir(dir, sizeof dir, "ro");
    cr_assert_eq(mkdir(dir, 0777), 0);
    child_result a = run(dir, true, NULL);
    cr_expect_gt(a.uncached, 0);
    cr_expect_eq(a.writes, 0);
    cr_expect_eq(count_entries(dir, NULL, 0), 0);
    DIR *d = opendir(dir);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) if (e->d_name[0] != '.') files++;
    closedir(d);
    cr_expect_eq(files, 0, "read-only mode left files behind");
    /* a read-only process uses what a writer stored */
    run(dir, false, NULL);
    child_result c = run(dir, true, NULL);
    cr_expect_eq(c.uncached, 0);
    remove_dir(dir);
}

static void late_init(void *res, void *arg)
{
    (void)arg;
    cx_status *st = res;
    cx_tensor *x = cx_add_scalar(cx_ones((int64_t[]){ 4 }, 1, CX_F32), 1.0);
    cx_sync();
    cx_free(x);
    st[0] = cx_cache_init("/tmp/cx_obs_cache_late", false);
}

Test(obs_cache, init_after_computation_is_an_error)
{
    cx_status st[1];
    cr_assert_eq(obs_in_child(late_init, NULL, st, sizeof st), 0);
    cr_expect_eq(st[0], CX_ERR_STATE);
}

#include "obs_internal.h"   /* white-box: the loader's robustness hook */

static void fill_cache(void *res, void *arg)
{
    int *st = res;
    st[0] = cx_cache_init((const char *)arg, false);
    obs_run r;
    st[1] = obs_train(2, &r);
}

Test(obs_cache, mutated_payloads_never_crash)
{
    char dir[256], entry[512];
    make_dir(dir, sizeof dir, "fuzz");
    int st[2];
    cr_assert_eq(obs_in_child(fill_cache, dir, st, sizeof st), 0);
    cr_assert_eq(st[0], CX_OK);
    cr_assert_eq(st[1], CX_OK);
    DIR *d = opendir(dir);
    cr_assert(d);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d)) != NULL) {
        if (!strstr(e->d_name, ".cxe")) continue;
        snprintf(entry, sizeof entry, "%s/%s", dir, e->d_name);
        int acc = cx_disk_cache_fuzz(entry, 400, (unsigned)files + 1);
        cr_expect_geq(acc, 0, "%s did not load unmutated", entry);
        cr_expect_lt(acc, 400, "the loader accepted every mutation of %s", entry);
        files++;
    }
    closedir(d);
    cr_expect_gt(files, 0);
    remove_dir(dir);
}
