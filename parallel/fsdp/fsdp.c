/* FSDP (ZeRO-2 / ZeRO-3) over the lazy core.
 *
 * A unit's forward pre-hook all-gathers its flat shard (a pinned collective)
 * and points the module's parameter slots at views of the gathered flat
 * parameter; the post-hook puts the value-less placeholders back. Autograd
 * does the rest: the all-gather's VJP is a reduce-scatter (scaled by
 * 1/world), so each shard's grad receives the mean gradient of its slice.
 * ZeRO-3 records the gather and its views in a rematerialization region:
 * backward gets a fresh, pinned all-gather, so the forward's gathered
 * parameters die right after the unit's forward. ZeRO-2 reuses the forward's
 * gathered parameters in backward. */
#include "fsdp_wrap_policy.h"
#include "parallel_internal.h"
#include <cxla/fsdp.h>

#include "cx_sbuf.h"
#include "cx_struct.h"
#include "cx_vec.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    cx_module *owner;         /* module holding the parameter slot */
    int slot;
    cx_tensor *placeholder;   /* value-less, shape only */
} param_ref;

typedef struct unit {
    struct cx_fsdp *f;
    cx_module *m;
    char *path;
    char *flat_name;
    int nparams, cap_refs, cap_info;
    param_ref *refs;
    cx_fsdp_param_info *info;
    cx_tensor *shard;         /* persistent, requires grad: what the optimizer sees */
    cx_fsdp_unit_info meta;
    bool grad_ckpt;
    cx_tensor *acc;           /* no_sync: its grad holds the unsharded accumulated gradient */
} unit;

struct cx_fsdp {
    cx_module *root;
    cx_fsdp_opts o;
    unit *units;
    int nunits, cap;
    cx_fsdp_unit_info *meta;
    int world, rank;
    int no_sync;
};

/* ---- hooks ----------------------------------------------------------------------- */

/* The unit's whole flat parameter, in compute_dtype, and the way its
 * gradient goes back to the shard. */
static cx_tensor *gather(unit *u)
{
    const cx_fsdp *f = u->f;
    bool bf16 = f->o.compute_dtype == CX_BF16;
    cx_tensor *src = bf16 ? cx_cast(u->shard, CX_BF16) : cx_alias(u->shard);
    cx_tensor *full;
    if (f->no_sync || (bf16 && f->o.fp32_reduce_scatter)) {
        /* backward stops at the gathered value: its gradient accumulates,
         * unsharded and in f32, in acc's grad, which cx_fsdp_backward
         * reduce-scatters (no_sync: at the first synced backward) */
        cx_no_grad_begin();
        cx_tensor *g = cx_all_gather(src, 0, NULL, true);
        cx_no_grad_end();
        full = cx_grad_tap(g, u->acc);
        cx_free(g);
    } else {
        /* the gather's gradient is the reduce-scatter (bf16: in bf16, then the cast's back to f32) */
        full = cx_all_gather_grad_scaled(src, 0, NULL, true, 1.0 / f->world);
    }
    cx_free(src);
    return full;
}

static void unit_pre(cx_module *m, void *ctx)
{
    unit *u = ctx;
    (void)m;
    bool zero3 = u->f->o.reshard_after_forward;
    if (zero3) cx_remat_begin();
    cx_tensor *full = gather(u);
    for (int i = 0; i < u->nparams; i++) {
        cx_fsdp_param_info *pi = &u->info[i];
        cx_tensor *piece = cx_slice(full, 0, pi->offset, pi->offset + pi->numel, 1);
        cx_tensor *view = cx_reshape(piece, pi->shape, pi->ndim);
        cx_free(piece);
        cx_module_set_param(u->refs[i].owner, u->refs[i].slot, view);
    }
    cx_free(full);
    if (zero3) cx_remat_end();
    if (u->grad_ckpt) cx_remat_begin();
}

static void unit_post(cx_module *m, void *ctx)
{
    unit *u = ctx;
    (void)m;
    if (u->grad_ckpt) cx_remat_end();
    /* persistent: the module keeps these past the step */
    for (int i = 0; i < u->nparams; i++)
        cx_module_set_param(u->refs[i].owner, u->refs[i].slot, cx_persist(cx_alias(u->refs[i].placeholder)));
}

