/* Pass 3a, the order of the kernels: a list schedule that runs, among the
 * kernels whose inputs exist, the one that frees the most arena bytes net
 * of what it allocates.
 *
 * Lowering emits kernels in the graph's post-order from its outputs. For a
 * training step that walks the whole backward chain of input gradients
 * first (the first output's gradient needs all of it) and reaches every
 * weight gradient only afterwards: each layer's activations and output
 * gradients then stay alive until the end of the backward, and the weight
 * gradient's product reads them cold. Scheduled by bytes, a weight
 * gradient (which frees the layer's input) runs right after the gradient it
 * reads is computed, as PyTorch's autograd runs it, and its bias and
 * gradient-norm sums follow while the data is still in cache.
 *
 * A kernel that reads no intermediate (a value of the step's inputs alone)
 * waits until nothing else is ready, and then the one that can wait least goes
 * first, so it runs right before its first reader instead of holding its
 * buffer from the start. Ties keep the lowered order, so a chain stays as
 * it was. */
#include "passes.h"

#include "cx_vec.h"

#include <limits.h>

typedef struct {
    int n;
    int *succ_start, *succ;   /* CSR: the kernels that must follow each kernel */
    int *preds_left;          /* unscheduled predecessors */
    int *reads_start, *reads; /* CSR: the distinct slots each kernel reads (out and scratch excluded) */
    int *readers_left;        /* per slot: unscheduled kernels reading it */
    char *written;            /* per slot: a kernel writing it has been scheduled */
    int *latest;              /* per kernel: the latest place it can take (latest_places) */
} order_state;

static void order_state_free(order_state *s)
{
    free(s->succ_start); free(s->succ); free(s->preds_left);
    free(s->reads_start); free(s->reads); free(s->readers_left); free(s->written);
    free(s->latest);
}

typedef struct { int *list; int n, cap; bool oom; int out, scratch; } slot_list;
static void collect_read(void *p, int slot)
{
    slot_list *l = p;
    if (slot == l->out || slot == l->scratch) return;
    for (int i = 0; i < l->n; i++) if (l->list[i] == slot) return;
    if (!CX_GROW(l->list, l->cap, l->n + 1)) { l->oom = true; return; }
    l->list[l->n++] = slot;
}

/* The distinct slots each kernel reads, as CSR. */
static bool build_reads(const cx_executable *e, order_state *s)
{
    int n = e->nkernels;
    slot_list l = { 0 };
    s->reads_start = malloc(sizeof(int) * (size_t)(n + 1));
    s->readers_left = calloc((size_t)e->nslots + 1, sizeof(int));
    s->written = calloc((size_t)e->nslots + 1, 1);
    if (!s->reads_start || !s->readers_left || !s->written) return false;
    int *flat = NULL, nflat = 0, cap = 0;
    for (int k = 0; k < n; k++) {
        l.n = 0;
        l.out = e->kernels[k].out_slot;
        l.scratch = e->kernels[k].scratch_slot;   /* lives within the kernel: neither freed nor kept by it */
        cx_kernel_each_read(&e->kernels[k], collect_read, &l);
        s->reads_start[k] = nflat;
        if (l.oom || !CX_GROW(flat, cap, nflat + l.n + 1)) { free(l.list); free(flat); return false; }
        for (int i = 0; i < l.n; i++) { flat[nflat++] = l.list[i]; s->readers_left[l.list[i]]++; }
    }
    s->reads_start[n] = nflat;
    s->reads = flat ? flat : malloc(sizeof(int));
    free(l.list);
    return s->reads != NULL;
}

typedef struct { int from, to; } edge;

/* The kernel order's hazards as edges: a read after the write it reads, a
 * write after the reads of the value it overwrites and after the write
 * before it (several kernels write one slot: concat pieces, in place). */
