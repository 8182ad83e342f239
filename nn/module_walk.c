/* Walking a module tree in state-dict order: full names, the parameter,
 * buffer and state-dict lists, ties, the structural signature. A tied
 * parameter is visited at every name it has, but only its first visit
 * (in this order, as PyTorch's named_parameters) lists it; later ones are
 * ties to that first name. This file only reads a tree; finding one slot
 * by its full name (cx_module_get) is module.c's, next to the lookup that
 * ties use, so module.c never calls back into the walk. */
#include "module_internal.h"

#include "cx_sbuf.h"
#include "cx_vec.h"

enum { WANT_PARAMS = 1, WANT_BUFFERS = 2 };

/* Visits an entry with the full-name prefix of its module ("" or "a.b.",
 * NUL-terminated at plen), whether it is a parameter, and `first`: NULL on
 * the first visit of its value, else the full name it had then. */
typedef void (*visit_fn)(void *ctx, const char *prefix, size_t plen, const cx_mod_entry *e, bool param,
                         const char *first);

/* A tied cell and the full name of its first visit. */
typedef struct {
    const cx_param_cell *c;
    char *first;
} seen_cell;

typedef struct {
    int want;
    visit_fn visit;
    void *ctx;
    cx_sbuf prefix;
    seen_cell *seen;
    int nseen, cap_seen;
    bool oom;
} walker;

/* NULL on the first visit of a tied cell (remembered with its full name),
 * else that name. Untied cells have one slot: never seen twice. */
static const char *seen_before(walker *w, const cx_mod_entry *e)
{
    if (e->c->refs < 2) return NULL;
    for (int i = 0; i < w->nseen; i++) if (w->seen[i].c == e->c) return w->seen[i].first;
    size_t plen = w->prefix.n, nl = strlen(e->name);
    char *full = malloc(plen + nl + 1);
    if (!full || !CX_GROW(w->seen, w->cap_seen, w->nseen + 1)) {
        free(full);
        w->oom = true;
        return NULL;
    }
    memcpy(full, w->prefix.s, plen);
    memcpy(full + plen, e->name, nl + 1);
    w->seen[w->nseen++] = (seen_cell){ e->c, full };
    return NULL;
}

static bool walk_from(walker *w, const cx_module *m)
{
    size_t plen = w->prefix.n;
    for (int i = 0; (w->want & WANT_PARAMS) && i < m->nparams; i++) {
        const char *first = seen_before(w, &m->params[i]);
        if (w->oom) return false;
        w->visit(w->ctx, w->prefix.s, plen, &m->params[i], true, first);
    }
    for (int i = 0; (w->want & WANT_BUFFERS) && i < m->nbuffers; i++)
        w->visit(w->ctx, w->prefix.s, plen, &m->buffers[i], false, NULL);
    for (int i = 0; i < m->nchildren; i++) {
        cx_sb_printf(&w->prefix, "%s.", m->children[i].name);
        if (w->prefix.oom) return false;
        bool ok = walk_from(w, m->children[i].m);
        /* back to this module's prefix for the next child */
        w->prefix.n = plen;
        w->prefix.s[plen] = '\0';
        if (!ok) return false;
    }
    return true;
}

/* @return false when out of memory. */
static bool walk(const cx_module *m, int want, visit_fn visit, void *ctx)
{
    walker w = { .want = want, .visit = visit, .ctx = ctx };
    cx_sb_append(&w.prefix, "", 0);   /* the root's prefix: "", never a NULL string */
    bool ok = !w.prefix.oom && walk_from(&w, m);
    free(cx_sb_finish(&w.prefix));
    for (int i = 0; i < w.nseen; i++) free(w.seen[i].first);
    free(w.seen);
    return ok;
}

/* ---- lists ------------------------------------------------------------------- */

typedef struct {
    int n;
    size_t chars;
    cx_named_tensor *out;
    char *names;
} collect_ctx;

