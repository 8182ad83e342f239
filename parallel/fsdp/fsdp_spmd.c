/* FSDPv2: FSDP expressed as SPMD shardings (see fsdp.h). The wrapper only
 * annotates; the partitioner (core/compile/partition.c) turns the
 * annotations into ZeRO-3's gathers and reduce-scatters. */
#include <cxla/fsdp.h>
#include <cxla/spmd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cx_spmd_fsdp {
    cx_module *model;
    const cx_mesh *mesh;
    cx_shard_output_fn shard_output;
    void *arg;
};

/* dim 0 over "fsdp", the rest replicated */
static cx_status shard_first_dim(cx_tensor *t, const cx_mesh *mesh)
{
    int nd = cx_ndim(t);
    if (nd == 0) return CX_OK;   /* a scalar has nothing to split */
    cx_spec_entry spec[CX_MAX_DIMS];
    for (int d = 0; d < nd; d++) spec[d] = CX_SPEC_NONE;
    spec[0] = CX_SPEC_NAME("fsdp");
    return cx_mark_sharding(t, mesh, spec, nd);
}

static cx_status default_shard_output(cx_tensor *out, const cx_mesh *mesh, void *arg)
{
    (void)arg;
    return shard_first_dim(out, mesh);
}

cx_spmd_fsdp *cx_spmd_fsdp_wrap(cx_module *model, const cx_mesh *mesh, cx_shard_output_fn shard_output, void *arg)
{
    if (!model || !mesh) { cx_set_last_error("spmd_fsdp_wrap: model and mesh are required"); return NULL; }
    if (!cx_is_spmd()) { cx_set_last_error("spmd_fsdp_wrap: SPMD mode is off (call cx_use_spmd first)"); return NULL; }
    if (cx_mesh_axis_index(mesh, "fsdp") < 0) {
        cx_set_last_error("spmd_fsdp_wrap: the mesh has no axis named 'fsdp', which parameters and activations shard over");
        return NULL;
    }
    cx_spmd_fsdp *f = calloc(1, sizeof *f);
    int n = 0;
    cx_named_tensor *ps = f ? cx_module_parameters(model, &n) : NULL;
    if (!f || !ps) {
        free(f);
        if (!ps && f) return NULL;   /* the module said why */
        cx_set_last_error("spmd_fsdp_wrap: out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (shard_first_dim(ps[i].tensor, mesh) != CX_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", cx_last_error());
            cx_set_last_error("spmd_fsdp_wrap: parameter %s: %s", ps[i].name, why);
            free(ps);
            free(f);
            return NULL;
        }
    }
    free(ps);
    *f = (cx_spmd_fsdp){ model, mesh, shard_output ? shard_output : default_shard_output, arg };
    return f;
}

cx_tensor *cx_spmd_fsdp_forward(cx_spmd_fsdp *f, cx_tensor *x)
{
    if (!f) return cx_poisoned("spmd_fsdp_forward: wrapper is NULL");
    cx_tensor *out = cx_module_forward(f->model, x);
    if (out && !cx_tensor_error(out) && f->shard_output(out, f->mesh, f->arg) != CX_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", cx_last_error());
        cx_drop(out);
        return cx_poisoned("spmd_fsdp_forward: shard_output: %s", why);
    }
    return out;
}

cx_module *cx_spmd_fsdp_module(const cx_spmd_fsdp *f) { return f ? f->model : NULL; }

void cx_spmd_fsdp_free(cx_spmd_fsdp *f) { free(f); }
