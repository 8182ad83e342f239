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

/* Whether an output that will take the buffer of an input k reads (its
 * donor) is written before kernel `at`: a copy there would read the new
 * value, and the alias pass would give the output a buffer of its own. */
static bool donor_written_before(const cx_executable *e, const cx_kernel *k, int at)
{
    for (int o = 0; o < e->n_outputs; o++) {
        if (!e->out_alias || e->out_alias[o] < 0) continue;
        int w = cx_exec_first_writer(e, e->out_slot[o]);
        if (w < 0 || w >= at) continue;
        for (int i = 0; i < k->prog.n; i++) {
            const cx_pinstr *in = &k->prog.ins[i];
            if (in->kind == P_LOAD && e->slots[in->slot].index == e->out_alias[o]) return true;
        }
    }
    return false;
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

/* Inserts a copy of kernel `src` writing a new slot at position `at`.
 * @return the new slot, -1 when out of memory. */
static int insert_copy(cx_executable *e, int src, int at)
{
    int slot = cx_exec_add_slot(e, SLOT_ARENA, -1, e->slots[e->kernels[src].out_slot].bytes);
    cx_kernel copy = e->kernels[src];
    if (slot < 0 || !copy_program(&copy.prog, &e->kernels[src].prog)) return -1;
    copy.out_slot = slot;
    if (!cx_exec_add_kernel(e)) { free(copy.prog.ins); free(copy.prog.views); return -1; }
    memmove(&e->kernels[at + 1], &e->kernels[at], sizeof *e->kernels * (size_t)(e->nkernels - 1 - at));
    e->kernels[at] = copy;
    return slot;
}

/* Whether the buffer would sit unread while the kernels in between write
 * more than twice its size: only then does a second pass over its inputs
 * buy memory at the step's peak, rather than cost time for nothing. */
static bool idle_long(const cx_executable *e, int slot, int last_use, int reader)
{
    int64_t written = 0;
    for (int j = last_use + 1; j < reader; j++) {
        const cx_slot *s = &e->slots[e->kernels[j].out_slot];
        if (s->kind == SLOT_ARENA) written += s->bytes;
    }
    return written > 2 * e->slots[slot].bytes;
}

static void rename_reads(cx_kernel *k, int from, int to)
{
    cx_prog_rename_loads(&k->prog, from, to);
    for (int i = 0; i < k->nin; i++) if (k->in[i].slot == from) k->in[i].slot = to;
}

bool cx_pass_recompute_input_values(cx_executable *e)
{
    for (int k = 0; k < e->nkernels; k++) {
        if (!loads_inputs_only(e, &e->kernels[k])) continue;
        const int first = e->kernels[k].out_slot;
        int current = first, last_use = k;
        for (int r = k + 1; r < e->nkernels; r++) {
            if (!cx_kernel_reads(&e->kernels[r], first)) continue;
            /* a reader soon after the last use keeps the buffer; a late
             * one gets a copy, unless the inputs may have changed by then */
            if (idle_long(e, first, last_use, r) && !donor_written_before(e, &e->kernels[k], r)) {
                current = insert_copy(e, k, r);
                if (current < 0) { cx_set_last_error("compile: out of memory"); return false; }
                r++;   /* the reader moved up by one */
            }
            rename_reads(&e->kernels[r], first, current);
            last_use = r;
        }
    }
    return true;
}
