/* The optimizer object shared by SGD and Adam(W): parameters, state, step. */
#include "optim_internal.h"
#include <cxla/spmd.h>

#include <math.h>
#include <string.h>

int cx_param_groups_by_ndim(const cx_named_tensor *params, int n, double weight_decay, cx_named_tensor *scratch,
                            cx_param_group out[2])
{
    if (n < 0 || (n > 0 && (!params || !scratch)) || !out) {
        cx_set_last_error("cx_param_groups_by_ndim: NULL or negative argument (%d parameters)", n);
        return -1;
    }
    /* the caller's headers set the size of both groups and their stride:
     * the library's own may be larger */
    size_t size = out[0].struct_size;
    const size_t min = CX_SIZE_THROUGH(cx_param_group, decay_masks);
    if (size < min) {
        cx_set_last_error("cx_param_groups_by_ndim: out[0].struct_size is %zu, below cx_param_group's first "
                          "version's %zu: initialize it with CX_STRUCT_SIZE(cx_param_group)", size, min);
        return -1;
    }
    /* scratch: the tensors of 2 or more dims, then the others, each in
     * their order */
    int nd = 0, rest = 0;
    for (int i = 0; i < n; i++) {
        if (params[i].tensor && cx_ndim(params[i].tensor) >= 2) scratch[nd++] = params[i];
        else rest++;
    }
    for (int i = 0, k = nd; i < n; i++)
        if (!params[i].tensor || cx_ndim(params[i].tensor) < 2) scratch[k++] = params[i];
    cx_param_group own[2] = { cx_param_group_of(scratch, nd, weight_decay), cx_param_group_of(scratch + nd, rest, 0.0) };
    char serr[256];
    for (int g = 0; g < 2; g++) {
        char *dst = (char *)out + (size_t)g * size;
        memcpy(dst, &size, sizeof size);
        (void)cx_struct_give(dst, &own[g], sizeof own[g], min, "cx_param_group", serr, sizeof serr);
    }
    return 2;
}

/* Every group's options and parameters are usable. */
static bool check_groups(const cx_optim_kind *kind, const cx_param_group *groups, int ngroups, int *total)
{
    *total = 0;
    if (ngroups < 0 || (ngroups > 0 && !groups)) {
        cx_set_last_error("%s: no parameter group list", kind->name);
        return false;
    }
    for (int g = 0; g < ngroups; g++) {
        const cx_param_group *gr = &groups[g];
        if (gr->n < 0 || (gr->n > 0 && !gr->params) || !(gr->weight_decay >= 0 && gr->weight_decay < INFINITY) ||
            !(gr->lr_scale > 0 && gr->lr_scale < INFINITY)) {
            cx_set_last_error("%s: parameter group %d: %d parameters, weight_decay %g, lr_scale %g (want a list, "
                              "weight_decay >= 0 and lr_scale > 0; cx_param_group_of sets lr_scale 1)",
                              kind->name, g, gr->n, gr->weight_decay, gr->lr_scale);
            return false;
        }
        for (int i = 0; i < gr->n; i++) {
            cx_tensor *t = gr->params[i].tensor;
            if (!t || !cx_is_persistent(t) || !cx_dtype_is_float(cx_dtype_of(t))) {
                cx_set_last_error("%s: parameter %d (%s) of group %d is not a persistent float tensor", kind->name,
                                  i, gr->params[i].name ? gr->params[i].name : "unnamed", g);
                return false;
            }
            cx_tensor *mask = gr->decay_masks ? gr->decay_masks[i] : NULL;
            /* f32, or bf16 where XLA_USE_BF16 holds f32 tensors so: 0 and 1 are exact in either */
            if (mask && (!cx_dtype_is_float(cx_dtype_of(mask)) || cx_numel(mask) != cx_numel(t) ||
                         cx_ndim(mask) != cx_ndim(t))) {
                cx_set_last_error("%s: the decay mask of parameter %d (%s) of group %d is not a float tensor of its "
                                  "shape", kind->name, i, gr->params[i].name ? gr->params[i].name : "unnamed", g);
                return false;
            }
        }
        *total += gr->n;
    }
    return true;
}

