/* Weight-decay masks over FSDP's flat shards, so that a parameter group
 * can decay a unit's weights and leave its biases and norms alone, as the
 * unwrapped model's groups would (PyTorch's FSDP gets this from
 * use_orig_params; here the flat shard stays one tensor and the mask says
 * which of its elements are whose). Built from the public shard metadata. */
#include "parallel_internal.h"

#include <cxla/fsdp.h>

#include <stdlib.h>
#include <string.h>

/* Unit u's shard: 1 over the elements of parameters of >= min_ndim dims,
 * 0 over the others and the padding. */
static cx_tensor *unit_mask(const cx_fsdp_unit_info *u, int min_ndim)
{
    float *m = calloc((size_t)(u->shard_numel ? u->shard_numel : 1), sizeof *m);
    if (!m) return NULL;
    int64_t lo = u->shard_offset, hi = lo + u->shard_numel;
    for (int p = 0; p < u->nparams; p++) {
        const cx_fsdp_param_info *pi = &u->params[p];
        if (pi->ndim < min_ndim) continue;
        int64_t a = pi->offset > lo ? pi->offset : lo, b = pi->offset + pi->numel < hi ? pi->offset + pi->numel : hi;
        for (int64_t i = a; i < b; i++) m[i - lo] = 1.0f;
    }
    int64_t n = u->shard_numel;
    cx_tensor *t = cx_from_host(m, &n, 1, CX_F32);
    free(m);
    return t && !cx_tensor_error(t) ? cx_persist(t) : (cx_free(t), NULL);
}

cx_tensor **cx_fsdp_decay_masks(const cx_fsdp *f, int min_ndim, int *n)
{
    *n = 0;
    int nu = 0;
    const cx_fsdp_unit_info *units = f ? cx_fsdp_shard_metadata(f, &nu) : NULL;
    if (!units) { cx_set_last_error("cx_fsdp_decay_masks: wrapper is NULL"); return NULL; }
    cx_tensor **masks = calloc((size_t)(nu ? nu : 1), sizeof *masks);
    for (int u = 0; masks && u < nu; u++) {
        if ((masks[u] = unit_mask(&units[u], min_ndim))) continue;
        for (int k = 0; k < u; k++) cx_free(masks[k]);
        free(masks);
        masks = NULL;
    }
    if (!masks) { cx_set_last_error("cx_fsdp_decay_masks: out of memory"); return NULL; }
    *n = nu;
    return masks;
}
