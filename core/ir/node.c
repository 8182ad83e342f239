/* IR nodes: creation, interning (the same op on the same inputs is the same
 * node, which is CSE at record time), and reference counting. */
#include "ir.h"
#include "obs.h"
#include "cx_hash.h"
#include "cx_vec.h"

#include <stdarg.h>

#include <stdatomic.h>

static atomic_uint_fast64_t g_next_id = 1;
uint64_t cx_next_id(void) { return atomic_fetch_add(&g_next_id, 1); }

static int g_mark_epoch;
int cx_mark_epoch(void) { g_mark_epoch += 2; return g_mark_epoch; }

/* Nodes are recycled through a free list; the loader thread makes data
 * nodes too, hence the lock. */
static cx_spinlock g_node_lock = CX_SPINLOCK_INIT;
static cx_node *g_free_nodes;
static int g_nfree_nodes;

static cx_node *node_alloc(void)
{
    cx_node *n = NULL;
    cx_spin_lock(&g_node_lock);
    if (g_free_nodes) { n = g_free_nodes; g_free_nodes = n->intern_next; g_nfree_nodes--; }
    cx_spin_unlock(&g_node_lock);
    if (n) { memset(n, 0, sizeof *n); return n; }
    return calloc(1, sizeof *n);
}

static void node_free(cx_node *n)
{
    cx_spin_lock(&g_node_lock);
#if defined(__SANITIZE_ADDRESS__)
    if (0) {
#else
    if (g_nfree_nodes < 8192) {
#endif
        n->intern_next = g_free_nodes;
        g_free_nodes = n;
        g_nfree_nodes++;
        n = NULL;
    }
    cx_spin_unlock(&g_node_lock);
    free(n);
}

/* ---- intern table (weak: it never keeps a node alive) ---------------------- */

static cx_node **g_tab;
static size_t g_tab_cap, g_tab_count;

static uint64_t desc_hash(const cx_node_desc *d, uint64_t remat)
{
    enum { SMALL_INPUTS = 8 };
    uint64_t w[6 + CX_MAX_DIMS + CX_MAX_ATTRS + SMALL_INPUTS];
    int n = 0;
    w[n++] = (uint64_t)d->op << 32 | (uint64_t)d->dtype << 24 | (uint64_t)d->ndim << 16 | (uint64_t)d->nattrs;
    for (int i = 0; i < d->ndim; i++) w[n++] = (uint64_t)d->shape[i];
    for (int i = 0; i < d->nattrs; i++) w[n++] = (uint64_t)d->attrs[i];
    memcpy(&w[n++], &d->fval, sizeof d->fval);
    w[n++] = (uint64_t)(d->flags & NF_REQUIRES_GRAD);
    w[n++] = remat;
    w[n++] = (uint64_t)d->ninputs;
    /* inputs are interned nodes: their addresses are their identity; most
     * ops have a few, hashed in the same call */
    bool small = d->ninputs <= SMALL_INPUTS;
    for (int i = 0; small && i < d->ninputs; i++) w[n++] = (uint64_t)(uintptr_t)d->inputs[i];
    uint64_t h = cx_hash64(w, sizeof *w * (size_t)n);
    return small ? h : cx_hash64_more(d->inputs, sizeof *d->inputs * (size_t)d->ninputs, h);
}

static bool node_matches(const cx_node *n, const cx_node_desc *d, uint64_t remat)
{
    if (n->op != d->op || n->dtype != d->dtype || n->ndim != d->ndim || n->ninputs != d->ninputs ||
        n->nattrs != d->nattrs || n->remat_tag != remat ||
        (n->flags & NF_REQUIRES_GRAD) != (d->flags & NF_REQUIRES_GRAD))
        return false;
    if (memcmp(&n->fval, &d->fval, sizeof n->fval)) return false;
    for (int i = 0; i < d->ndim; i++) if (n->shape[i] != d->shape[i]) return false;
    for (int i = 0; i < d->nattrs; i++) if (n->attrs[i] != d->attrs[i]) return false;
    for (int i = 0; i < d->ninputs; i++) if (n->inputs[i] != d->inputs[i]) return false;
    return true;
}

static void tab_grow(void)
{
    size_t cap = g_tab_cap ? g_tab_cap * 2 : 4096;
    cx_node **t = calloc(cap, sizeof *t);
    if (!t) return; /* keep the old table; chains just get longer */
    for (size_t i = 0; i < g_tab_cap; i++) {
        cx_node *n = g_tab[i];
        while (n) {
            cx_node *next = n->intern_next;
            size_t b = n->hash & (cap - 1);
            n->intern_next = t[b];
            t[b] = n;
            n = next;
        }
    }
    free(g_tab);
    g_tab = t;
    g_tab_cap = cap;
}

static void tab_remove(cx_node *n)
{
    size_t b = n->hash & (g_tab_cap - 1);
    for (cx_node **p = &g_tab[b]; *p; p = &(*p)->intern_next)
        if (*p == n) { *p = n->intern_next; g_tab_count--; return; }
}

static bool internable(const cx_node_desc *d)
{
    if (d->flags & NF_PINNED) return false;
    return d->op != OP_DATA && d->op != OP_RTSCALAR && d->op != OP_ERROR;
}

cx_node *cx_node_make(const cx_node_desc *d)
{
    CX_ASSERT(d->ndim >= 0 && d->ndim <= CX_MAX_DIMS && d->nattrs <= CX_MAX_ATTRS);
    /* leaves are never recomputed; and a data leaf may be made on the
     * loader's thread while the main thread is inside a remat region */
    bool leaf = d->op == OP_DATA || d->op == OP_RTSCALAR || d->op == OP_ERROR;
    uint64_t remat = leaf ? 0 : cx_remat_region();
    bool intern = internable(d);
    uint64_t h = 0;
    if (intern) {
        h = desc_hash(d, remat);
        if (g_tab_cap) {
            for (cx_node *n = g_tab[h & (g_tab_cap - 1)]; n; n = n->intern_next)
                if (n->hash == h && node_matches(n, d, remat)) { n->refs++; return n; }
        }
    }
    cx_node *n = node_alloc();
    if (!n) return NULL;
    n->op = (uint16_t)d->op;
    n->dtype = (uint8_t)d->dtype;
    n->ndim = (uint8_t)d->ndim;
    n->flags = d->flags | (remat ? NF_REMAT : 0);
    n->remat_tag = remat;
    if (d->ndim) memcpy(n->shape, d->shape, sizeof(int64_t) * (size_t)d->ndim);
    n->numel = cx_shape_numel(d->shape, d->ndim);
    n->ninputs = d->ninputs;
    n->inputs = d->ninputs <= 3 ? n->inline_inputs : calloc((size_t)d->ninputs, sizeof *n->inputs);
    if (!n->inputs) { free(n); return NULL; }
    for (int i = 0; i < d->ninputs; i++) { n->inputs[i] = d->inputs[i]; d->inputs[i]->refs++; }
    n->nattrs = d->nattrs;
    if (d->nattrs) memcpy(n->attrs, d->attrs, sizeof(int64_t) * (size_t)d->nattrs);
    n->fval = d->fval;
    n->id = cx_next_id();
    n->refs = 1;
    /* an interned node found again keeps the line that made it first */
    if (__builtin_expect(cx_obs_get() & OBS_IR_DEBUG, 0) && cx_obs_hooks.site) n->loc = cx_obs_hooks.site();
    if (intern) {
        if (g_tab_count * 2 >= g_tab_cap) tab_grow();
        n->hash = h;
        size_t b = h & (g_tab_cap - 1);
        n->intern_next = g_tab[b];
        g_tab[b] = n;
        g_tab_count++;
        n->flags |= NF_INTERNED;
    }
    return n;
}

void cx_node_ref(cx_node *n) { if (n) n->refs++; }

void cx_node_unref(cx_node *n)
{
    /* iterative release: long chains (a deep graph) must not blow the stack */
    cx_node *stack_small[64];
    cx_node **stack = stack_small;
    size_t sp = 0, cap = 64;
    if (!n) return;
    stack[sp++] = n;
    while (sp) {
        cx_node *x = stack[--sp];
        if (--x->refs > 0) continue;
        if (x->flags & NF_INTERNED) tab_remove(x);
        for (int i = 0; i < x->ninputs; i++) {
            if (sp == cap) {
                size_t ncap = cap * 2;
                cx_node **ns = malloc(ncap * sizeof *ns);
                if (!ns) { CX_ASSERT(!"out of memory while releasing a graph"); }
                memcpy(ns, stack, sp * sizeof *ns);
                if (stack != stack_small) free(stack);
                stack = ns;
                cap = ncap;
            }
            stack[sp++] = x->inputs[i];
        }
        if (x->inputs != x->inline_inputs) free(x->inputs);
        cx_buffer_unref(x->buf);
        free(x->err);
        free(x->init);
        free(x->sharding);
        node_free(x);
    }
    if (stack != stack_small) free(stack);
}

cx_node *cx_node_data(cx_buffer *buf, cx_dtype dt, const int64_t *shape, int ndim)
{
    cx_node_desc d = { .op = OP_DATA, .dtype = dt, .ndim = ndim, .shape = shape };
    cx_node *n = cx_node_make(&d);
    if (n) n->buf = buf;
    return n;
}

cx_node *cx_node_error(const char *msg)
{
    cx_node_desc d = { .op = OP_ERROR, .dtype = CX_F32, .ndim = 0, .shape = NULL };
    cx_node *n = cx_node_make(&d);
    if (n) n->err = strdup(msg);
    return n;
}

bool cx_node_postorder(cx_node *const *roots, int nroots, bool (*follow)(const cx_node *x, const cx_node *input),
                       bool (*visit)(void *ctx, cx_node *x), void *ctx)
{
    struct frame { cx_node *x; int next; } *stack = NULL;
    int sp = 0, scap = 0;
    int visited = cx_mark_epoch(), done = visited + 1;
    bool ok = true;
    for (int r = 0; r < nroots && ok; r++) {
        cx_node *root = roots[r];
        if (!root || root->mark == visited || root->mark == done) continue;
        if (!(ok = CX_GROW(stack, scap, sp + 1))) break;
        root->mark = visited;
        stack[sp++] = (struct frame){ root, 0 };
        while (sp && ok) {
            struct frame *f = &stack[sp - 1];
            if (f->next < f->x->ninputs) {
                cx_node *c = f->x->inputs[f->next++];
                if (c->mark == visited || c->mark == done || !follow(f->x, c)) continue;
                if (!(ok = CX_GROW(stack, scap, sp + 1))) break;
                c->mark = visited;
                stack[sp++] = (struct frame){ c, 0 };
                continue;
            }
            cx_node *x = f->x;
            sp--;
            x->mark = done;
            ok = visit(ctx, x);
        }
    }
    free(stack);
    return ok;
}
