/* The logger (util/cx_log.c): filters by level and module from CX_LOG_LEVEL
 * and CX_LOG_MODULES, the application's handler, the stderr lines it
 * replaces, and one line for a bad setting. Criterion runs every test in a
 * process of its own, so the environment and the logger start fresh. */
#include "cx_log.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAXREC 64

typedef struct {
    cx_log_level level;
    char module[32];
    char msg[256];
} record;

static record g_rec[MAXREC];
static int g_n;

static void keep(cx_log_level level, const char *module, const char *message, void *user)
{
    cr_assert_eq(user, (void *)g_rec);
    if (g_n >= MAXREC) return;
    g_rec[g_n].level = level;
    snprintf(g_rec[g_n].module, sizeof g_rec[g_n].module, "%s", module);
    snprintf(g_rec[g_n].msg, sizeof g_rec[g_n].msg, "%s", message);
    g_n++;
}

/* the environment, read again, with the handler catching what follows */
static void with_env(const char *level, const char *modules)
{
    if (level) setenv("CX_LOG_LEVEL", level, 1);
    else unsetenv("CX_LOG_LEVEL");
    if (modules) setenv("CX_LOG_MODULES", modules, 1);
    else unsetenv("CX_LOG_MODULES");
    g_n = 0;
    cx_log_set_handler(keep, g_rec);
    cx_log_reload();
}

/* one message at each level from `module`: which came through, as "EWID" letters */
static void through(const char *module, char out[5])
{
    int before = g_n;
    for (int l = CX_LOG_ERROR; l <= CX_LOG_DEBUG; l++) cx_logf((cx_log_level)l, module, "level %d", l);
    int k = 0;
    for (int i = before; i < g_n; i++) out[k++] = "EWID"[g_rec[i].level];
    out[k] = '\0';
}

Test(log, default_level_is_info)
{
    char got[5];
    with_env(NULL, NULL);
    through("shm", got);
    cr_assert_str_eq(got, "EWI");
}