/* ---- unit discovery ------------------------------------------------------------------ */

static unit *add_unit(cx_fsdp *f, cx_module *m, const char *path)
{
    if (!CX_GROW(f->units, f->cap, f->nunits + 1)) return NULL;
    unit *u = &f->units[f->nunits++];
    memset(u, 0, sizeof *u);
    u->f = f;
    u->m = m;
    u->path = strdup(path);
    return u->path ? u : NULL;
}

/* Children that become their own units: listed paths, listed type names, or
 * subtrees with at least min params. Depth-first, so inner units come
 * before the units that contain them. */
static bool find_units(cx_fsdp *f, cx_module *m, const char *path)
{
    for (int c = 0; c < cx_module_num_children(m); c++) {
        cx_module *ch = cx_module_child(m, c);
        char *p = cx_fsdp_join_path(path, cx_module_child_name(m, c));
        if (!p) return false;
        bool ok = find_units(f, ch, p);
        bool wrap = cx_fsdp_listed(p, f->o.wrap_paths, f->o.n_wrap_paths) ||
                    cx_fsdp_listed(cx_module_type_name(ch), f->o.auto_wrap_types, f->o.n_auto_wrap_types) ||
                    (f->o.auto_wrap_min_params > 0 && cx_module_num_params(ch) >= f->o.auto_wrap_min_params);
        if (ok && wrap && cx_module_num_params(ch) > 0) ok = add_unit(f, ch, p) != NULL;
        free(p);
        if (!ok) return false;
    }
    return true;
}

static bool is_unit_module(const cx_fsdp *f, const cx_module *m)
{
    for (int i = 0; i < f->nunits; i++) if (f->units[i].m == m) return true;
    return false;
}

/* Whether the unit holds `t` already: a tied parameter's later slot. The
 * unit keeps one ref, its first (state-dict order, as the module lists
 * it); setting that slot sets the shared value, which the later slots see. */
static bool unit_holds(const unit *u, const cx_tensor *t)
{
    for (int i = 0; i < u->nparams; i++)
        if (cx_module_param(u->refs[i].owner, u->refs[i].slot) == t) return true;
    return false;
}

/* Parameters a unit owns: its subtree's, minus nested units' subtrees. */
static bool collect_params(cx_fsdp *f, unit *u, cx_module *m, const char *path, bool top)
{
    if (!top && is_unit_module(f, m)) return true;
    for (int s = 0; s < cx_module_num_own_params(m); s++) {
        cx_tensor *t = cx_module_param(m, s);
        if (unit_holds(u, t)) continue;
        if (!CX_GROW(u->refs, u->cap_refs, u->nparams + 1) || !CX_GROW(u->info, u->cap_info, u->nparams + 1))
            return false;
        cx_fsdp_param_info *pi = &u->info[u->nparams];
        memset(pi, 0, sizeof *pi);
        pi->name = cx_fsdp_join_path(path, cx_module_param_name(m, s));
        if (!pi->name) return false;
        pi->ndim = cx_ndim(t);
        memcpy(pi->shape, cx_shape(t), sizeof(int64_t) * (size_t)pi->ndim);
        pi->numel = cx_numel(t);
        u->refs[u->nparams] = (param_ref){ m, s, NULL };
        u->nparams++;
    }
    for (int c = 0; c < cx_module_num_children(m); c++) {
        char *p = cx_fsdp_join_path(path, cx_module_child_name(m, c));
        if (!p) return false;
        bool ok = collect_params(f, u, cx_module_child(m, c), p, false);
        free(p);
        if (!ok) return false;
    }
    return true;
}

/* ---- ties across units ------------------------------------------------------------------- */

typedef struct {
    const cx_tensor *t;
    int unit, param;
} flat_slot;

static int by_tensor(const void *a, const void *b)
{
    const flat_slot *x = a, *y = b;
    if (x->t != y->t) return (uintptr_t)x->t < (uintptr_t)y->t ? -1 : 1;
    return x->unit != y->unit ? x->unit - y->unit : x->param - y->param;
}

