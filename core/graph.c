/* Sync: capture the pending graph of the live tensors, key it, find or
 * compile its executable, run it and materialize the outputs. */
#include "exec.h"
#include "obs.h"
#include "pool.h"

#include <math.h>
#include <unistd.h>

#ifndef CX_COMPILE_FLAGS
#define CX_COMPILE_FLAGS "default"
#endif

/* ---- the executable cache (in-memory LRU) ----------------------------------------------- */

#define CX_CACHE_CAP 256

typedef struct cache_entry {
    cx_executable *e;
    uint64_t last_use;
} cache_entry;

static cache_entry g_cache[CX_CACHE_CAP];
static int g_cache_n;
static uint64_t g_cache_clock;

static cx_executable *cache_find(uint64_t hi, uint64_t lo)
{
    for (int i = 0; i < g_cache_n; i++)
        if (g_cache[i].e->key_hi == hi && g_cache[i].e->key_lo == lo) {
            g_cache[i].last_use = ++g_cache_clock;
            return g_cache[i].e;
        }
    return NULL;
}

static void cache_insert(cx_executable *e)
{
    if (g_cache_n == CX_CACHE_CAP) {
        int victim = 0;
        for (int i = 1; i < g_cache_n; i++) if (g_cache[i].last_use < g_cache[victim].last_use) victim = i;
        cx_executable_free(g_cache[victim].e);
        g_cache[victim] = g_cache[--g_cache_n];
    }
    g_cache[g_cache_n++] = (cache_entry){ e, ++g_cache_clock };
}

void cx_cache_clear(void)
{
    for (int i = 0; i < g_cache_n; i++) cx_executable_free(g_cache[i].e);
    g_cache_n = 0;
}

/* ---- key ----------------------------------------------------------------------------------- */

typedef struct { uint64_t a, b; } key128;

static inline void kmix(key128 *k, uint64_t v)
{
    k->a ^= v; k->a *= 0x100000001b3ull; k->a ^= k->a >> 29;
    k->b += v * 0x9e3779b97f4a7c15ull; k->b = (k->b << 31 | k->b >> 33) * 0xbf58476d1ce4e5b9ull;
}

static void kmix_str(key128 *k, const char *s)
{
    for (; *s; s++) kmix(k, (uint64_t)(unsigned char)*s);
}

/* ---- capture ------------------------------------------------------------------------------ */

typedef struct {
    cx_node **nodes;
    int n, cap;
    cx_node **inputs;  /* data leaves, canonical order */
    int n_inputs, in_cap;
    cx_node **rts;
    int n_rts, rt_cap;
} capture;

static bool grow(void **p, int *cap, int need, size_t es)
{
    if (need <= *cap) return true;
    int c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * es);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* post-order DFS from each output; data leaves get ordinals in visit order */
static bool capture_graph(capture *cp, cx_node **outs, int nouts, int visited, int done)
{
    struct frame { cx_node *x; int next; } *stack = NULL;
    int sp = 0, scap = 0;
    for (int o = 0; o < nouts; o++) {
        cx_node *r = outs[o];
        if (r->mark == done) continue;
        if (!grow((void **)&stack, &scap, sp + 1, sizeof *stack)) { free(stack); return false; }
        stack[sp++] = (struct frame){ r, 0 };
        r->mark = visited;
        while (sp) {
            struct frame *f = &stack[sp - 1];
            /* a node holding its value (eager debug mode) is a leaf */
            if (f->next < f->x->ninputs && !f->x->buf) {
                cx_node *c = f->x->inputs[f->next++];
                if (c->mark == visited || c->mark == done) continue;
                c->mark = visited;
                if (!grow((void **)&stack, &scap, sp + 1, sizeof *stack)) { free(stack); return false; }
                stack[sp++] = (struct frame){ c, 0 };
                continue;
            }
            cx_node *x = f->x;
            sp--;
            x->mark = done;
            if (!grow((void **)&cp->nodes, &cp->cap, cp->n + 1, sizeof *cp->nodes)) { free(stack); return false; }
            x->index = cp->n;
            cp->nodes[cp->n++] = x;
            if (x->buf) {   /* OP_DATA, or a value computed by eager debug mode */
                if (!grow((void **)&cp->inputs, &cp->in_cap, cp->n_inputs + 1, sizeof *cp->inputs)) { free(stack); return false; }
                cp->inputs[cp->n_inputs++] = x;
            } else if (x->op == OP_RTSCALAR) {
                if (!grow((void **)&cp->rts, &cp->rt_cap, cp->n_rts + 1, sizeof *cp->rts)) { free(stack); return false; }
                cp->rts[cp->n_rts++] = x;
            }
        }
    }
    free(stack);
    return true;
}

