/* Tensor handles, the live list, steps, and tensors over host data. */
#include "ir.h"
#include "cx_vec.h"
#include "obs.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>

/* The live list holds every handle in creation order: sync takes its
 * outputs from it. The loader may create handles on another thread, so the
 * list is locked. */
static cx_spinlock g_live_mu = CX_SPINLOCK_INIT;
/* freed handles are reused: a step creates and frees hundreds */
static cx_tensor *g_free_handles;
/* recycling would hide use-after-free from the sanitizers */
#if defined(__SANITIZE_ADDRESS__)
#define CX_HANDLE_CACHE 0
#else
#define CX_HANDLE_CACHE 4096
#endif
static int g_nfree_handles;
static cx_tensor *g_live_head, *g_live_tail;

/* A released handle is not reused at once: it waits in a ring of the last
 * CX_HANDLE_QUARANTINE releases, pointing at a poisoned node that says how
 * its value went. A program that reads a tensor it no longer owns (the
 * loss after cx_step_end without cx_keep, a parameter after
 * cx_module_free) then gets that message through the usual poison, a NaN
 * from cx_item and an error from the step, instead of reading freed
 * memory; the check itself is the poison test every op already makes. A
 * handle is reused only after that many later releases and a new handle
 * taking its memory (until then it still reads as released); one used
 * after that is undefined as before. Small, so that handles come back
 * while their memory is still in cache: a step's trace makes and frees a
 * few hundred. */
#define CX_HANDLE_QUARANTINE 1024
static cx_tensor *g_quarantine[CX_HANDLE_QUARANTINE];
static int g_quarantine_pos;

static char g_msg_step_end[] = "tensor released at the end of its step; cx_keep it to read it after the step "
                               "(a kept tensor lives until the end of the next step)";
static char g_msg_freed[] = "tensor used after it was freed (cx_free, or with its owner: cx_module_free, "
                            "an optimizer's or wrapper's free)";
/* never freed: their counts start far above anything a program reaches */
static cx_node g_released_at_step_end = { .op = OP_ERROR, .dtype = CX_F32, .numel = 1, .refs = 1 << 30,
                                          .hrefs = 1 << 30, .err = g_msg_step_end };
static cx_node g_released_by_free = { .op = OP_ERROR, .dtype = CX_F32, .numel = 1, .refs = 1 << 30,
                                      .hrefs = 1 << 30, .err = g_msg_freed };

bool cx_tensor_released(const cx_tensor *t, const char *op)
{
    if (!t || !(t->flags & TF_RELEASED)) return false;
    cx_set_last_error("%s: %s", op, t->node->err);
    return true;
}

/* Steps: each open step owns the handles made while it is innermost. */
#define CX_MAX_STEP_DEPTH CX_RECORD_MAX_STEPS
typedef struct {
    cx_tensor **items;
    int n, cap;
} tensor_list;
static _Thread_local tensor_list t_steps[CX_MAX_STEP_DEPTH + 1];
/* handles kept at the end of a step live until the end of the next step at
 * the same depth, so a training loop that keeps its loss does not leak */
static _Thread_local tensor_list t_carry[CX_MAX_STEP_DEPTH + 1];

static bool list_push(tensor_list *l, cx_tensor *t)
{
    if (!CX_GROW(l->items, l->cap, l->n + 1)) return false;
    t->step_slot = l->n;
    l->items[l->n++] = t;
    return true;
}

void cx_live_range(cx_tensor **first, cx_tensor **last)
{
    cx_spin_lock(&g_live_mu);
    *first = g_live_head;
    *last = g_live_tail;
    cx_spin_unlock(&g_live_mu);
}

void (*cx_eager_hook)(cx_tensor *t);

static void live_link(cx_tensor *t)
{
    cx_spin_lock(&g_live_mu);
    t->prev = g_live_tail;
    t->next = NULL;
    if (g_live_tail) g_live_tail->next = t; else g_live_head = t;
    g_live_tail = t;
    cx_spin_unlock(&g_live_mu);
}