typedef struct {
    const cx_tensor *t;
    const char *name;
    int group, index;
} param_at;

static int by_tensor(const void *a, const void *b)
{
    const param_at *x = a, *y = b;
    if (x->t != y->t) return (uintptr_t)x->t < (uintptr_t)y->t ? -1 : 1;
    return x->group != y->group ? x->group - y->group : x->index - y->index;
}

/* A tensor updated twice per step would be stepped twice: each tensor
 * appears once in all groups (a tied parameter too: the module lists it
 * once). @return CX_OK, CX_ERR_ARG naming both places, CX_ERR_OOM. */
static cx_status check_unique(const cx_optim_kind *kind, const cx_param_group *groups, int ngroups, int total)
{
    param_at *all = malloc(sizeof *all * (size_t)(total ? total : 1));
    if (!all) {
        cx_set_last_error("%s: out of memory checking %d parameters", kind->name, total);
        return CX_ERR_OOM;
    }
    int k = 0;
    for (int g = 0; g < ngroups; g++)
        for (int i = 0; i < groups[g].n; i++)
            all[k++] = (param_at){ groups[g].params[i].tensor, groups[g].params[i].name, g, i };
    qsort(all, (size_t)total, sizeof *all, by_tensor);
    cx_status st = CX_OK;
    for (int i = 1; i < total && st == CX_OK; i++) {
        if (all[i].t != all[i - 1].t) continue;
        cx_set_last_error("%s: parameter %s (group %d) is the same tensor as %s (group %d): list each parameter once",
                          kind->name, all[i].name ? all[i].name : "unnamed", all[i].group,
                          all[i - 1].name ? all[i - 1].name : "unnamed", all[i - 1].group);
        st = CX_ERR_ARG;
    }
    free(all);
    return st;
}

/* Zero state (device data, not a constant, so step 1 traces the same graph
 * as every later step) for the kind's wanted slots of p. */
static bool make_state(const cx_optim_kind *kind, cx_oparam *p, const bool *want, const float *zeros)
{
    for (int s = 0; s < kind->nstate; s++) {
        if (!want[s]) continue;
        bool is_step = !strcmp(kind->state_names[s], "step");
        p->state[s] = is_step ? cx_from_host(zeros, NULL, 0, CX_F32)
                              : cx_from_host(zeros, cx_shape(p->p), cx_ndim(p->p), CX_F32);
        if (!p->state[s] || cx_tensor_error(p->state[s])) return false;
        cx_persist(p->state[s]);
        /* a state shaped like an SPMD-sharded parameter is split like it:
         * each rank keeps only its shard, as FSDPv2 needs (the update's
         * cx_assign then keeps it split) */
        const cx_mesh *mesh = NULL;
        cx_spec_entry spec[CX_MAX_DIMS];
        int nspec = is_step ? 0 : cx_get_sharding(p->p, &mesh, spec, CX_MAX_DIMS);
        if (nspec > 0 && cx_mark_sharding(p->state[s], mesh, spec, nspec) != CX_OK) return false;
        char label[512];
        snprintf(label, sizeof label, "%s.%s", p->name, kind->state_names[s]);
        cx_set_name(p->state[s], label);
    }
    return true;
}

/* The parameters, group after group, with their state. */
static bool fill_params(cx_optimizer *o, const cx_param_group *groups, const bool *want)
{
    size_t maxbytes = 0;
    for (int g = 0; g < o->ngroups; g++)
        for (int i = 0; i < groups[g].n; i++) {
            size_t b = (size_t)cx_numel(groups[g].params[i].tensor) * sizeof(float);
            if (b > maxbytes) maxbytes = b;
        }
    float *zeros = calloc(1, maxbytes ? maxbytes : sizeof(float));
    if (!zeros) return false;
    int k = 0;
    bool ok = true;
    for (int g = 0; g < o->ngroups && ok; g++) {
        o->groups[g] = (cx_ogroup){ groups[g].weight_decay, groups[g].lr_scale, k, groups[g].n };
        for (int i = 0; i < groups[g].n && ok; i++, k++) {
            cx_oparam *p = &o->ps[k];
            char fallback[32];
            snprintf(fallback, sizeof fallback, "param%d", k);
            p->name = strdup(groups[g].params[i].name ? groups[g].params[i].name : fallback);
            p->p = groups[g].params[i].tensor;
            p->decay_mask = groups[g].decay_masks ? groups[g].decay_masks[i] : NULL;
            o->n = k + 1;   /* what cx_optim_free releases */
            ok = p->name && make_state(o->kind, p, want, zeros);
        }
    }
    free(zeros);
    return ok;
}

