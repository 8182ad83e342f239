/* Checkpoints: bit-exact round trip, resume equivalence, reshard and
 * consolidation round trips, the tool's output, h5dump interoperability. */
#include <criterion/criterion.h>
#include <cxla/cxla.h>

#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[256];
static char g_tool[4096];

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/cx_test_ckpt_XXXXXX");
    cr_assert(mkdtemp(g_dir));
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    cr_assert(n > 0);
    exe[n] = '\0';
    snprintf(g_tool, sizeof g_tool, "%s/tools/consolidate_ckpts", dirname(dirname(exe)));
}

static void teardown(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_dir);
}

/* conv -> batch norm (buffers, i64 counter) -> relu -> dropout (RNG) -> linear */
static cx_module *make_model(uint64_t seed)
{
    cx_manual_seed(seed);
    cx_module *m[6] = { cx_nn_conv2d(1, 4, 3, cx_conv2d_default_opts()), cx_nn_batch_norm2d(4, cx_batch_norm_default_opts()),
                        cx_nn_relu(), cx_nn_dropout(0.2), cx_nn_flatten(1, -1), cx_nn_linear(4 * 6 * 6, 5, true) };
    return cx_nn_sequential(m, 6);
}

static cx_optimizer *make_opt(cx_module *m, bool adam)
{
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_optimizer *o;
    if (adam) {
        cx_adam_opts a = cx_adam_default_opts();
        a.lr = 0.01;
        o = cx_optim_adam(ps, n, a);
    } else {
        cx_sgd_opts s = cx_sgd_default_opts();
        s.lr = 0.05;
        s.momentum = 0.9;
        o = cx_optim_sgd(ps, n, s);
    }
    free(ps);
    return o;
}

static void train(cx_module *m, cx_optimizer *o, int from, int to)
{
    for (int s = from; s < to; s++) {
        float x[4 * 64];
        int64_t y[4];
        for (int i = 0; i < 4 * 64; i++) x[i] = (float)sin(0.1 * i + s);
        for (int i = 0; i < 4; i++) y[i] = (s + i) % 5;
        cx_step_begin();
        int64_t xs[4] = { 4, 1, 8, 8 }, ys[1] = { 4 };
        cx_tensor *tx = cx_from_host(x, xs, 4, CX_F32), *ty = cx_from_host(y, ys, 1, CX_I64);
        cx_optim_zero_grad(o);
        cx_tensor *loss = cx_cross_entropy(cx_module_forward(m, tx), ty, CX_REDUCE_MEAN, -100, 0.0);
        cr_assert_eq(cx_backward(loss), CX_OK);
        cr_assert_eq(cx_optim_step(o), CX_OK);
        cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    }
}

/* Every state-dict tensor and optimizer state equal, byte for byte. */
static void assert_same(cx_module *a, cx_optimizer *oa, cx_module *b, cx_optimizer *ob)
{
    for (int pass = 0; pass < 2; pass++) {
        int na, nb;
        cx_named_tensor *ta = pass ? cx_optim_state(oa, &na) : cx_module_state_dict(a, &na);
        cx_named_tensor *tb = pass ? cx_optim_state(ob, &nb) : cx_module_state_dict(b, &nb);
        cr_assert_eq(na, nb);
        for (int i = 0; i < na; i++) {
            cr_assert_str_eq(ta[i].name, tb[i].name);
            cx_dtype dt = cx_dtype_of(ta[i].tensor);
            size_t bytes = (size_t)cx_numel(ta[i].tensor) * cx_dtype_size(dt);
            void *ha = malloc(bytes + 1), *hb = malloc(bytes + 1);
            cr_assert_eq(cx_to_host(ta[i].tensor, ha, dt), CX_OK);
            cr_assert_eq(cx_to_host(tb[i].tensor, hb, dt), CX_OK);
            cr_assert(memcmp(ha, hb, bytes) == 0, "%s differs", ta[i].name);
            free(ha);
            free(hb);
        }
        free(ta);
        free(tb);
    }
    if (oa && ob) cr_assert_eq(cx_optim_step_count(oa), cx_optim_step_count(ob));
}

