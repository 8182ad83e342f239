/* The ranks agree before data moves: each contributes a fingerprint of
 * what it is about to run and its running collective sequence number to
 * one small all-gather, and a rank that differs makes every rank fail with
 * the same one-line message naming the ranks and what each would run.
 * cx_comm_check (eager collectives, mesh creation) uses it directly; the
 * runtime fingerprints whole graphs with it (runtime/desync.c). It needs
 * only the backend, so any layer may ask. */
#include "backend.h"
#include "cx_hash.h"
#include "cx_sbuf.h"
#include "cx_settings.h"

#include <stdatomic.h>

enum { DESC_BYTES = 240 };

static int64_t g_seq;   /* collectives this process has passed through the check */

bool cx_desync_enabled(void)
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
    if (world <= 1 || !cx_desync_enabled()) { g_seq += n; return CX_OK; }
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

cx_status cx_desync_report(const int64_t *all, int world, const char *desc)
{
    return report(cx_comm_get(), all, world, desc);
}

void cx_desync_seq_advance(int64_t n) { g_seq += n; }

cx_status cx_comm_check(const char *what)
{
    if (!what) what = "(unnamed)";
    return check(cx_hash64(what, strlen(what)) ^ 0x686f7374ull, 1, what);
}

int64_t cx_comm_sequence(void) { return g_seq; }
