/* FSDPv2: FSDP expressed as SPMD shardings (see fsdp.h). The wrapper only
 * annotates: parameters when it wraps, outputs through module hooks after
 * each wrapped forward; the partitioner (core/compile/partition.c) turns
 * the annotations into ZeRO-3's gathers and reduce-scatters. */
#include <cxla/fsdp.h>
#include <cxla/spmd.h>

#include "cx_struct.h"
#include "cx_vec.h"
#include "fsdp_wrap_policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    struct cx_spmd_fsdp *f;
    cx_module *m;
    char *path;
    bool ckpt, in_remat;
} wrapped;

struct cx_spmd_fsdp {
    cx_module *model;
    const cx_mesh *mesh;
    cx_spmd_fsdp_opts o;
    cx_shard_output_fn one;   /* cx_spmd_fsdp_wrap's one-tensor hook, adapted */
    void *one_arg;
    wrapped *w;               /* the picked submodules, then the root last */
    int nw, cap;
};

/* ---- shardings -------------------------------------------------------------------- */

/* The dimension a parameter of `shape` splits on: the first, or with
 * `maximal` the largest that divides by k (the first when none does). */
static int fsdp_dim(const int64_t *shape, int nd, const bool *taken, int k, bool maximal)
{
    int best = -1;
    for (int d = 0; d < nd; d++) {
        if (taken[d]) continue;
        if (!maximal) return d;
        if (shape[d] % k == 0 && (best < 0 || shape[d] > shape[best])) best = d;
    }
    for (int d = 0; best < 0 && d < nd; d++) if (!taken[d]) best = d;
    return best;
}

/* Adds "fsdp" to p's sharding on a dimension its other axes leave whole. */
static cx_status shard_param(const cx_spmd_fsdp *f, cx_tensor *p, int k)
{
    int nd = cx_ndim(p);
    if (nd == 0) return CX_OK;   /* a scalar has nothing to split */
    cx_spec_entry spec[CX_MAX_DIMS];
    const cx_mesh *cur = NULL;
    bool taken[CX_MAX_DIMS] = { false };
    int have = cx_get_sharding(p, &cur, spec, CX_MAX_DIMS);
    if (have == 0) for (int d = 0; d < nd; d++) spec[d] = CX_SPEC_NONE;
    else if (cur != f->mesh) {
        cx_set_last_error("it is sharded over another mesh than the wrapper's");
        return CX_ERR_ARG;
    }
    int fa = cx_mesh_axis_index(f->mesh, "fsdp");
    for (int d = 0; d < have; d++) {
        for (int a = 0; a < spec[d].naxes; a++) if (spec[d].axes[a] == fa) return CX_OK;   /* split already */
        taken[d] = spec[d].naxes > 0;
    }
    int d = fsdp_dim(cx_shape(p), nd, taken, k, f->o.shard_maximal);
    if (d < 0) return CX_OK;   /* every dimension split over other axes: left as it is */
    spec[d] = CX_SPEC_NAME("fsdp");
    return cx_mark_sharding(p, f->mesh, spec, nd);
}

static cx_status shard_batch_dim(cx_tensor *t, const cx_mesh *mesh)
{
    cx_spec_entry spec[CX_MAX_DIMS];
    int nd = cx_ndim(t);
    for (int d = 0; d < nd; d++) spec[d] = CX_SPEC_NONE;
    spec[0] = CX_SPEC_NAME("fsdp");
    return cx_mark_sharding(t, mesh, spec, nd);
}

/* The seed's default: a tensor, or a tuple's first element, split on its
 * first (batch) dimension; anything else is the caller's to say. */
static cx_status default_shard_output(cx_tensor **out, int n, const cx_mesh *mesh, void *arg)
{
    (void)arg;
    if (n < 1 || !out[0]) {
        cx_set_last_error("the forward gave no output to shard: pass shard_output (cx_spmd_fsdp_opts.shard_output)");
        return CX_ERR_ARG;
    }
    if (cx_ndim(out[0]) == 0) {
        cx_set_last_error("the default shards a tensor, or a tuple's first element, on its first (batch) dimension; "
                          "output 0 of %d is 0-d: pass shard_output (cx_spmd_fsdp_opts.shard_output)", n);
        return CX_ERR_ARG;
    }
    return shard_batch_dim(out[0], mesh);
}