void cx_set_node(cx_tensor *t, cx_node *n)
{
    if (t->node == n) return;
    cx_node_ref(n);
    n->hrefs++;
    if (t->node) { t->node->hrefs--; cx_node_unref(t->node); }
    t->node = n;
}

cx_tensor *cx_tensor_wrap(cx_node *n)
{
    if (!n) return NULL;
    cx_tensor *t = NULL;
    cx_spin_lock(&g_live_mu);
    if (g_free_handles) { t = g_free_handles; g_free_handles = t->next; g_nfree_handles--; }
    cx_spin_unlock(&g_live_mu);
    if (t) memset(t, 0, sizeof *t);
    else t = calloc(1, sizeof *t);
    if (!t) { cx_node_unref(n); cx_set_last_error("out of memory: tensor handle"); return NULL; }
    t->node = n;
    n->hrefs++;
    t->id = cx_next_id();
    int depth = cx_record()->step_depth;
    t->step_depth = depth;
    t->step_slot = -1;
    if (depth > 0 && !list_push(&t_steps[depth], t)) t->step_depth = 0;
    if (t->step_depth == 0) t->flags |= TF_PERSISTENT;
    live_link(t);
    return t;
}

cx_tensor *cx_tensor_of(cx_node *n)
{
    cx_node_ref(n);
    return cx_tensor_wrap(n);
}

cx_tensor *cx_poisoned(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cx_set_last_error("%s", msg);
    return cx_tensor_wrap(cx_node_error(msg));
}

static void release_handle(cx_tensor *t, cx_node *why)
{
    if (t->grad) release_handle(t->grad, why);
    if (t->donor) cx_node_unref(t->donor);
    t->node->hrefs--;
    cx_node_unref(t->node);
    if (t->name) free(t->name);
    /* one pass under the lock: out of the live list, into the quarantine,
     * the oldest quarantined handle to the free list. The node says how the
     * value went; every call that would follow the handle's other fields
     * (grad, name, step) checks TF_RELEASED first. */
    cx_spin_lock(&g_live_mu);
    if (t->prev) t->prev->next = t->next; else g_live_head = t->next;
    if (t->next) t->next->prev = t->prev; else g_live_tail = t->prev;
    t->node = why;
    t->flags = TF_RELEASED;
    cx_tensor *oldest = g_quarantine[g_quarantine_pos];
    g_quarantine[g_quarantine_pos] = t;
    g_quarantine_pos = (g_quarantine_pos + 1) % CX_HANDLE_QUARANTINE;
    if (oldest && g_nfree_handles < CX_HANDLE_CACHE) {
        oldest->next = g_free_handles;
        g_free_handles = oldest;
        g_nfree_handles++;
        oldest = NULL;
    }
    cx_spin_unlock(&g_live_mu);
    if (oldest) free(oldest);
}

static void step_forget(cx_tensor *t)
{
    if (t->step_depth > 0 && t->step_slot >= 0) {
        tensor_list *l = (t->flags & TF_KEPT) ? &t_carry[t->step_depth] : &t_steps[t->step_depth];
        if (t->step_slot < l->n && l->items[t->step_slot] == t) l->items[t->step_slot] = NULL;
    }
}

void cx_free(cx_tensor *t)
{
    if (!t || cx_tensor_released(t, "cx_free")) return;
    step_forget(t);
    release_handle(t, &g_released_by_free);
}

void cx_drop(cx_tensor *t)
{
    /* inside a step the step releases it; elsewhere nobody would */
    if (t && t->step_depth == 0 && !(t->flags & (TF_REQUIRES_GRAD | TF_RELEASED))) cx_free(t);
}

cx_tensor *cx_keep(cx_tensor *t)
{
    if (cx_tensor_released(t, "cx_keep")) return t;
    if (t && t->step_depth > 0) t->flags |= TF_KEPT;
    return t;
}

cx_tensor *cx_persist(cx_tensor *t)
{
    if (!t || cx_tensor_released(t, "cx_persist")) return t;
    step_forget(t);
    t->step_depth = 0;
    t->step_slot = -1;
    t->flags |= TF_PERSISTENT;
    t->flags &= ~(uint32_t)TF_KEPT;
    return t;
}

