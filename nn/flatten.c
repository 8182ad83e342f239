/* Flatten: merges dims start..end into one. */
#include "nn_internal.h"

typedef struct {
    int start, end;
} flatten;

static cx_tensor *flatten_forward(cx_module *m, cx_tensor *x)
{
    const flatten *f = cx_module_impl(m);
    return cx_flatten(x, f->start, f->end);
}

static const cx_module_type flatten_type = { CX_STRUCT_SIZE(cx_module_type), .name = "Flatten", .forward = flatten_forward, .free = free };

cx_module *cx_nn_flatten(int start_dim, int end_dim)
{
    flatten *f = malloc(sizeof *f);
    if (!f) { cx_set_last_error("cx_nn_flatten: out of memory"); return NULL; }
    *f = (flatten){ start_dim, end_dim };
    return cx_module_new(&flatten_type, f);
}
