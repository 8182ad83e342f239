/* Deferred modules: counting and materializing the tensors a deferred
 * construction left without values. */
#include "nn_internal.h"

int cx_module_num_deferred(const cx_module *m)
{
    int n = 0, count = 0;
    cx_named_tensor *sd = m ? cx_module_state_dict(m, &n) : NULL;
    for (int i = 0; sd && i < n; i++) count += cx_deferred_recipe(sd[i].tensor, NULL);
    free(sd);
    return count;
}

cx_status cx_module_materialize(cx_module *m)
{
    if (!m) { cx_set_last_error("cx_module_materialize: module is NULL"); return CX_ERR_ARG; }
    int n = 0;
    cx_named_tensor *sd = cx_module_state_dict(m, &n);
    if (!sd) { cx_set_last_error("cx_module_materialize: out of memory"); return CX_ERR_OOM; }
    cx_status st = CX_OK;
    for (int i = 0; st == CX_OK && i < n; i++) {
        st = cx_deferred_materialize(sd[i].tensor);
        if (st != CX_OK) cx_set_last_error("cx_module_materialize: %s: %s", sd[i].name, cx_last_error());
    }
    free(sd);
    return st;
}
