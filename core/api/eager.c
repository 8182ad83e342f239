/* Eager mode (XLA_USE_EAGER_DEBUG_MODE=1 at start, cx_set_eager at any step
 * boundary): every op runs as soon as it is recorded, through the same
 * compile cache and executor as lazy mode, except inside a compile region
 * (cx_compile_begin / end, torch_xla.compile), which is traced and
 * compiled as one graph. */
#include "api.h"

/* The node keeps its inputs (autograd walks them) and gains its value in
 * ->buf: capture then treats it as a device-data leaf. The value comes from
 * a one-op graph over the inputs' values, so it goes through the same
 * compile cache and executor as lazy mode. */
/* The compile region this thread has open. Per thread, as recording is:
 * the loader's thread keeps recording its leaves as before. */
static _Thread_local struct {
    bool open;
    int step_depth;   /* the step it opened in: it closes in the same one */
} t_region;

static void eager_run(cx_tensor *t)
{
    cx_node *x = t->node;
    if (t_region.open) return;   /* traced: cx_compile_end runs the region as one graph */
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

/* ---- switching at run time (torch_xla.experimental.eager_mode) ---------------------------- */

cx_status cx_set_eager(bool on)
{
    cx_obs_get();   /* the environment is read first, so it cannot undo this call later */
    int depth = cx_record()->step_depth;
    if (depth > 0) {
        cx_set_last_error("cx_set_eager: called inside an open step (depth %d); switch eager mode between steps, "
                          "after cx_step_end", depth);
        return CX_ERR_STATE;
    }
    if (t_region.open) {
        cx_set_last_error("cx_set_eager: called inside a compile region; switch eager mode after cx_compile_end");
        return CX_ERR_STATE;
    }
    cx_obs_set(OBS_EAGER, on);
    return CX_OK;
}

bool cx_is_eager(void) { return (cx_obs_get() & OBS_EAGER) != 0; }

cx_status cx_compile_begin(void)
{
    if (t_region.open) {
        cx_set_last_error("cx_compile_begin: a compile region is already open (regions do not nest; "
                          "close it with cx_compile_end)");
        return CX_ERR_STATE;
    }
    t_region.open = true;
    t_region.step_depth = cx_record()->step_depth;
    return CX_OK;
}

cx_status cx_compile_end(void)
{
    if (!t_region.open) {
        cx_set_last_error("cx_compile_end: no compile region is open (cx_compile_end without cx_compile_begin)");
        return CX_ERR_STATE;
    }
    t_region.open = false;
    int depth = cx_record()->step_depth;
    if (depth != t_region.step_depth) {
        cx_set_last_error("cx_compile_end: the region opened at step depth %d closes at depth %d; open and close a "
                          "compile region inside the same step", t_region.step_depth, depth);
        return CX_ERR_STATE;
    }
    /* what the region recorded is all that is pending in eager mode; in
     * lazy mode this is the mark_step torch_xla.compile ends with */
    return cx_materialize(NULL, 0, "user sync");
}
