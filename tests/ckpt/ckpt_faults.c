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
    cr_assert_eq(ckpt_hash_file(path, m.version, false, &m.files[r].hash, &m.files[r].size), CX_OK);
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
    cr_assert_eq(ckpt_hash_file(path, m.version, false, &m.files[0].hash, &m.files[0].size), CX_OK);
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
    cr_assert_eq(ckpt_hash_file(path, m.version, false, &m.files[1].hash, &m.files[1].size), CX_OK);
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
    cr_assert_eq(ckpt_hash_file(path, m.version, false, &m.files[1].hash, &m.files[1].size), CX_OK);
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

Test(ckpt_faults, marker_checksum_is_xxh3_of_the_file)
{
    make_sharded("x");
    ckpt_marker m;
    char prefix[512], path[1200];
    snprintf(prefix, sizeof prefix, "%s/x", g_dir);
    cr_assert_eq(ckpt_marker_read(prefix, &m), CX_OK);
    cr_assert_eq(m.version, CX_CKPT_FORMAT_VERSION);
    for (int r = 0; r < m.nfiles; r++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, m.files[r].name);
        FILE *f = fopen(path, "rb");
        cr_assert(f);
        char *buf = malloc((size_t)m.files[r].size);
        cr_assert(buf && fread(buf, 1, (size_t)m.files[r].size, f) == (size_t)m.files[r].size);
        fclose(f);
        cr_assert_eq(m.files[r].hash, cx_hash64(buf, (size_t)m.files[r].size), "%s", m.files[r].name);
        free(buf);
    }
    ckpt_marker_release(&m);
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

/* ---- files of format version 1 (cxh64 checksums) ------------------------------------ */

/* data/v1 holds a committed single-file checkpoint (Adam state, step 5,
 * epoch 2, position 24, RNG {42, 1000}) and its 2-rank reshard, written by
 * the library of commit 72647d1 with data/v1/make_v1.c: every tensor holds
 * v1_value(its name, i). */
static float v1_value(const char *name, int64_t i)
{
    int t = 0;
    for (const char *s = name; *s; s++) t += (unsigned char)*s;
    return (float)(t % 61 + i) / 8.0f;
}

static cx_module *v1_model(void)
{
    cx_manual_seed(11);
    cx_module *m[3] = { cx_nn_linear(4, 3, true), cx_nn_batch_norm2d(3, cx_batch_norm_default_opts()),
                        cx_nn_linear(3, 2, true) };
    return cx_nn_sequential(m, 3);
}

static cx_optimizer *v1_adam(cx_module *m)
{
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_optimizer *o = cx_optim_adam(ps, n, cx_adam_default_opts());
    free(ps);
    return o;
}

/* Each tensor of the model (opt: of the optimizer state), but those whose
 * name ends in `skip`, holds v1_value. */
static void assert_v1_values(cx_module *m, cx_optimizer *opt, const char *skip)
{
    int n = 0;
    cx_named_tensor *ts = opt ? cx_optim_state(opt, &n) : cx_module_state_dict(m, &n);
    cr_assert(ts && n > 0);
    for (int k = 0; k < n; k++) {
        size_t len = strlen(ts[k].name);
        if (skip && len >= strlen(skip) && !strcmp(ts[k].name + len - strlen(skip), skip)) continue;
        int64_t numel = cx_numel(ts[k].tensor);
        cx_dtype dt = cx_dtype_of(ts[k].tensor);
        void *raw = malloc(8 * (size_t)numel + 8);
        cr_assert(raw);
        cr_assert_eq(cx_to_host(ts[k].tensor, raw, dt), CX_OK);
        for (int64_t i = 0; i < numel; i++) {
            /* integers (a batch-norm counter) hold 8 * v1_value */
            double got = dt == CX_I64 ? (double)((int64_t *)raw)[i] / 8.0 : ((float *)raw)[i];
            cr_assert_eq(got, v1_value(ts[k].name, i), "%s[%lld] = %g", ts[k].name, (long long)i, got);
        }
        free(raw);
    }
    free(ts);
}

static void copy_v1(const char *name)
{
    cr_assert_eq(sh("cp " CX_CKPT_FIXTURES "/v1/%s[._]* %s/", name, g_dir), 0);
}