static cx_status one_tensor_shard_output(cx_tensor **out, int n, const cx_mesh *mesh, void *arg)
{
    const cx_spmd_fsdp *f = arg;
    if (n != 1) {
        cx_set_last_error("the shard_output given to cx_spmd_fsdp_wrap takes one tensor; the forward gave %d "
                          "(use cx_spmd_fsdp_wrap_opts with a cx_shard_outputs_fn)", n);
        return CX_ERR_ARG;
    }
    return f->one(out[0], mesh, f->one_arg);
}

/* ---- hooks ------------------------------------------------------------------------- */

static void wrapped_pre(cx_module *m, void *ctx)
{
    wrapped *w = ctx;
    (void)m;
    w->in_remat = w->ckpt;
    if (w->ckpt) cx_remat_begin();
}

/* The annotation goes after the remat region: backward recomputes the
 * block, not its output's placement. */
static cx_status wrapped_outputs(cx_module *m, cx_tensor **out, int n, void *ctx)
{
    wrapped *w = ctx;
    (void)m;
    if (w->in_remat) { cx_remat_end(); w->in_remat = false; }
    for (int i = 0; i < n; i++)
        if (!out[i] || cx_tensor_error(out[i])) return CX_OK;   /* the forward's own error travels in its output */
    const cx_spmd_fsdp *f = w->f;
    if (f->o.shard_output(out, n, f->mesh, f->o.shard_output_arg) == CX_OK) return CX_OK;
    char why[512];
    snprintf(why, sizeof why, "%s", cx_last_error());
    cx_set_last_error("FSDPv2 shard_output of %s (%s): %s", *w->path ? w->path : "the root", cx_module_type_name(w->m), why);
    return CX_ERR_ARG;
}

static void wrapped_post(cx_module *m, void *ctx)
{
    wrapped *w = ctx;
    (void)m;
    if (w->in_remat) { cx_remat_end(); w->in_remat = false; }
}

/* ---- the auto-wrap policy -------------------------------------------------------------- */

static bool add_wrapped(cx_spmd_fsdp *f, cx_module *m, const char *path, bool ckpt)
{
    if (!CX_GROW(f->w, f->cap, f->nw + 1)) return false;
    char *p = strdup(path);
    if (!p) return false;
    f->w[f->nw++] = (wrapped){ f, m, p, ckpt, false };
    return true;
}

/* Children are decided before their parent, as the seed's recursive wrap:
 * the size policy counts only parameters no wrapped descendant holds, which
 * go to *unwrapped. @return false when out of memory. */
static bool find_wrapped(cx_spmd_fsdp *f, cx_module *m, const char *path, int64_t *unwrapped)
{
    *unwrapped = 0;
    for (int s = 0; s < cx_module_num_own_params(m); s++) *unwrapped += cx_numel(cx_module_param(m, s));
    for (int c = 0; c < cx_module_num_children(m); c++) {
        cx_module *ch = cx_module_child(m, c);
        char *p = cx_fsdp_join_path(path, cx_module_child_name(m, c));
        int64_t left = 0;
        bool ok = p && find_wrapped(f, ch, p, &left);
        bool wrap = cx_fsdp_listed(cx_module_type_name(ch), f->o.auto_wrap_types, f->o.n_auto_wrap_types) ||
                    (f->o.auto_wrap_min_params > 0 && left >= f->o.auto_wrap_min_params);
        if (ok && wrap) ok = add_wrapped(f, ch, p, f->o.grad_ckpt);
        else *unwrapped += left;
        free(p);
        if (!ok) return false;
    }
    return true;
}

/* ---- the wrapper --------------------------------------------------------------------- */

static cx_status shard_params(cx_spmd_fsdp *f)
{
    int n = 0, shape[CX_MESH_MAX_DIMS];
    cx_mesh_shape(f->mesh, shape);
    int k = shape[cx_mesh_axis_index(f->mesh, "fsdp")];
    cx_named_tensor *ps = cx_module_parameters(f->model, &n);
    if (!ps) return CX_ERR_OOM;   /* the module said why */
    for (int i = 0; i < n; i++) {
        if (shard_param(f, ps[i].tensor, k) == CX_OK) continue;
        char why[512];
        snprintf(why, sizeof why, "%s", cx_last_error());
        cx_set_last_error("spmd_fsdp_wrap: parameter %s: %s", ps[i].name, why);
        free(ps);
        return CX_ERR_ARG;
    }
    free(ps);
    return CX_OK;
}