/* The caller's groups over the defaults, in an array of this library's
 * cx_param_group. The caller's array is stepped through by its first
 * element's struct_size: that is sizeof(cx_param_group) in the headers it
 * was built with, which may be older or newer than these.
 * @return the array (free(); one element for an empty list, so that NULL
 * means failure), or NULL with the error set. */
static cx_param_group *take_groups(const cx_optim_kind *kind, const cx_param_group *groups, int ngroups)
{
    if (ngroups < 0 || (ngroups > 0 && !groups)) {
        cx_set_last_error("%s: no parameter group list", kind->name);
        return NULL;
    }
    cx_param_group *own = calloc((size_t)(ngroups ? ngroups : 1), sizeof *own);
    if (!own) { cx_set_last_error("%s: out of memory for %d parameter groups", kind->name, ngroups); return NULL; }
    size_t stride = ngroups ? groups[0].struct_size : 0;
    for (int g = 0; g < ngroups; g++) {
        const cx_param_group *src = (const cx_param_group *)((const char *)groups + (size_t)g * stride);
        char serr[256];
        own[g] = cx_param_group_of(NULL, 0, 0.0);
        bool ok = src->struct_size == stride &&
                  cx_struct_take(&own[g], sizeof own[g], src, src->struct_size,
                                 CX_SIZE_THROUGH(cx_param_group, decay_masks), "cx_param_group", serr, sizeof serr);
        if (!ok) {
            if (src->struct_size != stride)
                snprintf(serr, sizeof serr, "cx_param_group.struct_size is %zu, not the %zu of group 0 (one array, "
                         "one struct_size)", src->struct_size, stride);
            cx_set_last_error("%s: parameter group %d: %s", kind->name, g, serr);
            free(own);
            return NULL;
        }
    }
    return own;
}

cx_optimizer *cx_optim_new(const cx_optim_kind *kind, const cx_param_group *given, int ngroups, double lr,
                           const bool *want)
{
    int total = 0;
    cx_param_group *groups = take_groups(kind, given, ngroups);
    if (!groups) return NULL;
    if (!check_groups(kind, groups, ngroups, &total) || check_unique(kind, groups, ngroups, total) != CX_OK) {
        free(groups);
        return NULL;
    }
    cx_optimizer *o = calloc(1, sizeof *o);
    if (!o) goto oom;
    o->kind = kind;
    o->lr = lr;
    o->ps = calloc((size_t)(total ? total : 1), sizeof *o->ps);
    o->groups = calloc((size_t)(ngroups ? ngroups : 1), sizeof *o->groups);
    if (!o->ps || !o->groups) goto oom;
    o->ngroups = ngroups;
    if (!fill_params(o, groups, want)) goto oom;
    free(groups);
    return o;
oom:
    free(groups);
    cx_optim_free(o);
    cx_set_last_error("%s: out of memory for the state of %d parameters", kind->name, total);
    return NULL;
}

void cx_optim_free(cx_optimizer *o)
{
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        free(o->ps[i].name);
        for (int s = 0; s < CX_OPTIM_MAX_STATE; s++) cx_free(o->ps[i].state[s]);
    }
    free(o->ps);
    free(o->groups);
    free(o);
}

cx_status cx_optim_assign(cx_tensor *dst, cx_tensor *value, const char *what)
{
    const char *e = cx_tensor_error(value);
    if (e) {
        cx_set_last_error("%s: %s", what, e);
        return CX_ERR_SHAPE;
    }
    return cx_assign(dst, value);
}

