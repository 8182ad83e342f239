/* Modules: named parameters, buffers and children, lookups by full name,
 * ties, forward with hooks. Full names, lists and signatures are in
 * module_walk.c, which reads the tree this file builds: the dependency
 * runs from module_walk.c to here, never back, so everything that edits a
 * module or finds one slot by name lives here, and module_walk.c only
 * walks. */
#include "module_internal.h"

#include "cx_struct.h"
#include "cx_vec.h"

cx_status cx_nn_persist(cx_tensor *t)
{
    cx_persist(t);
    return cx_is_pending(t) ? cx_sync_tensors(&t, 1) : CX_OK;
}

cx_module *cx_module_new(const cx_module_type *type, void *impl)
{
    if (!type) {
        cx_set_last_error("cx_module_new: type is NULL");
        return NULL;
    }
    cx_module_type t = { 0 };
    char err[256];
    /* every header with struct_size declares at least the first version's
     * members, so type->free is there to release impl even when refused */
    bool ok = cx_struct_take(&t, sizeof t, type, type->struct_size, CX_SIZE_THROUGH(cx_module_type, forward_many),
                             "cx_module_type", err, sizeof err);
    if (ok && !t.forward && !t.forward_many) {
        snprintf(err, sizeof err, "%s has neither forward nor forward_many", t.name ? t.name : "the type");
        ok = false;
    }
    if (!ok) {
        if (type->free) type->free(impl);
        cx_set_last_error("cx_module_new: %s", err);
        return NULL;
    }
    cx_module *m = calloc(1, sizeof *m);
    if (!m) {
        if (t.free) t.free(impl);
        cx_set_last_error("cx_module_new: out of memory for a %s", t.name);
        return NULL;
    }
    m->type = t;
    m->impl = impl;
    m->training = true;
    return m;
}

void *cx_module_impl(const cx_module *m) { return m->impl; }
const char *cx_module_type_name(const cx_module *m) { return m ? m->type.name : "(null)"; }

static bool valid_name(const char *name)
{
    return name && name[0] && !strchr(name, '.');
}

static bool name_taken(const cx_module *m, const char *name)
{
    for (int i = 0; i < m->nparams; i++) if (!strcmp(m->params[i].name, name)) return true;
    for (int i = 0; i < m->nbuffers; i++) if (!strcmp(m->buffers[i].name, name)) return true;
    for (int i = 0; i < m->nchildren; i++) if (!strcmp(m->children[i].name, name)) return true;
    return false;
}

/* Drops one slot's reference; the last one frees the tensor (and, for a
 * parameter, its gradient). */
static void cell_release(cx_param_cell *c, bool param)
{
    if (!c || --c->refs > 0) return;
    if (param) cx_zero_grad(c->t);
    cx_free(c->t);
    free(c);
}

static int add_entry(cx_module *m, const char *what, const char *name, cx_tensor *t, bool param)
{
    const char *err = NULL;
    if (!m || !t) err = "NULL module or tensor";
    else if (!valid_name(name)) err = "empty name or name with a dot";
    else if (name_taken(m, name)) err = "name already used";
    else if (cx_tensor_error(t)) err = cx_tensor_error(t);
    else if (param && !cx_dtype_is_float(cx_dtype_of(t))) err = "parameters must be floating point";
    if (err) {
        cx_set_last_error("%s '%s' of %s: %s", what, name ? name : "(null)", cx_module_type_name(m), err);
        cx_free(t);
        return -1;
    }
    cx_mod_entry **arr = param ? &m->params : &m->buffers;
    int *n = param ? &m->nparams : &m->nbuffers;
    int *cap = param ? &m->cap_params : &m->cap_buffers;
    char *copy = strdup(name);
    cx_param_cell *c = malloc(sizeof *c);
    if (!copy || !c || !CX_GROW(*arr, *cap, *n + 1)) {
        free(copy);
        free(c);
        cx_free(t);
        cx_set_last_error("%s '%s' of %s: out of memory", what, name, cx_module_type_name(m));
        return -1;
    }
    cx_status st = cx_nn_persist(t);
    if (st != CX_OK) {
        free(copy);
        free(c);
        cx_free(t);
        return -1;
    }
    if (param) cx_requires_grad(t, true);
    *c = (cx_param_cell){ t, 1 };
    (*arr)[*n] = (cx_mod_entry){ copy, c };
    return (*n)++;
}

int cx_module_register_parameter(cx_module *m, const char *name, cx_tensor *t)
{
    return add_entry(m, "parameter", name, t, true);
}

int cx_module_register_buffer(cx_module *m, const char *name, cx_tensor *t)
{
    return add_entry(m, "buffer", name, t, false);
}

