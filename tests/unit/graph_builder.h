/* Hand-built compiler graphs for the white-box pass tests. */
#ifndef CX_TEST_GRAPH_BUILDER_H
#define CX_TEST_GRAPH_BUILDER_H

#include "passes.h"

#include <string.h>

/* ---- hand-built graphs -------------------------------------------------------------- */

typedef struct {
    cx_graph g;
    cx_gnode nodes[32];
    int storage[96];
    int nstorage;
    int outs[8], alias[8];
} gbuild;

static inline void gb_init(gbuild *b)
{
    memset(b, 0, sizeof *b);
    b->g.nodes = b->nodes;
    b->g.input_storage = b->storage;
    b->g.outputs = b->outs;
    b->g.out_alias = b->alias;
}

/* A node of f32[shape] with inputs (graph indices); data leaves get input
 * ordinals in creation order. */
static inline int gb_node(gbuild *b, cx_op op, int nd, const int64_t *shape, int nin, const int *ins)
{
    int i = b->g.n++;
    cx_gnode *n = &b->nodes[i];
    n->op = op;
    n->dtype = CX_F32;
    n->ndim = (uint8_t)nd;
    n->numel = 1;
    for (int d = 0; d < nd; d++) { n->shape[d] = shape[d]; n->numel *= shape[d]; }
    n->ninputs = nin;
    n->inputs = b->storage + b->nstorage;
    for (int k = 0; k < nin; k++) b->storage[b->nstorage++] = ins[k];
    n->input_ordinal = op == OP_DATA ? b->g.n_inputs++ : -1;
    return i;
}

static inline void gb_attrs(gbuild *b, int i, int n, const int64_t *attrs)
{
    b->nodes[i].nattrs = n;
    memcpy(b->nodes[i].attrs, attrs, sizeof(int64_t) * (size_t)n);
}

static inline void gb_output(gbuild *b, int i, int alias)
{
    b->outs[b->g.n_outputs] = i;
    b->alias[b->g.n_outputs++] = alias;
}

#endif
