/* Sequential: children "0", "1", ... applied in order. */
#include "nn_internal.h"

static cx_tensor *sequential_forward(cx_module *m, cx_tensor *x)
{
    int n = cx_module_num_children(m);
    if (n == 0) return cx_alias(x);
    cx_tensor *h = x;
    for (int i = 0; i < n; i++) {
        cx_tensor *next = cx_module_forward(cx_module_child(m, i), h);
        if (h != x) cx_drop(h);   /* intermediates only, never the caller's input */
        h = next;
    }
    return h;
}

static const cx_module_type sequential_type = { CX_STRUCT_SIZE(cx_module_type), .name = "Sequential", .forward = sequential_forward };

int cx_nn_sequential_append(cx_module *seq, cx_module *c)
{
    char name[16];
    snprintf(name, sizeof name, "%d", cx_module_num_children(seq));
    return cx_module_add_child(seq, name, c);
}

cx_module *cx_nn_sequential(cx_module **mods, int n)
{
    cx_module *m = cx_module_new(&sequential_type, NULL);
    bool ok = m != NULL;
    for (int i = 0; i < n; i++) {
        if (!ok) { cx_module_free(mods[i]); continue; }
        if (!mods[i]) {
            char why[512];
            snprintf(why, sizeof why, "%s", cx_last_error());
            cx_set_last_error("cx_nn_sequential: module %d is NULL (its constructor failed%s%s)", i, why[0] ? ": " : "", why);
            ok = false;
            continue;
        }
        ok = cx_nn_sequential_append(m, mods[i]) >= 0;
    }
    if (!ok) { cx_module_free(m); return NULL; }
    return m;
}