/* A tied parameter lives in one flat parameter: if two units each held it,
 * each would shard, gather and update its own copy and the tie would come
 * apart after the first step. Both uses must be in one unit.
 * @return CX_OK, CX_ERR_ARG naming both names and units, CX_ERR_OOM. */
static cx_status check_ties(cx_fsdp *f)
{
    int total = 0;
    for (int i = 0; i < f->nunits; i++) total += f->units[i].nparams;
    flat_slot *all = malloc(sizeof *all * (size_t)(total ? total : 1));
    if (!all) { cx_set_last_error("fsdp_wrap: out of memory"); return CX_ERR_OOM; }
    int k = 0;
    for (int i = 0; i < f->nunits; i++)
        for (int p = 0; p < f->units[i].nparams; p++)
            all[k++] = (flat_slot){ cx_module_param(f->units[i].refs[p].owner, f->units[i].refs[p].slot), i, p };
    qsort(all, (size_t)total, sizeof *all, by_tensor);
    cx_status st = CX_OK;
    for (int i = 1; i < total && st == CX_OK; i++) {
        if (all[i].t != all[i - 1].t) continue;
        const unit *a = &f->units[all[i - 1].unit], *b = &f->units[all[i].unit];
        cx_set_last_error("fsdp_wrap: %s (FSDP unit %s) and %s (unit %s) are one tied parameter; a tied parameter "
                          "must be used inside one unit: wrap the modules sharing it in the same unit",
                          a->info[all[i - 1].param].name, a->path[0] ? a->path : "(root)",
                          b->info[all[i].param].name, b->path[0] ? b->path : "(root)");
        st = CX_ERR_ARG;
    }
    free(all);
    return st;
}

/* ---- wrap ------------------------------------------------------------------------------- */

/* The flat parameter is padded to a multiple of world * this. */
static int64_t shard_multiple(const cx_fsdp *f)
{
    return f->o.shard_size_multiple > 0 ? f->o.shard_size_multiple : 1;
}

/* What every rank must wrap alike beyond the model itself: the units (their
 * parameters follow from the model and the unit paths) and what sizes the
 * collectives; appended to the module signature, in its "entry;" form. */
static char *wrap_entries(const cx_fsdp *f)
{
    char *deferred = cx_deferred_entries(f->root);
    if (!deferred) return NULL;
    cx_sbuf b = { 0 };
    for (int i = 0; i < f->nunits; i++)
        cx_sb_printf(&b, "fsdp unit %s: zero%d, shard multiple %lld;", f->units[i].path[0] ? f->units[i].path : "(root)",
                     f->o.reshard_after_forward ? 3 : 2, (long long)shard_multiple(f));
    cx_sb_printf(&b, "%s", deferred);
    free(deferred);
    return cx_sb_finish(&b);
}

/* Buffers stay whole on every rank: deferred ones get their values now. */
static cx_status materialize_buffers(cx_module *m)
{
    int n = 0;
    cx_named_tensor *bufs = cx_module_buffers(m, &n);
    if (!bufs) { cx_set_last_error("fsdp_wrap: out of memory"); return CX_ERR_OOM; }
    cx_status st = CX_OK;
    for (int i = 0; st == CX_OK && i < n; i++) st = cx_deferred_materialize(bufs[i].tensor);
    free(bufs);
    return st;
}

/* Elements [a, b) of parameter i of u, flattened: generated from its
 * recipe when deferred (no rank ever makes the whole), else a view. */
static cx_tensor *param_piece(const unit *u, int i, int64_t a, int64_t b)
{
    cx_tensor *p = cx_module_param(u->refs[i].owner, u->refs[i].slot);
    cx_init_recipe r;
    if (cx_deferred_recipe(p, &r)) return cx_init_range(&r, a, b - a, CX_F32);
    int64_t all = -1;
    cx_tensor *flat = cx_reshape(p, &all, 1);
    cx_tensor *piece = cx_slice(flat, 0, a, b, 1);
    cx_free(flat);
    return piece;
}