static _Thread_local capture t_cap;  /* reused buffers between syncs */
static cx_exec_info g_last_info;

cx_exec_info cx_last_exec_info(void) { return g_last_info; }

static int input_ordinal(const capture *cp, const cx_node *x)
{
    for (int i = 0; i < cp->n_inputs; i++) if (cp->inputs[i] == x) return i;
    return -1;
}

cx_status cx_materialize(cx_tensor **ts, int nts, const char *cause)
{
    cx_status status = CX_OK;
    int obs = cx_obs_get();   /* observability switches (obs.h) */
    /* 1. outputs: unique pending nodes, in tensor creation order */
    int cap_t = 0, n_t = 0;
    cx_tensor **tens = NULL;
    if (ts) {
        for (int i = 0; i < nts; i++) {
            cx_tensor *t = ts[i];
            if (!t) continue;
            if (t->node->op == OP_ERROR) { cx_set_error("%s", t->node->err); status = CX_ERR_SHAPE; continue; }
            if (t->node->op == OP_DATA) continue;
            if (t->node->buf) { cx_obs_settle(t); continue; }   /* eager: already computed */
            if (!grow((void **)&tens, &cap_t, n_t + 1, sizeof *tens)) { free(tens); cx_set_error("sync: out of memory"); return CX_ERR_OOM; }
            tens[n_t++] = t;
        }
    } else {
        for (cx_tensor *t = cx_live_first(); t; t = t->next) {
            if (t->node->op == OP_DATA) continue;
            if (t->node->op == OP_ERROR) { if (status == CX_OK) cx_set_error("%s", t->node->err); status = CX_ERR_SHAPE; continue; }
            if (t->node->buf) { cx_obs_settle(t); continue; }   /* eager: already computed */
            if (!grow((void **)&tens, &cap_t, n_t + 1, sizeof *tens)) { free(tens); cx_set_error("sync: out of memory"); return CX_ERR_OOM; }
            tens[n_t++] = t;
        }
    }
    if (n_t == 0) { free(tens); return status; }
    char err_saved[1024] = "";
    if (status != CX_OK) snprintf(err_saved, sizeof err_saved, "%s", cx_last_error());

    double t_start = cx_now();
    int epoch = cx_mark_epoch();
    int out_mark = cx_mark_epoch();
    cx_node **outs = malloc(sizeof *outs * (size_t)n_t);
    int *tens_out = malloc(sizeof(int) * (size_t)n_t);
    int *out_alias = malloc(sizeof(int) * (size_t)n_t);
    if (!outs || !tens_out || !out_alias) {
        free(outs); free(tens_out); free(out_alias); free(tens);
        cx_set_error("sync: out of memory");
        return CX_ERR_OOM;
    }
    int nouts = 0;
    for (int i = 0; i < n_t; i++) {
        cx_node *x = tens[i]->node;
        if (x->mark == out_mark) {
            tens_out[i] = x->index;
            continue;
        }
        x->mark = out_mark;
        x->index = nouts;
        tens_out[i] = nouts;
        out_alias[nouts] = -1;
        outs[nouts++] = x;
    }
    /* 2. capture (marks are reset by the capture's own epoch) */
    capture *cp = &t_cap;
    cp->n = cp->n_inputs = cp->n_rts = 0;
    bool ok = capture_graph(cp, outs, nouts, epoch, epoch + 1);
    /* 3. aliasing plan: a cx_assign'd output may take its old buffer when
     * nothing else can see that buffer any more */
    for (int i = 0; ok && i < n_t; i++) {
        cx_tensor *t = tens[i];
        int o = tens_out[i];
        cx_node *d = t->donor;
        if (!(t->flags & TF_ASSIGNED) || !d || out_alias[o] >= 0) continue;
        if (d->hrefs != 0 || !d->buf || d->buf->refs != 1 || d->op != OP_DATA) continue;
        if ((int64_t)d->buf->bytes != outs[o]->numel * (int64_t)cx_dtype_size((cx_dtype)outs[o]->dtype)) continue;
        int ord = input_ordinal(cp, d);
        if (ord < 0) {
            if (!grow((void **)&cp->inputs, &cp->in_cap, cp->n_inputs + 1, sizeof *cp->inputs)) { ok = false; break; }
            ord = cp->n_inputs;
            cp->inputs[cp->n_inputs++] = d;
        }
        bool taken = false;
        for (int q = 0; q < nouts; q++) if (out_alias[q] == ord) taken = true;
        if (taken) continue;
        out_alias[o] = ord;
    }
    if (!ok) {
        free(outs); free(tens_out); free(out_alias); free(tens);
        cx_set_error("sync: out of memory");
        return CX_ERR_OOM;
    }
    /* 4. key */
    key128 key = { 0xcbf29ce484222325ull, 0x84222325cbf29ce4ull };
    kmix_str(&key, CX_VERSION_STRING);
    kmix_str(&key, CX_COMPILE_FLAGS);
    kmix_str(&key, cx_obs_compile_options());   /* user compile options (disk_cache.c) */
    kmix(&key, (uint64_t)cx_get_num_threads());  /* conv scratch has one tile buffer per thread */
    for (int i = 0; i < cp->n; i++) {
        cx_node *x = cp->nodes[i];
        if (x->buf && x->op != OP_DATA) {   /* eager value: a data leaf */
            kmix(&key, (uint64_t)OP_DATA << 32 | (uint64_t)x->dtype << 16 | (uint64_t)x->ndim << 8);
            for (int d = 0; d < x->ndim; d++) kmix(&key, (uint64_t)x->shape[d]);
            kmix(&key, 0);
            continue;
        }
        kmix(&key, (uint64_t)x->op << 32 | (uint64_t)x->dtype << 16 | (uint64_t)x->ndim << 8 | (uint64_t)x->ninputs);
        for (int d = 0; d < x->ndim; d++) kmix(&key, (uint64_t)x->shape[d]);
        for (int a = 0; a < x->nattrs; a++) kmix(&key, (uint64_t)x->attrs[a]);
        uint64_t fb;
        memcpy(&fb, &x->fval, sizeof fb);
        kmix(&key, fb);
        for (int k = 0; k < x->ninputs; k++) kmix(&key, (uint64_t)x->inputs[k]->index);
    }
    kmix(&key, (uint64_t)cp->n_inputs);
    for (int i = 0; i < cp->n_inputs; i++) {
        cx_node *x = cp->inputs[i];
        if (x->mark != epoch + 1) { /* donor appended outside the graph */
            kmix(&key, 0xd0d0ull);
            kmix(&key, (uint64_t)x->numel);
        }
    }
    for (int o = 0; o < nouts; o++) { kmix(&key, (uint64_t)outs[o]->index); kmix(&key, (uint64_t)(int64_t)out_alias[o]); }

    /* 5. cache or compile */
    cx_executable *e = cache_find(key.a, key.b);
    int source = 0;   /* 0 in-memory hit, 1 compiled, 2 persistent cache hit */
    double tc = cx_now();
    if (e) {
        cx_counter_add("CachedCompile", 1);
    } else if ((obs & OBS_DISK_CACHE) && (e = cx_disk_cache_load(key.a, key.b)) != NULL) {
        cache_insert(e);
        source = 2;
    } else {
        cx_graph g = { 0 };
        g.n = cp->n;
        g.nodes = calloc((size_t)cp->n + 1, sizeof *g.nodes);
        int total_inputs = 0;
        for (int i = 0; i < cp->n; i++) total_inputs += cp->nodes[i]->ninputs;
        g.input_storage = malloc(sizeof(int) * (size_t)(total_inputs + 1));
        g.outputs = malloc(sizeof(int) * (size_t)(nouts + 1));
        g.out_alias = malloc(sizeof(int) * (size_t)(nouts + 1));
        if (!g.nodes || !g.input_storage || !g.outputs || !g.out_alias) {
            free(g.nodes); free(g.input_storage); free(g.outputs); free(g.out_alias);
            free(outs); free(tens_out); free(out_alias); free(tens);
            cx_set_error("compile: out of memory");
            return CX_ERR_OOM;
        }
        int pos = 0, in_ord = 0, rt_ord = 0;
        for (int i = 0; i < cp->n; i++) {
            cx_node *x = cp->nodes[i];
            cx_gnode *gn = &g.nodes[i];
            if (x->buf && x->op != OP_DATA) {   /* eager value: a data leaf */
                gn->op = OP_DATA;
                gn->dtype = x->dtype;
                gn->ndim = x->ndim;
                memcpy(gn->shape, x->shape, sizeof gn->shape);
                gn->numel = x->numel;
                gn->inputs = g.input_storage + pos;
                gn->input_ordinal = in_ord++;
                continue;
            }
            gn->op = x->op;
            gn->dtype = x->dtype;
            gn->ndim = x->ndim;
            memcpy(gn->shape, x->shape, sizeof gn->shape);
            gn->numel = x->numel;
            gn->ninputs = x->ninputs;
            gn->inputs = g.input_storage + pos;
            for (int k = 0; k < x->ninputs; k++) gn->inputs[k] = x->inputs[k]->index;
            pos += x->ninputs;
            gn->nattrs = x->nattrs;
            memcpy(gn->attrs, x->attrs, sizeof gn->attrs);
            gn->fval = x->fval;
            gn->input_ordinal = x->op == OP_DATA ? in_ord++ : x->op == OP_RTSCALAR ? rt_ord++ : -1;
        }
        g.n_inputs = cp->n_inputs;
        g.n_rts = cp->n_rts;
        g.n_outputs = nouts;
        for (int o = 0; o < nouts; o++) { g.outputs[o] = outs[o]->index; g.out_alias[o] = out_alias[o]; }
        e = cx_lower(&g);
        free(g.nodes); free(g.input_storage); free(g.outputs); free(g.out_alias);
        if (!e) {
            free(outs); free(tens_out); free(out_alias); free(tens);
            return CX_ERR_STATE;
        }
        e->key_hi = key.a;
        e->key_lo = key.b;
        cache_insert(e);
        cx_counter_add("UncachedCompile", 1);
        cx_metric_add("CompileTime", cx_now() - tc);
        source = 1;
        cx_obs_compiled(e);   /* persistent cache store; cx_cache_init is refused from now on */
    }
    if (obs & OBS_TRACE) {
        if (source == 1) cx_trace_event("compile", "compile", tc, cx_now(), NULL);
        else if (source == 2) cx_trace_event("compile", "persistent_cache_load", tc, cx_now(), NULL);
    }
    /* debug analysis and graph dumps see the graph before it runs */
    if (obs & (OBS_DEBUG | OBS_DUMP)) cx_obs_graph(cause, key.a, key.b, cp->nodes, cp->n, outs, nouts, e, source);

    /* 6. bind inputs, runtime scalars and outputs */
    void **inputs = malloc(sizeof(void *) * (size_t)(cp->n_inputs + 1));
    double *rt_f = malloc(sizeof(double) * (size_t)(cp->n_rts + 1));
    int64_t *rt_i = malloc(sizeof(int64_t) * (size_t)(cp->n_rts + 1));
    cx_buffer **obufs = calloc((size_t)nouts + 1, sizeof *obufs);
    void **optr = malloc(sizeof(void *) * (size_t)(nouts + 1));
    cx_status st = CX_OK;
    if (!inputs || !rt_f || !rt_i || !obufs || !optr) { st = CX_ERR_OOM; cx_set_error("sync: out of memory"); }
    for (int i = 0; st == CX_OK && i < cp->n_inputs; i++) {
        if (!cp->inputs[i]->buf) {
            char b[160];
            cx_set_error("sync: a value-less placeholder of shape %s was used in a computation",
                         cx_shape_str(b, sizeof b, cp->inputs[i]->shape, cp->inputs[i]->ndim));
            st = CX_ERR_STATE;
            break;
        }
        inputs[i] = cp->inputs[i]->buf->data;
    }
    for (int i = 0; st == CX_OK && i < cp->n_rts; i++) { rt_f[i] = cp->rts[i]->rt_f; rt_i[i] = cp->rts[i]->rt_i; }
    for (int o = 0; st == CX_OK && o < nouts; o++) {
        if (out_alias[o] >= 0) {
            obufs[o] = cp->inputs[out_alias[o]]->buf;
            cx_buffer_ref(obufs[o]);
        } else {
            obufs[o] = cx_buffer_new((size_t)e->out_bytes[o]);
            if (!obufs[o]) { st = CX_ERR_OOM; break; }
        }
        optr[o] = obufs[o]->data;
    }
    /* 7. run */
    if (st == CX_OK) {
        double te = cx_now();
        st = cx_execute(e, inputs, rt_f, rt_i, optr);
        double te1 = cx_now();
        cx_metric_add("ExecuteTime", te1 - te);
        if (obs & OBS_TRACE) {
            char args[96];
            snprintf(args, sizeof args, "\"kernels\": %d, \"hash\": \"%016llx%016llx\"", e->num_work_kernels,
                     (unsigned long long)e->key_hi, (unsigned long long)e->key_lo);
            cx_trace_event("execute", "execute", te, te1, args);
        }
    }
    g_last_info = (cx_exec_info){ .num_kernels = e->num_work_kernels, .num_nodes = e->num_nodes,
                                  .arena_bytes = e->arena_bytes, .intermediate_bytes = e->intermediate_bytes,
                                  .num_inputs = e->n_inputs, .num_outputs = e->n_outputs, .num_aliased = e->num_aliased,
                                  .key_hi = e->key_hi, .key_lo = e->key_lo };
    /* 8. materialize */
    if (st == CX_OK) {
        cx_node **newn = calloc((size_t)nouts + 1, sizeof *newn);
        if (!newn) { st = CX_ERR_OOM; cx_set_error("sync: out of memory"); }
        for (int o = 0; st == CX_OK && o < nouts; o++) {
            newn[o] = cx_node_data(obufs[o], (cx_dtype)outs[o]->dtype, outs[o]->shape, outs[o]->ndim);
            if (!newn[o]) { st = CX_ERR_OOM; break; }
            obufs[o] = NULL;
        }
        if (st == CX_OK) {
            cx_counter_add("CreateDataHandles", nouts);
            for (int i = 0; i < n_t; i++) {
                cx_tensor *t = tens[i];
                cx_node *nn = newn[tens_out[i]];
                cx_set_node(t, nn);
                if (t->flags & TF_REQUIRES_GRAD) { nn->flags |= NF_REQUIRES_GRAD; nn->grad_leaf = t; }
                t->flags &= ~(uint32_t)TF_ASSIGNED;
                if (t->donor) { cx_node_unref(t->donor); t->donor = NULL; }
            }
        }
        for (int o = 0; o < nouts; o++) if (newn && newn[o]) cx_node_unref(newn[o]); /* tensors hold them now */
        free(newn);
    }
    for (int o = 0; o < nouts; o++) if (obufs && obufs[o]) cx_buffer_unref(obufs[o]);
    free(inputs); free(rt_f); free(rt_i); free(obufs); free(optr);
    free(outs); free(tens_out); free(out_alias); free(tens);
    double t_end = cx_now();
    cx_metric_add("SyncTime", t_end - t_start);
    if (obs & OBS_TRACE) {
        char args[64];
        snprintf(args, sizeof args, "\"cause\": \"%s\", \"outputs\": %d", cause, nouts);
        cx_trace_event("sync", "sync", t_start, t_end, args);
    }
    if (st != CX_OK) return st;
    if (status != CX_OK) cx_set_error("%s", err_saved);
    return status;
}
