/* Pass 3b, values of inputs computed again where they are read late: an
 * elementwise kernel that reads nothing but the step's inputs (parameters,
 * the batch) computes the same bytes at any point of the step, so a reader
 * far after it gets its own copy computed right before it, and the first
 * buffer dies early. Under autocast every weight's bf16 cast is read by the
 * forward matmul and again, much later, by the backward one; a GPT's token
 * indices are expanded for the embedding's gather and again for its
 * scatter-add. Kept, each buffer spans the peak of the step; recomputed,
 * each is a pass over a parameter-sized input. */
#include "passes.h"
#include "cx_vec.h"

/* A copy costs a pass over the inputs; a long program is not "cheap". */
enum { MAX_RECOMPUTED_INSTRUCTIONS = 16 };

static bool loads_inputs_only(const cx_executable *e, const cx_kernel *k)
{
    if (k->kind != K_FUSED || k->has_epilogue || e->slots[k->out_slot].kind != SLOT_ARENA) return false;
    if (k->prog.n > MAX_RECOMPUTED_INSTRUCTIONS) return false;
    for (int i = 0; i < k->prog.n; i++) {
        const cx_pinstr *in = &k->prog.ins[i];
        if (in->kind == P_LOAD && e->slots[in->slot].kind != SLOT_INPUT) return false;
    }
    return true;
}

static bool copy_program(cx_program *dst, const cx_program *src)
{
    *dst = *src;
    dst->ins = malloc(sizeof *dst->ins * (size_t)(src->n + 1));
    dst->views = malloc(sizeof *dst->views * (size_t)(src->nviews + 1));
    if (!dst->ins || !dst->views) {
        free(dst->ins); free(dst->views);
        *dst = (cx_program){ 0 };
        return false;
    }
    /* a program without views (constants, iotas) has no array to copy */
    if (src->n) memcpy(dst->ins, src->ins, sizeof *dst->ins * (size_t)src->n);
    if (src->nviews) memcpy(dst->views, src->views, sizeof *dst->views * (size_t)src->nviews);
    dst->cap = src->n;
    dst->vcap = src->nviews;
    return true;
}

/* What the pass decides, before the kernel list is rebuilt once: copies
 * of a kernel placed before a reader, and readers that read a copy. */
typedef struct { int before, src, slot; } planned_copy;
typedef struct { int reader, from, to; } planned_read;

typedef struct {
    int nk;
    int *rstart, *rlist;       /* the kernels reading each slot, in order (CSR) */
    int64_t *written;          /* arena bytes written by kernels [0, j) */
    int *donor_limit;          /* per input slot: the first kernel writing an output that takes its buffer */
    planned_copy *copies;
    int ncopies, copies_cap;
    planned_read *reads;
    int nreads, reads_cap;
} plan;

static void plan_free(plan *p)
{
    free(p->rstart); free(p->rlist); free(p->written); free(p->donor_limit); free(p->copies); free(p->reads);
}

typedef struct { int *count, *stamp, *list, *fill, k; } read_ctx;

static void count_read(void *c, int slot)
{
    read_ctx *r = c;
    if (r->stamp[slot] == r->k + 1) return;   /* one entry per kernel, however many loads */
    r->stamp[slot] = r->k + 1;
    if (r->list) r->list[r->fill[slot]++] = r->k;
    else r->count[slot]++;
}

/* The readers of every slot, in kernel order. */
static bool build_readers(const cx_executable *e, plan *p)
{
    const int ns = e->nslots;
    int *count = calloc((size_t)ns + 1, sizeof(int)), *stamp = calloc((size_t)ns + 1, sizeof(int));
    int *fill = malloc(sizeof(int) * ((size_t)ns + 1));
    p->rstart = malloc(sizeof(int) * ((size_t)ns + 2));
    bool ok = count && stamp && fill && p->rstart;
    read_ctx r = { count, stamp, NULL, fill, 0 };
    for (int k = 0; ok && k < p->nk; k++) { r.k = k; cx_kernel_each_read(&e->kernels[k], count_read, &r); }
    if (ok) {
        p->rstart[0] = 0;
        for (int s = 0; s < ns; s++) { p->rstart[s + 1] = p->rstart[s] + count[s]; fill[s] = p->rstart[s]; stamp[s] = 0; }
        p->rlist = malloc(sizeof(int) * ((size_t)p->rstart[ns] + 1));
        ok = p->rlist != NULL;
    }
    r.list = p->rlist;
    for (int k = 0; ok && k < p->nk; k++) { r.k = k; cx_kernel_each_read(&e->kernels[k], count_read, &r); }
    free(count); free(stamp); free(fill);
    return ok;
}