/* One rendezvous on the model and its wrapping, then rank 0's values. */
static cx_status take_master_model(cx_fsdp *f)
{
    char *extra = wrap_entries(f);
    if (!extra) { cx_set_last_error("fsdp_wrap: out of memory"); return CX_ERR_OOM; }
    cx_status st = materialize_buffers(f->root);
    if (st == CX_OK) st = cx_agree_on_module(f->root, extra, "fsdp_wrap");
    free(extra);
    return st == CX_OK ? cx_take_master_state(f->root, "fsdp_wrap") : st;
}

static cx_status shard_unit(cx_fsdp *f, unit *u)
{
    int64_t total = 0;
    for (int i = 0; i < u->nparams; i++) { u->info[i].offset = total; total += u->info[i].numel; }
    int64_t mult = (int64_t)f->world * shard_multiple(f);
    int64_t padded = (total + mult - 1) / mult * mult;
    if (padded == 0) padded = mult;
    int64_t shard = padded / f->world;
    /* this rank's range [s0, s1) of the flat parameter, built from the
     * overlapping pieces only: no rank ever materializes the whole unit */
    int64_t s0 = shard * f->rank, s1 = s0 + shard;
    cx_tensor **pieces = malloc(sizeof *pieces * (size_t)(u->nparams + 1));
    if (!pieces) { cx_set_last_error("fsdp_wrap: out of memory"); return CX_ERR_OOM; }
    int k = 0;
    for (int i = 0; i < u->nparams; i++) {
        int64_t lo = u->info[i].offset, hi = lo + u->info[i].numel;
        int64_t a = lo > s0 ? lo : s0, b = hi < s1 ? hi : s1;
        if (a < b) pieces[k++] = param_piece(u, i, a - lo, b - lo);
    }
    int64_t pad_lo = total > s0 ? total : s0;
    if (s1 > pad_lo) {
        int64_t pad = s1 - pad_lo;
        pieces[k++] = cx_zeros(&pad, 1, CX_F32);
    }
    cx_tensor *mine = k == 1 ? cx_alias(pieces[0]) : cx_concat(pieces, k, 0);
    u->shard = cx_persist(cx_alias(mine));
    for (int i = 0; i < k; i++) cx_free(pieces[i]);
    free(pieces);
    cx_free(mine);
    cx_status st = cx_sync_tensors(&u->shard, 1);
    if (st != CX_OK) return st;
    u->acc = cx_placeholder(&padded, 1, CX_F32);
    cx_requires_grad(u->shard, true);
    cx_set_name(u->shard, u->flat_name);
    /* the full values now live sharded: the module keeps shapes only */
    for (int i = 0; i < u->nparams; i++) {
        u->refs[i].placeholder = cx_placeholder(u->info[i].shape, u->info[i].ndim, CX_F32);
        cx_module_set_param(u->refs[i].owner, u->refs[i].slot, cx_alias(u->refs[i].placeholder));
    }
    u->meta = (cx_fsdp_unit_info){ .path = u->path, .flat_name = u->flat_name, .nparams = u->nparams, .params = u->info,
                                   .flat_numel = total, .padded_numel = padded, .shard_numel = shard,
                                   .padding = padded - total, .world_size = f->world, .rank = f->rank,
                                   .shard_offset = shard * f->rank };
    return CX_OK;
}

/* Everything a unit holds; its module keeps whatever is in its slots. */
static void unit_release(unit *u)
{
    cx_module_remove_hooks(u->m, u);
    for (int k = 0; k < u->nparams; k++) {
        cx_free(u->refs[k].placeholder);
        free((char *)u->info[k].name);
    }
    cx_free(u->shard);
    cx_free(u->acc);
    free(u->refs);
    free(u->info);
    free(u->path);
    free(u->flat_name);
}