static int run_tool(const char *args, char *out, size_t cap)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", g_tool, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t len = fread(out, 1, cap - 1, p);
    out[len] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TestSuite(ckpt, .init = setup, .fini = teardown);

Test(ckpt, round_trip_is_bit_exact)
{
    for (int adam = 0; adam < 2; adam++) {
        cx_module *a = make_model(1);
        cx_optimizer *oa = make_opt(a, adam);
        train(a, oa, 0, 3);
        char prefix[512];
        snprintf(prefix, sizeof prefix, "%s/rt%d", g_dir, adam);
        cx_rng_state rng = cx_get_rng_state();
        cx_ckpt_extra ex = { 3, 7, 123 };
        cr_assert_eq(cx_ckpt_save(prefix, cx_ckpt_model_single(a), oa, &ex), CX_OK, "%s", cx_last_error());
        cr_assert(cx_ckpt_is_committed(prefix));

        cx_module *b = make_model(99);
        cx_optimizer *ob = make_opt(b, adam);
        cx_manual_seed(12345);
        cx_ckpt_extra got = { 0, 0, 0 };
        cr_assert_eq(cx_ckpt_load(prefix, cx_ckpt_model_single(b), ob, &got), CX_OK, "%s", cx_last_error());
        cx_rng_state r2 = cx_get_rng_state();
        cr_assert(r2.seed == rng.seed && r2.offset == rng.offset);
        cr_assert(got.step == 3 && got.epoch == 7 && got.sampler_position == 123);
        assert_same(a, oa, b, ob);
        cx_optim_free(oa);
        cx_optim_free(ob);
        cx_module_free(a);
        cx_module_free(b);
    }
}

Test(ckpt, compressed_round_trip)
{
    cx_module *a = make_model(1);
    cx_optimizer *oa = make_opt(a, true);
    train(a, oa, 0, 2);
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/z", g_dir);
    cx_ckpt_opts o = cx_ckpt_default_opts();
    o.compress_level = 3;
    cr_assert_eq(cx_ckpt_save_opts(prefix, cx_ckpt_model_single(a), oa, NULL, o), CX_OK, "%s", cx_last_error());
    cx_module *b = make_model(5);
    cx_optimizer *ob = make_opt(b, true);
    cr_assert_eq(cx_ckpt_load(prefix, cx_ckpt_model_single(b), ob, NULL), CX_OK, "%s", cx_last_error());
    assert_same(a, oa, b, ob);
    cx_optim_free(oa);
    cx_optim_free(ob);
    cx_module_free(a);
    cx_module_free(b);
}

Test(ckpt, resume_equals_uninterrupted_training)
{
    const int k = 3;
    cx_module *a = make_model(1);
    cx_optimizer *oa = make_opt(a, true);
    train(a, oa, 0, 2 * k);

    cx_module *b = make_model(1);
    cx_optimizer *ob = make_opt(b, true);
    train(b, ob, 0, k);
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/resume", g_dir);
    cr_assert_eq(cx_ckpt_save(prefix, cx_ckpt_model_single(b), ob, NULL), CX_OK, "%s", cx_last_error());
    cx_optim_free(ob);
    cx_module_free(b);

    char latest[512];
    cr_assert_eq(cx_ckpt_latest(g_dir, latest, sizeof latest), CX_OK, "%s", cx_last_error());
    cr_assert_str_eq(latest, prefix);
    cx_module *c = make_model(77);
    cx_optimizer *oc = make_opt(c, true);
    cr_assert_eq(cx_ckpt_load(latest, cx_ckpt_model_single(c), oc, NULL), CX_OK, "%s", cx_last_error());
    train(c, oc, k, 2 * k);
    assert_same(a, oa, c, oc);
    cx_optim_free(oa);
    cx_optim_free(oc);
    cx_module_free(a);
    cx_module_free(c);
}

