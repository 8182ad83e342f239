/* The compiler's input: the graph of one sync as plain arrays (no pointers
 * into the IR), made by capture (capture.c), partitioned for SPMD, and
 * lowered by the passes into an executable. */
#ifndef CX_COMPILE_GRAPH_H
#define CX_COMPILE_GRAPH_H

#include "executable.h"

typedef struct {
    uint16_t op;
    uint32_t loc;            /* XLA_IR_DEBUG: the node's location (cx_node.loc) */
    uint8_t dtype, ndim;
    int64_t shape[CX_MAX_DIMS];
    int64_t numel;
    int ninputs;
    int *inputs;             /* indices into the graph */
    int nattrs;
    int64_t attrs[CX_MAX_ATTRS];
    double fval;
    int input_ordinal;       /* OP_DATA: ordinal; OP_RTSCALAR: rt ordinal */
} cx_gnode;

typedef struct cx_graph {
    int n;
    cx_gnode *nodes;         /* topological order */
    int *input_storage;
    int n_inputs, n_rts;
    int n_outputs;
    int *outputs;            /* graph index per output */
    int *out_alias;          /* input ordinal or -1 */
} cx_graph;

/* Lowers a captured graph (compile/: the passes). @return the executable or NULL (error set). */
cx_executable *cx_lower(const cx_graph *g);

#endif
