/* Reading and editing an executable: what each pass needs to add slots and
 * kernels, ask who reads a slot, and move a value to another slot. */
#include "executable.h"

#include "cx_vec.h"

#include <limits.h>

int cx_exec_add_slot(cx_executable *e, cx_slot_kind kind, int index, int64_t bytes)
{
    if (!CX_GROW(e->slots, e->slots_cap, e->nslots + 1)) return -1;
    e->slots[e->nslots] = (cx_slot){ kind, index, bytes, 0, INT_MAX, -1 };
    return e->nslots++;
}

cx_kernel *cx_exec_add_kernel(cx_executable *e)
{
    if (!CX_GROW(e->kernels, e->kernels_cap, e->nkernels + 1)) return NULL;
    cx_kernel *k = &e->kernels[e->nkernels++];
    memset(k, 0, sizeof *k);
    k->scratch_slot = -1;
    k->wait_at = -1;
    k->node = -1;
    return k;
}

void cx_kernel_each_read(const cx_kernel *k, void (*fn)(void *ctx, int slot), void *ctx)
{
    for (int i = 0; i < k->prog.n; i++)
        if (k->prog.ins[i].kind == P_LOAD) fn(ctx, k->prog.ins[i].slot);
    for (int i = 0; i < k->nin; i++) fn(ctx, k->in[i].slot);
    if (k->scratch_slot >= 0) fn(ctx, k->scratch_slot);
}

typedef struct { int slot; bool hit; } find_ctx;
static void find_slot(void *p, int slot)
{
    find_ctx *f = p;
    if (slot == f->slot) f->hit = true;
}

bool cx_kernel_reads(const cx_kernel *k, int slot)
{
    find_ctx f = { slot, false };
    cx_kernel_each_read(k, find_slot, &f);
    return f.hit;
}

int cx_exec_count_readers(const cx_executable *e, int slot, int *only)
{
    int cnt = 0;
    for (int k = 0; k < e->nkernels; k++)
        if (cx_kernel_reads(&e->kernels[k], slot)) { cnt++; *only = k; }
    return cnt;
}

int cx_exec_first_reader(const cx_executable *e, int slot, int after)
{
    for (int k = after + 1; k < e->nkernels; k++)
        if (cx_kernel_reads(&e->kernels[k], slot)) return k;
    return e->nkernels;
}

int cx_exec_first_writer(const cx_executable *e, int slot)
{
    for (int k = 0; k < e->nkernels; k++) if (e->kernels[k].out_slot == slot) return k;
    return -1;
}

void cx_prog_rename_loads(cx_program *p, int from, int to)
{
    for (int i = 0; i < p->n; i++)
        if (p->ins[i].kind == P_LOAD && p->ins[i].slot == from) p->ins[i].slot = to;
}

void cx_exec_rename_slot(cx_executable *e, int from, int to)
{
    for (int j = 0; j < e->nkernels; j++) {
        cx_kernel *k = &e->kernels[j];
        if (k->out_slot == from) k->out_slot = to;
        cx_prog_rename_loads(&k->prog, from, to);
        for (int i = 0; i < k->nin; i++) if (k->in[i].slot == from) k->in[i].slot = to;
        if (k->scratch_slot == from) k->scratch_slot = to;
    }
}

void cx_contiguous_strides(const int64_t *shape, int nd, int64_t *s)
{
    int64_t acc = 1;
    for (int i = nd - 1; i >= 0; i--) { s[i] = acc; acc *= shape[i]; }
}

bool cx_view_is_identity(const cx_view *v, const int64_t *shape, int nd)
{
    int64_t S[CX_MAX_DIMS];
    cx_contiguous_strides(shape, nd, S);
    if (v->offset != 0 || v->masked) return false;
    for (int d = 0; d < nd; d++) if (shape[d] > 1 && v->strides[d] != S[d]) return false;
    return true;
}

bool cx_view_is_broadcast(const cx_view *v, const int64_t *shape, int nd)
{
    if (v->masked || v->offset < 0) return false;
    for (int d = 0; d < nd; d++) if (shape[d] > 1 && v->strides[d] != 0) return false;
    return true;
}

bool cx_index_is_rows(const cx_kin *ix, int axis, int64_t *outer_stride, int64_t *axis_stride)
{
    const cx_view *v = &ix->view;
    if (v->masked || v->offset < 0 || axis < 0 || axis >= ix->ndim) return false;
    for (int d = axis + 1; d < ix->ndim; d++) if (ix->shape[d] > 1 && v->strides[d] != 0) return false;
    int64_t so = 0, expect = -1;
    for (int d = axis - 1; d >= 0; d--) {
        if (ix->shape[d] == 1) continue;
        if (v->strides[d] < 0 || (expect >= 0 && v->strides[d] != expect)) return false;
        if (expect < 0) so = v->strides[d];
        if (__builtin_mul_overflow(v->strides[d], ix->shape[d], &expect)) return false;
    }
    if (v->strides[axis] < 0) return false;
    *outer_stride = so;
    *axis_stride = ix->shape[axis] > 1 ? v->strides[axis] : 0;
    return true;
}

void cx_exec_clear_kernels(cx_executable *e)
{
    for (int k = 0; k < e->nkernels; k++) {
        free(e->kernels[k].prog.ins);
        free(e->kernels[k].prog.views);
    }
    free(e->kernels);
    free(e->slots);
    e->kernels = NULL;
    e->slots = NULL;
    e->nkernels = e->nslots = e->kernels_cap = e->slots_cap = 0;
}

void cx_executable_free(cx_executable *e)
{
    if (!e) return;
    cx_exec_clear_kernels(e);
    free(e->out_dtypes);
    free(e->out_bytes);
    free(e->out_alias);
    free(e->out_slot);
    free(e->out_sharding);
    cx_spmd_notes_free(e->spmd_notes);
    free(e);
}

const char *cx_kernel_kind_name(int kind)
{
    static const char *const names[] = {
        [K_FUSED] = "fused", [K_REDUCE] = "reduce", [K_MATMUL] = "matmul", [K_CONV] = "conv2d",
        [K_CONV_BI] = "conv2d_bwd_input", [K_CONV_BW] = "conv2d_bwd_weight", [K_MAXPOOL] = "max_pool2d",
        [K_MAXPOOL_BWD] = "max_pool2d_bwd", [K_AVGPOOL] = "avg_pool2d", [K_AVGPOOL_BWD] = "avg_pool2d_bwd",
        [K_GATHER] = "gather", [K_SCATTER_ADD] = "scatter_add", [K_CONCAT] = "concat", [K_PAD] = "pad",
        [K_COLL] = "collective", [K_ATTENTION] = "attention", [K_ATTENTION_BWD] = "attention_bwd",
        [K_LAYER_NORM] = "layer_norm", [K_LAYER_NORM_BWD] = "layer_norm_bwd", [K_COPY] = "copy",
    };
    _Static_assert(sizeof names / sizeof *names == K_COPY + 1, "a kernel kind without a name");
    if (kind < 0 || (size_t)kind >= sizeof names / sizeof *names || !names[kind]) return "kernel";
    return names[kind];
}
