/* Pass 3, epilogues: an elementwise kernel that only post-processes a heavy
 * kernel's output (bias, activation, relu's gradient mask) runs in place
 * right after it, while the output is in cache; the output's own arena slot
 * disappears. Where the kernel can apply the epilogue itself (conv bias and
 * relu, a linear layer's bias and relu or residual, the relu-gradient
 * mask), it does, and no program runs at all; a
 * bf16 matmul whose only reader casts it to f32 writes its f32 sums, and a
 * layer norm whose only reader casts it to bf16 writes bf16. */
#include "passes.h"

#include <stdlib.h>

/* Whether x's view (the bias) reads one value per channel of the conv h's
 * (N, O, OH*OW) output as the merged kernel m iterates it. */
static bool per_channel(const cx_kernel *h, const cx_kernel *m, const cx_view *v)
{
    const int nd = m->ndim;
    const int64_t *shape = m->shape;
    if (nd < 3 || nd > 4 || h->ndim != 4 || shape[0] != h->shape[0] || shape[1] != h->shape[1]) return false;
    int64_t plane = 1;
    for (int d = 2; d < nd; d++) plane *= shape[d];
    if (plane != h->shape[2] * h->shape[3] || v->offset != 0 || v->masked) return false;
    for (int d = 0; d < nd; d++)
        if (shape[d] > 1 && v->strides[d] != (d == 1 ? 1 : 0)) return false;
    return true;
}

/* Whether x's view (the bias) reads one value per column of the bf16
 * matmul h's output, (..., n) in m's element order. */
static bool per_column(const cx_kernel *h, const cx_kernel *m, const cx_view *v)
{
    const int nd = m->ndim, hb = h->in[1].ndim;
    if (nd < 1 || hb < 2 || m->shape[nd - 1] != h->in[1].shape[hb - 1] || v->offset != 0 || v->masked) return false;
    for (int d = 0; d < nd; d++)
        if (m->shape[d] > 1 && v->strides[d] != (d == nd - 1 ? 1 : 0)) return false;
    return true;
}

/* Whether h (an f32 matmul) can apply the epilogue program of m itself
 * as out + bias[column] + an addend: five instructions, the output, the
 * bias and the addend (of the output's shape, read in its element order)
 * loaded in any order, the output and the bias added first, then the
 * addend (a linear layer's bias, and the residual it adds into). The
 * kernel adds in that order, so the bits are the program's (an add's
 * operand order changes none). *load: the bias's load. */
static bool bias_then_addend(const cx_kernel *h, const cx_kernel *m, int *load)
{
    const cx_program *p = &m->prog;
    const cx_pinstr *in = p->ins;
    if (p->n != 5 || p->result != 4) return false;
    int o = -1, bias = -1, addend = -1;
    for (int i = 0; i < 3; i++) {
        if (in[i].kind != P_LOAD || in[i].dtype != CX_F32 || in[i].src_dtype != CX_F32) return false;
        const cx_view *v = &p->views[in[i].view];
        if (in[i].slot == m->out_slot) o = i;
        else if (cx_view_is_identity(v, m->shape, m->ndim)) addend = i;
        else if (per_column(h, m, v)) bias = i;
    }
    if (o < 0 || bias < 0 || addend < 0) return false;
    const cx_pinstr *sum = &in[3], *total = &in[4];
    if (sum->kind != P_BIN || sum->op != OP_ADD || sum->dtype != CX_F32 ||
        !((sum->a == o && sum->b == bias) || (sum->a == bias && sum->b == o)))
        return false;
    if (total->kind != P_BIN || total->op != OP_ADD || total->dtype != CX_F32 ||
        !((total->a == 3 && total->b == addend) || (total->a == addend && total->b == 3)))
        return false;
    *load = bias;
    return true;
}

/* Whether an epilogue the heavy kernel h took over (merged: its program
 * now loads the output from merged->out_slot) is one the kernel applies
 * itself while the output is in cache:
 *  - after a conv, out + bias[channel], optionally then relu (Conv2d and
 *    ReLU), over the conv's own (N, O, OH*OW) element split;
 *  - after a matmul, out + bias[column], optionally then relu (a Linear
 *    and its ReLU), or, in f32, then + an addend of the output's shape
 *    read in place (a Linear and the residual it adds into): the
 *    program's adds in its order, with no pass of the interpreter;
 *  - after a conv input gradient or max-pool backward, where(m > 0, out, 0)
 *    with m in the output's layout (relu's gradient, as P_POSMASK).
 * In f32 every instruction is f32. In bf16 (autocast) the mask is bf16
 * and the f32 bias is cast to bf16 first, each step rounded as the
 * program would: the bf16 kernels apply exactly these steps.
 * @return the cx_epi, with the index of the load of the bias or mask in
 * *load. */