cx_tensor *cx_alias(cx_tensor *t)
{
    if (!t) return NULL;
    return cx_tensor_of(t->node);
}

void cx_step_begin(void)
{
    cx_record_ctx *rec = cx_record();
    if (rec->step_depth >= CX_MAX_STEP_DEPTH) {
        cx_set_last_error("cx_step_begin: steps nested deeper than %d", CX_MAX_STEP_DEPTH);
        return;
    }
    int d = ++rec->step_depth;
    cx_autocast_step_began(d);
    /* last step's kept handles now belong to this step */
    tensor_list *c = &t_carry[d];
    for (int i = 0; i < c->n; i++) {
        cx_tensor *t = c->items[i];
        if (!t) continue;
        t->flags &= ~(uint32_t)TF_KEPT;
        if (!list_push(&t_steps[d], t)) { t->step_depth = 0; t->flags |= TF_PERSISTENT; }
    }
    c->n = 0;
}

bool cx_step_close(void)
{
    cx_record_ctx *rec = cx_record();
    if (rec->step_depth == 0) {
        cx_set_last_error("cx_step_end: no step is open");
        return false;
    }
    int d = rec->step_depth;
    tensor_list *l = &t_steps[d];
    tensor_list *c = &t_carry[d];
    for (int i = 0; i < l->n; i++) {
        cx_tensor *t = l->items[i];
        if (!t) continue;
        if (t->flags & TF_KEPT) {
            if (!list_push(c, t)) { t->flags &= ~(uint32_t)TF_KEPT; t->step_depth = 0; t->flags |= TF_PERSISTENT; }
        } else {
            release_handle(t, &g_released_at_step_end);
        }
    }
    l->n = 0;
    rec->step_depth--;
    return true;
}

/* ---- creation ------------------------------------------------------------ */

bool cx_check_shape(const char *op, const int64_t *shape, int ndim)
{
    if (ndim < 0 || ndim > CX_MAX_DIMS || (ndim > 0 && !shape)) {
        cx_set_last_error("%s: rank %d is outside 0..%d", op, ndim, CX_MAX_DIMS);
        return false;
    }
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) {
            char b[160];
            cx_set_last_error("%s: negative dimension in shape %s", op, cx_shape_str(b, sizeof b, shape, ndim));
            return false;
        }
    return true;
}

cx_tensor *cx_from_host(const void *data, const int64_t *shape, int ndim, cx_dtype dtype)
{
    if (!cx_check_shape("from_host", shape, ndim)) return cx_poisoned("%s", cx_last_error());
    if ((unsigned)dtype >= CX_DTYPE_COUNT) return cx_poisoned("from_host: unknown dtype %d", (int)dtype);
    double t0 = cx_now();
    int64_t numel = cx_shape_numel(shape, ndim);
    cx_dtype held = cx_held_dtype(dtype);
    size_t bytes = (size_t)numel * cx_dtype_size(held);
    if (bytes && !data) return cx_poisoned("from_host: data is NULL for %lld elements", (long long)numel);
    cx_buffer *b = cx_buffer_new(bytes);
    if (!b) return cx_poisoned("from_host: %s", cx_last_error());
    if (bytes && held != dtype) cx_f32_to_bf16_row(b->data, data, numel); /* only f32 is held otherwise */
    else if (bytes) memcpy(b->data, data, bytes);
    cx_node *n = cx_node_data(b, held, shape, ndim);
    if (!n) { cx_buffer_unref(b); return cx_poisoned("from_host: out of memory"); }
    double t1 = cx_now();
    cx_metric_add("TransferToDeviceTime", t1 - t0);
    cx_counter_add("CreateDataHandles", 1);
    if (cx_obs_get() & OBS_TRACE) {
        char args[48];
        snprintf(args, sizeof args, "\"bytes\": %zu", bytes);
        cx_obs_trace("transfer", "TransferToDevice", t0, t1, args);
    }
    return cx_tensor_wrap(n);
}

