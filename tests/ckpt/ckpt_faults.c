/* Checkpoint failure modes: every bad input is one line and exit 1 from
 * consolidate_ckpts (no crash, no output left), and a save killed with
 * SIGKILL at any point leaves the previous committed checkpoint loadable
 * and no marker for the broken one. */
#include <criterion/criterion.h>
#include <cxla/cxla.h>
#include <hdf5.h>

#include "ckpt_internal.h"

#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[256], g_tool[4096];
static char g_out[1 << 14];

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/cx_test_ckptf_XXXXXX");
    cr_assert(mkdtemp(g_dir));
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    cr_assert(n > 0);
    exe[n] = '\0';
    snprintf(g_tool, sizeof g_tool, "%s/tools/consolidate_ckpts", dirname(dirname(dirname(exe))));
}

static void teardown(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_dir);
}

static int sh(const char *fmt, const char *a, const char *b)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    return system(cmd);
}

static cx_module *mlp(uint64_t seed)
{
    cx_manual_seed(seed);
    cx_module *m[3] = { cx_nn_linear(16, 32, true), cx_nn_relu(), cx_nn_linear(32, 4, true) };
    return cx_nn_sequential(m, 3);
}

/* A committed 2-rank sharded checkpoint at <dir>/<name>. */
static void make_sharded(const char *name)
{
    char full[512], out[512];
    snprintf(full, sizeof full, "%s/src_%s", g_dir, name);
    snprintf(out, sizeof out, "%s/%s", g_dir, name);
    cx_module *m = mlp(1);
    cr_assert_eq(cx_ckpt_save(full, cx_ckpt_model_single(m), NULL, NULL), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_ckpt_reshard(full, out, 2, cx_ckpt_consolidate_default_opts()), CX_OK, "%s", cx_last_error());
    cx_module_free(m);
}

/* Runs the tool on <dir>/<name>: exit code, one line of error expected. */
static int consolidate(const char *name)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s --ckpt-prefix %s/%s --save-path %s/out.h5 2>&1", g_tool, g_dir, name, g_dir);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t len = fread(g_out, 1, sizeof g_out - 1, p);
    g_out[len] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect_refused(const char *name, const char *needle)
{
    int rc = consolidate(name);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, g_out);
    /* "found N ..." then exactly one error line */
    char *err = strstr(g_out, "consolidate_ckpts: ");
    cr_assert(err, "%s", g_out);
    cr_assert(strchr(err, '\n') && strchr(err, '\n')[1] == '\0', "more than one error line: %s", g_out);
    cr_assert(strstr(err, needle), "expected '%s' in: %s", needle, g_out);
    char out[600];
    snprintf(out, sizeof out, "%s/out.h5", g_dir);
    cr_assert(access(out, F_OK) != 0, "partial output left behind");
}

/* Rewrites the marker's entry for rank r so only the check under test fires. */
static void recommit(const char *name, int r)
{
    ckpt_marker m;
    char prefix[512], path[1200];
    snprintf(prefix, sizeof prefix, "%s/%s", g_dir, name);
    cr_assert_eq(ckpt_marker_read(prefix, &m), CX_OK);
    snprintf(path, sizeof path, "%s/%s", g_dir, m.files[r].name);
    cr_assert_eq(ckpt_hash_file(path, false, &m.files[r].hash, &m.files[r].size), CX_OK);
    cr_assert_eq(ckpt_marker_write(prefix, &m), CX_OK);
    ckpt_marker_release(&m);
}

TestSuite(ckpt_faults, .init = setup, .fini = teardown);

Test(ckpt_faults, valid_checkpoint_consolidates)
{
    make_sharded("ok");
    cr_assert_eq(consolidate("ok"), 0, "%s", g_out);
    cr_assert(strstr(g_out, "found 2 checkpoint files in"), "%s", g_out);
    cr_assert(strstr(g_out, "saved consolidated model to"), "%s", g_out);
}

Test(ckpt_faults, truncated_file)
{
    make_sharded("t");
    sh("truncate -s -100 %s/t_rank-1-of-2.h5%s", g_dir, "");
    expect_refused("t", "truncated");
}

Test(ckpt_faults, wrong_magic)
{
    make_sharded("m");
    sh("printf 'garbage!' | dd of=%s/m_rank-0-of-2.h5 conv=notrunc status=none%s", g_dir, "");
    recommit("m", 0);
    expect_refused("m", "not a readable HDF5 file");
}

Test(ckpt_faults, wrong_version)
{
    make_sharded("v");
    char path[512];
    snprintf(path, sizeof path, "%s/v_rank-0-of-2.h5", g_dir);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert(f >= 0);
    hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    int64_t v = 7;
    cr_assert(H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0);
    H5Aclose(a);
    H5Fclose(f);
    /* re-commit so the marker's size check passes and the version check is reached */
    ckpt_marker m;
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/v", g_dir);
    cr_assert_eq(ckpt_marker_read(prefix, &m), CX_OK);
    cr_assert_eq(ckpt_hash_file(path, false, &m.files[0].hash, &m.files[0].size), CX_OK);
    cr_assert_eq(ckpt_marker_write(prefix, &m), CX_OK);
    ckpt_marker_release(&m);
    expect_refused("v", "unsupported checkpoint format version 7");
}

Test(ckpt_faults, missing_rank)
{
    make_sharded("r");
    sh("rm %s/r_rank-1-of-2.h5%s", g_dir, "");
    expect_refused("r", "missing");
}