cx_spmd_fsdp *cx_spmd_fsdp_wrap_opts(cx_module *model, const cx_mesh *mesh, cx_spmd_fsdp_opts opts)
{
    if (!model || !mesh) { cx_set_last_error("spmd_fsdp_wrap: model and mesh are required"); return NULL; }
    cx_spmd_fsdp_opts own = cx_spmd_fsdp_default_opts();
    if (!CX_TAKE_STRUCT("spmd_fsdp_wrap", cx_spmd_fsdp_opts, own, &opts, shard_maximal)) return NULL;
    if (!cx_is_spmd()) { cx_set_last_error("spmd_fsdp_wrap: SPMD mode is off (call cx_use_spmd first)"); return NULL; }
    if (cx_mesh_axis_index(mesh, "fsdp") < 0) {
        cx_set_last_error("spmd_fsdp_wrap: the mesh has no axis named 'fsdp', which parameters and activations shard over");
        return NULL;
    }
    if (own.auto_wrap_min_params < 0 || own.n_auto_wrap_types < 0 || (own.n_auto_wrap_types > 0 && !own.auto_wrap_types)) {
        cx_set_last_error("spmd_fsdp_wrap: auto_wrap_min_params and n_auto_wrap_types must be >= 0 (with the list given)");
        return NULL;
    }
    cx_spmd_fsdp *f = calloc(1, sizeof *f);
    if (!f) { cx_set_last_error("spmd_fsdp_wrap: out of memory"); return NULL; }
    f->model = model;
    f->mesh = mesh;
    f->o = own;
    if (!f->o.shard_output) f->o.shard_output = default_shard_output;
    int64_t left = 0;
    if (!find_wrapped(f, model, "", &left) || !add_wrapped(f, model, "", false)) {
        cx_set_last_error("spmd_fsdp_wrap: out of memory");
        cx_spmd_fsdp_free(f);
        return NULL;
    }
    if (shard_params(f) != CX_OK) { cx_spmd_fsdp_free(f); return NULL; }
    for (int i = 0; i < f->nw; i++) {
        cx_module_hooks h = { CX_STRUCT_SIZE(cx_module_hooks), .pre = wrapped_pre, .post = wrapped_post, .ctx = &f->w[i],
                              .outputs = wrapped_outputs };
        if (cx_module_add_hooks(f->w[i].m, &h) < 0) {
            char why[512];
            snprintf(why, sizeof why, "%s", cx_last_error());
            cx_set_last_error("spmd_fsdp_wrap: %s: %s", *f->w[i].path ? f->w[i].path : "the root", why);
            cx_spmd_fsdp_free(f);
            return NULL;
        }
    }
    return f;
}

cx_spmd_fsdp *cx_spmd_fsdp_wrap(cx_module *model, const cx_mesh *mesh, cx_shard_output_fn shard_output, void *arg)
{
    cx_spmd_fsdp_opts o = cx_spmd_fsdp_default_opts();
    cx_spmd_fsdp *f = cx_spmd_fsdp_wrap_opts(model, mesh, o);
    if (f && shard_output) {
        f->one = shard_output;
        f->one_arg = arg;
        f->o.shard_output = one_tensor_shard_output;
        f->o.shard_output_arg = f;
    }
    return f;
}

cx_tensor *cx_spmd_fsdp_forward(cx_spmd_fsdp *f, cx_tensor *x)
{
    if (!f) return cx_poisoned("spmd_fsdp_forward: wrapper is NULL");
    return cx_module_forward(f->model, x);
}

int cx_spmd_fsdp_forward_many(cx_spmd_fsdp *f, cx_tensor *const *in, int n_in, cx_tensor **out, int max_out)
{
    if (!f) { cx_set_last_error("spmd_fsdp_forward_many: wrapper is NULL"); return -1; }
    return cx_module_forward_many(f->model, in, n_in, out, max_out);
}

int cx_spmd_fsdp_num_wrapped(const cx_spmd_fsdp *f) { return f ? f->nw - 1 : 0; }

const char *cx_spmd_fsdp_wrapped_path(const cx_spmd_fsdp *f, int i)
{
    return f && i >= 0 && i < f->nw - 1 ? f->w[i].path : "";
}

cx_module *cx_spmd_fsdp_module(const cx_spmd_fsdp *f) { return f ? f->model : NULL; }

void cx_spmd_fsdp_free(cx_spmd_fsdp *f)
{
    if (!f) return;
    for (int i = 0; i < f->nw; i++) {
        cx_module_remove_hooks(f->w[i].m, &f->w[i]);
        free(f->w[i].path);
    }
    free(f->w);
    free(f);
}