cx_fsdp *cx_fsdp_wrap(cx_module *m, cx_fsdp_opts opts)
{
    if (!m) { cx_set_last_error("fsdp_wrap: module is NULL"); return NULL; }
    cx_fsdp_opts own_opts = cx_fsdp_default_opts();
    if (!CX_TAKE_STRUCT("fsdp_wrap", cx_fsdp_opts, own_opts, &opts, grad_ckpt)) return NULL;
    opts = own_opts;
    if (opts.shard_size_multiple < 0 || opts.auto_wrap_min_params < 0) {
        cx_set_last_error("fsdp_wrap: shard_size_multiple and auto_wrap_min_params must be >= 0");
        return NULL;
    }
    if (opts.compute_dtype != CX_F32 && opts.compute_dtype != CX_BF16) {
        cx_set_last_error("fsdp_wrap: compute_dtype %s: want f32 or bf16", cx_dtype_name(opts.compute_dtype));
        return NULL;
    }
    cx_fsdp *f = calloc(1, sizeof *f);
    if (!f) { cx_set_last_error("fsdp_wrap: out of memory"); return NULL; }
    f->root = m;
    f->o = opts;
    f->world = cx_world_size();
    f->rank = cx_global_ordinal();
    bool ok = find_units(f, m, "") && add_unit(f, m, "");
    for (int i = 0; ok && i < f->nunits; i++) {
        unit *u = &f->units[i];
        ok = collect_params(f, u, u->m, u->path, true);
        u->flat_name = cx_fsdp_join_path(u->path, "flat_param");
        if (!u->flat_name) ok = false;
        u->grad_ckpt = opts.grad_ckpt;
    }
    if (!ok) { cx_set_last_error("fsdp_wrap: out of memory"); cx_fsdp_free(f); return NULL; }
    /* units that own no parameters (all nested) are dropped */
    int k = 0;
    for (int i = 0; i < f->nunits; i++) {
        if (f->units[i].nparams > 0) f->units[k++] = f->units[i];
        else unit_release(&f->units[i]);
    }
    f->nunits = k;
    /* after the agreement, which includes the ties: every rank decides alike */
    if (take_master_model(f) != CX_OK || check_ties(f) != CX_OK) { cx_fsdp_free(f); return NULL; }
    for (int i = 0; i < f->nunits; i++)
        if (shard_unit(f, &f->units[i]) != CX_OK) { cx_fsdp_free(f); return NULL; }
    f->meta = calloc((size_t)f->nunits + 1, sizeof *f->meta);
    if (!f->meta) { cx_set_last_error("fsdp_wrap: out of memory"); cx_fsdp_free(f); return NULL; }
    for (int i = 0; i < f->nunits; i++) {
        f->meta[i] = f->units[i].meta;
        cx_module_hooks h = { CX_STRUCT_SIZE(cx_module_hooks), .pre = unit_pre, .post = unit_post, .ctx = &f->units[i] };
        if (cx_module_add_hooks(f->units[i].m, &h) < 0) { cx_fsdp_free(f); return NULL; }
    }
    return f;
}

void cx_fsdp_free(cx_fsdp *f)
{
    if (!f) return;
    for (int i = 0; i < f->nunits; i++) unit_release(&f->units[i]);
    free(f->units);
    free(f->meta);
    free(f);
}

cx_module *cx_fsdp_module(cx_fsdp *f) { return f ? f->root : NULL; }
cx_tensor *cx_fsdp_forward(cx_fsdp *f, cx_tensor *x) { return cx_module_forward(f ? f->root : NULL, x); }

int cx_fsdp_forward_many(cx_fsdp *f, cx_tensor *const *in, int n_in, cx_tensor **out, int max_out)
{
    return cx_module_forward_many(f ? f->root : NULL, in, n_in, out, max_out);
}

