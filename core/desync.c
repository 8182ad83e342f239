/* Desync detection. Ranks that run different collectives (a different graph
 * after an uneven last batch, a collective one rank skips) either sum
 * buffers of different sizes, which overflows the smaller one, or pair up
 * off by one and hang at the end. Before a graph's first collective, and
 * before every collective outside a graph, each rank contributes a
 * fingerprint of what it is about to run and its running collective
 * sequence number to one small all-gather; a rank that differs makes every
 * rank fail with the same one-line message, before any data moves.
 * CX_DESYNC_CHECK=0 turns it off. */
#include "exec.h"
#include "obs.h"
#include "cx_hash.h"
#include "cx_settings.h"
#include "cx_sbuf.h"
#include "cx_time.h"

#include <stdatomic.h>

enum { DESC_BYTES = 240 };

static int64_t g_seq;   /* collectives this process has passed through the check */

static bool check_enabled(void)
{
    static _Atomic int enabled = -1;
    int e = atomic_load_explicit(&enabled, memory_order_relaxed);
    if (e < 0) {
        e = cx_setting_bool("CX_DESYNC_CHECK");
        atomic_store_explicit(&enabled, e, memory_order_relaxed);
    }
    return e != 0;
}

static cx_status gather(const cx_comm_backend *be, cx_dtype dt, const void *in, void *out, int64_t count)
{
    cx_comm_op op = { .kind = CX_COLL_ALL_GATHER, .dtype = dt, .in = in, .out = out, .count = count, .scale = 1.0 };
    if (be->run) return be->run(be->ctx, &op);
    void *req = be->start(be->ctx, &op);
    return req ? be->wait(be->ctx, req) : CX_ERR_COMM;
}

/* "ranks 0, 2, 3" for the ranks whose (fingerprint, seq) equals rank r's */
static void ranks_like(cx_sbuf *b, const int64_t *all, int world, int r)
{
    int shown = 0, n = 0;
    for (int q = 0; q < world; q++) n += all[2 * q] == all[2 * r] && all[2 * q + 1] == all[2 * r + 1];
    cx_sb_printf(b, n > 1 ? "ranks " : "rank ");
    for (int q = 0; q < world; q++) {
        if (all[2 * q] != all[2 * r] || all[2 * q + 1] != all[2 * r + 1]) continue;
        if (shown == 8) { cx_sb_printf(b, " and %d more", n - shown); break; }
        cx_sb_printf(b, "%s%d", shown++ ? "," : "", q);
    }
}

/* Every rank learns what the others were about to run and builds the same
 * message from it. */
static cx_status report(const cx_comm_backend *be, const int64_t *all, int world, const char *desc)
{
    char mine[DESC_BYTES] = { 0 };
    snprintf(mine, sizeof mine, "%s", desc);
    char *descs = calloc((size_t)world, DESC_BYTES);
    if (!descs) { cx_set_last_error("desync: ranks run different collectives (out of memory describing them)"); return CX_ERR_COMM; }
    cx_status st = gather(be, CX_U8, mine, descs, DESC_BYTES);
    cx_sbuf b = { 0 };
    cx_sb_printf(&b, "desync: ranks are about to run different collectives:");
    for (int r = 0; r < world; r++) {
        bool first = true;   /* one line per distinct (fingerprint, seq) */
        for (int q = 0; q < r && first; q++) first = all[2 * q] != all[2 * r] || all[2 * q + 1] != all[2 * r + 1];
        if (!first) continue;
        cx_sb_printf(&b, "%s ", r ? ";" : "");
        ranks_like(&b, all, world, r);
        descs[(size_t)r * DESC_BYTES + DESC_BYTES - 1] = '\0';
        cx_sb_printf(&b, " at #%lld: %s", (long long)all[2 * r + 1],
                     st == CX_OK ? descs + (size_t)r * DESC_BYTES : "(description lost)");
    }
    cx_sb_printf(&b, " (a different graph, e.g. after an uneven last batch, or a collective one rank skips)");
    char *msg = cx_sb_finish(&b);
    cx_set_last_error("%s", msg ? msg : "desync: ranks are about to run different collectives");
    free(msg);
    free(descs);
    return CX_ERR_COMM;
}

/* Compares (fp, seq) across the world; seq advances by n on agreement. */
static cx_status check(uint64_t fp, int64_t n, const char *desc)
{
    const cx_comm_backend *be = cx_comm_get();
    int world = be->world_size(be->ctx);
    if (world <= 1 || !check_enabled()) { g_seq += n; return CX_OK; }
    int64_t mine[2] = { (int64_t)fp, g_seq };
    cx_counter_add("DesyncCheck", 1);   /* a collective of its own: CollectiveCount includes it */
    int64_t *all = malloc(sizeof(int64_t) * 2 * (size_t)world);
    if (!all) { cx_set_last_error("desync check: out of memory"); return CX_ERR_OOM; }
    cx_status st = gather(be, CX_I64, mine, all, 2);
    bool same = st == CX_OK;
    for (int r = 0; same && r < world; r++) same = all[2 * r] == mine[0] && all[2 * r + 1] == mine[1];
    if (st == CX_OK && !same) st = report(be, all, world, desc);
    free(all);
    if (st == CX_OK) g_seq += n;
    return st;
}

static void put_kernel(cx_sbuf *b, const cx_kernel *k)
{
    const cx_kin *x = &k->in[0];
    cx_sb_printf(b, "%s %s[", cx_op_table[k->coll_op].name, cx_dtype_name((cx_dtype)x->dtype));
    for (int d = 0; d < x->ndim; d++) cx_sb_printf(b, "%s%lld", d ? "," : "", (long long)x->shape[d]);
    cx_sb_printf(b, "]");
}