static void count_visit(void *ctx, const char *prefix, size_t plen, const cx_mod_entry *e, bool param,
                        const char *first)
{
    (void)prefix; (void)param;
    collect_ctx *c = ctx;
    if (first) return;
    c->n++;
    c->chars += plen + strlen(e->name) + 1;
}

static void fill_visit(void *ctx, const char *prefix, size_t plen, const cx_mod_entry *e, bool param,
                       const char *first)
{
    (void)param;
    collect_ctx *c = ctx;
    if (first) return;
    size_t nl = strlen(e->name);
    memcpy(c->names, prefix, plen);
    memcpy(c->names + plen, e->name, nl + 1);
    c->out[c->n++] = (cx_named_tensor){ c->names, e->c->t };
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

/* ---- ties -------------------------------------------------------------------- */

typedef struct {
    int n;
    size_t chars;
    cx_tied_param *out;
    char *names;
} ties_ctx;

static void ties_count_visit(void *ctx, const char *prefix, size_t plen, const cx_mod_entry *e, bool param,
                             const char *first)
{
    (void)prefix; (void)param;
    ties_ctx *c = ctx;
    if (!first) return;
    c->n++;
    c->chars += plen + strlen(e->name) + 1 + strlen(first) + 1;
}

static void ties_fill_visit(void *ctx, const char *prefix, size_t plen, const cx_mod_entry *e, bool param,
                            const char *first)
{
    (void)param;
    ties_ctx *c = ctx;
    if (!first) return;
    size_t nl = strlen(e->name), fl = strlen(first);
    char *key = c->names, *src = key + plen + nl + 1;
    memcpy(key, prefix, plen);
    memcpy(key + plen, e->name, nl + 1);
    memcpy(src, first, fl + 1);
    c->out[c->n++] = (cx_tied_param){ key, src, e->c->t };
    c->names = src + fl + 1;
}

cx_tied_param *cx_module_tied_params(const cx_module *m, int *n)
{
    *n = 0;
    if (!m) { cx_set_last_error("cx_module_tied_params: module is NULL"); return NULL; }
    ties_ctx c = { 0 };
    if (!walk(m, WANT_PARAMS, ties_count_visit, &c)) goto oom;
    size_t head = (size_t)(c.n ? c.n : 1) * sizeof(cx_tied_param);
    char *block = malloc(head + c.chars + 1);
    if (!block) goto oom;
    ties_ctx f = { .out = (cx_tied_param *)block, .names = block + head };
    if (!walk(m, WANT_PARAMS, ties_fill_visit, &f)) { free(block); goto oom; }
    *n = f.n;
    return f.out;
oom:
    cx_set_last_error("cx_module_tied_params of %s: out of memory", cx_module_type_name(m));
    return NULL;
}

static void numel_visit(void *ctx, const char *prefix, size_t plen, const cx_mod_entry *e, bool param,
                        const char *first)
{
    (void)prefix; (void)plen; (void)param;
    if (!first) *(int64_t *)ctx += cx_numel(e->c->t);
}

int64_t cx_module_num_params(const cx_module *m)
{
    if (!m) return 0;
    int64_t total = 0;
    return walk(m, WANT_PARAMS, numel_visit, &total) ? total : -1;
}

/* ---- structural signature -------------------------------------------------- */

static void signature_visit(void *ctx, const char *prefix, size_t plen, const cx_mod_entry *e, bool param,
                            const char *first)
{
    (void)plen;
    cx_sbuf *b = ctx;
    if (first) {
        cx_sb_printf(b, "tie %s%s=%s;", prefix, e->name, first);
        return;
    }
    const cx_tensor *t = e->c->t;
    cx_sb_printf(b, "%s%s%s:%s:(", param ? "" : "buffer ", prefix, e->name, cx_dtype_name(cx_dtype_of(t)));
    for (int d = 0; d < cx_ndim(t); d++) cx_sb_printf(b, d ? ", %lld" : "%lld", (long long)cx_dim(t, d));
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
