/* Ctrl-C under a checkpoint manager: the first SIGINT requests preemption
 * (the program saves and stops), a second one ends the process at once, and
 * a SIGINT the process inherited as ignored stays ignored. */
#include <criterion/criterion.h>
#include <cxla/cxla.h>

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char g_dir[64];

static cx_ckpt_manager *manager(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/cx_test_ctrl_c_XXXXXX");
    cr_assert(mkdtemp(g_dir));
    cx_ckpt_manager *m = cx_ckpt_manager_new(g_dir, cx_ckpt_manager_default_opts());
    cr_assert(m, "%s", cx_last_error());
    rmdir(g_dir);
    return m;
}

static bool sigint_is_default(void)
{
    struct sigaction sa;
    return sigaction(SIGINT, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL;
}

Test(ctrl_c, first_saves_second_stops)
{
    cx_ckpt_manager *m = manager();
    cr_assert(!cx_ckpt_manager_reached_preemption(m, 1));
    cr_assert(!sigint_is_default(), "the manager does not watch Ctrl-C");
    raise(SIGINT);
    cr_assert(cx_ckpt_manager_reached_preemption(m, 2), "a first Ctrl-C did not request preemption");
    /* what a second Ctrl-C meets: the default, which ends the process */
    cr_assert(sigint_is_default(), "a second Ctrl-C would not end the process");
    cx_ckpt_manager_free(m);
}

Test(ctrl_c, second_ends_the_process, .signal = SIGINT)
{
    cx_ckpt_manager *m = manager();
    raise(SIGINT);
    cr_assert(cx_ckpt_manager_reached_preemption(m, 1), "a first Ctrl-C did not request preemption");
    raise(SIGINT);
    cr_assert_fail("a second Ctrl-C did not end the process");
}

Test(ctrl_c, sigterm_saves_then_ctrl_c_too)
{
    cx_ckpt_manager *m = manager();
    raise(SIGTERM);
    cr_assert(cx_ckpt_manager_reached_preemption(m, 1), "SIGTERM did not request preemption");
    raise(SIGINT);
    cr_assert(cx_ckpt_manager_reached_preemption(m, 2));
    cr_assert(sigint_is_default());
    cx_ckpt_manager_free(m);
}

Test(ctrl_c, ignored_stays_ignored)
{
    signal(SIGINT, SIG_IGN);
    cx_ckpt_manager *m = manager();
    raise(SIGINT);
    cr_assert(!cx_ckpt_manager_reached_preemption(m, 1), "an ignored SIGINT requested preemption");
    cx_ckpt_manager_free(m);
}

Test(ctrl_c, not_watched_without_watch_sigterm, .signal = SIGINT)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/cx_test_ctrl_c_XXXXXX");
    cr_assert(mkdtemp(g_dir));
    cx_ckpt_manager_opts o = cx_ckpt_manager_default_opts();
    o.watch_sigterm = false;
    cx_ckpt_manager *m = cx_ckpt_manager_new(g_dir, o);
    cr_assert(m);
    rmdir(g_dir);
    raise(SIGINT);
    cr_assert_fail("with watch_sigterm off, Ctrl-C did not end the process");
}
