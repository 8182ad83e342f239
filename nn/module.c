/* Modules: named parameters, buffers and children; state-dict names. */
#include "nn_internal.h"

#include "cx_sbuf.h"
#include "cx_vec.h"

typedef struct {
    char *name;
    cx_tensor *t;
} entry;

typedef struct {
    char *name;
    cx_module *m;
} child;

struct cx_module {
    const cx_module_type *type;
    void *impl;
    bool training;
    entry *params;
    int nparams, cap_params;
    entry *buffers;
    int nbuffers, cap_buffers;
    child *children;
    int nchildren, cap_children;
    cx_module_hooks hooks[CX_MODULE_MAX_HOOKS];
    int nhooks;
};

cx_status cx_nn_persist(cx_tensor *t)
{
    cx_persist(t);
    return cx_is_pending(t) ? cx_sync_tensors(&t, 1) : CX_OK;
}

cx_module *cx_module_new(const cx_module_type *type, void *impl)
{
    CX_ASSERT(type && type->forward);
    cx_module *m = calloc(1, sizeof *m);
    if (!m) {
        if (type->free) type->free(impl);
        cx_set_last_error("cx_module_new: out of memory for a %s", type->name);
        return NULL;
    }
    m->type = type;
    m->impl = impl;
    m->training = true;
    return m;
}

void *cx_module_impl(const cx_module *m) { return m->impl; }
const char *cx_module_type_name(const cx_module *m) { return m ? m->type->name : "(null)"; }

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
    entry **arr = param ? &m->params : &m->buffers;
    int *n = param ? &m->nparams : &m->nbuffers;
    int *cap = param ? &m->cap_params : &m->cap_buffers;
    char *copy = strdup(name);
    if (!copy || !CX_GROW(*arr, *cap, *n + 1)) {
        free(copy);
        cx_free(t);
        cx_set_last_error("%s '%s' of %s: out of memory", what, name, cx_module_type_name(m));
        return -1;
    }
    cx_status st = cx_nn_persist(t);
    if (st != CX_OK) {
        free(copy);
        cx_free(t);
        return -1;
    }
    if (param) cx_requires_grad(t, true);
    (*arr)[*n] = (entry){ copy, t };
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
    m->children[m->nchildren] = (child){ copy, c };
    return m->nchildren++;
}

cx_tensor *cx_module_param(const cx_module *m, int slot)
{
    CX_ASSERT(slot >= 0 && slot < m->nparams);
    return m->params[slot].t;
}

cx_tensor *cx_module_buffer(const cx_module *m, int slot)
{
    CX_ASSERT(slot >= 0 && slot < m->nbuffers);
    return m->buffers[slot].t;
}

cx_module *cx_module_child(const cx_module *m, int slot)
{
    CX_ASSERT(slot >= 0 && slot < m->nchildren);
    return m->children[slot].m;
}

int cx_module_num_children(const cx_module *m) { return m->nchildren; }

void cx_module_set_param(cx_module *m, int slot, cx_tensor *t)
{
    CX_ASSERT(slot >= 0 && slot < m->nparams && t);
    if (m->params[slot].t != t) cx_free(m->params[slot].t);
    m->params[slot].t = t;
}

void cx_module_set_buffer(cx_module *m, int slot, cx_tensor *t)
{
    CX_ASSERT(slot >= 0 && slot < m->nbuffers && t);
    if (m->buffers[slot].t != t) cx_free(m->buffers[slot].t);
    m->buffers[slot].t = t;
}

cx_tensor *cx_module_forward(cx_module *m, cx_tensor *x)
{
    if (!m) return cx_poisoned("cx_module_forward: module is NULL");
    /* pre hooks in registration order, post hooks in reverse: they nest */
    for (int i = 0; i < m->nhooks; i++) if (m->hooks[i].pre) m->hooks[i].pre(m, m->hooks[i].ctx);
    cx_tensor *y = m->type->forward(m, x);
    for (int i = m->nhooks - 1; i >= 0; i--) if (m->hooks[i].post) m->hooks[i].post(m, m->hooks[i].ctx);
    return y;
}

