/* Collectives: IR builders, the replica-group table, and the backend
 * registry (world of one unless parallel/ registers MPI). */
#include "internal.h"
#include "cx_struct.h"
#include "cx_vec.h"
#include "exec.h"
#include "spmd_internal.h"

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

static const cx_comm_backend g_world_of_one = { CX_STRUCT_SIZE(cx_comm_backend), .name = "world-of-one", .world_size = one_size, .rank = one_rank,
                                                .start = one_start, .wait = one_wait };
static cx_comm_backend g_backend = { CX_STRUCT_SIZE(cx_comm_backend), .name = "world-of-one", .world_size = one_size, .rank = one_rank,
                                     .start = one_start, .wait = one_wait };

/* The last backend that could give shared memory: its blocks are freed
 * through it also after it is unregistered (tensors outlive the world). */
static bool (*g_free_shared)(void *ctx, void *p);
static void *g_free_shared_ctx;

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
    /* the arena is made again from the new backend's memory */
    cx_arena_release();
    if (b && nb.free_shared) {
        g_free_shared = nb.free_shared;
        g_free_shared_ctx = nb.ctx;
    }
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
    if (p && !(g_free_shared && g_free_shared(g_free_shared_ctx, p))) free(p);
}
const cx_comm_backend *cx_comm_get(void) { return &g_backend; }
int cx_comm_world_size(void) { return g_backend.world_size(g_backend.ctx); }
int cx_comm_rank(void) { return g_backend.rank(g_backend.ctx); }

/* The message for a reduction outside cx_reduce_op, naming a cx_reduction
 * passed by mistake (the two enums once shared values). false: valid. */
static bool bad_reduce_op(const char *op, cx_reduce_op red)
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

