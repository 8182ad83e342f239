/* The comm backend registry (world of one unless parallel/ registers MPI)
 * and the replica-group table. The ops that record collectives are
 * ops/collectives.c. */
#include "backend.h"
#include "cx_struct.h"
#include "cx_vec.h"

/* ---- world of one ----------------------------------------------------------- */

static int one_size(void *ctx) { (void)ctx; return 1; }
static int one_rank(void *ctx) { (void)ctx; return 0; }

static void *one_start(void *ctx, const cx_comm_op *op)
{
    (void)ctx;
    size_t es = cx_dtype_size(op->dtype);
    if (op->out != op->in) memmove(op->out, op->in, (size_t)op->count * es);
    if ((op->kind == CX_COLL_ALL_REDUCE || op->kind == CX_COLL_REDUCE_SCATTER) && op->scale != 1.0) {
        if (op->dtype == CX_F32) {
            float *o = op->out;
            for (int64_t i = 0; i < op->count; i++) o[i] = (float)(o[i] * op->scale);
        } else if (op->dtype == CX_BF16) {
            uint16_t *o = op->out;
            for (int64_t i = 0; i < op->count; i++) o[i] = cx_f32_to_bf16_inline((float)(cx_bf16_to_f32_inline(o[i]) * op->scale));
        }
    }
    return (void *)1;
}

static cx_status one_wait(void *ctx, void *req) { (void)ctx; (void)req; return CX_OK; }

static const cx_comm_backend g_world_of_one = { CX_STRUCT_SIZE(cx_comm_backend), .name = "world-of-one",
                                                .world_size = one_size, .rank = one_rank, .start = one_start,
                                                .wait = one_wait };
static cx_comm_backend g_backend = { CX_STRUCT_SIZE(cx_comm_backend), .name = "world-of-one", .world_size = one_size,
                                     .rank = one_rank, .start = one_start, .wait = one_wait };

/* Every backend that could give shared memory, newest last: a block is
 * freed through the one that owns it, also after that backend was
 * unregistered or replaced (tensors and the arena outlive a world). */
#define MAX_SHARED_OWNERS 16
static struct { bool (*free_shared)(void *ctx, void *p); void *ctx; } g_owners[MAX_SHARED_OWNERS];
static int g_nowners;
static _Atomic uint64_t g_generation;

static void remember_owner(bool (*fn)(void *ctx, void *p), void *ctx)
{
    for (int i = 0; i < g_nowners; i++)
        if (g_owners[i].free_shared == fn && g_owners[i].ctx == ctx) return;
    if (g_nowners == MAX_SHARED_OWNERS) {
        /* the oldest can no longer be told its blocks: keep the newest */
        memmove(g_owners, g_owners + 1, sizeof g_owners[0] * (MAX_SHARED_OWNERS - 1));
        g_nowners--;
    }
    g_owners[g_nowners].free_shared = fn;
    g_owners[g_nowners++].ctx = ctx;
}

uint64_t cx_comm_generation(void) { return atomic_load(&g_generation); }

cx_status cx_comm_register(const cx_comm_backend *b)
{
    cx_comm_backend nb = g_world_of_one;
    char err[256];
    if (b) {
        memset(&nb, 0, sizeof nb);   /* members past the caller's struct_size: none */
        if (!cx_struct_take(&nb, sizeof nb, b, b->struct_size, CX_SIZE_THROUGH(cx_comm_backend, free_shared),
                            "cx_comm_backend", err, sizeof err)) {
            cx_set_last_error("comm_register: %s", err);
            return CX_ERR_ARG;
        }
        if (!nb.world_size || !nb.rank || !nb.start || !nb.wait) {
            cx_set_last_error("comm_register: backend %s lacks world_size, rank, start or wait", nb.name ? nb.name : "");
            return CX_ERR_ARG;
        }
    }
    g_backend = nb;
    /* memory held from the old backend (the executor's arena) is made again
     * from the new one's */
    atomic_fetch_add(&g_generation, 1);
    if (b && nb.free_shared) remember_owner(nb.free_shared, nb.ctx);
    return CX_OK;
}

void *cx_comm_alloc_shared(size_t bytes)
{
    return g_backend.alloc_shared ? g_backend.alloc_shared(g_backend.ctx, bytes) : NULL;
}

void *cx_comm_alloc(size_t bytes)
{
    void *p = cx_comm_alloc_shared(bytes);
    size_t cap = (bytes + 63) & ~(size_t)63;
    if (!p) p = aligned_alloc(64, cap ? cap : 64);
    if (!p) cx_set_last_error("out of memory: a collective buffer of %zu bytes", bytes);
    return p;
}

void cx_comm_free(void *p)
{
    if (!p) return;
    for (int i = g_nowners - 1; i >= 0; i--)
        if (g_owners[i].free_shared(g_owners[i].ctx, p)) return;
    free(p);
}
const cx_comm_backend *cx_comm_get(void) { return &g_backend; }
int cx_world_size(void) { return g_backend.world_size(g_backend.ctx); }
int cx_global_ordinal(void) { return g_backend.rank(g_backend.ctx); }