/* Flips one byte of dataset h5's raw data in a file. */
static void flip_data_byte(const char *path, const char *h5)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert(f >= 0);
    hid_t d = H5Dopen2(f, h5, H5P_DEFAULT);
    cr_assert(d >= 0);
    haddr_t at = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    cr_assert(at != HADDR_UNDEF);
    FILE *fp = fopen(path, "r+b");
    cr_assert(fp);
    fseek(fp, (long)at + 1, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, (long)at + 1, SEEK_SET);
    fputc(c ^ 0x01, fp);
    fclose(fp);
}

Test(ckpt_faults, version1_checkpoint_loads)
{
    copy_v1("v1_single");
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/v1_single", g_dir);
    cx_module *m = v1_model();
    cx_optimizer *o = v1_adam(m);
    cx_ckpt_extra ex = { 0, 0, 0 };
    /* unsharded into unsharded: each tensor checked against its cxh64 */
    cr_assert_eq(cx_ckpt_load(prefix, cx_ckpt_model_single(m), o, &ex), CX_OK, "%s", cx_last_error());
    cr_assert(ex.step == 5 && ex.epoch == 2 && ex.sampler_position == 24);
    cr_assert_eq(cx_optim_step_count(o), 5);
    cx_rng_state rng = cx_get_rng_state();
    cr_assert(rng.seed == 42 && rng.offset == 1000);
    assert_v1_values(m, NULL, NULL);
    assert_v1_values(m, o, NULL);
    cx_optim_free(o);
    cx_module_free(m);
}

Test(ckpt_faults, version1_sharded_checkpoint_loads_and_consolidates)
{
    copy_v1("v1_sharded");
    char prefix[512], out[512];
    snprintf(prefix, sizeof prefix, "%s/v1_sharded", g_dir);
    snprintf(out, sizeof out, "%s/out.h5", g_dir);
    /* stitched from two files, each checked against the marker's cxh64 */
    cx_module *m = v1_model();
    cx_optimizer *o = v1_adam(m);
    cr_assert_eq(cx_ckpt_load(prefix, cx_ckpt_model_single(m), o, NULL), CX_OK, "%s", cx_last_error());
    assert_v1_values(m, NULL, NULL);
    /* a flat unit keeps one 0-d step: its first parameter's */
    assert_v1_values(m, o, ".step");
    cx_optim_free(o);
    cx_module_free(m);

    /* consolidated into a file of the current version */
    cr_assert_eq(consolidate("v1_sharded"), 0, "%s", g_out);
    hid_t f = H5Fopen(out, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert(f >= 0);
    int64_t version = 0;
    cr_assert_eq(ckpt_attr_read_i64(f, "format_version", &version), 0);
    cr_assert_eq(version, CX_CKPT_FORMAT_VERSION);
    /* its per-tensor checksum is XXH3-64 of the raw data */
    float w[12];
    uint64_t stored = 0;
    hid_t d = H5Dopen2(f, "/model/0.weight", H5P_DEFAULT);
    cr_assert(d >= 0 && H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, w) >= 0);
    cr_assert_eq(ckpt_attr_read_u64(d, "xxh3_64", &stored), 0);
    cr_assert_eq(stored, cx_hash64(w, sizeof w));
    cr_assert(H5Aexists(d, "cxh64") == 0);
    H5Dclose(d);
    H5Fclose(f);
    m = v1_model();
    cr_assert_eq(cx_ckpt_load_full(out, cx_ckpt_model_single(m), NULL, NULL), CX_OK, "%s", cx_last_error());
    assert_v1_values(m, NULL, NULL);
    cx_module_free(m);
}

Test(ckpt_faults, version1_checksums_are_checked)
{
    char path[512], prefix[512];
    copy_v1("v1_sharded");
    snprintf(path, sizeof path, "%s/v1_sharded_rank-0-of-2.h5", g_dir);
    flip_data_byte(path, "/model/flat_param");
    expect_refused("v1_sharded", "checksum mismatch with the commit marker");

    copy_v1("v1_single");
    snprintf(path, sizeof path, "%s/v1_single_rank-0-of-1.h5", g_dir);
    snprintf(prefix, sizeof prefix, "%s/v1_single", g_dir);
    flip_data_byte(path, "/model/0.weight");
    cx_module *m = v1_model();
    cr_assert_eq(cx_ckpt_load(prefix, cx_ckpt_model_single(m), NULL, NULL), CX_ERR_IO);
    cr_assert(strstr(cx_last_error(), "/model/0.weight: checksum mismatch"), "%s", cx_last_error());
    cx_module_free(m);
}

