/* What a save or load works on: the public model handles (a module, or an
 * FSDP wrapper) seen as one view, with an owned copy of the FSDP layout. */
#include "ckpt_internal.h"

#include "cx_struct.h"

#include <stdlib.h>
#include <string.h>

cx_status ckpt_take_opts(cx_ckpt_opts *opts, const char *fn)
{
    cx_ckpt_opts own = cx_ckpt_default_opts();
    if (!CX_TAKE_STRUCT(fn, cx_ckpt_opts, own, opts, verify)) return CX_ERR_ARG;
    *opts = own;
    return CX_OK;
}

cx_ckpt_model cx_ckpt_model_single(cx_module *m) { return (cx_ckpt_model){ CX_CKPT_SINGLE, m, NULL }; }
cx_ckpt_model cx_ckpt_model_ddp(cx_module *m) { return (cx_ckpt_model){ CX_CKPT_DDP, m, NULL }; }
cx_ckpt_model cx_ckpt_model_spmd(cx_module *m) { return (cx_ckpt_model){ CX_CKPT_SPMD, m, NULL }; }
cx_ckpt_model cx_ckpt_model_fsdp(cx_fsdp *f, bool zero3)
{
    return (cx_ckpt_model){ zero3 ? CX_CKPT_FSDP_ZERO3 : CX_CKPT_FSDP_ZERO2, NULL, f };
}

const char *cx_ckpt_strategy_name(cx_ckpt_strategy s)
{
    switch (s) {
    case CX_CKPT_SINGLE: return "none";
    case CX_CKPT_DDP: return "ddp";
    case CX_CKPT_FSDP_ZERO2: return "fsdp-zero2";
    case CX_CKPT_FSDP_ZERO3: return "fsdp-zero3";
    case CX_CKPT_SPMD: return "spmd";
    }
    return "unknown";
}

void ckpt_view_release(ckpt_view *v)
{
    if (!v) return;
    ckpt_units_free(v->units, v->nunits);
    free(v->flat);
    memset(v, 0, sizeof *v);
}

/* @return 0, or -1 when out of memory (u is then freed by the caller). */
static int copy_unit(ckpt_unit *u, const cx_fsdp_unit_info *x)
{
    u->path = strdup(x->path ? x->path : "");
    u->flat_name = strdup(x->flat_name ? x->flat_name : "flat_param");
    u->params = calloc((size_t)(x->nparams ? x->nparams : 1), sizeof *u->params);
    if (!u->path || !u->flat_name || !u->params) return -1;
    u->nparams = x->nparams;
    for (int p = 0; p < x->nparams; p++) {
        ckpt_pinfo *pi = &u->params[p];
        pi->name = strdup(x->params[p].name);
        if (!pi->name) return -1;
        pi->ndim = x->params[p].ndim;
        memcpy(pi->shape, x->params[p].shape, sizeof pi->shape);
        pi->numel = x->params[p].numel;
        pi->offset = x->params[p].offset;
    }
    u->flat_numel = x->flat_numel;
    u->padded_numel = x->padded_numel;
    u->shard_numel = x->shard_numel;
    u->padding = x->padding;
    u->world = x->world_size;
    u->rank = x->rank;
    u->shard_offset = x->shard_offset;
    return 0;
}

/* The local shard of unit i: the flat parameter named after the unit, else
 * the one at the unit's position. */
static cx_tensor *shard_of(const ckpt_unit *u, int i, const cx_named_tensor *flat, int nflat)
{
    for (int k = 0; k < nflat; k++)
        if (flat[k].name && !strcmp(flat[k].name, u->flat_name)) return flat[k].tensor;
    return i < nflat ? flat[i].tensor : NULL;
}

static cx_status view_of_fsdp(cx_fsdp *f, ckpt_view *v)
{
    v->sharded = true;
    v->module = cx_fsdp_module(f);
    int nu = 0, nflat = 0;
    const cx_fsdp_unit_info *info = cx_fsdp_shard_metadata(f, &nu);
    cx_named_tensor *flat = cx_fsdp_parameters(f, &nflat);
    v->units = calloc((size_t)(nu ? nu : 1), sizeof *v->units);
    v->flat = calloc((size_t)(nu ? nu : 1), sizeof *v->flat);
    cx_status st = flat && v->units && v->flat ? CX_OK : CX_ERR_OOM;
    if (st == CX_OK) v->nunits = nu;
    for (int i = 0; i < nu && st == CX_OK; i++) {
        ckpt_unit *u = &v->units[i];
        if (copy_unit(u, &info[i]) < 0) {
            st = CX_ERR_OOM;
            break;
        }
        v->flat[i] = shard_of(u, i, flat, nflat);
        if (!v->flat[i] || cx_numel(v->flat[i]) != u->shard_numel) {
            cx_set_last_error("checkpoint: FSDP unit %s has no local shard of %lld elements", u->flat_name,
                              (long long)u->shard_numel);
            st = CX_ERR_STATE;
        }
    }
    if (st == CX_ERR_OOM) cx_set_last_error("checkpoint: out of memory describing the FSDP shards");
    free(flat);
    if (st != CX_OK) ckpt_view_release(v);
    return st;
}

cx_status ckpt_view_of(cx_ckpt_model m, ckpt_view *v)
{
    memset(v, 0, sizeof *v);
    v->strategy = m.strategy;
    if (m.strategy == CX_CKPT_SINGLE || m.strategy == CX_CKPT_DDP || m.strategy == CX_CKPT_SPMD) {
        if (!m.module) {
            cx_set_last_error("checkpoint: no module given");
            return CX_ERR_ARG;
        }
        v->module = m.module;
        v->spmd = m.strategy == CX_CKPT_SPMD;
        return CX_OK;
    }
    if (m.strategy != CX_CKPT_FSDP_ZERO2 && m.strategy != CX_CKPT_FSDP_ZERO3) {
        cx_set_last_error("checkpoint: unknown strategy %d", (int)m.strategy);
        return CX_ERR_ARG;
    }
    if (!m.fsdp) {
        cx_set_last_error("checkpoint: no FSDP wrapper given");
        return CX_ERR_ARG;
    }
    return view_of_fsdp(m.fsdp, v);
}