int cx_module_add_child(cx_module *m, const char *name, cx_module *c)
{
    const char *err = NULL;
    if (m && !c) {
        /* a constructor that failed: its reason (out of memory, a bad size)
         * is the one worth reporting */
        char why[512];
        snprintf(why, sizeof why, "%s", cx_last_error());
        cx_set_last_error("child '%s' of %s: its constructor failed%s%s", name ? name : "(null)", cx_module_type_name(m),
                          why[0] ? ": " : "", why);
        return -1;
    }
    if (!m || !c) err = "NULL module";
    else if (!valid_name(name)) err = "empty name or name with a dot";
    else if (name_taken(m, name)) err = "name already used";
    if (err) {
        cx_set_last_error("child '%s' of %s: %s", name ? name : "(null)", cx_module_type_name(m), err);
        cx_module_free(c);
        return -1;
    }
    char *copy = strdup(name);
    if (!copy || !CX_GROW(m->children, m->cap_children, m->nchildren + 1)) {
        free(copy);
        cx_module_free(c);
        cx_set_last_error("child '%s' of %s: out of memory", name, cx_module_type_name(m));
        return -1;
    }
    c->training = m->training;
    m->children[m->nchildren] = (cx_mod_child){ copy, c };
    return m->nchildren++;
}

cx_tensor *cx_module_param(const cx_module *m, int slot)
{
    CX_ASSERT(slot >= 0 && slot < m->nparams);
    return m->params[slot].c->t;
}

cx_tensor *cx_module_buffer(const cx_module *m, int slot)
{
    CX_ASSERT(slot >= 0 && slot < m->nbuffers);
    return m->buffers[slot].c->t;
}

cx_module *cx_module_child(const cx_module *m, int slot)
{
    CX_ASSERT(slot >= 0 && slot < m->nchildren);
    return m->children[slot].m;
}

int cx_module_num_children(const cx_module *m) { return m->nchildren; }

/* Through the cell: every slot a tied parameter has sees the new tensor. */
static void cell_set(cx_param_cell *c, cx_tensor *t)
{
    if (c->t != t) cx_free(c->t);
    c->t = t;
}

void cx_module_set_param(cx_module *m, int slot, cx_tensor *t)
{
    CX_ASSERT(slot >= 0 && slot < m->nparams && t);
    cell_set(m->params[slot].c, t);
}

void cx_module_set_buffer(cx_module *m, int slot, cx_tensor *t)
{
    CX_ASSERT(slot >= 0 && slot < m->nbuffers && t);
    cell_set(m->buffers[slot].c, t);
}

/* ---- lookups by full name ------------------------------------------------------ */

cx_module *cx_module_find(cx_module *m, const char *path)
{
    while (m && path && *path) {
        const char *dot = strchr(path, '.');
        size_t len = dot ? (size_t)(dot - path) : strlen(path);
        cx_module *next = NULL;
        for (int i = 0; i < m->nchildren; i++) {
            if (strlen(m->children[i].name) == len && !strncmp(m->children[i].name, path, len)) {
                next = m->children[i].m;
                break;
            }
        }
        m = next;
        path = dot ? dot + 1 : path + len;
    }
    return m;
}

/* The module holding the last component of the full name `key` under m
 * ("a.b.weight": the module "a.b", *leaf = "weight"). @return NULL when no
 * such module exists. */
static cx_module *mod_owner(const cx_module *m, const char *key, const char **leaf)
{
    if (!m || !key) return NULL;
    const char *dot = strrchr(key, '.');
    *leaf = dot ? dot + 1 : key;
    if (!dot) return (cx_module *)m;
    char path[512];
    size_t len = (size_t)(dot - key);
    if (len >= sizeof path) return NULL;
    memcpy(path, key, len);
    path[len] = '\0';
    return cx_module_find((cx_module *)m, path);
}

/* The parameter (*param = true) or buffer named `key` under m, NULL if none. */
static cx_mod_entry *mod_lookup(const cx_module *m, const char *key, bool *param)
{
    const char *leaf;
    cx_module *owner = mod_owner(m, key, &leaf);
    if (!owner) return NULL;
    for (int i = 0; i < owner->nparams; i++)
        if (!strcmp(owner->params[i].name, leaf)) { *param = true; return &owner->params[i]; }
    for (int i = 0; i < owner->nbuffers; i++)
        if (!strcmp(owner->buffers[i].name, leaf)) { *param = false; return &owner->buffers[i]; }
    return NULL;
}

cx_tensor *cx_module_get(const cx_module *m, const char *key)
{
    bool param;
    cx_mod_entry *e = mod_lookup(m, key, &param);
    return e ? e->c->t : NULL;
}

/* ---- ties -------------------------------------------------------------------- */