/* The graph's collectives in order: what they are, on which groups, over
 * which shapes, plus the graph's own key (without the thread count). */
static uint64_t graph_fingerprint(const cx_executable *e, int *ncoll, cx_sbuf *desc)
{
    uint64_t h = cx_hash64_more(&e->shared_hi, sizeof e->shared_hi, e->shared_lo);
    *ncoll = 0;
    for (int i = 0; i < e->nkernels; i++) {
        const cx_kernel *k = &e->kernels[i];
        if (k->kind != K_COLL) continue;
        const cx_kin *x = &k->in[0];
        int64_t w[4 + CX_MAX_DIMS + CX_MAX_ATTRS];
        int n = 0;
        w[n++] = k->coll_op;
        w[n++] = x->dtype;
        w[n++] = k->out_numel;
        for (int d = 0; d < x->ndim; d++) w[n++] = x->shape[d];
        for (int a = 0; a < k->nattrs; a++)
            if (a != CX_AT_COLL_GROUPS) w[n++] = k->attrs[a];
        h = cx_hash64_more(w, sizeof *w * (size_t)n, h);
        int ng, gs;
        const int *ranks;
        if (cx_groups_describe(CX_ATTR(k, CX_AT_COLL_GROUPS), &ng, &gs, &ranks))
            h = cx_hash64_more(ranks, sizeof *ranks * (size_t)(ng * gs), h);
        if (desc && *ncoll < 4) { cx_sb_printf(desc, "%s", *ncoll ? ", " : ""); put_kernel(desc, k); }
        (*ncoll)++;
    }
    if (desc && *ncoll > 4) cx_sb_printf(desc, ", ... (%d in all)", *ncoll);
    return h;
}

/* A graph's check in flight. Its all-gather starts when the graph starts
 * running and is waited for right before the graph's first collective:
 * by then the other ranks have usually started the same step, so the check
 * costs its latency, not the ranks' skew, which a blocking exchange at that
 * point would expose (the first gradient all-reduce hides it otherwise). */
struct cx_desync_pending {
    void *req;
    int64_t mine[2];
    int64_t *all;
    int ncoll, world;
};

/* "desync check of all_reduce f32[1024]": what a rank waiting in the check
 * is about to run (the watchdog shows it). */
static void label_first(const cx_executable *e, char *out, size_t cap)
{
    cx_sbuf b = { 0 };
    for (int i = 0; i < e->nkernels; i++)
        if (e->kernels[i].kind == K_COLL) { put_kernel(&b, &e->kernels[i]); break; }
    char *d = cx_sb_finish(&b);
    snprintf(out, cap, "desync check of %s", d ? d : "a collective");
    free(d);
}

cx_desync_pending *cx_desync_begin_graph(const cx_executable *e, cx_status *st)
{
    *st = CX_OK;
    int ncoll;
    uint64_t fp = graph_fingerprint(e, &ncoll, NULL);
    if (ncoll == 0) return NULL;
    const cx_comm_backend *be = cx_comm_get();
    int world = be->world_size(be->ctx);
    if (world <= 1 || !check_enabled()) { g_seq += ncoll; return NULL; }
    cx_counter_add("DesyncCheck", 1);   /* a collective of its own: CollectiveCount includes it */
    cx_desync_pending *p = calloc(1, sizeof *p);
    if (p) p->all = malloc(sizeof(int64_t) * 2 * (size_t)world);
    if (!p || !p->all) {
        if (p) free(p->all);
        free(p);
        cx_set_last_error("desync check: out of memory");
        *st = CX_ERR_OOM;
        return NULL;
    }
    *p = (cx_desync_pending){ .mine = { (int64_t)fp, g_seq }, .all = p->all, .ncoll = ncoll, .world = world };
    char label[96];
    label_first(e, label, sizeof label);
    cx_comm_op op = { .kind = CX_COLL_ALL_GATHER, .dtype = CX_I64, .in = p->mine, .out = p->all, .count = 2,
                      .scale = 1.0, .label = label };
    if (!(p->req = be->start(be->ctx, &op))) {
        free(p->all);
        free(p);
        *st = CX_ERR_COMM;
        return NULL;
    }
    return p;
}

cx_status cx_desync_end_graph(cx_desync_pending *p, const cx_executable *e)
{
    if (!p) return CX_OK;
    double t0 = cx_now();
    const cx_comm_backend *be = cx_comm_get();
    cx_status st = be->wait(be->ctx, p->req);
    bool same = st == CX_OK;
    for (int r = 0; same && r < p->world; r++) same = p->all[2 * r] == p->mine[0] && p->all[2 * r + 1] == p->mine[1];
    if (st == CX_OK && !same) {
        cx_sbuf desc = { 0 };
        int ncoll;
        graph_fingerprint(e, &ncoll, &desc);
        const char *file = cx_record()->site_file;
        if (file && (cx_obs_get() & OBS_DEBUG)) cx_sb_printf(&desc, " from %s:%d", file, cx_record()->site_line);
        char *d = cx_sb_finish(&desc);
        st = report(be, p->all, p->world, d ? d : "(no description)");
        free(d);
    }
    if (st == CX_OK) g_seq += p->ncoll;
    /* the time the step waited for the check */
    cx_metric_add("DesyncCheckTime", cx_now() - t0);
    free(p->all);
    free(p);
    return st;
}

#include <cxla/comm.h>

cx_status cx_comm_check(const char *what)
{
    if (!what) what = "(unnamed)";
    return check(cx_hash64(what, strlen(what)) ^ 0x686f7374ull, 1, what);
}

int64_t cx_comm_sequence(void) { return g_seq; }
