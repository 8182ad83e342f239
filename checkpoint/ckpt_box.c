/* Boxes of tensors: reading a global box of any entry (SPMD pieces and
 * whole datasets by hyperslab, FSDP flat shards row by row). The top of
 * the read side: it calls the element-range reader (ckpt_read.c) and the
 * piece reader (ckpt_spmd_read.c), and only loads call it. */
#include "ckpt_internal.h"

#include <string.h>

/* A flat-shard entry (FSDP): the box as rows along its last dimension,
 * each an element range of the tensor. */
static cx_status read_rows(ckpt_src *s, const ckpt_entry *e, const int64_t *start, const int64_t *count, void *mem,
                           const int64_t *mem_shape, const int64_t *mem_off)
{
    int nd = e->ndim;
    int64_t idx[CX_MAX_DIMS] = { 0 }, rows = 1;
    for (int d = 0; d < nd - 1; d++) rows *= count[d];
    size_t es = cx_dtype_size(e->dtype);
    cx_status st = CX_OK;
    for (int64_t r = 0; r < rows && st == CX_OK; r++) {
        int64_t g = 0, m = 0;
        for (int d = 0; d < nd; d++) {
            int64_t i = d < nd - 1 ? idx[d] : 0;
            g = g * e->shape[d] + start[d] + i;
            m = m * mem_shape[d] + mem_off[d] + i;
        }
        st = ckpt_src_read(s, e, g, g + count[nd - 1], (char *)mem + (size_t)m * es);
        for (int d = nd - 2; d >= 0; d--) {
            if (++idx[d] < count[d]) break;
            idx[d] = 0;
        }
    }
    return st;
}

cx_status ckpt_src_read_box(ckpt_src *s, const ckpt_entry *e, const int64_t *start, const int64_t *count, void *mem,
                            const int64_t *mem_shape, const int64_t *mem_off)
{
    int64_t n = 1;
    bool whole = true;
    for (int d = 0; d < e->ndim; d++) {
        n *= count[d];
        whole = whole && start[d] == 0 && count[d] == e->shape[d] && mem_shape[d] == e->shape[d] && mem_off[d] == 0;
    }
    if (n == 0) return CX_OK;
    if (whole) return ckpt_src_read(s, e, 0, e->numel, mem);   /* checked against its checksum where it has one */
    if (e->npieces) {
        cx_status st = CX_OK;
        for (int p = 0; p < e->npieces && st == CX_OK; p++)
            st = ckpt_spmd_read_piece(s, e, &e->pieces[p], start, count, mem, mem_shape, mem_off);
        return st;
    }
    if (!e->replicated) return read_rows(s, e, start, count, mem, mem_shape, mem_off);
    /* a whole dataset of the home file: one piece holding everything */
    cx_shard_box all;
    memset(&all, 0, sizeof all);
    memcpy(all.count, e->shape, sizeof all.count);
    ckpt_piece p = { .file = s->home, .h5path = e->h5path, .nboxes = 1, .boxes = &all };
    memcpy(p.local_shape, e->shape, sizeof p.local_shape);
    return ckpt_spmd_read_piece(s, e, &p, start, count, mem, mem_shape, mem_off);
}