bool cx_bad_reduce_op(const char *op, cx_reduce_op red)
{
    static const char *const loss[] = { "CX_REDUCE_MEAN", "CX_REDUCE_SUM", "CX_REDUCE_NONE" };
    if ((unsigned)red - CX_RED_SUM <= CX_RED_MIN - CX_RED_SUM) return false;
    if ((unsigned)red <= CX_REDUCE_NONE)
        cx_set_last_error("%s: reduction %s (%d) is a cx_reduction, for losses; a collective takes a cx_reduce_op "
                          "(CX_RED_SUM, CX_RED_MEAN, CX_RED_MAX or CX_RED_MIN)", op, loss[red], (int)red);
    else
        cx_set_last_error("%s: reduction %d is not a cx_reduce_op (CX_RED_SUM, CX_RED_MEAN, CX_RED_MAX or CX_RED_MIN)",
                          op, (int)red);
    return true;
}

int cx_comm_local_rank(void)
{
    return g_backend.local_rank ? g_backend.local_rank(g_backend.ctx) : g_backend.rank(g_backend.ctx);
}

int cx_comm_local_size(void)
{
    return g_backend.local_size ? g_backend.local_size(g_backend.ctx) : g_backend.world_size(g_backend.ctx);
}

cx_status cx_comm_run(const cx_comm_op *op)
{
    if (!op) { cx_set_last_error("comm_run: op is NULL"); return CX_ERR_ARG; }
    if ((op->kind == CX_COLL_ALL_REDUCE || op->kind == CX_COLL_REDUCE_SCATTER) && cx_bad_reduce_op("comm_run", op->red))
        return CX_ERR_ARG;
    void *req = g_backend.start(g_backend.ctx, op);
    if (!req) return CX_ERR_COMM;
    return g_backend.wait(g_backend.ctx, req);
}

/* ---- replica groups ---------------------------------------------------------------- */

/* Group lists are interned so a node carries a small id; id 0 = all ranks. */
typedef struct { int ngroups, group_size; int *ranks; } group_list;
static group_list *g_groups;
static int g_ngroups, g_groups_cap;

const int *cx_groups_lookup(int64_t id, int rank, int *size)
{
    if (id <= 0 || id > g_ngroups) { *size = 0; return NULL; }
    group_list *g = &g_groups[id - 1];
    for (int i = 0; i < g->ngroups; i++)
        for (int j = 0; j < g->group_size; j++)
            if (g->ranks[i * g->group_size + j] == rank) { *size = g->group_size; return &g->ranks[i * g->group_size]; }
    *size = -1;
    return NULL;
}

int cx_groups_describe(int64_t id, int *ngroups, int *group_size, const int **ranks)
{
    if (id <= 0 || id > g_ngroups) return 0;
    *ngroups = g_groups[id - 1].ngroups;
    *group_size = g_groups[id - 1].group_size;
    *ranks = g_groups[id - 1].ranks;
    return 1;
}

/* @return the group id, 0 for all ranks, -1 (with error set) if invalid. */
int64_t cx_groups_intern(const cx_replica_groups *rg, const char *op, int *group_size)
{
    int world = cx_world_size();
    if (!rg) { *group_size = world; return 0; }
    if (rg->ngroups <= 0 || rg->group_size <= 0 || !rg->ranks) {
        cx_set_last_error("%s: replica groups must have ngroups > 0, group_size > 0 and ranks", op);
        return -1;
    }
    int total = rg->ngroups * rg->group_size;
    /* every rank exactly once, as XLA requires */
    char *seen = calloc((size_t)(world > total ? world : total), 1);
    if (!seen) { cx_set_last_error("%s: out of memory", op); return -1; }
    for (int i = 0; i < total; i++) {
        int r = rg->ranks[i];
        if (r < 0 || r >= world || seen[r]) {
            free(seen);
            cx_set_last_error("%s: replica groups are invalid: rank %d is %s (world size %d)", op, r,
                         (r < 0 || r >= world) ? "out of range" : "listed twice", world);
            return -1;
        }
        seen[r] = 1;
    }
    free(seen);
    if (total != world) {
        cx_set_last_error("%s: replica groups cover %d ranks but the world has %d", op, total, world);
        return -1;
    }
    *group_size = rg->group_size;
    for (int i = 0; i < g_ngroups; i++) {
        group_list *g = &g_groups[i];
        if (g->ngroups == rg->ngroups && g->group_size == rg->group_size &&
            !memcmp(g->ranks, rg->ranks, sizeof(int) * (size_t)total))
            return i + 1;
    }
    if (!CX_GROW(g_groups, g_groups_cap, g_ngroups + 1)) { cx_set_last_error("%s: out of memory", op); return -1; }
    int *ranks = malloc(sizeof(int) * (size_t)total);
    if (!ranks) { cx_set_last_error("%s: out of memory", op); return -1; }
    memcpy(ranks, rg->ranks, sizeof(int) * (size_t)total);
    g_groups[g_ngroups] = (group_list){ rg->ngroups, rg->group_size, ranks };
    return ++g_ngroups;
}