cx_tensor *cx_from_fill(const int64_t *shape, int ndim, cx_dtype dtype, cx_fill_fn fill, void *ctx)
{
    if (!cx_check_shape("from_fill", shape, ndim)) return cx_poisoned("%s", cx_last_error());
    if ((unsigned)dtype >= CX_DTYPE_COUNT || !fill) return cx_poisoned("from_fill: bad dtype or NULL fill");
    double t0 = cx_now();
    int64_t numel = cx_shape_numel(shape, ndim);
    cx_dtype held = cx_held_dtype(dtype);
    size_t bytes = (size_t)numel * cx_dtype_size(dtype);
    cx_buffer *b = cx_buffer_new((size_t)numel * cx_dtype_size(held));
    /* fill writes `dtype`; a held bf16 tensor is filled through an f32 copy */
    void *dst = held == dtype ? (b ? b->data : NULL) : malloc(bytes ? bytes : 1);
    if (!b || (held != dtype && !dst)) {
        if (held != dtype) free(dst);
        if (b) cx_buffer_unref(b);
        return cx_poisoned("from_fill: %s", b ? "out of memory" : cx_last_error());
    }
    cx_status st = fill(ctx, dst, bytes);
    if (held != dtype) {
        if (st == CX_OK) cx_f32_to_bf16_row(b->data, dst, numel);
        free(dst);
    }
    if (st != CX_OK) {
        char msg[900];
        snprintf(msg, sizeof msg, "%s", cx_last_error());
        cx_buffer_unref(b);
        return cx_poisoned("%s", msg);
    }
    cx_node *n = cx_node_data(b, held, shape, ndim);
    if (!n) { cx_buffer_unref(b); return cx_poisoned("from_fill: out of memory"); }
    cx_metric_add("TransferToDeviceTime", cx_now() - t0);
    cx_counter_add("CreateDataHandles", 1);
    return cx_tensor_wrap(n);
}

cx_tensor *cx_placeholder(const int64_t *shape, int ndim, cx_dtype dtype)
{
    if (!cx_check_shape("placeholder", shape, ndim)) return cx_poisoned("%s", cx_last_error());
    if ((unsigned)dtype >= CX_DTYPE_COUNT) return cx_poisoned("placeholder: unknown dtype %d", (int)dtype);
    cx_node *n = cx_node_data(NULL, cx_held_dtype(dtype), shape, ndim);
    if (!n) return cx_poisoned("placeholder: out of memory");
    cx_tensor *t = cx_tensor_wrap(n);
    return cx_persist(t);
}

/* ---- introspection ---------------------------------------------------------- */

int cx_ndim(const cx_tensor *t) { return t ? t->node->ndim : 0; }
const int64_t *cx_shape(const cx_tensor *t) { return t ? t->node->shape : NULL; }
int64_t cx_numel(const cx_tensor *t) { return t ? t->node->numel : 0; }
cx_dtype cx_dtype_of(const cx_tensor *t) { return t ? (cx_dtype)t->node->dtype : CX_F32; }
bool cx_is_pending(const cx_tensor *t) { return t && t->node->op != OP_DATA; }
bool cx_is_persistent(const cx_tensor *t) { return t && t->step_depth == 0; }
const char *cx_tensor_error(const cx_tensor *t)
{
    if (!t) return "NULL tensor";
    return t->node->op == OP_ERROR ? t->node->err : NULL;
}

int64_t cx_dim(const cx_tensor *t, int axis)
{
    if (!t) return 0;
    int nd = t->node->ndim;
    if (axis < 0) axis += nd;
    if (axis < 0 || axis >= nd) return 0;
    return t->node->shape[axis];
}

void cx_set_name(cx_tensor *t, const char *name)
{
    if (!t || cx_tensor_released(t, "set_name")) return;
    free(t->name);
    t->name = name ? strdup(name) : NULL;
}

const char *cx_get_name(const cx_tensor *t) { return t && !(t->flags & TF_RELEASED) ? t->name : NULL; }
