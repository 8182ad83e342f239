/* The integer attributes of each op, by name. A node (and the kernel lowered
 * from it) keeps them in attrs[0 .. nattrs); read them with CX_ATTR, which
 * checks the index against nattrs, never with a bare number. */
#ifndef CX_OP_ATTRS_H
#define CX_OP_ATTRS_H

#include "cx_assert.h"

#include <cxla/core.h>

#define CX_MAX_ATTRS 24

/* OP_RNG */
enum { CX_AT_RNG_KIND = 0 };
/* OP_CAST: the target dtype (casts to different dtypes never intern together) */
enum { CX_AT_CAST_DTYPE = 0 };
/* OP_REDUCE_SUM, OP_REDUCE_MAX: bit d set = dim d is reduced */
enum { CX_AT_REDUCE_MASK = 0 };
/* OP_ARGMAX, OP_CONCAT, OP_GATHER, OP_SCATTER_ADD: the axis */
enum { CX_AT_AXIS = 0 };
/* a concat kernel (one per input): where its input starts along the axis */
enum { CX_AT_CONCAT_OFFSET = 1, CX_AT_CONCAT_COUNT };
/* OP_SLICE */
enum { CX_AT_SLICE_AXIS = 0, CX_AT_SLICE_START, CX_AT_SLICE_STEP, CX_AT_SLICE_COUNT };
/* OP_CONV2D; the backward ops add the shape the op cannot see from its
 * inputs: the input's (N, C, H, W) for the input gradient, the weight's
 * (O, C/groups, KH, KW) for the weight gradient */
enum {
    CX_AT_CONV_STRIDE_H = 0, CX_AT_CONV_STRIDE_W, CX_AT_CONV_PAD_H, CX_AT_CONV_PAD_W,
    CX_AT_CONV_DIL_H, CX_AT_CONV_DIL_W, CX_AT_CONV_GROUPS,
    CX_AT_CONV_COUNT,
    CX_AT_CONV_SHAPE = CX_AT_CONV_COUNT,
    CX_AT_CONV_BWD_COUNT = CX_AT_CONV_SHAPE + 4,
};
/* OP_MAXPOOL, OP_AVGPOOL, OP_MAXPOOL_BWD; OP_AVGPOOL_BWD adds the input's
 * (N, C, H, W) */
enum {
    CX_AT_POOL_KH = 0, CX_AT_POOL_KW, CX_AT_POOL_SH, CX_AT_POOL_SW, CX_AT_POOL_PH, CX_AT_POOL_PW,
    CX_AT_POOL_COUNT,
    CX_AT_POOL_SHAPE = CX_AT_POOL_COUNT,
    CX_AT_POOL_BWD_COUNT = CX_AT_POOL_SHAPE + 4,
};
/* collectives: the interned replica groups (0: every rank), the reduction
 * (cx_reduce_op), the gather / scatter / all_to_all split axis, and the
 * all_to_all concat axis or the broadcast root */
enum {
    CX_AT_COLL_GROUPS = 0, CX_AT_COLL_REDUCE, CX_AT_COLL_AXIS, CX_AT_COLL_AXIS2,
    CX_AT_COLL_COUNT,
    CX_AT_COLL_CONCAT_AXIS = CX_AT_COLL_AXIS2,
    CX_AT_COLL_ROOT = CX_AT_COLL_AXIS2,
};
/* OP_ATTENTION, OP_ATTENTION_BWD (fval: the score scale); a backward
 * kernel's own, after the op's: CX_AT_ATTN_INTERLEAVED, its gradients
 * written as (N, T, 3, H, D) (codegen sets it, compile/codegen.c) */
enum { CX_AT_ATTN_CAUSAL = 0, CX_AT_ATTN_COUNT, CX_AT_ATTN_INTERLEAVED = CX_AT_ATTN_COUNT };
/* OP_LAYER_NORM, OP_LAYER_NORM_BWD: none (fval: eps) */
/* OP_PERMUTE: output dim d reads input dim CX_ATTR(n, CX_AT_PERM(d)) */
#define CX_AT_PERM(d) (d)
/* OP_PAD of rank nd: low, high and interior padding of dim d */
#define CX_AT_PAD_LO(nd, d) (d)
#define CX_AT_PAD_HI(nd, d) ((nd) + (d))
#define CX_AT_PAD_INTERIOR(nd, d) (2 * (nd) + (d))
#define CX_AT_PAD_COUNT(nd) (3 * (nd))

_Static_assert(CX_AT_PAD_COUNT(CX_MAX_DIMS) <= CX_MAX_ATTRS, "OP_PAD keeps 3 attributes per dim");
_Static_assert(CX_AT_CONV_BWD_COUNT <= CX_MAX_ATTRS && CX_AT_POOL_BWD_COUNT <= CX_MAX_ATTRS, "attribute space");

static inline int64_t cx_attr_at(const int64_t *attrs, int nattrs, int i)
{
    CX_ASSERT(i >= 0 && i < nattrs);
    return attrs[i];
}
/* CX_ATTR(x, i): attribute i of a node, graph node or kernel. */
#define CX_ATTR(x, i) cx_attr_at((x)->attrs, (x)->nattrs, (i))

#endif