static bool build_edges(const cx_executable *e, order_state *s)
{
    int n = e->nkernels, ns = e->nslots;
    int *last_writer = malloc(sizeof(int) * (size_t)(ns + 1));
    int **readers = calloc((size_t)ns + 1, sizeof(int *)), *nreaders = calloc((size_t)ns + 1, sizeof(int)),
        *readers_cap = calloc((size_t)ns + 1, sizeof(int));
    edge *edges = NULL;
    int nedges = 0, edges_cap = 0;
    bool ok = last_writer && readers && nreaders && readers_cap;
    for (int i = 0; ok && i < ns; i++) last_writer[i] = -1;
    for (int k = 0; ok && k < n; k++) {
        for (int r = s->reads_start[k]; ok && r < s->reads_start[k + 1]; r++) {
            int slot = s->reads[r];
            if (last_writer[slot] >= 0) {
                ok = CX_GROW(edges, edges_cap, nedges + 1);
                if (ok) edges[nedges++] = (edge){ last_writer[slot], k };
            }
            ok = ok && CX_GROW(readers[slot], readers_cap[slot], nreaders[slot] + 1);
            if (ok) readers[slot][nreaders[slot]++] = k;
        }
        int o = e->kernels[k].out_slot;
        ok = ok && CX_GROW(edges, edges_cap, nedges + nreaders[o] + 1);
        if (!ok) break;
        if (last_writer[o] >= 0) edges[nedges++] = (edge){ last_writer[o], k };
        for (int i = 0; i < nreaders[o]; i++) edges[nedges++] = (edge){ readers[o][i], k };
        nreaders[o] = 0;
        last_writer[o] = k;
    }
    if (ok) {
        s->succ_start = calloc((size_t)n + 1, sizeof(int));
        s->succ = malloc(sizeof(int) * (size_t)(nedges + 1));
        s->preds_left = calloc((size_t)n + 1, sizeof(int));
        ok = s->succ_start && s->succ && s->preds_left;
    }
    if (ok) {
        for (int i = 0; i < nedges; i++) { s->succ_start[edges[i].from + 1]++; s->preds_left[edges[i].to]++; }
        for (int k = 0; k < n; k++) s->succ_start[k + 1] += s->succ_start[k];
        int *fill = malloc(sizeof(int) * (size_t)(n + 1));   /* the next free place in each kernel's list */
        ok = fill != NULL;
        for (int k = 0; ok && k < n; k++) fill[k] = s->succ_start[k];
        for (int i = 0; ok && i < nedges; i++) s->succ[fill[edges[i].from]++] = edges[i].to;
        free(fill);
    }
    for (int i = 0; readers && i < ns; i++) free(readers[i]);
    free(readers); free(nreaders); free(readers_cap); free(edges); free(last_writer);
    return ok;
}

/* Arena bytes kernel k frees (inputs it is the last reader of) minus the
 * arena bytes it allocates (its output's first write), given what is
 * scheduled so far. */
static int64_t net_freed(const cx_executable *e, const order_state *s, int k)
{
    int64_t net = 0;
    for (int r = s->reads_start[k]; r < s->reads_start[k + 1]; r++) {
        int slot = s->reads[r];
        if (e->slots[slot].kind == SLOT_ARENA && s->readers_left[slot] == 1) net += e->slots[slot].bytes;
    }
    int o = e->kernels[k].out_slot;
    if (e->slots[o].kind == SLOT_ARENA && !s->written[o]) net -= e->slots[o].bytes;
    return net;
}

static bool reads_intermediate(const cx_executable *e, const order_state *s, int k)
{
    for (int r = s->reads_start[k]; r < s->reads_start[k + 1]; r++)
        if (e->slots[s->reads[r]].kind == SLOT_ARENA) return true;
    return false;
}

/* The latest place each kernel can take, given the longest chain of
 * kernels that must follow it: a forward's first gather (every layer after
 * it) is needed before a loss's target (a short chain to the loss's
 * gradient). Edges run from lower to higher lowered indices, so one
 * backward pass does. */
