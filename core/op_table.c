/* The op property table: one row per primitive, guarded by a static assert
 * so adding an op without describing it fails to compile. */
#include "internal.h"

cx_tensor *cx_vjp_unary(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_binary(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_where(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_movement(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_reduce(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_matmul(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_conv(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_pool(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_gather(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_attention(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_layer_norm(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_collective(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);

const cx_op_info cx_op_table[OP_COUNT] = {
    [OP_DATA] = { "data", 0, G_LEAF, NULL },
    [OP_CONST] = { "constant", 0, G_LEAF, NULL },
    [OP_RTSCALAR] = { "runtime_scalar", 0, G_LEAF, NULL },
    [OP_IOTA] = { "iota", 0, G_LEAF, NULL },
    [OP_RNG] = { "rng", 2, G_LEAF, NULL },
    [OP_NEG] = { "neg", 1, G_UNARY, cx_vjp_unary },
    [OP_EXP] = { "exp", 1, G_UNARY, cx_vjp_unary },
    [OP_LOG] = { "log", 1, G_UNARY, cx_vjp_unary },
    [OP_SQRT] = { "sqrt", 1, G_UNARY, cx_vjp_unary },
    [OP_RSQRT] = { "rsqrt", 1, G_UNARY, cx_vjp_unary },
    [OP_TANH] = { "tanh", 1, G_UNARY, cx_vjp_unary },
    [OP_ERF] = { "erf", 1, G_UNARY, cx_vjp_unary },
    [OP_ABS] = { "abs", 1, G_UNARY, cx_vjp_unary },
    [OP_SIGN] = { "sign", 1, G_UNARY, cx_vjp_unary },
    [OP_CAST] = { "cast", 1, G_UNARY, cx_vjp_unary },
    [OP_ADD] = { "add", 2, G_BINARY, cx_vjp_binary },
    [OP_SUB] = { "sub", 2, G_BINARY, cx_vjp_binary },
    [OP_MUL] = { "mul", 2, G_BINARY, cx_vjp_binary },
    [OP_DIV] = { "div", 2, G_BINARY, cx_vjp_binary },
    [OP_MAX] = { "maximum", 2, G_BINARY, cx_vjp_binary },
    [OP_MIN] = { "minimum", 2, G_BINARY, cx_vjp_binary },
    [OP_POW] = { "pow", 2, G_BINARY, cx_vjp_binary },
    [OP_LT] = { "lt", 2, G_BINARY, NULL },
    [OP_LE] = { "le", 2, G_BINARY, NULL },
    [OP_EQ] = { "eq", 2, G_BINARY, NULL },
    [OP_WHERE] = { "where", 3, G_TERNARY, cx_vjp_where },
    [OP_REDUCE_SUM] = { "sum", 1, G_REDUCE, cx_vjp_reduce },
    [OP_REDUCE_MAX] = { "max", 1, G_REDUCE, cx_vjp_reduce },
    [OP_ARGMAX] = { "argmax", 1, G_REDUCE, NULL },
    [OP_RESHAPE] = { "reshape", 1, G_MOVEMENT, cx_vjp_movement },
    [OP_PERMUTE] = { "permute", 1, G_MOVEMENT, cx_vjp_movement },
    [OP_EXPAND] = { "expand", 1, G_MOVEMENT, cx_vjp_movement },
    [OP_SLICE] = { "slice", 1, G_MOVEMENT, cx_vjp_movement },
    [OP_PAD] = { "pad", 1, G_MOVEMENT, cx_vjp_movement },
    [OP_CONCAT] = { "concat", -1, G_MOVEMENT, cx_vjp_movement },
    [OP_MATMUL] = { "matmul", 2, G_CONTRACT, cx_vjp_matmul },
    [OP_CONV2D] = { "conv2d", 2, G_CONTRACT, cx_vjp_conv },
    [OP_CONV2D_BWD_INPUT] = { "conv2d_bwd_input", 2, G_CONTRACT, NULL },
    [OP_CONV2D_BWD_WEIGHT] = { "conv2d_bwd_weight", 2, G_CONTRACT, NULL },
    [OP_MAXPOOL] = { "max_pool2d", 1, G_CONTRACT, cx_vjp_pool },
    [OP_MAXPOOL_BWD] = { "max_pool2d_bwd", 2, G_CONTRACT, NULL },
    [OP_AVGPOOL] = { "avg_pool2d", 1, G_CONTRACT, cx_vjp_pool },
    [OP_AVGPOOL_BWD] = { "avg_pool2d_bwd", 1, G_CONTRACT, NULL },
    [OP_GATHER] = { "gather", 2, G_CONTRACT, cx_vjp_gather },
    [OP_SCATTER_ADD] = { "scatter_add", 3, G_CONTRACT, cx_vjp_gather },
    [OP_ATTENTION] = { "attention", 3, G_CONTRACT, cx_vjp_attention },
    [OP_ATTENTION_BWD] = { "attention_bwd", 5, G_CONTRACT, NULL },
    [OP_LAYER_NORM] = { "layer_norm", 3, G_CONTRACT, cx_vjp_layer_norm },
    [OP_LAYER_NORM_BWD] = { "layer_norm_bwd", 3, G_CONTRACT, NULL },
    [OP_ALL_REDUCE] = { "all_reduce", 1, G_COLLECTIVE, cx_vjp_collective },
    [OP_ALL_GATHER] = { "all_gather", 1, G_COLLECTIVE, cx_vjp_collective },
    [OP_REDUCE_SCATTER] = { "reduce_scatter", 1, G_COLLECTIVE, cx_vjp_collective },
    [OP_ALL_TO_ALL] = { "all_to_all", 1, G_COLLECTIVE, cx_vjp_collective },
    [OP_BROADCAST] = { "broadcast", 1, G_COLLECTIVE, cx_vjp_collective },
    [OP_ERROR] = { "error", 0, G_ERROR, NULL },
};

_Static_assert(OP_COUNT == 55, "update cx_op_table (and the executor) when adding an op");
