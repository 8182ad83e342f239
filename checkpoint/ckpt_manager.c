/* A checkpoint manager in the spirit of PyTorch/XLA's CheckpointManager:
 * saves on an interval into DIR/ckpt-step-<N>, keeps the newest
 * max_to_keep committed checkpoints (an older one is deleted only after a
 * newer one has committed), and turns a SIGTERM or a first Ctrl-C (SIGINT)
 * into an agreed step at which every rank saves and stops (preemption). */
#include "ckpt_internal.h"

#include "cx_fs.h"
#include "cx_struct.h"

#include <cxla/parallel.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct cx_ckpt_manager {
    char *dir;
    char *meta;                /* our copy of o.meta (NULL: none) */
    cx_ckpt_manager_opts o;
};

static volatile sig_atomic_t g_preempt;

static void on_sigterm(int sig)
{
    (void)sig;
    g_preempt = 1;
}

cx_ckpt_manager *cx_ckpt_manager_new(const char *dir, cx_ckpt_manager_opts o)
{
    cx_ckpt_manager_opts own_o = cx_ckpt_manager_default_opts();
    if (!CX_TAKE_STRUCT("cx_ckpt_manager_new", cx_ckpt_manager_opts, own_o, &o, watch_sigterm)) return NULL;
    o = own_o;
    if (!dir || !*dir || o.save_interval < 0 || o.max_to_keep < 0) {
        cx_set_last_error("cx_ckpt_manager_new: want a directory, save_interval >= 0 and max_to_keep >= 0 (got %s, "
                          "%lld, %d)", dir ? dir : "NULL", (long long)o.save_interval, o.max_to_keep);
        return NULL;
    }
    /* here rather than at the first save, which may be hours away */
    if (o.meta && strlen(o.meta) >= CX_CKPT_META_MAX) {
        cx_set_last_error("cx_ckpt_manager_new: meta has %zu bytes, more than CX_CKPT_META_MAX - 1 (%d)",
                          strlen(o.meta), CX_CKPT_META_MAX - 1);
        return NULL;
    }
    char failed[4096];
    int err = cx_mkdir_p(dir, failed, sizeof failed);
    if (err) {
        cx_set_last_error("cx_ckpt_manager_new: cannot create %s: %s", failed, strerror(err));
        return NULL;
    }
    cx_ckpt_manager *m = calloc(1, sizeof *m);
    if (m) m->dir = strdup(dir);
    if (m && o.meta) m->meta = strdup(o.meta);   /* the caller's string need not outlive this call */
    if (!m || !m->dir || (o.meta && !m->meta)) {
        cx_ckpt_manager_free(m);
        cx_set_last_error("cx_ckpt_manager_new: out of memory");
        return NULL;
    }
    m->o = o;
    m->o.meta = m->meta;
    if (o.watch_sigterm) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigterm;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        /* Ctrl-C saves too, but only the first: SA_RESETHAND puts the default
         * back, so a second Ctrl-C stops the process at once, as users expect.
         * An ignored SIGINT stays ignored (a shell's background job). */
        struct sigaction was;
        sa.sa_flags = SA_RESETHAND;
        if (sigaction(SIGINT, NULL, &was) == 0 && was.sa_handler != SIG_IGN) sigaction(SIGINT, &sa, NULL);
    }
    return m;
}

void cx_ckpt_manager_free(cx_ckpt_manager *m)
{
    if (!m) return;
    free(m->dir);
    free(m->meta);
    free(m);
}

bool cx_ckpt_manager_should_save(const cx_ckpt_manager *m, int64_t step)
{
    return m && m->o.save_interval > 0 && step > 0 && step % m->o.save_interval == 0;
}

static void max_of(const double *all, int world, int n, double *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = all[i];
        for (int r = 1; r < world; r++)
            if (all[r * n + i] > out[i]) out[i] = all[r * n + i];
    }
}

bool cx_ckpt_manager_reached_preemption(cx_ckpt_manager *m, int64_t step)
{
    (void)step;
    if (!m) return false;
    double mine = g_preempt ? 1.0 : 0.0, any = mine;
    /* every rank must stop at the same step: the flags are exchanged */
    if (cx_world_size() > 1 && cx_mesh_reduce("preemption", &mine, 1, max_of, &any) != CX_OK) return false;
    return any > 0;
}

void cx_ckpt_manager_request_preemption(void) { g_preempt = 1; }

void cx_ckpt_manager_prefix(const cx_ckpt_manager *m, int64_t step, char *out, size_t cap)
{
    snprintf(out, cap, "%s/ckpt-step-%lld", m->dir, (long long)step);
}

/* Steps of the committed checkpoints in dir, newest first. @return their count (at most cap). */
static int committed_steps(const char *dir, int64_t *steps, int cap)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        long long s;
        char tail[16];
        if (sscanf(e->d_name, "ckpt-step-%lld%15s", &s, tail) == 2 && !strcmp(tail, ".commit")) steps[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++)   /* newest first */
        for (int k = i; k > 0 && steps[k] > steps[k - 1]; k--) {
            int64_t t = steps[k];
            steps[k] = steps[k - 1];
            steps[k - 1] = t;
        }
    return n;
}

/* Removes this rank's files of the checkpoint at `step` (marker gone already). */
static void remove_own_files(const cx_ckpt_manager *m, int64_t step)
{
    char want[64];
    snprintf(want, sizeof want, "ckpt-step-%lld_rank-%d-of-", (long long)step, cx_global_ordinal());
    DIR *d = opendir(m->dir);
    struct dirent *e;
    char path[4400];
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, want, strlen(want))) continue;
        snprintf(path, sizeof path, "%s/%s", m->dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
}

/* Keeps the newest max_to_keep: rank 0 takes the old markers away (so the
 * checkpoints are no longer committed), then every rank deletes its files. */
static cx_status prune(const cx_ckpt_manager *m)
{
    if (m->o.max_to_keep <= 0) return CX_OK;
    int64_t steps[4096];
    int n = committed_steps(m->dir, steps, 4096);
    if (cx_global_ordinal() == 0) {
        for (int i = m->o.max_to_keep; i < n; i++) {
            char p[4200];
            snprintf(p, sizeof p, "%s/ckpt-step-%lld.commit", m->dir, (long long)steps[i]);
            unlink(p);
        }
    }
    if (cx_world_size() > 1 && cx_barrier() != CX_OK) return CX_ERR_COMM;
    for (int i = m->o.max_to_keep; i < n; i++) remove_own_files(m, steps[i]);
    return CX_OK;
}

cx_status cx_ckpt_manager_save(cx_ckpt_manager *m, int64_t step, cx_ckpt_model model, cx_optimizer *opt,
                               const cx_ckpt_extra *extra)
{
    if (!m) { cx_set_last_error("cx_ckpt_manager_save: manager is NULL"); return CX_ERR_ARG; }
    char prefix[4200];
    cx_ckpt_manager_prefix(m, step, prefix, sizeof prefix);
    cx_ckpt_opts so = cx_ckpt_default_opts();
    so.meta = m->meta;
    cx_status st = cx_ckpt_save_opts(prefix, model, opt, extra, so);
    /* older checkpoints go only once this one has committed */
    return st == CX_OK ? prune(m) : st;
}

cx_status cx_ckpt_manager_latest(const cx_ckpt_manager *m, char *out, size_t cap)
{
    if (!m) { cx_set_last_error("cx_ckpt_manager_latest: manager is NULL"); return CX_ERR_ARG; }
    return cx_ckpt_latest(m->dir, out, cap);
}