static bool same_layout(const cx_tensor *a, const cx_tensor *b)
{
    return cx_dtype_of(a) == cx_dtype_of(b) && cx_ndim(a) == cx_ndim(b) &&
           !memcmp(cx_shape(a), cx_shape(b), sizeof(int64_t) * (size_t)cx_ndim(a));
}

/* "f32 (3, 4)", for messages. */
static const char *layout_str(const cx_tensor *t, char *out, size_t cap)
{
    size_t o = (size_t)snprintf(out, cap, "%s (", cx_dtype_name(cx_dtype_of(t)));
    for (int d = 0; d < cx_ndim(t) && o < cap; d++)
        o += (size_t)snprintf(out + o, cap - o, d ? ", %lld" : "%lld", (long long)cx_dim(t, d));
    if (o < cap) snprintf(out + o, cap - o, ")");
    return out;
}

/* Points `dst` (a new or existing parameter slot of `owner`) at `c`. */
static cx_status tie_slot(cx_module *owner, const char *leaf, cx_param_cell *c, const char *key, const char *src)
{
    for (int i = 0; i < owner->nparams; i++) {
        cx_mod_entry *e = &owner->params[i];
        if (strcmp(e->name, leaf)) continue;
        if (e->c == c) return CX_OK;
        if (!same_layout(e->c->t, c->t)) {
            char a[160], b[160];
            cx_set_last_error("cx_module_tie: %s is %s, %s is %s", key, layout_str(e->c->t, a, sizeof a), src,
                              layout_str(c->t, b, sizeof b));
            return CX_ERR_SHAPE;
        }
        c->refs++;
        cell_release(e->c, true);
        e->c = c;
        return CX_OK;
    }
    if (name_taken(owner, leaf) || !valid_name(leaf)) {
        cx_set_last_error("cx_module_tie: %s names a buffer, a child or nothing valid in %s", key,
                          cx_module_type_name(owner));
        return CX_ERR_ARG;
    }
    char *copy = strdup(leaf);
    if (!copy || !CX_GROW(owner->params, owner->cap_params, owner->nparams + 1)) {
        free(copy);
        cx_set_last_error("cx_module_tie: out of memory tying %s", key);
        return CX_ERR_OOM;
    }
    c->refs++;
    owner->params[owner->nparams++] = (cx_mod_entry){ copy, c };
    return CX_OK;
}

cx_status cx_module_tie(cx_module *m, const char *key, const char *source_key)
{
    if (!m || !key || !source_key) {
        cx_set_last_error("cx_module_tie: NULL argument");
        return CX_ERR_ARG;
    }
    bool param = false;
    cx_mod_entry *src = mod_lookup(m, source_key, &param);
    if (!src || !param) {
        cx_set_last_error("cx_module_tie: %s has no parameter %s to tie %s to", cx_module_type_name(m), source_key,
                          key);
        return CX_ERR_ARG;
    }
    const char *leaf;
    cx_module *owner = mod_owner(m, key, &leaf);
    if (!owner) {
        cx_set_last_error("cx_module_tie: %s has no module to hold %s", cx_module_type_name(m), key);
        return CX_ERR_ARG;
    }
    /* the cell, not the entry: growing the owner's slots may move entries */
    return tie_slot(owner, leaf, src->c, key, source_key);
}

/* ---- forward ----------------------------------------------------------------- */

/* Pre hooks in registration order, the forward, post hooks in reverse (they
 * nest), for one input and output or many. */
static int run_forward(cx_module *m, cx_tensor *const *in, int n_in, cx_tensor **out, int max_out)
{
    for (int i = 0; i < m->nhooks; i++) if (m->hooks[i].pre) m->hooks[i].pre(m, m->hooks[i].ctx);
    int k;
    /* `forward` is the one-in/one-out path whenever the type has it */
    if (m->type.forward && (!m->type.forward_many || (n_in == 1 && max_out == 1))) {
        out[0] = m->type.forward(m, in[0]);
        k = 1;
    } else {
        k = m->type.forward_many(m, in, n_in, out, max_out);
        /* writing past max_out is a bug of the module type, not the caller */
        CX_ASSERT(k <= max_out);
    }
    bool failed = k < 0;
    for (int i = m->nhooks - 1; i >= 0; i--) {
        /* after a failed output hook the others still close what their pre opened */
        if (!failed && m->hooks[i].outputs && m->hooks[i].outputs(m, out, k, m->hooks[i].ctx) != CX_OK) failed = true;
        if (m->hooks[i].post) m->hooks[i].post(m, m->hooks[i].ctx);
    }
    if (failed && k >= 0) {
        for (int i = 0; i < k; i++) { cx_drop(out[i]); out[i] = NULL; }
        k = -1;
    }
    return k;
}