cx_status cx_optim_step(cx_optimizer *o)
{
    if (!o) { cx_set_last_error("cx_optim_step: optimizer is NULL"); return CX_ERR_ARG; }
    cx_status st = CX_OK;
    cx_no_grad_begin();
    for (int g = 0; g < o->ngroups && st == CX_OK; g++) {
        const cx_ogroup *gr = &o->groups[g];
        cx_tensor *hp[CX_OPTIM_MAX_HP];
        int nhp = o->kind->hyper(o, gr, hp);
        CX_ASSERT(nhp <= CX_OPTIM_MAX_HP);
        for (int i = gr->first; i < gr->first + gr->n && st == CX_OK; i++) {
            cx_oparam *p = &o->ps[i];
            if (!cx_grad(p->p)) continue;
            st = o->kind->update(o, gr, p, hp);
            p->steps++;
        }
        for (int i = 0; i < nhp; i++) cx_drop(hp[i]);
    }
    cx_no_grad_end();
    o->steps++;
    return st;
}

int cx_optim_num_groups(const cx_optimizer *o) { return o ? o->ngroups : 0; }

void cx_optim_zero_grad(cx_optimizer *o)
{
    if (!o) return;
    for (int i = 0; i < o->n; i++) cx_zero_grad(o->ps[i].p);
}

void cx_optim_set_lr(cx_optimizer *o, double lr) { o->lr = lr; }
double cx_optim_get_lr(const cx_optimizer *o) { return o->lr; }
int64_t cx_optim_step_count(const cx_optimizer *o) { return o->steps; }
const char *cx_optim_name(const cx_optimizer *o) { return o->kind->name; }

void cx_optim_set_step_count(cx_optimizer *o, int64_t steps)
{
    o->steps = steps;
    for (int i = 0; i < o->n; i++) o->ps[i].steps = steps;
}

/* One block: array then names. */
static cx_named_tensor *named_block(int count, size_t chars, cx_named_tensor **arr, char **names)
{
    size_t head = (size_t)(count ? count : 1) * sizeof(cx_named_tensor);
    char *block = malloc(head + chars + 1);
    if (!block) return NULL;
    *arr = (cx_named_tensor *)block;
    *names = block + head;
    return *arr;
}

cx_named_tensor *cx_optim_state(const cx_optimizer *o, int *n)
{
    int count = 0;
    size_t chars = 0;
    for (int i = 0; i < o->n; i++)
        for (int s = 0; s < o->kind->nstate; s++)
            if (o->ps[i].state[s]) {
                count++;
                chars += strlen(o->ps[i].name) + strlen(o->kind->state_names[s]) + 2;
            }
    cx_named_tensor *arr;
    char *names;
    if (!named_block(count, chars, &arr, &names)) {
        cx_set_last_error("cx_optim_state: out of memory");
        *n = 0;
        return NULL;
    }
    int k = 0;
    for (int i = 0; i < o->n; i++)
        for (int s = 0; s < o->kind->nstate; s++)
            if (o->ps[i].state[s]) {
                int w = sprintf(names, "%s.%s", o->ps[i].name, o->kind->state_names[s]);
                arr[k++] = (cx_named_tensor){ names, o->ps[i].state[s] };
                names += w + 1;
            }
    *n = k;
    return arr;
}

cx_named_tensor *cx_optim_params(const cx_optimizer *o, int *n)
{
    size_t chars = 0;
    for (int i = 0; i < o->n; i++) chars += strlen(o->ps[i].name) + 1;
    cx_named_tensor *arr;
    char *names;
    if (!named_block(o->n, chars, &arr, &names)) {
        cx_set_last_error("cx_optim_params: out of memory");
        *n = 0;
        return NULL;
    }
    for (int i = 0; i < o->n; i++) {
        size_t l = strlen(o->ps[i].name);
        memcpy(names, o->ps[i].name, l + 1);
        arr[i] = (cx_named_tensor){ names, o->ps[i].p };
        names += l + 1;
    }
    *n = o->n;
    return arr;
}