Test(log, level_by_name_and_number)
{
    static const struct { const char *env, *want; } cases[] = {
        { "error", "E" }, { "warning", "EW" }, { "INFO", "EWI" }, { "debug", "EWID" },
        { "0", "E" }, { "1", "EW" }, { "2", "EWI" }, { "3", "EWID" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char got[5];
        with_env(cases[i].env, NULL);
        through("runtime", got);
        cr_assert_str_eq(got, cases[i].want, "CX_LOG_LEVEL=%s", cases[i].env);
    }
}

Test(log, module_levels_override_both_ways)
{
    char got[5];
    with_env("warning", "shm=debug,watch=error");
    through("shm", got);
    cr_assert_str_eq(got, "EWID");
    through("watch", got);
    cr_assert_str_eq(got, "E", "errors are always shown; a module's level hides the rest");
    through("runtime", got);
    cr_assert_str_eq(got, "EW", "an unlisted module keeps CX_LOG_LEVEL");
    cr_assert(cx_log_enabled(CX_LOG_DEBUG, "shm"));
    cr_assert(!cx_log_enabled(CX_LOG_INFO, "runtime"));
}

Test(log, handler_gets_level_module_and_message)
{
    with_env(NULL, NULL);
    cx_logf(CX_LOG_WARNING, "cache", "CX_CACHE_DIR=%s: %s", "/x", "read-only");
    cr_assert_eq(g_n, 1);
    cr_assert_eq(g_rec[0].level, CX_LOG_WARNING);
    cr_assert_str_eq(g_rec[0].module, "cache");
    cr_assert_str_eq(g_rec[0].msg, "CX_CACHE_DIR=/x: read-only", "no prefix, no newline");
}

Test(log, bad_level_is_one_error_line, .init = cr_redirect_stderr)
{
    char got[5];
    with_env("loud", NULL);
    cr_assert_eq(g_n, 1, "%d lines", g_n);
    cr_assert_eq(g_rec[0].level, CX_LOG_ERROR);
    cr_assert_str_eq(g_rec[0].module, "settings");
    cr_assert_str_eq(g_rec[0].msg, "bad CX_LOG_LEVEL 'loud': want one of error, warning, info, debug or 0-3 "
                                   "(default info); the value is ignored");
    through("shm", got);
    cr_assert_str_eq(got, "EWI", "the default level");
    cx_log_set_handler(NULL, NULL);
    cx_logf(CX_LOG_INFO, "shm", "after");
    fflush(stderr);
    cr_assert_stderr_eq_str("cxla: notice: after\n", "one report only, not one per message");
}

Test(log, bad_module_list_is_one_error_line)
{
    char got[5];
    with_env("warning", "shm");
    cr_assert_eq(g_n, 1);
    cr_assert_str_eq(g_rec[0].msg, "bad CX_LOG_MODULES 'shm': want module=level,... with levels error, warning, "
                                   "info, debug or 0-3; the value is ignored");
    through("shm", got);
    cr_assert_str_eq(got, "EW", "the list is ignored, CX_LOG_LEVEL holds");
    cr_assert(cx_log_modules_valid("a=1,b=debug,"));
    cr_assert(!cx_log_modules_valid("a=5"));
    cr_assert(!cx_log_modules_valid("=info"));
    cr_assert(!cx_log_modules_valid("a=info,,b=1"));
}

/* what users saw before there was a logger: these exact lines */
Test(log, stderr_lines_without_a_handler, .init = cr_redirect_stderr)
{
    with_env("debug", NULL);
    cx_log_set_handler(NULL, NULL);
    cx_logf(CX_LOG_INFO, "shm", "shared-memory collectives off, using MPI: %s", "why");
    cx_logf(CX_LOG_ERROR, "cache", "CX_CACHE_DIR=/x: no");
    cx_logf(CX_LOG_WARNING, "x", "w");
    cx_logf(CX_LOG_DEBUG, "x", "d");
    fflush(stderr);
    cr_assert_stderr_eq_str("cxla: notice: shared-memory collectives off, using MPI: why\n"
                            "cxla: CX_CACHE_DIR=/x: no\n"
                            "cxla: warning: w\n"
                            "cxla: debug: d\n");
}

static void relog(cx_log_level level, const char *module, const char *message, void *user)
{
    (void)level, (void)module, (void)user;
    if (!strcmp(message, "outer")) cx_logf(CX_LOG_INFO, "inner", "from the handler");
    g_n++;
}

Test(log, a_handler_that_logs_does_not_deadlock, .init = cr_redirect_stderr)
{
    with_env(NULL, NULL);
    cx_log_set_handler(relog, NULL);
    cx_logf(CX_LOG_INFO, "x", "outer");
    fflush(stderr);
    cr_assert_eq(g_n, 1, "the inner message goes to stderr, not back into the handler");
    cr_assert_stderr_eq_str("cxla: notice: from the handler\n");
}

static int g_counts[4];

static void count(cx_log_level level, const char *module, const char *message, void *user)
{
    (void)module, (void)message, (void)user;
    g_counts[level]++;   /* unlocked on purpose: the logger serializes handler calls */
}

static void *spam(void *arg)
{
    for (int i = 0; i < 5000; i++) cx_logf((cx_log_level)(i % 4), "thread", "%d %d", *(int *)arg, i);
    return NULL;
}

Test(log, threads_share_the_handler)
{
    with_env("debug", NULL);
    cx_log_set_handler(count, NULL);
    pthread_t t[4];
    int ids[4] = { 0, 1, 2, 3 };
    for (int i = 0; i < 4; i++) cr_assert_eq(pthread_create(&t[i], NULL, spam, &ids[i]), 0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    for (int l = 0; l < 4; l++) cr_assert_eq(g_counts[l], 4 * 1250, "level %d: %d calls", l, g_counts[l]);
}