static cx_epi fold_epilogue(const cx_kernel *h, const cx_kernel *merged, int *load)
{
    const cx_program *p = &merged->prog;
    const cx_pinstr *in = p->ins;
    const int dt = merged->out_dtype;
    if (h->kind == K_MATMUL && dt == CX_F32 && bias_then_addend(h, merged, load)) return EPI_BIAS_ADD;
    if (p->n < 3 || p->result != p->n - 1 || in[0].kind != P_LOAD || in[1].kind != P_LOAD) return EPI_PROG;
    if (dt != CX_F32 && dt != CX_BF16) return EPI_PROG;
    const int o = in[0].slot == merged->out_slot ? 0 : 1, x = 1 - o;
    if (in[o].slot != merged->out_slot || in[x].slot == merged->out_slot) return EPI_PROG;
    /* every instruction in the output's dtype but a bf16 program's bias
     * load and its cast */
    const bool bias_kind = h->kind == K_CONV || h->kind == K_MATMUL;
    const bool cast_bias = dt == CX_BF16 && bias_kind;
    for (int i = 0; i < p->n; i++) {
        int want = cast_bias && i == x ? CX_F32 : dt;
        if (in[i].dtype != want || (in[i].kind == P_LOAD && in[i].src_dtype != want)) return EPI_PROG;
    }
    const cx_view *v = &p->views[in[x].view];
    const int b = cast_bias ? 2 : x;   /* the bias's register, cast or not */
    const int add = cast_bias ? 3 : 2;   /* after the two loads (and the cast) */
    if (bias_kind && (!cast_bias || (in[2].kind == P_CAST && in[2].a == x)) && add < p->n &&
        in[add].kind == P_BIN && in[add].op == OP_ADD &&
        ((in[add].a == o && in[add].b == b) || (in[add].a == b && in[add].b == o)) &&
        (p->n == add + 1 || (p->n == add + 2 && in[add + 1].kind == P_RELU && in[add + 1].a == add))) {
        if (h->kind == K_CONV ? !per_channel(h, merged, v) : !per_column(h, merged, v)) return EPI_PROG;
        *load = x;
        return p->n == add + 2 ? EPI_BIAS_RELU : EPI_BIAS;
    }
    if ((h->kind == K_CONV_BI || h->kind == K_MAXPOOL_BWD) && p->n == 3 && in[2].kind == P_POSMASK &&
        in[2].a == x && in[2].b == o && cx_view_is_identity(v, merged->shape, merged->ndim)) {
        *load = x;
        return EPI_POSMASK;
    }
    return EPI_PROG;
}

/* Whether f can run as h's epilogue: f is the only reader of h's output,
 * an elementwise kernel of h's dtype over the same elements (it then runs
 * in place over h's output), reading that output in
 * its own element order, and not writing over a buffer it also reads. */
static bool epilogue_fits(const cx_executable *e, int k, const cx_kernel *h, int reader)
{
    const cx_kernel *f = &e->kernels[reader];
    if (reader <= k || f->kind != K_FUSED || f->out_numel != h->out_numel || f->out_dtype != h->out_dtype) return false;
    if (e->slots[f->out_slot].kind == SLOT_OUTPUT && e->out_alias[e->slots[f->out_slot].index] >= 0) return false;
    for (int i = 0; i < f->prog.n; i++) {
        const cx_pinstr *in = &f->prog.ins[i];
        if (in->kind != P_LOAD) continue;
        if (in->slot == f->out_slot) return false;
        if (in->slot == h->out_slot && !cx_view_is_identity(&f->prog.views[in->view], f->shape, f->ndim)) return false;
    }
    return true;
}

/* Whether f, the only reader of kernel k's output (h's), comes after it
 * and only casts that output, read whole and in order, from `from` to
 * `to`, into a buffer no output aliases. */
static bool only_casts(const cx_executable *e, int k, const cx_kernel *h, int reader, int from, int to)
{
    const cx_kernel *f = &e->kernels[reader];
    if (reader <= k || f->kind != K_FUSED || f->out_dtype != to || f->out_numel != h->out_numel) return false;
    if (e->slots[f->out_slot].kind == SLOT_OUTPUT && e->out_alias[e->slots[f->out_slot].index] >= 0) return false;
    const cx_program *p = &f->prog;
    if (p->n != 2 || p->result != 1) return false;
    const cx_pinstr *ld = &p->ins[0], *cast = &p->ins[1];
    return ld->kind == P_LOAD && ld->slot == h->out_slot && ld->src_dtype == from && ld->dtype == from &&
           cx_view_is_identity(&p->views[ld->view], f->shape, f->ndim) && cast->kind == P_CAST && cast->a == 0 &&
           cast->dtype == to;
}