static bool latest_places(order_state *s)
{
    int n = s->n;
    s->latest = malloc(sizeof(int) * (size_t)(n + 1));
    if (!s->latest) return false;
    for (int k = n - 1; k >= 0; k--) {
        int at = n - 1;
        for (int j = s->succ_start[k]; j < s->succ_start[k + 1]; j++)
            if (s->latest[s->succ[j]] - 1 < at) at = s->latest[s->succ[j]] - 1;
        s->latest[k] = at;
    }
    return true;
}

/* Whether kernel k reads an intermediate already computed: k keeps it
 * alive while it waits. */
static bool holds_an_intermediate(const cx_executable *e, const order_state *s, int k)
{
    for (int r = s->reads_start[k]; r < s->reads_start[k + 1]; r++)
        if (e->slots[s->reads[r]].kind == SLOT_ARENA && s->written[s->reads[r]]) return true;
    return false;
}

/* Whether running k lets a kernel start that holds an intermediate (a
 * weight's cast before its product), counting k's edges to it. */
static bool enables_a_reader(const cx_executable *e, const order_state *s, int k)
{
    for (int j = s->succ_start[k]; j < s->succ_start[k + 1]; j++) {
        int f = s->succ[j], edges = 0;
        for (int q = s->succ_start[k]; q < s->succ_start[k + 1]; q++) edges += s->succ[q] == f;
        if (s->preds_left[f] == edges && holds_an_intermediate(e, s, f)) return true;
    }
    return false;
}

/* The ready kernel to run next: one reading an intermediate before one that
 * does not; among the former the most bytes freed, among the latter first
 * one that lets a kernel holding an intermediate start, then the one with
 * the least room to wait; then the lowered order. */
static int pick(const cx_executable *e, const order_state *s, const int *ready, int nready)
{
    int best = -1;
    bool best_inter = false;
    int64_t best_key = 0;
    for (int i = 0; i < nready; i++) {
        int k = ready[i];
        bool inter = reads_intermediate(e, s, k);
        int64_t key = inter ? net_freed(e, s, k)
                            : (enables_a_reader(e, s, k) ? (int64_t)1 << 40 : 0) - (int64_t)s->latest[k];
        bool better = best < 0 || (inter && !best_inter) ||
                      (inter == best_inter && (key > best_key || (key == best_key && k < ready[best])));
        if (better) { best = i; best_inter = inter; best_key = key; }
    }
    return best;
}

bool cx_pass_order_by_memory(cx_executable *e)
{
    int n = e->nkernels;
    for (int k = 0; k < n; k++)   /* FSDP keeps its depth-first order: see cx_pass_schedule_overlap */
        if (e->kernels[k].kind == K_COLL && e->kernels[k].coll_op == OP_ALL_GATHER) return true;
    if (n < 3) return true;
    order_state s = { .n = n };
    int *ready = malloc(sizeof(int) * (size_t)n);
    cx_kernel *order = malloc(sizeof *order * (size_t)n);
    bool ok = ready && order && build_reads(e, &s) && build_edges(e, &s) && latest_places(&s);
    int nready = 0;
    for (int k = 0; ok && k < n; k++) if (s.preds_left[k] == 0) ready[nready++] = k;
    for (int t = 0; ok && t < n; t++) {
        int i = pick(e, &s, ready, nready);
        CX_ASSERT(i >= 0);
        int k = ready[i];
        ready[i] = ready[--nready];
        order[t] = e->kernels[k];
        for (int r = s.reads_start[k]; r < s.reads_start[k + 1]; r++) s.readers_left[s.reads[r]]--;
        s.written[e->kernels[k].out_slot] = 1;
        for (int j = s.succ_start[k]; j < s.succ_start[k + 1]; j++)
            if (--s.preds_left[s.succ[j]] == 0) ready[nready++] = s.succ[j];
    }
    if (ok) memcpy(e->kernels, order, sizeof *order * (size_t)n);
    else cx_set_last_error("compile: out of memory");
    free(ready); free(order);
    order_state_free(&s);
    return ok;
}