cx_tensor *cx_module_forward(cx_module *m, cx_tensor *x)
{
    if (!m) return cx_poisoned("cx_module_forward: module is NULL");
    cx_tensor *y = NULL;
    int k = run_forward(m, &x, 1, &y, 1);
    if (k == 1) return y;
    if (k == 0) return cx_poisoned("cx_module_forward: %s produced no output for one input", m->type.name);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", cx_last_error());
    return cx_poisoned("cx_module_forward: %s", msg);
}

int cx_module_forward_many(cx_module *m, cx_tensor *const *in, int n_in, cx_tensor **out, int max_out)
{
    const char *err = NULL;
    if (!m) err = "module is NULL";
    else if (n_in < 0 || max_out < 0 || (n_in > 0 && !in) || (max_out > 0 && !out)) err = "bad input or output list";
    else if (!m->type.forward_many && (n_in != 1 || max_out < 1)) err = "takes one input and gives one output";
    if (err) {
        cx_set_last_error("cx_module_forward_many: %s: %s (%d inputs, room for %d outputs)", cx_module_type_name(m),
                          err, n_in, max_out);
        return -1;
    }
    for (int i = 0; i < max_out; i++) out[i] = NULL;
    return run_forward(m, in, n_in, out, max_out);
}

/* ---- hooks, names, modes, lifetime ------------------------------------------------ */

int cx_module_add_hooks(cx_module *m, const cx_module_hooks *h)
{
    if (!m || !h) { cx_set_last_error("cx_module_add_hooks: NULL argument"); return -1; }
    cx_module_hooks own = { CX_STRUCT_SIZE(cx_module_hooks) };
    if (!CX_TAKE_STRUCT("cx_module_add_hooks", cx_module_hooks, own, h, ctx)) return -1;
    if (m->nhooks == CX_MODULE_MAX_HOOKS) {
        cx_set_last_error("cx_module_add_hooks: module already has %d hooks", CX_MODULE_MAX_HOOKS);
        return -1;
    }
    m->hooks[m->nhooks] = own;
    return m->nhooks++;
}

void cx_module_remove_hooks(cx_module *m, void *ctx)
{
    if (!m) return;
    int k = 0;
    for (int i = 0; i < m->nhooks; i++) if (m->hooks[i].ctx != ctx) m->hooks[k++] = m->hooks[i];
    m->nhooks = k;
}

int cx_module_param_slot(const cx_module *m, const char *name)
{
    if (!m || !name) return -1;
    for (int i = 0; i < m->nparams; i++) if (!strcmp(m->params[i].name, name)) return i;
    return -1;
}

int cx_module_num_own_params(const cx_module *m) { return m ? m->nparams : 0; }
const char *cx_module_param_name(const cx_module *m, int slot)
{
    return m && slot >= 0 && slot < m->nparams ? m->params[slot].name : NULL;
}
const char *cx_module_child_name(const cx_module *m, int slot)
{
    return m && slot >= 0 && slot < m->nchildren ? m->children[slot].name : NULL;
}

void cx_module_train(cx_module *m, bool on)
{
    if (!m) return;
    m->training = on;
    for (int i = 0; i < m->nchildren; i++) cx_module_train(m->children[i].m, on);
}

bool cx_module_is_training(const cx_module *m) { return m && m->training; }

void cx_module_free(cx_module *m)
{
    if (!m) return;
    for (int i = 0; i < m->nchildren; i++) {
        cx_module_free(m->children[i].m);
        free(m->children[i].name);
    }
    for (int i = 0; i < m->nparams; i++) {
        cell_release(m->params[i].c, true);
        free(m->params[i].name);
    }
    for (int i = 0; i < m->nbuffers; i++) {
        cell_release(m->buffers[i].c, false);
        free(m->buffers[i].name);
    }
    if (m->type.free) m->type.free(m->impl);
    free(m->children);
    free(m->params);
    free(m->buffers);
    free(m);
}

cx_status cx_module_load(cx_module *m, const char *key, const void *data, cx_dtype dtype)
{
    cx_tensor *t = cx_module_get(m, key);
    if (!t) {
        cx_set_last_error("cx_module_load: %s has no parameter or buffer '%s'", cx_module_type_name(m),
                     key ? key : "(null)");
        return CX_ERR_ARG;
    }
    cx_tensor *v = cx_from_host(data, cx_shape(t), cx_ndim(t), dtype);
    cx_tensor *c = dtype == cx_dtype_of(t) ? v : cx_cast(v, cx_dtype_of(t));
    cx_status st = cx_assign(t, c);
    if (c != v) cx_free(c);
    cx_free(v);
    if (st != CX_OK) return st;
    return cx_sync_tensors(&t, 1);
}