/* ---- SPMD checkpoints: the boxes of each tensor are checked ---------------- */

/* A committed 1-rank SPMD checkpoint <dir>/<name> whose 0.weight (32, 16)
 * is rewritten to say it holds only the given boxes (start, count,
 * local_start per box) of a tensor of global shape g0 x 16; the marker is
 * updated, so only the box checks can refuse it. */
static void make_spmd_boxes(const char *name, int64_t g0, const int64_t *boxes, int nboxes)
{
    char prefix[512], path[600];
    snprintf(prefix, sizeof prefix, "%s/%s", g_dir, name);
    cx_module *m = mlp(1);
    cr_assert_eq(cx_ckpt_save(prefix, cx_ckpt_model_spmd(m), NULL, NULL), CX_OK, "%s", cx_last_error());
    cx_module_free(m);
    snprintf(path, sizeof path, "%s_rank-0-of-1.h5", prefix);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert(f >= 0);
    cr_assert(H5Lexists(f, "/spmd_metadata", H5P_DEFAULT) > 0, "an SPMD save has no /spmd_metadata");
    hid_t d = H5Dopen2(f, "/model/0.weight", H5P_DEFAULT);
    int64_t gshape[2] = { g0, 16 }, dims[3] = { nboxes, 3, 2 };
    cr_assert(d >= 0 && ckpt_attr_write_i64s(d, "global_shape", gshape, 2) == 0 &&
              ckpt_attr_write_i64_array(d, "shard_boxes", boxes, 3, dims) == 0);
    H5Dclose(d);
    H5Fclose(f);
    recommit(name, 0);
}

Test(ckpt_faults, spmd_boxes_checked)
{
    /* the whole tensor as one box: fine (the forged attributes say what the dataset is) */
    const int64_t whole[] = { 0, 0, 32, 16, 0, 0 };
    make_spmd_boxes("whole", 32, whole, 1);
    cr_assert_eq(consolidate("whole"), 0, "%s", g_out);
    sh("rm %s/out.h5%s", g_dir, "");
    /* half of it: the other half is in no file */
    const int64_t half[] = { 0, 0, 16, 16, 0, 0 };
    make_spmd_boxes("half", 32, half, 1);
    expect_refused("half", "0.weight in its 1 files do not cover the tensor exactly once");
    /* two boxes overlapping by 4 rows */
    const int64_t overlap[] = { 0, 0, 20, 16, 0, 0, 16, 0, 16, 16, 16, 0 };
    make_spmd_boxes("overlap", 32, overlap, 2);
    expect_refused("overlap", "do not cover the tensor exactly once");
    /* the same box twice */
    const int64_t twice[] = { 0, 0, 16, 16, 0, 0, 0, 0, 16, 16, 0, 0 };
    make_spmd_boxes("twice", 16, twice, 2);
    expect_refused("twice", "do not cover the tensor exactly once");
    /* a box beyond the dataset, and one beyond the global shape */
    const int64_t beyond_data[] = { 0, 0, 32, 16, 8, 0 };
    make_spmd_boxes("beyond_data", 32, beyond_data, 1);
    expect_refused("beyond_data", "/model/0.weight: a shard box lies outside the global shape or the dataset");
    const int64_t beyond_global[] = { 8, 0, 32, 16, 0, 0 };
    make_spmd_boxes("beyond_global", 32, beyond_global, 1);
    expect_refused("beyond_global", "a shard box lies outside");
    /* a model of another shape is refused before anything is read */
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/whole", g_dir);
    cx_manual_seed(2);
    cx_module *l[3] = { cx_nn_linear(16, 30, true), cx_nn_relu(), cx_nn_linear(30, 4, true) };
    cx_module *m = cx_nn_sequential(l, 3);
    cr_assert_neq(cx_ckpt_load(prefix, cx_ckpt_model_spmd(m), NULL, NULL), CX_OK);
    cr_assert(strstr(cx_last_error(), "0.weight has shape (32, 16), the model expects (30, 16)"), "%s", cx_last_error());
    cx_module_free(m);
}