Test(ckpt, reshard_and_consolidate_round_trip)
{
    cx_module *a = make_model(1);
    cx_optimizer *oa = make_opt(a, true);
    train(a, oa, 0, 2);
    static char out[1 << 16];
    char p[512], q[512], r[512], args[2048], full[600];
    snprintf(p, sizeof p, "%s/full", g_dir);
    snprintf(q, sizeof q, "%s/sh4", g_dir);
    snprintf(r, sizeof r, "%s/sh2", g_dir);
    cr_assert_eq(cx_ckpt_save(p, cx_ckpt_model_single(a), oa, NULL), CX_OK, "%s", cx_last_error());

    /* 1 -> 4 -> 2 -> full, with the optimizer state */
    snprintf(args, sizeof args, "--ckpt-prefix %s --reshard 4 --out-prefix %s --with-optimizer", p, q);
    cr_assert_eq(run_tool(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "found 1 checkpoint files in"), "%s", out);
    snprintf(args, sizeof args, "--ckpt-prefix %s --reshard 2 --out-prefix %s --with-optimizer", q, r);
    cr_assert_eq(run_tool(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "found 4 checkpoint files in"), "%s", out);
    /* spelled as PyTorch/XLA's consolidate_sharded_ckpts command (its docs' --ckpt_prefix / --ckpt_suffix) */
    snprintf(args, sizeof args, "--ckpt_prefix %s --ckpt_suffix '_rank-*-of-*.h5' --with_optimizer", r);
    cr_assert_eq(run_tool(args, out, sizeof out), 0, "%s", out);
    snprintf(full, sizeof full, "%s_consolidated.h5", r);
    cr_assert(strstr(out, "found 2 checkpoint files in"), "%s", out);
    cr_assert(strstr(out, "saved consolidated model to"), "%s", out);
    cr_assert(access(full, R_OK) == 0);

    cx_module *b = make_model(3);
    cx_optimizer *ob = make_opt(b, true);
    cr_assert_eq(cx_ckpt_load_full(full, cx_ckpt_model_single(b), ob, NULL), CX_OK, "%s", cx_last_error());
    assert_same(a, oa, b, ob);

    /* a sharded checkpoint loads straight into an unwrapped model */
    cx_module *c = make_model(4);
    cx_optimizer *oc = make_opt(c, true);
    cr_assert_eq(cx_ckpt_load(q, cx_ckpt_model_single(c), oc, NULL), CX_OK, "%s", cx_last_error());
    assert_same(a, oa, c, oc);

    /* without the optimizer state, loading with an optimizer is refused */
    snprintf(args, sizeof args, "--ckpt-prefix %s --save-path %s/model_only.h5", q, g_dir);
    cr_assert_eq(run_tool(args, out, sizeof out), 0, "%s", out);
    snprintf(full, sizeof full, "%s/model_only.h5", g_dir);
    cr_assert_neq(cx_ckpt_load_full(full, cx_ckpt_model_single(c), oc, NULL), CX_OK);
    cr_assert_eq(cx_ckpt_load_full(full, cx_ckpt_model_single(c), NULL, NULL), CX_OK, "%s", cx_last_error());

    /* h5dump lists every key with its PyTorch shape */
    if (system("command -v h5dump >/dev/null 2>&1") == 0) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "h5dump -H %s 2>&1", full);
        FILE *f = popen(cmd, "r");
        size_t len = fread(out, 1, sizeof out - 1, f);
        out[len] = '\0';
        cr_assert_eq(pclose(f), 0, "%s", out);
        cr_assert(strstr(out, "DATASET \"0.weight\""), "%s", out);
        cr_assert(strstr(out, "( 4, 1, 3, 3 )"), "%s", out);
        cr_assert(strstr(out, "DATASET \"5.weight\""), "%s", out);
        cr_assert(strstr(out, "( 5, 144 )"), "%s", out);
        cr_assert(strstr(out, "DATASET \"1.running_mean\""), "%s", out);
    }
    cx_optim_free(oa);
    cx_optim_free(ob);
    cx_optim_free(oc);
    cx_module_free(a);
    cx_module_free(b);
    cx_module_free(c);
}

/* One line for each flag mistake (exit 2); PyTorch's ".pth" suffix finds no
 * file, and the message names the files cxla wrote instead (exit 1). */