cx_status cx_fsdp_backward(cx_fsdp *f, cx_tensor *loss)
{
    if (!f) { cx_set_last_error("fsdp_backward: wrapper is NULL"); return CX_ERR_ARG; }
    cx_status st = cx_backward(loss);
    if (st != CX_OK || f->no_sync) return st;
    /* the first synced backward after no_sync: reduce-scatter what the
     * micro-batches accumulated, onto this one's shard gradient */
    for (int i = 0; i < f->nunits; i++) {
        unit *u = &f->units[i];
        cx_tensor *acc = cx_grad(u->acc);
        if (!acc) continue;
        cx_tensor *part = cx_reduce_scatter(acc, CX_RED_SUM, 1.0 / f->world, 0, NULL, true);
        cx_tensor *g = cx_grad(u->shard);
        if (g) {
            cx_tensor *sum = cx_add(g, part);
            st = cx_assign(g, sum);
            cx_free(sum);
        } else {
            cx_set_grad(u->shard, part);
        }
        cx_free(part);
        cx_zero_grad(u->acc);
        if (st != CX_OK) return st;
    }
    return CX_OK;
}

void cx_fsdp_no_sync_begin(cx_fsdp *f) { if (f) f->no_sync++; }
void cx_fsdp_no_sync_end(cx_fsdp *f) { if (f && f->no_sync > 0) f->no_sync--; }

cx_named_tensor *cx_fsdp_parameters(const cx_fsdp *f, int *n)
{
    *n = 0;
    if (!f) return NULL;
    cx_named_tensor *ts = calloc((size_t)f->nunits + 1, sizeof *ts);
    if (!ts) return NULL;
    for (int i = 0; i < f->nunits; i++) ts[i] = (cx_named_tensor){ f->units[i].flat_name, f->units[i].shard };
    *n = f->nunits;
    return ts;
}

const cx_fsdp_unit_info *cx_fsdp_shard_metadata(const cx_fsdp *f, int *nunits)
{
    *nunits = f ? f->nunits : 0;
    return f ? f->meta : NULL;
}

cx_tensor *cx_fsdp_clip_grad_norm(cx_fsdp *f, double max_norm)
{
    if (!f || !(max_norm > 0)) return cx_poisoned("fsdp_clip_grad_norm: bad arguments (max_norm %g)", max_norm);
    cx_tensor *acc = NULL;
    for (int i = 0; i < f->nunits; i++) {
        cx_tensor *g = cx_grad(f->units[i].shard);
        if (!g) continue;
        cx_tensor *sq = cx_mul(g, g);
        cx_tensor *s = cx_sum(sq, NULL, 0, false);
        cx_free(sq);
        if (acc) { cx_tensor *t = cx_add(acc, s); cx_free(acc); cx_free(s); acc = t; }
        else acc = s;
    }
    if (!acc) return cx_scalar(0.0, CX_F32);
    /* padding is zero in every shard's grad: the global sum is exact */
    cx_tensor *total = cx_all_reduce(acc, CX_RED_SUM, 1.0, NULL, true);
    cx_tensor *norm = cx_sqrt(total);
    cx_tensor *den = cx_add_scalar(norm, 1e-6);
    cx_tensor *mx = cx_scalar(max_norm, CX_F32);
    cx_tensor *coef = cx_div(mx, den);
    cx_tensor *one = cx_scalar(1.0, CX_F32);
    cx_tensor *c = cx_minimum(coef, one);
    for (int i = 0; i < f->nunits; i++) {
        cx_tensor *g = cx_grad(f->units[i].shard);
        if (!g) continue;
        cx_tensor *ng = cx_mul(g, c);
        cx_assign(g, ng);
        cx_free(ng);
    }
    cx_free(acc); cx_free(total); cx_free(den); cx_free(mx); cx_free(coef); cx_free(one); cx_free(c);
    return norm;
}

/* ---- state dicts --------------------------------------------------------------------------- */

