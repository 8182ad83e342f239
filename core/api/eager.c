/* Eager debug mode (XLA_USE_EAGER_DEBUG_MODE=1): every op runs as soon as it
 * is recorded, through the same compile cache and executor as lazy mode. */
#include "api.h"

/* The node keeps its inputs (autograd walks them) and gains its value in
 * ->buf: capture then treats it as a device-data leaf. The value comes from
 * a one-op graph over the inputs' values, so it goes through the same
 * compile cache and executor as lazy mode. */
static void eager_run(cx_tensor *t)
{
    cx_node *x = t->node;
    if (x->buf || x->op == OP_ERROR || cx_op_table[x->op].group == G_LEAF) return;
    cx_node *small[8];
    cx_node **ins = x->ninputs <= 8 ? small : malloc(sizeof *ins * (size_t)x->ninputs);
    if (!ins) return;   /* stays lazy: same result later */
    bool ok = true;
    for (int i = 0; i < x->ninputs; i++) {
        cx_node *c = x->inputs[i];
        /* every value input, device data included, is wrapped in a fresh
         * leaf: the capture below then never marks the caller's nodes, which
         * matters because cx_backward keeps its walk state in them while its
         * VJP rules record (and here run) new ops */
        if (c->buf) {
            cx_buffer_ref(c->buf);
            ins[i] = cx_node_data(c->buf, (cx_dtype)c->dtype, c->shape, c->ndim);
            if (!ins[i]) { cx_buffer_unref(c->buf); ok = false; }
        } else {
            cx_node_ref(c);
            ins[i] = c;
        }
        if (!ok) { for (int k = 0; k < i; k++) cx_node_unref(ins[k]); break; }
    }
    if (ok) {
        cx_node_desc d = { .op = (cx_op)x->op, .dtype = (cx_dtype)x->dtype, .ndim = x->ndim, .shape = x->shape,
                           .ninputs = x->ninputs, .inputs = ins, .nattrs = x->nattrs, .attrs = x->attrs,
                           .fval = x->fval, .flags = x->flags & NF_PINNED };
        cx_node *y = cx_node_make(&d);
        for (int i = 0; i < x->ninputs; i++) cx_node_unref(ins[i]);
        if (y) {
            cx_tensor *tmp = cx_tensor_wrap(y);
            if (tmp && cx_materialize(&tmp, 1, "eager") == CX_OK && tmp->node->op == OP_DATA && !x->buf) {
                x->buf = tmp->node->buf;
                cx_buffer_ref(x->buf);
            }
            cx_free(tmp);
        }
    }
    if (ins != small) free(ins);
}

/* Recording (ops/) hands each op to the hook; filled here, at load time,
 * so the ops layer never calls up into sync. */
__attribute__((constructor)) static void register_eager(void) { cx_eager_hook = eager_run; }
