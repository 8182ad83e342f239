/* PT_XLA_DEBUG_LEVEL: the compilation / execution analysis names the cause
 * of each execution (user sync, a value read mid-step, the loader's step
 * end) and the C call site; the "too frequent" warnings. */
#include <criterion/criterion.h>

#include "test_obs_cnn.h"

static char g_path[256];

static void debug_on(const char *level)
{
    snprintf(g_path, sizeof g_path, "/tmp/cx_obs_debug_%d.txt", (int)getpid());
    unlink(g_path);
    setenv("PT_XLA_DEBUG_LEVEL", level, 1);
    setenv("PT_XLA_DEBUG_FILE", g_path, 1);
    cx_debug_reload_env();
}

static char *debug_text(void)
{
    char *s = obs_read_file(g_path);
    cr_assert(s, "no debug output in %s", g_path);
    return s;
}

static cx_tensor *small_graph(double k)
{
    cx_tensor *x = cx_from_host((float[]){ 1, 2, 3, 4 }, (int64_t[]){ 4 }, 1, CX_F32);
    return cx_sum(cx_mul_scalar(cx_exp(x), k), NULL, 0, false);
}

Test(obs_debug, user_sync_names_cause_and_call_site)
{
    debug_on("1");
    cx_tensor *y = small_graph(2.0);
    int line = __LINE__ + 1;
    cr_assert_eq(cx_sync(), CX_OK);
    char *s = debug_text();
    cr_expect(strstr(s, "Compilation Analysis: Compilation Cause\nCompilation Analysis:   user sync: "), "%s", s);
    cr_expect(strstr(s, "Compilation Analysis:   Graph Hash: "), "%s", s);
    cr_expect(strstr(s, "Compilation Analysis:   Number of Graph Inputs: 1\n"), "%s", s);
    cr_expect(strstr(s, "Compilation Analysis:   Number of Graph Outputs: "), "%s", s);
    char site[128];
    snprintf(site, sizeof site, "cx_sync (%s:%d)", __FILE__, line);
    cr_expect(strstr(s, site), "no '%s' in:\n%s", site, s);
    cr_expect(strstr(s, "Post Compilation Analysis: Graph input size: "), "%s", s);
    cr_expect(!strstr(s, "Execution Analysis"), "level 1 has no execution analysis");
    cx_exec_info ei = cx_last_exec_info();
    char hash[40];
    snprintf(hash, sizeof hash, "%016llx%016llx", (unsigned long long)ei.key_hi, (unsigned long long)ei.key_lo);
    cr_expect(strstr(s, hash), "%s", s);
    free(s);
    cx_free(y);
    unlink(g_path);
}

Test(obs_debug, value_read_mid_step)
{
    debug_on("2");
    cx_step_begin();
    cx_tensor *y = small_graph(3.0);
    double v = cx_item(y);   /* mid-step read: runs the subgraph */
    cr_expect(isfinite(v));
    cx_step_end();
    char *s = debug_text();
    cr_expect(strstr(s, "Compilation Analysis:   value read: "), "%s", s);
    cr_expect(strstr(s, "Execution Analysis: Execution Cause\nExecution Analysis:   value read: "), "%s", s);
    cr_expect(strstr(s, "cx_item (" __FILE__ ":"), "%s", s);
    free(s);
    unlink(g_path);
}

Test(obs_debug, loader_step_end)
{
    debug_on("2");
    obs_run r;
    cr_assert_eq(obs_train(3, &r), CX_OK, "%s", cx_last_error());
    char *s = debug_text();
    cr_expect(strstr(s, "Compilation Analysis:   loader: mark_step in parallel loader at step end\n"), "%s", s);
    /* one compile for the step, then executions only */
    cr_expect_eq(obs_count(s, "Execution Analysis:   loader: "), 3, "%s", s);
    cr_expect_eq(obs_count(s, "Compilation Analysis:   loader: "), 1, "%s", s);
    /* the loader's caller is on the C stack */
    cr_expect(strstr(s, "cx_loader_end_step") || strstr(s, "cx_loader_next"), "%s", s);
    free(s);
    unlink(g_path);
}

Test(obs_debug, plain_step_end_and_frequency_warnings)
{
    debug_on("1");
    for (int i = 0; i < 4; i++) {
        cx_step_begin();
        cx_tensor *y = small_graph(1.0);
        cr_expect(isfinite(cx_item(y)));   /* a read every step: too frequent */
        cx_step_end();
    }
    char *s = debug_text();
    cr_expect(strstr(s, "pt-xla-profiler: TransferFromDeviceTime too frequent: 4 counts during 4 steps\n"), "%s", s);
    free(s);
    unlink(g_path);
    /* a graph that changes every step recompiles every step */
    debug_on("1");
    for (int i = 0; i < 12; i++) {
        cx_step_begin();
        cx_keep(small_graph(1.0 + i));   /* the constant is part of the graph */
        cx_step_end();
    }
    s = debug_text();
    cr_expect(strstr(s, "pt-xla-profiler: CompileTime too frequent: "), "%s", s);
    cr_expect(strstr(s, "Compilation Analysis:   step end: "), "%s", s);
    free(s);
    unlink(g_path);
}

Test(obs_debug, quiet_when_off)
{
    unsetenv("PT_XLA_DEBUG_LEVEL");
    snprintf(g_path, sizeof g_path, "/tmp/cx_obs_debug_off_%d.txt", (int)getpid());
    setenv("PT_XLA_DEBUG_FILE", g_path, 1);
    cx_debug_reload_env();
    cr_expect_eq(cx_debug_level(), 0);
    cx_tensor *y = small_graph(2.0);
    cr_assert_eq(cx_sync(), CX_OK);
    cr_expect_eq(access(g_path, F_OK), -1, "debug output with the level off");
    cx_free(y);
}

/* A backend that says this process is local rank 1 of 2 on its node:
 * where the debug analysis learns the node layout (never the launcher's
 * environment). No collective runs, so start and wait are never called. */
static int two(void *ctx) { (void)ctx; return 2; }
static int one(void *ctx) { (void)ctx; return 1; }
static void *no_start(void *ctx, const cx_comm_op *op) { (void)ctx; (void)op; return NULL; }
static cx_status no_wait(void *ctx, void *req) { (void)ctx; (void)req; return CX_ERR_COMM; }

Test(obs_debug, other_local_ranks_are_quiet)
{
    cx_comm_backend be = { CX_STRUCT_SIZE(cx_comm_backend), .name = "local-rank-1", .world_size = two, .rank = one,
                           .start = no_start, .wait = no_wait, .local_rank = one, .local_size = two };
    cr_assert_eq(cx_comm_register(&be), CX_OK, "%s", cx_last_error());
    setenv("LOCAL_RANK", "0", 1);   /* the environment says otherwise: not read */
    debug_on("2");
    char mine[600];   /* in a world of 2, each rank's file carries its rank */
    snprintf(mine, sizeof mine, "%s.1", g_path);
    cx_tensor *y = small_graph(2.0);
    cr_assert_eq(cx_sync(), CX_OK);
    cr_expect(access(g_path, F_OK) == -1 && access(mine, F_OK) == -1, "local rank 1 printed");
    setenv("CX_DEBUG_ALL_RANKS", "1", 1);
    cx_debug_reload_env();
    cx_tensor *z = small_graph(5.0);
    cr_assert_eq(cx_sync(), CX_OK);
    cr_expect_eq(access(mine, F_OK), 0, "CX_DEBUG_ALL_RANKS=1 must print");
    cx_free(y);
    cx_free(z);
    unlink(mine);
    cx_comm_register(NULL);
}
