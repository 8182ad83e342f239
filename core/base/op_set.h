/* The op set: one enum of primitives and one property table (name, arity,
 * group), the vocabulary the IR, the compiler and the executor share. The
 * table is guarded by a static assert (op_table.c): adding an op without
 * describing it fails to compile. The gradient rules are a column of their
 * own one layer up (autograd/vjp_table.c), under the same guard. */
#ifndef CX_OP_SET_H
#define CX_OP_SET_H

#include "op_attrs.h"

typedef enum {
    /* leaves */
    OP_DATA = 0, OP_CONST, OP_RTSCALAR, OP_IOTA, OP_RNG,
    /* elementwise unary */
    OP_NEG, OP_EXP, OP_LOG, OP_SQRT, OP_RSQRT, OP_TANH, OP_ERF, OP_ABS, OP_SIGN, OP_CAST,
    /* GELU (erf form) and its derivative, one op each: as a composite a
     * GPT's gradient of it was ~16 program instructions over every
     * hidden value, each through the register file */
    OP_GELU, OP_GELU_GRAD,
    /* elementwise binary / ternary */
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_MIN, OP_POW, OP_LT, OP_LE, OP_EQ, OP_WHERE,
    /* reductions */
    OP_REDUCE_SUM, OP_REDUCE_MAX, OP_ARGMAX,
    /* movement */
    OP_RESHAPE, OP_PERMUTE, OP_EXPAND, OP_SLICE, OP_PAD, OP_CONCAT,
    /* contraction and friends */
    OP_MATMUL, OP_CONV2D, OP_CONV2D_BWD_INPUT, OP_CONV2D_BWD_WEIGHT,
    OP_MAXPOOL, OP_MAXPOOL_BWD, OP_AVGPOOL, OP_AVGPOOL_BWD, OP_GATHER, OP_SCATTER_ADD,
    /* fused: one kernel each, where the composite would write and re-read */
    OP_ATTENTION, OP_ATTENTION_BWD, OP_LAYER_NORM, OP_LAYER_NORM_BWD,
    /* collectives */
    OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_TO_ALL, OP_BROADCAST,
    /* a poisoned value (bad arguments somewhere upstream) */
    OP_ERROR,
    OP_COUNT
} cx_op;

typedef enum {
    G_LEAF, G_UNARY, G_BINARY, G_TERNARY, G_REDUCE, G_MOVEMENT, G_CONTRACT, G_COLLECTIVE, G_ERROR
} cx_op_group;

typedef struct {
    const char *name;
    int arity;           /* -1: variadic */
    cx_op_group group;
} cx_op_info;

extern const cx_op_info cx_op_table[OP_COUNT];

#endif