/* Whether f, h's only reader, is just h's output cast to f32, where h is
 * a bf16 matmul: autocast's product whose value goes on in f32 (a
 * gradient into an f32 layer, a weight's gradient to its f32 master). h
 * then writes its f32 sums itself, unrounded: the value rounded to bf16
 * and widened again, which is what the cast kernel made of them, loses
 * bits for nothing, and the cast was a pass over the whole output. */
static bool casts_to_f32(const cx_executable *e, int k, const cx_kernel *h, int reader)
{
    return h->kind == K_MATMUL && h->out_dtype == CX_BF16 && !h->has_epilogue &&
           only_casts(e, k, h, reader, CX_BF16, CX_F32);
}

/* Whether f, h's only reader, is just h's output cast to bf16, where h is
 * a layer norm: autocast's f32 norm before a bf16 product (a transformer
 * block's input). h then rounds its values as it writes them, which is
 * what the cast kernel made of them, and the f32 output and its pass over
 * memory are gone. */
static bool norm_casts_to_bf16(const cx_executable *e, int k, const cx_kernel *h, int reader)
{
    return h->kind == K_LAYER_NORM && h->out_dtype == CX_F32 && only_casts(e, k, h, reader, CX_F32, CX_BF16);
}

/* h (kernel k) takes over its reader's place and output: its value is
 * the reader's, and its node joins the reader's group */
static void take_reader_place(cx_executable *e, int k, int reader, cx_kernel merged)
{
    const cx_kernel *f = &e->kernels[reader];
    merged.out_slot = f->out_slot;
    merged.node = f->node;
    merged.loc = f->loc;
    merged.ndim = f->ndim;
    memcpy(merged.shape, f->shape, sizeof merged.shape);
    e->slots[e->kernels[k].out_slot].last = -1; /* dead: no arena space */
    e->kernels[reader] = merged;
    memmove(&e->kernels[k], &e->kernels[k + 1], sizeof *e->kernels * (size_t)(e->nkernels - k - 1));
    e->nkernels--;
}

void cx_pass_fuse_epilogues(cx_executable *e)
{
    for (int k = 0; k < e->nkernels; k++) {
        cx_kernel *h = &e->kernels[k];
        if (h->kind != K_MATMUL && h->kind != K_CONV && h->kind != K_CONV_BI && h->kind != K_MAXPOOL_BWD &&
            h->kind != K_LAYER_NORM)
            continue;
        if (e->slots[h->out_slot].kind != SLOT_ARENA) continue;
        int reader = -1;
        if (cx_exec_count_readers(e, h->out_slot, &reader) != 1) continue;
        const bool to_f32 = casts_to_f32(e, k, h, reader);
        if (to_f32 || norm_casts_to_bf16(e, k, h, reader)) {
            cx_kernel merged = *h;
            merged.out_dtype = to_f32 ? CX_F32 : CX_BF16;
            free(e->kernels[reader].prog.ins);   /* the cast's program goes with it */
            free(e->kernels[reader].prog.views);
            take_reader_place(e, k, reader, merged);
            k--;
            continue;
        }
        /* a matmul that took its cast writes f32 sums and runs no program
         * (the format admits none there) */
        if (h->kind == K_LAYER_NORM || cx_kernel_is_matmul_f32_sums(h) || !epilogue_fits(e, k, h, reader)) continue;
        /* the heavy op moves to the reader's position and writes the reader's
         * output; the program then runs in place over it (the heavy op's own
         * geometry comes from its inputs and attributes) */
        cx_kernel *f = &e->kernels[reader];
        cx_kernel merged = *h;
        merged.has_epilogue = true;
        merged.prog = f->prog;
        cx_prog_rename_loads(&merged.prog, h->out_slot, f->out_slot);
        merged.out_slot = f->out_slot;   /* fold_epilogue reads the merged kernel's output slot */
        merged.ndim = f->ndim;
        memcpy(merged.shape, f->shape, sizeof merged.shape);
        merged.epi = (uint8_t)fold_epilogue(h, &merged, &merged.epi_load);
        take_reader_place(e, k, reader, merged);
        k--;
    }
}