Test(ckpt, tool_flag_errors_are_one_line)
{
    cx_module *a = make_model(1);
    char p[512], args[2048];
    static char out[1 << 14];
    snprintf(p, sizeof p, "%s/final_ckpt", g_dir);
    cr_assert_eq(cx_ckpt_save(p, cx_ckpt_model_single(a), NULL, NULL), CX_OK, "%s", cx_last_error());
    cx_module_free(a);
    const struct {
        const char *args;
        const char *line;
    } cases[] = {
        { "", "consolidate_ckpts: --ckpt-prefix is required (see consolidate_ckpts --help)\n" },
        { "--ckpt_prefix", "consolidate_ckpts: --ckpt-prefix needs a value (see consolidate_ckpts --help)\n" },
        { "--ckpt-prefix x --reshard 2", "consolidate_ckpts: --reshard needs --out-prefix (see consolidate_ckpts --help)\n" },
        { "--ckpt-prefix x --out_prefix y", "consolidate_ckpts: --out-prefix needs --reshard (see consolidate_ckpts --help)\n" },
        { "--ckpt-prefix x --compress=23",
          "consolidate_ckpts: --compress: expected an integer in [0, 22], got '23' (see consolidate_ckpts --help)\n" },
        { "--ckpt-prefix x --bogus", "consolidate_ckpts: unknown flag --bogus (see consolidate_ckpts --help)\n" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cr_expect_eq(run_tool(cases[i].args, out, sizeof out), 2, "%s: %s", cases[i].args, out);
        cr_expect_str_eq(out, cases[i].line);
    }
    snprintf(args, sizeof args, "--ckpt_prefix %s --ckpt_suffix '_rank-*-of-*.pth'", p);
    cr_expect_eq(run_tool(args, out, sizeof out), 1, "%s", out);
    char want[2048];
    snprintf(want, sizeof want, "consolidate_ckpts: no checkpoint files match %s_rank-*-of-*.pth, but 1 match "
             "%s_rank-*-of-*.h5, the names cxla writes (drop --ckpt-suffix)\n", p, p);
    cr_expect_str_eq(out, want);
}

Test(ckpt, wrong_shape_is_refused_and_model_untouched)
{
    cx_module *a = make_model(1);
    char p[512];
    snprintf(p, sizeof p, "%s/shape", g_dir);
    cr_assert_eq(cx_ckpt_save(p, cx_ckpt_model_single(a), NULL, NULL), CX_OK, "%s", cx_last_error());
    cx_module *m[2] = { cx_nn_conv2d(1, 4, 3, cx_conv2d_default_opts()), cx_nn_linear(4, 5, true) };
    cx_module *b = cx_nn_sequential(m, 2);
    cr_assert_eq(cx_ckpt_load(p, cx_ckpt_model_single(b), NULL, NULL), CX_ERR_SHAPE);
    cr_assert(strstr(cx_last_error(), "shape") || strstr(cx_last_error(), "has no"), "%s", cx_last_error());
    cr_assert(!strchr(cx_last_error(), '\n'));
    /* no committed checkpoint: a clear error */
    snprintf(p, sizeof p, "%s/none", g_dir);
    cr_assert_eq(cx_ckpt_load(p, cx_ckpt_model_single(a), NULL, NULL), CX_ERR_IO);
    cr_assert(strstr(cx_last_error(), "no checkpoint at"), "%s", cx_last_error());
    cx_module_free(a);
    cx_module_free(b);
}

/* A program's metadata (what it needs before it can build the model) rides
 * along: read back from the committed prefix, from the consolidated and
 * resharded copies, from what the manager saved and cx_ckpt_latest finds,
 * and "" from a checkpoint saved without any. */
Test(ckpt, program_meta_round_trip)
{
    const char *meta = "vocab_size=256 block_size=128 n_layer=4 n_head=4 n_embd=256";
    cx_module *a = make_model(1);
    char p[512], q[512], full[600], none[512];
    snprintf(p, sizeof p, "%s/meta", g_dir);
    cx_ckpt_opts o = cx_ckpt_default_opts();
    o.meta = meta;
    cr_assert_eq(cx_ckpt_save_opts(p, cx_ckpt_model_single(a), NULL, NULL, o), CX_OK, "%s", cx_last_error());
    char *got = cx_ckpt_read_meta(p);
    cr_assert(got, "%s", cx_last_error());
    cr_assert_str_eq(got, meta);
    free(got);

    snprintf(full, sizeof full, "%s/meta_full.h5", g_dir);
    cr_assert_eq(cx_ckpt_consolidate(p, full, cx_ckpt_consolidate_default_opts()), CX_OK, "%s", cx_last_error());
    got = cx_ckpt_read_meta(full);
    cr_assert(got, "%s", cx_last_error());
    cr_assert_str_eq(got, meta);
    free(got);
    snprintf(q, sizeof q, "%s/meta_sh2", g_dir);
    cr_assert_eq(cx_ckpt_reshard(p, q, 2, cx_ckpt_consolidate_default_opts()), CX_OK, "%s", cx_last_error());
    got = cx_ckpt_read_meta(q);
    cr_assert(got, "%s", cx_last_error());
    cr_assert_str_eq(got, meta);
    free(got);

    snprintf(none, sizeof none, "%s/plain", g_dir);
    cr_assert_eq(cx_ckpt_save(none, cx_ckpt_model_single(a), NULL, NULL), CX_OK, "%s", cx_last_error());
    got = cx_ckpt_read_meta(none);
    cr_assert(got, "%s", cx_last_error());
    cr_assert_str_eq(got, "");
    free(got);
    /* the metadata is the program's: loads neither need nor mind it */
    cr_assert_eq(cx_ckpt_load(p, cx_ckpt_model_single(a), NULL, NULL), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_ckpt_load_full(full, cx_ckpt_model_single(a), NULL, NULL), CX_OK, "%s", cx_last_error());
    cx_module_free(a);
}

Test(ckpt, program_meta_from_the_manager_and_errors)
{
    char dir[512], latest[600], p[600];
    snprintf(dir, sizeof dir, "%s/mgr", g_dir);
    cx_ckpt_manager_opts mo = cx_ckpt_manager_default_opts();
    mo.watch_sigterm = false;
    char meta[32] = "n_layer=2";
    mo.meta = meta;
    cx_ckpt_manager *m = cx_ckpt_manager_new(dir, mo);
    cr_assert(m, "%s", cx_last_error());
    strcpy(meta, "changed");   /* the manager keeps its own copy */
    cx_module *a = make_model(1);
    cr_assert_eq(cx_ckpt_manager_save(m, 5, cx_ckpt_model_single(a), NULL, NULL), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_ckpt_latest(dir, latest, sizeof latest), CX_OK, "%s", cx_last_error());
    char *got = cx_ckpt_read_meta(latest);
    cr_assert(got, "%s", cx_last_error());
    cr_assert_str_eq(got, "n_layer=2");
    free(got);
    cx_ckpt_manager_free(m);

    /* missing or uncommitted: NULL and a one-line error */
    snprintf(p, sizeof p, "%s/nothing", g_dir);
    cr_assert_null(cx_ckpt_read_meta(p));
    cr_assert(strstr(cx_last_error(), "no checkpoint at"), "%s", cx_last_error());
    snprintf(p, sizeof p, "%s/ckpt-step-5.commit", dir);
    cr_assert_eq(unlink(p), 0);
    snprintf(p, sizeof p, "%s/ckpt-step-5", dir);
    cr_assert_null(cx_ckpt_read_meta(p));
    cr_assert(!strchr(cx_last_error(), '\n'), "%s", cx_last_error());

    /* too long to store whole: refused, not cut */
    static char big[CX_CKPT_META_MAX + 1];
    memset(big, 'x', CX_CKPT_META_MAX);
    cx_ckpt_opts o = cx_ckpt_default_opts();
    o.meta = big;
    snprintf(p, sizeof p, "%s/big", g_dir);
    cr_assert_eq(cx_ckpt_save_opts(p, cx_ckpt_model_single(a), NULL, NULL, o), CX_ERR_ARG);
    cr_assert(strstr(cx_last_error(), "CX_CKPT_META_MAX"), "%s", cx_last_error());
    cr_assert(!cx_ckpt_is_committed(p));
    mo.meta = big;
    cr_assert_null(cx_ckpt_manager_new(dir, mo));
    cx_module_free(a);
}