cx_status cx_fsdp_full_state_dict(cx_fsdp *f, cx_fsdp_tensor_fn fn, void *ctx)
{
    if (!f || !fn) { cx_set_last_error("fsdp_full_state_dict: NULL argument"); return CX_ERR_ARG; }
    cx_status st = CX_OK;
    for (int i = 0; i < f->nunits && st == CX_OK; i++) {
        unit *u = &f->units[i];
        /* one unit at a time: only this unit is ever whole */
        cx_no_grad_begin();
        cx_tensor *full = cx_all_gather(u->shard, 0, NULL, true);
        cx_no_grad_end();
        float *h = malloc(sizeof(float) * (size_t)u->meta.padded_numel);
        if (!h) { cx_free(full); cx_set_last_error("fsdp_full_state_dict: out of memory"); return CX_ERR_OOM; }
        st = cx_to_host(full, h, CX_F32);
        cx_free(full);
        for (int k = 0; st == CX_OK && k < u->nparams && f->rank == 0; k++)
            st = fn(ctx, u->info[k].name, u->info[k].shape, u->info[k].ndim, h + u->info[k].offset);
        free(h);
    }
    if (st != CX_OK || f->rank != 0) return st;
    int nb = 0;
    cx_named_tensor *bufs = cx_module_buffers(f->root, &nb);
    if (!bufs) { cx_set_last_error("fsdp_full_state_dict: out of memory"); return CX_ERR_OOM; }
    for (int i = 0; i < nb && st == CX_OK; i++) {
        int64_t n = cx_numel(bufs[i].tensor);
        float *h = malloc(sizeof(float) * (size_t)(n ? n : 1));
        if (!h) { st = CX_ERR_OOM; cx_set_last_error("fsdp_full_state_dict: out of memory"); break; }
        st = cx_to_host(bufs[i].tensor, h, CX_F32);
        if (st == CX_OK) st = fn(ctx, bufs[i].name, cx_shape(bufs[i].tensor), cx_ndim(bufs[i].tensor), h);
        free(h);
    }
    free(bufs);
    return st;
}

cx_status cx_fsdp_load_full_param(cx_fsdp *f, const char *name, const float *data, int64_t numel)
{
    if (!f || !name || (numel && !data)) { cx_set_last_error("fsdp_load_full_param: NULL argument"); return CX_ERR_ARG; }
    for (int i = 0; i < f->nunits; i++) {
        unit *u = &f->units[i];
        for (int k = 0; k < u->nparams; k++) {
            if (strcmp(u->info[k].name, name)) continue;
            if (u->info[k].numel != numel) {
                cx_set_last_error("fsdp_load_full_param: %s has %lld elements, the data %lld", name,
                                  (long long)u->info[k].numel, (long long)numel);
                return CX_ERR_ARG;
            }
            /* the part of [offset, offset + numel) inside this rank's shard */
            int64_t lo = u->info[k].offset, hi = lo + numel;
            int64_t s0 = u->meta.shard_offset, s1 = s0 + u->meta.shard_numel;
            int64_t a = lo > s0 ? lo : s0, b = hi < s1 ? hi : s1;
            if (a >= b) return CX_OK;
            float *h = malloc(sizeof(float) * (size_t)u->meta.shard_numel);
            if (!h) { cx_set_last_error("fsdp_load_full_param: out of memory"); return CX_ERR_OOM; }
            cx_status st = cx_to_host(u->shard, h, CX_F32);
            if (st == CX_OK) {
                memcpy(h + (a - s0), data + (a - lo), sizeof(float) * (size_t)(b - a));
                int64_t sn = u->meta.shard_numel;
                cx_tensor *v = cx_from_host(h, &sn, 1, CX_F32);
                st = cx_assign(u->shard, v);
                cx_free(v);
                if (st == CX_OK) st = cx_sync_tensors(&u->shard, 1);
            }
            free(h);
            return st;
        }
    }
    cx_set_last_error("fsdp_load_full_param: no parameter named '%s'", name);
    return CX_ERR_ARG;
}

/* ---- gradient checkpointing --------------------------------------------------------------------- */

static void remat_pre(cx_module *m, void *ctx) { (void)m; (void)ctx; cx_remat_begin(); }
static void remat_post(cx_module *m, void *ctx) { (void)m; (void)ctx; cx_remat_end(); }
static int g_remat_tag;

cx_status cx_checkpoint_module(cx_module *m)
{
    if (!m) { cx_set_last_error("checkpoint_module: module is NULL"); return CX_ERR_ARG; }
    cx_module_hooks h = { CX_STRUCT_SIZE(cx_module_hooks), .pre = remat_pre, .post = remat_post, .ctx = &g_remat_tag };
    return cx_module_add_hooks(m, &h) < 0 ? CX_ERR_ARG : CX_OK;
}
