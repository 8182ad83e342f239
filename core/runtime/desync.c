/* Desync detection. Ranks that run different collectives (a different graph
 * after an uneven last batch, a collective one rank skips) either sum
 * buffers of different sizes, which overflows the smaller one, or pair up
 * off by one and hang at the end. Before a graph's first collective, and
 * before every collective outside a graph, each rank contributes a
 * fingerprint of what it is about to run and its running collective
 * sequence number to one small all-gather; a rank that differs makes every
 * rank fail with the same one-line message, before any data moves.
 * CX_DESYNC_CHECK=0 turns it off. This file fingerprints a graph's
 * collectives; the agreement itself, which collectives outside a graph use
 * too (cx_comm_check), is base/agree.c. */
#include "runtime.h"
#include "backend.h"
#include "obs.h"
#include "cx_hash.h"
#include "cx_sbuf.h"
#include "cx_time.h"

#include <stdatomic.h>

enum { DESC_BYTES = 240 };

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
        if (desc && *ncoll == 0 && k->loc && cx_obs_hooks.site_str) {   /* XLA_IR_DEBUG: the user's line */
            char at[96];
            cx_obs_hooks.site_str(k->loc, at, sizeof at);
            cx_sb_printf(desc, " (made at %s)", at);
        }
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
    if (world <= 1 || !cx_desync_enabled()) { cx_desync_seq_advance(ncoll); return NULL; }
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
    *p = (cx_desync_pending){ .mine = { (int64_t)fp, cx_comm_sequence() }, .all = p->all, .ncoll = ncoll, .world = world };
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
        st = cx_desync_report(p->all, p->world, d ? d : "(no description)");
        free(d);
    }
    if (st == CX_OK) cx_desync_seq_advance(p->ncoll);
    /* the time the step waited for the check */
    cx_metric_add("DesyncCheckTime", cx_now() - t0);
    free(p->all);
    free(p);
    return st;
}