cx_status cx_comm_run(const cx_comm_op *op)
{
    if (!op) { cx_set_last_error("comm_run: op is NULL"); return CX_ERR_ARG; }
    if ((op->kind == CX_COLL_ALL_REDUCE || op->kind == CX_COLL_REDUCE_SCATTER) && bad_reduce_op("comm_run", op->red))
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
    int world = cx_comm_world_size();
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

/* ---- IR builders ---------------------------------------------------------------------- */

/* attributes: op_attrs.h, CX_AT_COLL_* */
static cx_tensor *coll(cx_op op, cx_tensor *a, const int64_t *shape, int64_t gid, int64_t red, int64_t ax0,
                       int64_t ax1, double scale, bool pin)
{
    int64_t attrs[CX_AT_COLL_COUNT];
    attrs[CX_AT_COLL_GROUPS] = gid;
    attrs[CX_AT_COLL_REDUCE] = red;
    attrs[CX_AT_COLL_AXIS] = ax0;
    attrs[CX_AT_COLL_AXIS2] = ax1;
    cx_tensor *r;
    if (pin) {
        /* pinned: a unique node CSE can never merge */
        cx_tensor *ins[1] = { a };
        cx_node *n;
        uint32_t flags = NF_PINNED | ((a->node->flags & NF_REQUIRES_GRAD) && cx_grad_enabled() ? NF_REQUIRES_GRAD : 0);
        cx_node *in = ins[0]->node;
        cx_node_desc d = { .op = op, .dtype = (cx_dtype)a->node->dtype, .ndim = a->node->ndim, .shape = shape,
                           .ninputs = 1, .inputs = &in, .nattrs = CX_AT_COLL_COUNT, .attrs = attrs, .fval = scale, .flags = flags };
        n = cx_node_make(&d);
        if (!n) return cx_poisoned("%s: out of memory", cx_op_table[op].name);
        r = cx_tensor_wrap(n);
    } else {
        r = cx_make_op(op, (cx_dtype)a->node->dtype, shape, a->node->ndim, &a, 1, attrs, CX_AT_COLL_COUNT, scale);
    }
    return r;
}

static cx_tensor *check_coll(cx_tensor *a, const char *op)
{
    if (!a) return cx_poisoned("%s: input is NULL", op);
    if (a->node->op == OP_ERROR) return cx_tensor_of(a->node);
    return NULL;
}

cx_tensor *cx_all_reduce(cx_tensor *a, cx_reduce_op red, double scale, const cx_replica_groups *groups, bool pin)
{
    cx_tensor *p = check_coll(a, "all_reduce");
    if (p) return p;
    int gs;
    int64_t gid = cx_groups_intern(groups, "all_reduce", &gs);
    if (gid < 0) return cx_poisoned("%s", cx_last_error());
    if (bad_reduce_op("all_reduce", red)) return cx_poisoned("%s", cx_last_error());
    return coll(OP_ALL_REDUCE, a, a->node->shape, gid, red, 0, 0, scale, pin);
}

cx_tensor *cx_all_gather(cx_tensor *a, int axis, const cx_replica_groups *groups, bool pin)
{
    return cx_all_gather_grad_scaled(a, axis, groups, pin, 1.0);
}

cx_tensor *cx_all_gather_grad_scaled(cx_tensor *a, int axis, const cx_replica_groups *groups, bool pin, double grad_scale)
{
    cx_tensor *p = check_coll(a, "all_gather");
    if (p) return p;
    int gs;
    int64_t gid = cx_groups_intern(groups, "all_gather", &gs);
    if (gid < 0) return cx_poisoned("%s", cx_last_error());
    int ax = cx_norm_axis(axis, a->node->ndim);
    if (ax < 0 || a->node->ndim == 0) return cx_poisoned("all_gather: axis %d out of range for rank %d", axis, a->node->ndim);
    int64_t shape[CX_MAX_DIMS];
    memcpy(shape, a->node->shape, sizeof shape);
    shape[ax] *= gs;
    return coll(OP_ALL_GATHER, a, shape, gid, 0, ax, 0, grad_scale, pin);
}

cx_tensor *cx_reduce_scatter(cx_tensor *a, cx_reduce_op red, double scale, int axis, const cx_replica_groups *groups, bool pin)
{
    cx_tensor *p = check_coll(a, "reduce_scatter");
    if (p) return p;
    int gs;
    int64_t gid = cx_groups_intern(groups, "reduce_scatter", &gs);
    if (gid < 0) return cx_poisoned("%s", cx_last_error());
    int ax = cx_norm_axis(axis, a->node->ndim);
    if (ax < 0 || a->node->ndim == 0) return cx_poisoned("reduce_scatter: axis %d out of range for rank %d", axis, a->node->ndim);
    if (a->node->shape[ax] % gs)
        return cx_poisoned("reduce_scatter: axis %d of size %lld is not divisible by the group size %d", ax,
                         (long long)a->node->shape[ax], gs);
    if (bad_reduce_op("reduce_scatter", red)) return cx_poisoned("%s", cx_last_error());
    if (red == CX_RED_MAX || red == CX_RED_MIN)
        return cx_poisoned("reduce_scatter: only sum and mean reductions are supported");
    int64_t shape[CX_MAX_DIMS];
    memcpy(shape, a->node->shape, sizeof shape);
    shape[ax] /= gs;
    return coll(OP_REDUCE_SCATTER, a, shape, gid, red, ax, 0, scale, pin);
}

cx_tensor *cx_all_to_all(cx_tensor *a, int split_axis, int concat_axis, const cx_replica_groups *groups, bool pin)
{
    cx_tensor *p = check_coll(a, "all_to_all");
    if (p) return p;
    int gs;
    int64_t gid = cx_groups_intern(groups, "all_to_all", &gs);
    if (gid < 0) return cx_poisoned("%s", cx_last_error());
    int nd = a->node->ndim;
    int sa = cx_norm_axis(split_axis, nd), ca = cx_norm_axis(concat_axis, nd);
    if (sa < 0 || ca < 0 || nd == 0) return cx_poisoned("all_to_all: axes %d, %d out of range for rank %d", split_axis, concat_axis, nd);
    if (a->node->shape[sa] % gs)
        return cx_poisoned("all_to_all: split axis %d of size %lld is not divisible by the group size %d", sa,
                         (long long)a->node->shape[sa], gs);
    int64_t shape[CX_MAX_DIMS];
    memcpy(shape, a->node->shape, sizeof shape);
    shape[sa] /= gs;
    shape[ca] *= gs;
    return coll(OP_ALL_TO_ALL, a, shape, gid, 0, sa, ca, 1.0, pin);
}

cx_tensor *cx_broadcast(cx_tensor *a, int root, const cx_replica_groups *groups, bool pin)
{
    cx_tensor *p = check_coll(a, "broadcast");
    if (p) return p;
    int gs;
    int64_t gid = cx_groups_intern(groups, "broadcast", &gs);
    if (gid < 0) return cx_poisoned("%s", cx_last_error());
    if (root < 0 || root >= gs) return cx_poisoned("broadcast: root %d is outside the group of %d", root, gs);
    return coll(OP_BROADCAST, a, a->node->shape, gid, 0, 0, root, 1.0, pin);
}

cx_tensor *cx_vjp_collective(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    (void)in; (void)out; (void)i;
    int64_t gid = CX_ATTR(n, CX_AT_COLL_GROUPS);
    cx_reduce_op red = (cx_reduce_op)CX_ATTR(n, CX_AT_COLL_REDUCE);
    int axis = (int)CX_ATTR(n, CX_AT_COLL_AXIS);
    cx_replica_groups rg, *rgp = NULL;
    int ng, gs;
    const int *ranks;
    if (cx_groups_describe(gid, &ng, &gs, &ranks)) { rg = (cx_replica_groups){ ng, gs, ranks }; rgp = &rg; }
    switch ((cx_op)n->op) {
    case OP_ALL_REDUCE:
        if (red == CX_RED_MAX || red == CX_RED_MIN) return NULL;
        return cx_all_reduce(g, red, n->fval, rgp, true);
    case OP_ALL_GATHER: return cx_reduce_scatter(g, CX_RED_SUM, n->fval, axis, rgp, true);
    case OP_REDUCE_SCATTER: {
        cx_tensor *a = cx_all_gather(g, axis, rgp, true);
        if (red == CX_RED_MEAN || n->fval != 1.0) {
            int size = rgp ? gs : cx_comm_world_size();
            double s = n->fval * (red == CX_RED_MEAN ? 1.0 / size : 1.0);
            cx_tensor *r = cx_mul_scalar(a, s);
            cx_drop(a);
            return r;
        }
        return a;
    }
    case OP_ALL_TO_ALL: return cx_all_to_all(g, (int)CX_ATTR(n, CX_AT_COLL_CONCAT_AXIS), axis, rgp, true);
    default: return NULL;
    }
}