Test(ckpt_faults, mixed_world_sizes)
{
    make_sharded("w");
    char full[512], out[512];
    snprintf(full, sizeof full, "%s/src_w", g_dir);
    snprintf(out, sizeof out, "%s/w4", g_dir);
    cr_assert_eq(cx_ckpt_reshard(full, out, 4, cx_ckpt_consolidate_default_opts()), CX_OK, "%s", cx_last_error());
    /* a rank file of the 4-rank checkpoint dropped in place of rank 1 */
    sh("cp %s/w4_rank-1-of-4.h5 %s/w_rank-1-of-4.h5", g_dir, g_dir);
    expect_refused("w", "");
    cr_assert(strstr(g_out, "mixed world sizes") || strstr(g_out, "not listed in the commit marker"), "%s", g_out);
    /* and with the marker rewritten to list it, the world sizes disagree */
    sh("rm %s/w_rank-1-of-2.h5%s", g_dir, "");
    ckpt_marker m;
    char prefix[512], path[600];
    snprintf(prefix, sizeof prefix, "%s/w", g_dir);
    cr_assert_eq(ckpt_marker_read(prefix, &m), CX_OK);
    snprintf(m.files[1].name, sizeof m.files[1].name, "w_rank-1-of-4.h5");
    snprintf(path, sizeof path, "%s/w_rank-1-of-4.h5", g_dir);
    cr_assert_eq(ckpt_hash_file(path, false, &m.files[1].hash, &m.files[1].size), CX_OK);
    cr_assert_eq(ckpt_marker_write(prefix, &m), CX_OK);
    ckpt_marker_release(&m);
    expect_refused("w", "mixed world sizes");
}

Test(ckpt_faults, wrong_shape)
{
    make_sharded("s");
    char path[512];
    snprintf(path, sizeof path, "%s/s_rank-1-of-2.h5", g_dir);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert(f >= 0);
    cr_assert(H5Ldelete(f, "/model/flat_param", H5P_DEFAULT) >= 0);
    hsize_t n = 3;
    hid_t sp = H5Screate_simple(1, &n, NULL);
    hid_t d = H5Dcreate2(f, "/model/flat_param", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert(d >= 0);
    H5Dclose(d);
    H5Sclose(sp);
    H5Fclose(f);
    ckpt_marker m;
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/s", g_dir);
    cr_assert_eq(ckpt_marker_read(prefix, &m), CX_OK);
    cr_assert_eq(ckpt_hash_file(path, false, &m.files[1].hash, &m.files[1].size), CX_OK);
    cr_assert_eq(ckpt_marker_write(prefix, &m), CX_OK);
    ckpt_marker_release(&m);
    expect_refused("s", "wrong shape");
}

Test(ckpt_faults, flipped_byte)
{
    make_sharded("c");
    char path[512];
    snprintf(path, sizeof path, "%s/c_rank-0-of-2.h5", g_dir);
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size - 200, SEEK_SET);   /* raw tensor data near the end */
    int c = fgetc(f);
    fseek(f, size - 200, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
    expect_refused("c", "checksum");
}

/* ---- SIGKILL during saves ------------------------------------------------------- */

static const char *g_kill_phase;
static void kill_hook(const char *phase)
{
    if (!strcmp(phase, g_kill_phase)) raise(SIGKILL);
}

Test(ckpt_faults, sigkill_while_saving_keeps_previous)
{
    const char *phases[] = { "file-written", "renamed", "before-marker" };
    char good[512], broken[512];
    snprintf(good, sizeof good, "%s/good", g_dir);
    cx_module *m = mlp(1);
    cr_assert_eq(cx_ckpt_save(good, cx_ckpt_model_single(m), NULL, NULL), CX_OK, "%s", cx_last_error());
    for (int i = 0; i < 3; i++) {
        /* a new prefix, and the same prefix (overwriting) */
        for (int same = 0; same < 2; same++) {
            snprintf(broken, sizeof broken, "%s/%s", g_dir, same ? "good" : "next");
            pid_t pid = fork();
            cr_assert(pid >= 0);
            if (pid == 0) {
                g_kill_phase = phases[i];
                ckpt_test_hook = kill_hook;
                cx_module *m2 = mlp(2);
                cx_ckpt_save(broken, cx_ckpt_model_single(m2), NULL, NULL);
                _exit(0);
            }
            int st;
            waitpid(pid, &st, 0);
            cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "phase %s", phases[i]);
            cr_assert(!cx_ckpt_is_committed(broken) || !same, "phase %s: a marker for the broken save", phases[i]);
            if (!same) {
                char marker[600];
                snprintf(marker, sizeof marker, "%s.commit", broken);
                cr_assert(access(marker, F_OK) != 0, "phase %s: marker exists", phases[i]);
                /* the previous committed checkpoint still loads, bit-exact */
                cx_module *b = mlp(9);
                cr_assert_eq(cx_ckpt_load(good, cx_ckpt_model_single(b), NULL, NULL), CX_OK, "%s", cx_last_error());
                float wa[32 * 16], wb[32 * 16];
                cx_to_host(cx_module_get(m, "0.weight"), wa, CX_F32);
                cx_to_host(cx_module_get(b, "0.weight"), wb, CX_F32);
                cr_assert(memcmp(wa, wb, sizeof wa) == 0);
                cx_module_free(b);
                char latest[512];
                cr_assert_eq(cx_ckpt_latest(g_dir, latest, sizeof latest), CX_OK, "%s", cx_last_error());
                cr_assert_str_eq(latest, good);
            } else {
                /* overwriting un-commits first: never a marker over mixed files */
                cr_assert(!cx_ckpt_is_committed(good));
                cr_assert_eq(cx_ckpt_save(good, cx_ckpt_model_single(m), NULL, NULL), CX_OK, "%s", cx_last_error());
            }
        }
    }
    cx_module_free(m);
}