/* Bytes written before each kernel, and each input's first overwrite. */
static bool build_limits(const cx_executable *e, plan *p)
{
    const int ns = e->nslots;
    p->written = malloc(sizeof(int64_t) * ((size_t)p->nk + 1));
    p->donor_limit = malloc(sizeof(int) * ((size_t)ns + 1));
    int *first_writer = malloc(sizeof(int) * ((size_t)ns + 1)), *input_slot = malloc(sizeof(int) * ((size_t)e->n_inputs + 1));
    bool ok = p->written && p->donor_limit && first_writer && input_slot;
    for (int s = 0; ok && s < ns; s++) { p->donor_limit[s] = p->nk; first_writer[s] = -1; }
    for (int i = 0; ok && i < e->n_inputs; i++) input_slot[i] = -1;
    for (int s = 0; ok && s < ns; s++)
        if (e->slots[s].kind == SLOT_INPUT && e->slots[s].index >= 0 && e->slots[s].index < e->n_inputs)
            input_slot[e->slots[s].index] = s;
    if (ok) p->written[0] = 0;
    for (int k = 0; ok && k < p->nk; k++) {
        const int o = e->kernels[k].out_slot;
        p->written[k + 1] = p->written[k] + (e->slots[o].kind == SLOT_ARENA ? e->slots[o].bytes : 0);
        if (first_writer[o] < 0) first_writer[o] = k;
    }
    for (int o = 0; ok && e->out_alias && o < e->n_outputs; o++) {
        const int in = e->out_alias[o], w = e->out_slot[o] >= 0 ? first_writer[e->out_slot[o]] : -1;
        if (in < 0 || in >= e->n_inputs || input_slot[in] < 0 || w < 0) continue;
        if (w < p->donor_limit[input_slot[in]]) p->donor_limit[input_slot[in]] = w;
    }
    free(first_writer); free(input_slot);
    return ok;
}

/* Copies of candidate k for its late readers. */
static bool plan_kernel(cx_executable *e, plan *p, int k)
{
    const cx_kernel *kn = &e->kernels[k];
    const int first = kn->out_slot;
    const int64_t bytes = e->slots[first].bytes;
    /* a copy before reader r reads k's inputs there: not once an output
     * taking one of their buffers is written before r */
    int limit = p->nk;
    for (int i = 0; i < kn->prog.n; i++)
        if (kn->prog.ins[i].kind == P_LOAD && p->donor_limit[kn->prog.ins[i].slot] < limit)
            limit = p->donor_limit[kn->prog.ins[i].slot];
    int current = first, last_use = k;
    for (int q = p->rstart[first]; q < p->rstart[first + 1]; q++) {
        const int r = p->rlist[q];
        if (r <= k) continue;
        /* a late reader, the buffer idle across more than twice its size
         * of other writes: only then does a second pass over the inputs
         * buy memory at the step's peak rather than cost time for nothing */
        if (p->written[r] - p->written[last_use + 1] > 2 * bytes && r <= limit) {
            current = cx_exec_add_slot(e, SLOT_ARENA, -1, bytes);
            if (current < 0 || !CX_GROW(p->copies, p->copies_cap, p->ncopies + 1)) return false;
            p->copies[p->ncopies++] = (planned_copy){ r, k, current };
        }
        if (current != first) {
            if (!CX_GROW(p->reads, p->reads_cap, p->nreads + 1)) return false;
            p->reads[p->nreads++] = (planned_read){ r, first, current };
        }
        last_use = r;
    }
    return true;
}

static int by_reader(const void *a, const void *b)
{
    const planned_copy *x = a, *y = b;
    return x->before != y->before ? (x->before > y->before) - (x->before < y->before) : (x->src > y->src) - (x->src < y->src);
}

static int read_by_reader(const void *a, const void *b)
{
    const planned_read *x = a, *y = b;
    return (x->reader > y->reader) - (x->reader < y->reader);
}

static void rename_reads(cx_kernel *k, int from, int to)
{
    cx_prog_rename_loads(&k->prog, from, to);
    for (int i = 0; i < k->nin; i++) if (k->in[i].slot == from) k->in[i].slot = to;
}

/* The kernel list with the copies in place, in one pass; every
 * allocation comes first, so a failure leaves e as it was. */
static bool apply(cx_executable *e, plan *p)
{
    qsort(p->copies, (size_t)p->ncopies, sizeof *p->copies, by_reader);
    qsort(p->reads, (size_t)p->nreads, sizeof *p->reads, read_by_reader);
    cx_kernel *out = malloc(sizeof *out * ((size_t)(p->nk + p->ncopies) + 1));
    cx_program *progs = calloc((size_t)p->ncopies + 1, sizeof *progs);
    int made = 0;
    bool ok = out && progs;
    for (; ok && made < p->ncopies; made++) ok = copy_program(&progs[made], &e->kernels[p->copies[made].src].prog);
    if (!ok) {
        for (int c = 0; c < made; c++) { free(progs[c].ins); free(progs[c].views); }
        free(out); free(progs);
        return false;
    }
    int n = 0, c = 0, rd = 0;
    for (int i = 0; i < p->nk; i++) {
        for (; c < p->ncopies && p->copies[c].before == i; c++) {
            out[n] = e->kernels[p->copies[c].src];
            out[n].prog = progs[c];
            out[n++].out_slot = p->copies[c].slot;
        }
        out[n] = e->kernels[i];
        for (; rd < p->nreads && p->reads[rd].reader == i; rd++) rename_reads(&out[n], p->reads[rd].from, p->reads[rd].to);
        n++;
    }
    free(progs);
    free(e->kernels);
    e->kernels = out;
    e->nkernels = e->kernels_cap = n;
    return true;
}

bool cx_pass_recompute_input_values(cx_executable *e)
{
    plan p = { .nk = e->nkernels };
    bool ok = build_readers(e, &p) && build_limits(e, &p);
    for (int k = 0; ok && k < p.nk; k++)
        if (loads_inputs_only(e, &e->kernels[k])) ok = plan_kernel(e, &p, k);
    if (ok && p.ncopies) ok = apply(e, &p);
    plan_free(&p);
    if (!ok) cx_set_last_error("compile: out of memory");
    return ok;
}