int cx_module_add_hooks(cx_module *m, const cx_module_hooks *h)
{
    if (!m || !h) { cx_set_last_error("cx_module_add_hooks: NULL argument"); return -1; }
    if (m->nhooks == CX_MODULE_MAX_HOOKS) {
        cx_set_last_error("cx_module_add_hooks: module already has %d hooks", CX_MODULE_MAX_HOOKS);
        return -1;
    }
    m->hooks[m->nhooks] = *h;
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
        cx_zero_grad(m->params[i].t);
        cx_free(m->params[i].t);
        free(m->params[i].name);
    }
    for (int i = 0; i < m->nbuffers; i++) {
        cx_free(m->buffers[i].t);
        free(m->buffers[i].name);
    }
    if (m->type->free) m->type->free(m->impl);
    free(m->children);
    free(m->params);
    free(m->buffers);
    free(m);
}

/* ---- walking the tree ------------------------------------------------------ */

enum { WANT_PARAMS = 1, WANT_BUFFERS = 2 };

/* Visits entries in state-dict order; `visit` gets the full-name prefix of
 * the entry's module ("" or "a.b.", NUL-terminated at plen), the entry, and
 * whether it is a parameter. */
typedef void (*visit_fn)(void *ctx, const char *prefix, size_t plen, const entry *e, bool param);

static bool walk_from(const cx_module *m, int want, cx_sbuf *prefix, visit_fn visit, void *ctx)
{
    size_t plen = prefix->n;
    if (want & WANT_PARAMS)
        for (int i = 0; i < m->nparams; i++) visit(ctx, prefix->s, plen, &m->params[i], true);
    if (want & WANT_BUFFERS)
        for (int i = 0; i < m->nbuffers; i++) visit(ctx, prefix->s, plen, &m->buffers[i], false);
    for (int i = 0; i < m->nchildren; i++) {
        cx_sb_printf(prefix, "%s.", m->children[i].name);
        if (prefix->oom) return false;
        bool ok = walk_from(m->children[i].m, want, prefix, visit, ctx);
        /* back to this module's prefix for the next child */
        prefix->n = plen;
        prefix->s[plen] = '\0';
        if (!ok) return false;
    }
    return true;
}

/* @return false when out of memory (the prefix could not grow). */
static bool walk(const cx_module *m, int want, visit_fn visit, void *ctx)
{
    cx_sbuf prefix = { 0 };
    cx_sb_append(&prefix, "", 0);   /* the root's prefix: "", never a NULL string */
    bool ok = !prefix.oom && walk_from(m, want, &prefix, visit, ctx);
    free(cx_sb_finish(&prefix));
    return ok;
}

typedef struct {
    int n;
    size_t chars;
    cx_named_tensor *out;
    char *names;
} collect_ctx;

static void count_visit(void *ctx, const char *prefix, size_t plen, const entry *e, bool param)
{
    (void)prefix; (void)param;
    collect_ctx *c = ctx;
    c->n++;
    c->chars += plen + strlen(e->name) + 1;
}

static void fill_visit(void *ctx, const char *prefix, size_t plen, const entry *e, bool param)
{
    (void)param;
    collect_ctx *c = ctx;
    size_t nl = strlen(e->name);
    memcpy(c->names, prefix, plen);
    memcpy(c->names + plen, e->name, nl + 1);
    c->out[c->n++] = (cx_named_tensor){ c->names, e->t };
    c->names += plen + nl + 1;
}

static cx_named_tensor *collect(const cx_module *m, int want, int *n, const char *what)
{
    *n = 0;
    collect_ctx c = { 0 };
    if (!walk(m, want, count_visit, &c)) goto oom;
    /* One block: the array, then the names it points into. */
    size_t head = (size_t)(c.n ? c.n : 1) * sizeof(cx_named_tensor);
    char *block = malloc(head + c.chars + 1);
    if (!block) goto oom;
    collect_ctx f = { .out = (cx_named_tensor *)block, .names = block + head };
    if (!walk(m, want, fill_visit, &f)) { free(block); goto oom; }
    *n = f.n;
    return f.out;
oom:
    cx_set_last_error("%s of %s: out of memory", what, cx_module_type_name(m));
    return NULL;
}

