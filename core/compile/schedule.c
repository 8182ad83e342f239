/* Pass 4, the schedule of collectives: in place where they can be, DDP's
 * overlap of gradient all-reduces with the rest of backward, FSDP's gather
 * prefetch, and where each asynchronous collective is waited for. The order
 * is a function of the graph alone, so every rank issues the same sequence
 * of collectives. */
#include "passes.h"

/* An all-reduce or broadcast whose input is an intermediate nothing else
 * reads (DDP's bucket: a concat of gradients) writes its result over that
 * input, as MPI_IN_PLACE: the bucket then costs its bytes once, not twice
 * for the whole time the collective is in flight. */
void cx_pass_collectives_in_place(cx_executable *e)
{
    for (int k = 0; k < e->nkernels; k++) {
        cx_kernel *h = &e->kernels[k];
        if (h->kind != K_COLL || h->nin != 1 || h->scratch_slot >= 0) continue;
        if (h->coll_op != OP_ALL_REDUCE && h->coll_op != OP_BROADCAST) continue;
        const int in = h->in[0].slot, out = h->out_slot;
        if (in == out || e->slots[in].kind != SLOT_ARENA || e->slots[out].kind != SLOT_ARENA) continue;
        if (e->slots[in].bytes != e->slots[out].bytes) continue;
        int only = -1;
        if (cx_exec_count_readers(e, in, &only) != 1 || only != k) continue;
        cx_exec_rename_slot(e, out, in);
    }
}

static bool is_grad_collective(const cx_kernel *k)
{
    return k->kind == K_COLL && (k->coll_op == OP_ALL_REDUCE || k->coll_op == OP_REDUCE_SCATTER);
}

/* The dependence graph of the kernels: j after i when j reads what i
 * writes, writes what i reads, or both write the same slot. */
typedef struct {
    int n;
    char *dep;      /* dep[j * n + i]: j depends on i */
    int *indeg;
    char *waits;    /* reads a gradient collective's result */
} depgraph;

static void depgraph_free(depgraph *d) { free(d->dep); free(d->indeg); free(d->waits); }

static bool depgraph_build(const cx_executable *e, depgraph *d)
{
    int n = e->nkernels;
    d->n = n;
    d->dep = calloc((size_t)n * (size_t)n, 1);
    d->indeg = calloc((size_t)n, sizeof(int));
    d->waits = calloc((size_t)n, 1);
    if (!d->dep || !d->indeg || !d->waits) { depgraph_free(d); return false; }
    for (int j = 0; j < n; j++)
        for (int i = 0; i < j; i++) {
            const cx_kernel *ki = &e->kernels[i], *kj = &e->kernels[j];
            bool raw = cx_kernel_reads(kj, ki->out_slot), war = cx_kernel_reads(ki, kj->out_slot);
            if (raw || war || ki->out_slot == kj->out_slot) { d->dep[(size_t)j * (size_t)n + (size_t)i] = 1; d->indeg[j]++; }
            if (raw && is_grad_collective(ki)) d->waits[j] = 1;
        }
    return true;
}

/* The next kernel to issue among those ready: first a gradient collective;
 * then a concat piece, which copies a gradient into its bucket and frees it
 * (otherwise every gradient of a bucket waits until the last one is
 * computed); then work that waits on no collective; then anything. */
static int pick_next(const cx_executable *e, const depgraph *d, const char *done)
{
    for (int pass = 0; pass < 4; pass++)
        for (int k = 0; k < d->n; k++) {
            if (done[k] || d->indeg[k]) continue;
            const cx_kernel *kn = &e->kernels[k];
            if (pass == 0 && !is_grad_collective(kn)) continue;
            if (pass == 1 && (kn->kind != K_CONCAT || d->waits[k])) continue;
            if (pass == 2 && d->waits[k]) continue;
            return k;
        }
    return -1;
}

/* Gradient collectives overlap the rest of backward: a list schedule that
 * issues each all-reduce / reduce-scatter as soon as its inputs exist and
 * runs whatever waits on one only when nothing else is ready. */
bool cx_pass_schedule_overlap(cx_executable *e)
{
    int n = e->nkernels, ncoll = 0, ngather = 0;
    for (int k = 0; k < n; k++) {
        ncoll += is_grad_collective(&e->kernels[k]);
        ngather += e->kernels[k].kind == K_COLL && e->kernels[k].coll_op == OP_ALL_GATHER;
    }
    /* FSDP graphs keep the memory-minded depth-first order (with prefetch):
     * pulling independent work forward there would hold gathered units longer */
    if (ncoll == 0 || ngather > 0 || n < 3) return true;
    depgraph d = { 0 };
    char *done = calloc((size_t)n, 1);
    cx_kernel *order = malloc(sizeof *order * (size_t)n);
    if (!done || !order || !depgraph_build(e, &d)) {
        free(done); free(order);
        cx_set_last_error("compile: out of memory");
        return false;
    }
    for (int t = 0; t < n; t++) {
        int pick = pick_next(e, &d, done);
        CX_ASSERT(pick >= 0);
        done[pick] = 1;
        order[t] = e->kernels[pick];
        for (int j = 0; j < n; j++) if (d.dep[(size_t)j * (size_t)n + (size_t)pick]) d.indeg[j]--;
    }
    memcpy(e->kernels, order, sizeof *order * (size_t)n);
    free(order); free(done);
    depgraph_free(&d);
    return true;
}

/* FSDP prefetch: each all-gather moves up to where the previous gather's
 * result is first used, so it runs while the previous unit computes. It
 * stays after that previous collective (the issue order every rank shares
 * is unchanged) and holds at most one unit ahead of its use. */
void cx_pass_prefetch_gathers(cx_executable *e)
{
    int prev = -1;
    for (int k = 0; k < e->nkernels; k++) {
        cx_kernel *kn = &e->kernels[k];
        if (kn->kind != K_COLL) continue;
        if (kn->coll_op != OP_ALL_GATHER || prev < 0) { prev = k; continue; }
        int target = cx_exec_first_reader(e, e->kernels[prev].out_slot, prev);
        /* inputs must exist by then */
        for (int i = 0; i < kn->nin; i++) {
            int w = cx_exec_first_writer(e, kn->in[i].slot);
            if (w >= target) target = w + 1;
        }
        if (target < k && target > prev) {
            cx_kernel moved = *kn;
            memmove(&e->kernels[target + 1], &e->kernels[target], sizeof *e->kernels * (size_t)(k - target));
            e->kernels[target] = moved;
            k = target;
        }
        prev = k;
    }
}

void cx_pass_collective_waits(cx_executable *e)
{
    for (int k = 0; k < e->nkernels; k++)
        if (e->kernels[k].kind == K_COLL) e->kernels[k].wait_at = cx_exec_first_reader(e, e->kernels[k].out_slot, k);
}