cx_named_tensor *cx_module_parameters(const cx_module *m, int *n)
{
    return collect(m, WANT_PARAMS, n, "cx_module_parameters");
}

cx_named_tensor *cx_module_buffers(const cx_module *m, int *n)
{
    return collect(m, WANT_BUFFERS, n, "cx_module_buffers");
}

cx_named_tensor *cx_module_state_dict(const cx_module *m, int *n)
{
    return collect(m, WANT_PARAMS | WANT_BUFFERS, n, "cx_module_state_dict");
}

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

cx_tensor *cx_module_get(const cx_module *m, const char *key)
{
    if (!m || !key) return NULL;
    const char *dot = strrchr(key, '.');
    const cx_module *owner = m;
    const char *leaf = key;
    if (dot) {
        char path[512];
        size_t len = (size_t)(dot - key);
        if (len >= sizeof path) return NULL;
        memcpy(path, key, len);
        path[len] = '\0';
        owner = cx_module_find((cx_module *)m, path);
        leaf = dot + 1;
    }
    if (!owner) return NULL;
    for (int i = 0; i < owner->nparams; i++) if (!strcmp(owner->params[i].name, leaf)) return owner->params[i].t;
    for (int i = 0; i < owner->nbuffers; i++) if (!strcmp(owner->buffers[i].name, leaf)) return owner->buffers[i].t;
    return NULL;
}

static void numel_visit(void *ctx, const char *prefix, size_t plen, const entry *e, bool param)
{
    (void)prefix; (void)plen; (void)param;
    *(int64_t *)ctx += cx_numel(e->t);
}

int64_t cx_module_num_params(const cx_module *m)
{
    if (!m) return 0;
    int64_t total = 0;
    return walk(m, WANT_PARAMS, numel_visit, &total) ? total : -1;
}

/* ---- structural signature -------------------------------------------------- */

static void signature_visit(void *ctx, const char *prefix, size_t plen, const entry *e, bool param)
{
    (void)plen;
    cx_sbuf *b = ctx;
    cx_sb_printf(b, "%s%s%s:%s:(", param ? "" : "buffer ", prefix, e->name, cx_dtype_name(cx_dtype_of(e->t)));
    for (int d = 0; d < cx_ndim(e->t); d++) cx_sb_printf(b, d ? ", %lld" : "%lld", (long long)cx_dim(e->t, d));
    cx_sb_append(b, ");", 2);
}

char *cx_module_signature(const cx_module *m)
{
    if (!m) { cx_set_last_error("cx_module_signature: module is NULL"); return NULL; }
    cx_sbuf b = { 0 };
    bool ok = walk(m, WANT_PARAMS | WANT_BUFFERS, signature_visit, &b);
    char *text = cx_sb_finish(&b);
    if (ok && text) return text;
    free(text);
    cx_set_last_error("cx_module_signature of %s: out of memory", cx_module_type_name(m));
    return NULL;
}

static cx_module_sig_entry sig_entry(const char *at)
{
    return (cx_module_sig_entry){ at, (int)strcspn(at, ";") };
}

bool cx_module_signature_diff(const char *a, const char *b, cx_module_sig_entry *ea, cx_module_sig_entry *eb)
{
    if (!a) a = "";
    if (!b) b = "";
    size_t i = 0;
    while (a[i] && a[i] == b[i]) i++;
    if (a[i] == b[i]) return false;
    /* the texts agree up to i, so the entry holding i starts at the same
     * offset in both */
    while (i > 0 && a[i - 1] != ';') i--;
    if (ea) *ea = sig_entry(a + i);
    if (eb) *eb = sig_entry(b + i);
    return true;
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
