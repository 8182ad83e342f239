/* Debugging aids: the environment switches, PT_XLA_DEBUG_LEVEL's
 * compilation/execution analysis, XLA_SAVE_TENSORS_FILE graph dumps,
 * cx_ir_text/cx_ir_dot, XLA_USE_EAGER_DEBUG_MODE, step closures and the
 * call-site entry points. See include/cxla/debug.h for the user's view and
 * obs.h for how the hot paths reach this file. */
#define _GNU_SOURCE   /* dladdr */
#define CX_NO_CALLSITE_MACROS
#include "obs.h"

#include <cxla/debug.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdarg.h>

_Atomic int cx_obs_flags = OBS_UNINIT;

void cx_obs_set(int bit, bool on)
{
    if (on) atomic_fetch_or_explicit(&cx_obs_flags, bit, memory_order_relaxed);
    else atomic_fetch_and_explicit(&cx_obs_flags, ~bit, memory_order_relaxed);
}

/* ---- configuration --------------------------------------------------------- */

typedef struct {
    int debug_level;
    bool all_ranks;
    char *debug_file;      /* PT_XLA_DEBUG_FILE, NULL: stderr */
    char *dump_path;       /* XLA_SAVE_TENSORS_FILE */
    bool dump_dot;         /* XLA_SAVE_TENSORS_FMT=dot */
    char *metrics_path;    /* XLA_METRICS_FILE */
} obs_config;

static obs_config g_cfg;
static pthread_mutex_t g_cfg_mu = PTHREAD_MUTEX_INITIALIZER;

static char *env_dup(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? strdup(v) : NULL;
}

static bool env_true(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0 && strcmp(v, "false") != 0;
}

static void read_env_locked(void)
{
    free(g_cfg.debug_file);
    free(g_cfg.dump_path);
    free(g_cfg.metrics_path);
    memset(&g_cfg, 0, sizeof g_cfg);
    const char *lv = getenv("PT_XLA_DEBUG_LEVEL");
    g_cfg.debug_level = lv ? atoi(lv) : 0;
    if (g_cfg.debug_level < 0) g_cfg.debug_level = 0;
    g_cfg.all_ranks = env_true("CX_DEBUG_ALL_RANKS");
    g_cfg.debug_file = env_dup("PT_XLA_DEBUG_FILE");
    g_cfg.dump_path = env_dup("XLA_SAVE_TENSORS_FILE");
    const char *fmt = getenv("XLA_SAVE_TENSORS_FMT");
    g_cfg.dump_dot = fmt && !strcmp(fmt, "dot");
    if (fmt && *fmt && strcmp(fmt, "text") && strcmp(fmt, "dot"))
        fprintf(stderr, "cxla: XLA_SAVE_TENSORS_FMT=%s is not supported (text or dot); using text\n", fmt);
    g_cfg.metrics_path = env_dup("XLA_METRICS_FILE");
    cx_obs_set(OBS_DEBUG, g_cfg.debug_level > 0);
    cx_obs_set(OBS_DUMP, g_cfg.dump_path != NULL);
    cx_obs_set(OBS_METRICS_FILE, g_cfg.metrics_path != NULL);
    cx_obs_set(OBS_EAGER, env_true("XLA_USE_EAGER_DEBUG_MODE"));
}

void cx_obs_init(void)
{
    pthread_mutex_lock(&g_cfg_mu);
    if (atomic_load(&cx_obs_flags) & OBS_UNINIT) {
        read_env_locked();
        cx_obs_set(OBS_UNINIT, false);
        pthread_mutex_unlock(&g_cfg_mu);
        /* outside the lock: cx_cache_init may report through cx_set_error */
        const char *dir = getenv("CX_CACHE_DIR");
        if (dir && *dir && !cx_cache_dir() && cx_cache_init(dir, env_true("CX_CACHE_READONLY")) != CX_OK)
            fprintf(stderr, "cxla: CX_CACHE_DIR=%s: %s\n", dir, cx_last_error());
        return;
    }
    pthread_mutex_unlock(&g_cfg_mu);
}

void cx_debug_reload_env(void)
{
    pthread_mutex_lock(&g_cfg_mu);
    read_env_locked();
    cx_obs_set(OBS_UNINIT, false);
    pthread_mutex_unlock(&g_cfg_mu);
}

int cx_debug_level(void)
{
    cx_obs_get();
    return g_cfg.debug_level;
}

/* ---- call sites ---------------------------------------------------------------- */

static _Thread_local const char *t_site_file;
static _Thread_local int t_site_line;

const char *cx_obs_site_file(int *line)
{
    *line = t_site_line;
    return t_site_file;
}

cx_status cx_sync_at(const char *file, int line)
{
    t_site_file = file;
    t_site_line = line;
    cx_status st = cx_sync();
    t_site_file = NULL;
    return st;
}

cx_status cx_step_end_at(const char *file, int line)
{
    t_site_file = file;
    t_site_line = line;
    cx_status st = cx_step_end();
    t_site_file = NULL;
    return st;
}

double cx_item_at(cx_tensor *t, const char *file, int line)
{
    t_site_file = file;
    t_site_line = line;
    double v = cx_item(t);
    t_site_file = NULL;
    return v;
}

/* The loader (nn/) ends its steps with a plain cx_step_end; core must not
 * depend on nn, so the cause is recognized from the caller's exported
 * symbol. Only called when debugging or dumping is on (dladdr is not free). */
const char *cx_obs_step_cause(void *ra)
{
    Dl_info di;
    if (ra && dladdr(ra, &di) && di.dli_sname && !strncmp(di.dli_sname, "cx_loader_", 10)) return "loader";
    return "step end";
}

static const char *cause_text(const char *cause)
{
    if (!strcmp(cause, "user sync")) return "user called cx_sync / cx_sync_tensors (mark_step)";
    if (!strcmp(cause, "step end")) return "cx_step_end (mark_step) at the end of a step";
    if (!strcmp(cause, "loader")) return "mark_step in parallel loader at step end";
    if (!strcmp(cause, "value read"))
        return "user code trying to access a tensor value (cx_item / cx_to_host) before the step ended; "
               "read it after cx_step_end, or cx_keep it";
    if (!strcmp(cause, "eager")) return "eager debug mode runs every op (XLA_USE_EAGER_DEBUG_MODE)";
    return "";
}

/* ---- analysis output ---------------------------------------------------------------- */

static int local_rank(void)
{
    const char *v = getenv("LOCAL_RANK");
    if (!v) v = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    return v ? atoi(v) : cx_comm_rank();
}

/* @return the stream for analysis output, or NULL when this rank is quiet */
static FILE *dbg_open(bool *close_it)
{
    *close_it = false;
    if (!g_cfg.all_ranks && local_rank() != 0) return NULL;
    if (!g_cfg.debug_file) return stderr;
    char path[4096];
    /* like the other per-rank files: ranks asked to print must not interleave */
    if (cx_comm_world_size() > 1) snprintf(path, sizeof path, "%s.%d", g_cfg.debug_file, cx_comm_rank());
    else snprintf(path, sizeof path, "%s", g_cfg.debug_file);
    FILE *f = fopen(path, "a");
    *close_it = f != NULL;
    return f ? f : stderr;
}

static void dbg_close(FILE *f, bool close_it)
{
    if (close_it) fclose(f); else fflush(f);
}

static void print_frames(FILE *f, const char *prefix, const char *api)
{
    int line;
    const char *file = cx_obs_site_file(&line);
    if (file) fprintf(f, "%s   %s (%s:%d)\n", prefix, api, file, line);
    void *pcs[32];
    int n = backtrace(pcs, 32);
    /* skip this file's and the sync machinery's frames: from the frame
     * after cx_materialize on, the stack is the caller's */
    int start = 0;
    for (int i = 0; i < n; i++) {
        Dl_info di;
        if (dladdr(pcs[i], &di) && di.dli_sname && !strcmp(di.dli_sname, "cx_materialize")) { start = i + 1; break; }
    }
    int shown = 0;
    for (int i = start; i < n && shown < 8; i++) {
        Dl_info di;
        if (!dladdr(pcs[i], &di)) { fprintf(f, "%s   %p\n", prefix, pcs[i]); shown++; continue; }
        const char *mod = di.dli_fname ? strrchr(di.dli_fname, '/') : NULL;
        mod = mod ? mod + 1 : di.dli_fname ? di.dli_fname : "?";
        /* a return address points after the call; -1 lands in the call */
        uintptr_t off = (uintptr_t)pcs[i] - 1 - (uintptr_t)di.dli_fbase;
        if (di.dli_sname && !strcmp(di.dli_sname, "__libc_start_call_main")) break;
        if (di.dli_sname)
            fprintf(f, "%s   %s+0x%lx (%s+0x%lx)\n", prefix, di.dli_sname,
                    (unsigned long)((uintptr_t)pcs[i] - (uintptr_t)di.dli_saddr), mod, (unsigned long)off);
        else
            fprintf(f, "%s   ?? (%s+0x%lx)\n", prefix, mod, (unsigned long)off);
        shown++;
    }
}

static const char *api_of(const char *cause)
{
    if (!strcmp(cause, "user sync")) return "cx_sync";
    if (!strcmp(cause, "value read")) return "cx_item";
    return "cx_step_end";
}

static void analysis(FILE *f, const char *who, const char *cause, uint64_t hi, uint64_t lo, const cx_executable *e,
                     int source)
{
    char p[64];
    snprintf(p, sizeof p, "%s Analysis:", who);
    static const char *bar = "================================================================================";
    fprintf(f, "%s %s\n%s %s Cause\n", p, bar, p, who);
    fprintf(f, "%s   %s: %s\n", p, cause, cause_text(cause));
    if (source == 2) fprintf(f, "%s   (loaded from the persistent compile cache, not compiled)\n", p);
    fprintf(f, "%s Graph Info:\n%s   Graph Hash: %016llx%016llx\n", p, p, (unsigned long long)hi, (unsigned long long)lo);
    fprintf(f, "%s   Number of Graph Inputs: %d\n%s   Number of Graph Outputs: %d\n", p, e->n_inputs, p, e->n_outputs);
    fprintf(f, "%s C Frames Triggered Execution:\n", p);
    print_frames(f, p, api_of(cause));
    fprintf(f, "%s --------------------------------------------------------------------------------\n", p);
    fprintf(f, "%s %s\n\n", p, bar);
}

static void post_compile(FILE *f, const cx_executable *e)
{
    int64_t in_bytes = 0, out_bytes = 0, alias_bytes = 0, prog = (int64_t)sizeof *e;
    for (int s = 0; s < e->nslots; s++) if (e->slots[s].kind == SLOT_INPUT) in_bytes += e->slots[s].bytes;
    for (int o = 0; o < e->n_outputs; o++) {
        out_bytes += e->out_bytes[o];
        if (e->out_alias[o] >= 0) alias_bytes += e->out_bytes[o];
    }
    for (int k = 0; k < e->nkernels; k++)
        prog += (int64_t)sizeof(cx_kernel) + e->kernels[k].prog.n * (int64_t)sizeof(cx_pinstr) +
                e->kernels[k].prog.nviews * (int64_t)sizeof(cx_view);
    const char *p = "Post Compilation Analysis:";
    const double gb = 1024.0 * 1024.0 * 1024.0;
    fprintf(f, "%s ================================================================================\n", p);
    fprintf(f, "%s Graph input size: %f GB\n", p, (double)in_bytes / gb);
    fprintf(f, "%s Graph output size: %f GB\n", p, (double)out_bytes / gb);
    fprintf(f, "%s Aliased Input size: %f GB\n", p, (double)alias_bytes / gb);
    fprintf(f, "%s Intermediate tensor size: %f GB\n", p, (double)e->intermediate_bytes / gb);
    fprintf(f, "%s Compiled program size: %f GB\n", p, (double)prog / gb);
    fprintf(f, "%s Kernels: %d, arena %lld bytes\n", p, e->num_work_kernels, (long long)e->arena_bytes);
    fprintf(f, "%s --------------------------------------------------------------------------------\n", p);
    fprintf(f, "%s ================================================================================\n\n", p);
}

/* ---- IR formatting (dumps and cx_ir_text / cx_ir_dot) --------------------------------- */


static bool is_leaf_value(const cx_node *x) { return x->op == OP_DATA || x->buf != NULL; }

static void type_str(cx_sbuf *b, const cx_node *x)
{
    cx_sb_printf(b, "%s[", cx_dtype_name((cx_dtype)x->dtype));
    for (int d = 0; d < x->ndim; d++) cx_sb_printf(b, "%s%lld", d ? "," : "", (long long)x->shape[d]);
    cx_sb_printf(b, "]");
}

static void attrs_str(cx_sbuf *b, const cx_node *x)
{
    if (x->op == OP_CONST) cx_sb_printf(b, ", value=%.9g", x->fval);
    else if (x->op == OP_RTSCALAR) cx_sb_printf(b, ", runtime_value=%.9g", x->rt_f);
    else if (x->fval != 0 && !is_leaf_value(x)) cx_sb_printf(b, ", fval=%.9g", x->fval);
    if (x->nattrs > 0 && !is_leaf_value(x)) {
        cx_sb_printf(b, ", attrs=[");
        for (int a = 0; a < x->nattrs; a++) cx_sb_printf(b, "%s%lld", a ? "," : "", (long long)x->attrs[a]);
        cx_sb_printf(b, "]");
    }
    if (x->flags & NF_PINNED) cx_sb_printf(b, ", pinned");
}

static const char *op_name(const cx_node *x)
{
    return is_leaf_value(x) ? "device_data" : cx_op_table[x->op].name;
}

/* nodes: topological, each node's ->index is its position; roots: outputs */
static void format_text(cx_sbuf *b, cx_node *const *nodes, int n, cx_node *const *roots, int nroots,
                        cx_tensor *const *named)
{
    cx_sb_printf(b, "IR {\n");
    for (int i = 0; i < n; i++) {
        const cx_node *x = nodes[i];
        cx_sb_printf(b, "  %%%d = ", i);
        type_str(b, x);
        cx_sb_printf(b, " %s(", op_name(x));
        if (!is_leaf_value(x))
            for (int k = 0; k < x->ninputs; k++) cx_sb_printf(b, "%s%%%d", k ? ", " : "", x->inputs[k]->index);
        cx_sb_printf(b, ")");
        attrs_str(b, x);
        bool first = true;
        for (int r = 0; r < nroots; r++)
            if (roots[r] == x) {
                cx_sb_printf(b, first ? ", ROOT=%d" : ",%d", r);
                if (named && named[r] && named[r]->name) cx_sb_printf(b, " (%s)", named[r]->name);
                first = false;
            }
        cx_sb_printf(b, "\n");
    }
    cx_sb_printf(b, "}\n");
}

static void dot_escape(cx_sbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') cx_sb_printf(b, "\\%c", *s);
        else if ((unsigned char)*s >= 32) cx_sb_printf(b, "%c", *s);
    }
}

static void format_dot(cx_sbuf *b, const char *title, cx_node *const *nodes, int n, cx_node *const *roots, int nroots)
{
    cx_sb_printf(b, "digraph G {\n  label=\"");
    dot_escape(b, title);
    cx_sb_printf(b, "\";\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
    for (int i = 0; i < n; i++) {
        const cx_node *x = nodes[i];
        cx_sb_printf(b, "  n%d [label=\"%%%d %s\\n", i, i, op_name(x));
        type_str(b, x);
        for (int r = 0; r < nroots; r++) if (roots[r] == x) cx_sb_printf(b, "\\nROOT=%d", r);
        cx_sb_printf(b, "\"");
        if (is_leaf_value(x)) cx_sb_printf(b, ", style=filled, fillcolor=\"#dde8ff\"");
        else if (cx_op_table[x->op].group == G_COLLECTIVE) cx_sb_printf(b, ", style=filled, fillcolor=\"#ffe0c0\"");
        cx_sb_printf(b, "];\n");
    }
    for (int i = 0; i < n; i++) {
        const cx_node *x = nodes[i];
        if (is_leaf_value(x)) continue;
        for (int k = 0; k < x->ninputs; k++) cx_sb_printf(b, "  n%d -> n%d [label=\"%d\"];\n", x->inputs[k]->index, i, k);
    }
    cx_sb_printf(b, "}\n");
}

/* post-order walk of pending tensors (what a sync would capture) */
static char *ir_string(cx_tensor *const *ts, int nts, bool dot)
{
    if (nts < 0 || (nts > 0 && !ts)) { cx_set_error("ir dump: bad tensor list"); return NULL; }
    cx_node **roots = calloc((size_t)nts + 1, sizeof *roots);
    cx_node **order = NULL;
    struct frame { cx_node *x; int next; } *stack = NULL;
    int n = 0, cap = 0, sp = 0, scap = 0;
    bool oom = !roots;
    int visited = cx_mark_epoch(), done = cx_mark_epoch();
    for (int r = 0; r < nts && !oom; r++) {
        if (!ts[r]) continue;
        cx_node *root = ts[r]->node;
        roots[r] = root;
        if (root->mark == visited || root->mark == done) continue;
        root->mark = visited;
        sp = 0;
        if (sp == scap) {
            scap = scap ? scap * 2 : 64;
            void *q = realloc(stack, sizeof *stack * (size_t)scap);
            if (!q) { oom = true; break; }
            stack = q;
        }
        stack[sp++] = (struct frame){ root, 0 };
        while (sp && !oom) {
            struct frame *f = &stack[sp - 1];
            if (!is_leaf_value(f->x) && f->next < f->x->ninputs) {
                cx_node *c = f->x->inputs[f->next++];
                if (c->mark == visited || c->mark == done) continue;
                c->mark = visited;
                if (sp == scap) {
                    scap *= 2;
                    void *q = realloc(stack, sizeof *stack * (size_t)scap);
                    if (!q) { oom = true; break; }
                    stack = q;
                }
                stack[sp++] = (struct frame){ c, 0 };
                continue;
            }
            cx_node *x = f->x;
            sp--;
            x->mark = done;
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                void *q = realloc(order, sizeof *order * (size_t)cap);
                if (!q) { oom = true; break; }
                order = q;
            }
            x->index = n;
            order[n++] = x;
        }
    }
    cx_sbuf b = { 0 };
    if (!oom) {
        if (dot) format_dot(&b, "pending tensors", order, n, roots, nts);
        else format_text(&b, order, n, roots, nts, ts);
    }
    free(stack);
    free(order);
    free(roots);
    if (oom || b.oom) { free(b.s); cx_set_error("ir dump: out of memory"); return NULL; }
    return b.s;
}

char *cx_ir_text(cx_tensor *const *ts, int n) { return ir_string(ts, n, false); }
char *cx_ir_dot(cx_tensor *const *ts, int n) { return ir_string(ts, n, true); }

/* ---- the per-graph hook ------------------------------------------------------------------ */

static int64_t g_graph_seq;

static void dump_graph(const char *cause, uint64_t hi, uint64_t lo, cx_node *const *nodes, int n, cx_node *const *outs,
                       int nouts, int source)
{
    cx_sbuf b = { 0 };
    char title[160];
    snprintf(title, sizeof title, "graph %lld: hash %016llx%016llx, cause %s", (long long)g_graph_seq,
             (unsigned long long)hi, (unsigned long long)lo, cause);
    if (g_cfg.dump_dot) {
        cx_sb_printf(&b, "// [cx_graph %lld] Graph Hash: %016llx%016llx; cause: %s; %s\n", (long long)g_graph_seq,
                  (unsigned long long)hi, (unsigned long long)lo, cause,
                  source == 1 ? "compiled" : source == 2 ? "persistent cache hit" : "cache hit");
        format_dot(&b, title, nodes, n, outs, nouts);
    } else {
        cx_sb_printf(&b, "[cx_graph %lld]\nCause: %s\nGraph Hash: %016llx%016llx\nCompile: %s\n", (long long)g_graph_seq,
                  cause, (unsigned long long)hi, (unsigned long long)lo,
                  source == 1 ? "compiled" : source == 2 ? "persistent cache hit" : "cache hit");
        cx_sb_printf(&b, "## BEGIN_GRAPH\n");
        format_text(&b, nodes, n, outs, nouts, NULL);
        cx_sb_printf(&b, "## END_GRAPH\n\n");
    }
    if (b.oom) { free(b.s); return; }
    char path[4096];
    if (cx_comm_world_size() > 1) snprintf(path, sizeof path, "%s.%d", g_cfg.dump_path, cx_comm_rank());
    else snprintf(path, sizeof path, "%s", g_cfg.dump_path);
    FILE *f = fopen(path, "a");
    if (f) {
        fputs(b.s, f);
        fclose(f);
    }
    free(b.s);
}

void cx_obs_graph(const char *cause, uint64_t hi, uint64_t lo, cx_node *const *nodes, int n, cx_node *const *outs,
                  int nouts, const cx_executable *e, int source)
{
    g_graph_seq++;
    int flags = cx_obs_get();
    if (flags & OBS_DUMP) dump_graph(cause, hi, lo, nodes, n, outs, nouts, source);
    if (!(flags & OBS_DEBUG)) return;
    bool close_it;
    FILE *f = dbg_open(&close_it);
    if (!f) return;
    if (source != 0) {
        analysis(f, "Compilation", cause, hi, lo, e, source);
        post_compile(f, e);
    }
    if (g_cfg.debug_level >= 2) analysis(f, "Execution", cause, hi, lo, e, source);
    dbg_close(f, close_it);
}

/* ---- eager debug mode ---------------------------------------------------------------------- */

void cx_obs_settle(cx_tensor *t)
{
    cx_node *x = t->node;
    cx_buffer_ref(x->buf);
    cx_node *d = cx_node_data(x->buf, (cx_dtype)x->dtype, x->shape, x->ndim);
    if (!d) { cx_buffer_unref(x->buf); return; }   /* stays as is: still correct, just not settled */
    cx_set_node(t, d);
    cx_node_unref(d);
    if (t->flags & TF_REQUIRES_GRAD) { d->flags |= NF_REQUIRES_GRAD; d->grad_leaf = t; }
    t->flags &= ~(uint32_t)TF_ASSIGNED;
    if (t->donor) { cx_node_unref(t->donor); t->donor = NULL; }
}

/* The node keeps its inputs (autograd walks them) and gains its value in
 * ->buf: capture then treats it as a device-data leaf. The value comes from
 * a one-op graph over the inputs' values, so it goes through the same
 * compile cache and executor as lazy mode. */
void cx_obs_eager_run(cx_tensor *t)
{
    cx_node *x = t->node;
    if (x->buf || x->op == OP_ERROR || cx_op_table[x->op].group == G_LEAF) return;
    cx_node *small[8];
    cx_node **ins = x->ninputs <= 8 ? small : malloc(sizeof *ins * (size_t)x->ninputs);
    if (!ins) return;   /* stays lazy: same result later */
    bool ok = true;
    for (int i = 0; i < x->ninputs; i++) {
        cx_node *c = x->inputs[i];
        /* every value input, device data included, is wrapped in a fresh
         * leaf: the capture below then never marks the caller's nodes, which
         * matters because cx_backward keeps its walk state in them while its
         * VJP rules record (and here run) new ops */
        if (c->buf) {
            cx_buffer_ref(c->buf);
            ins[i] = cx_node_data(c->buf, (cx_dtype)c->dtype, c->shape, c->ndim);
            if (!ins[i]) { cx_buffer_unref(c->buf); ok = false; }
        } else {
            cx_node_ref(c);
            ins[i] = c;
        }
        if (!ok) { for (int k = 0; k < i; k++) cx_node_unref(ins[k]); break; }
    }
    if (ok) {
        cx_node_desc d = { .op = (cx_op)x->op, .dtype = (cx_dtype)x->dtype, .ndim = x->ndim, .shape = x->shape,
                           .ninputs = x->ninputs, .inputs = ins, .nattrs = x->nattrs, .attrs = x->attrs,
                           .fval = x->fval, .flags = x->flags & NF_PINNED };
        cx_node *y = cx_node_make(&d);
        for (int i = 0; i < x->ninputs; i++) cx_node_unref(ins[i]);
        if (y) {
            cx_tensor *tmp = cx_tensor_wrap(y);
            if (tmp && cx_materialize(&tmp, 1, "eager") == CX_OK && tmp->node->op == OP_DATA && !x->buf) {
                x->buf = tmp->node->buf;
                cx_buffer_ref(x->buf);
            }
            cx_free(tmp);
        }
    }
    if (ins != small) free(ins);
}

/* ---- step closures ------------------------------------------------------------------------------ */

typedef struct {
    cx_step_closure_fn fn;
    void *arg;
    bool async;
} closure;

typedef struct {
    closure *v;
    int n, cap;
} closure_list;

static pthread_mutex_t g_cl_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cl_cv = PTHREAD_COND_INITIALIZER;
static closure_list g_pending;        /* added during the current step */
static closure_list g_async_q;        /* waiting for the async thread */
static int g_async_head;
static bool g_async_busy, g_async_started;

static bool cl_push(closure_list *l, closure c)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        closure *v = realloc(l->v, sizeof *v * (size_t)cap);
        if (!v) return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = c;
    return true;
}

static void *async_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_cl_mu);
    for (;;) {
        while (g_async_head == g_async_q.n) {
            g_async_busy = false;
            pthread_cond_broadcast(&g_cl_cv);
            pthread_cond_wait(&g_cl_cv, &g_cl_mu);
        }
        g_async_busy = true;
        closure c = g_async_q.v[g_async_head++];
        if (g_async_head == g_async_q.n) g_async_head = g_async_q.n = 0;
        pthread_mutex_unlock(&g_cl_mu);
        c.fn(c.arg);
        pthread_mutex_lock(&g_cl_mu);
    }
    return NULL;
}

cx_status cx_add_step_closure(cx_step_closure_fn fn, void *arg, bool run_async)
{
    if (!fn) { cx_set_error("add_step_closure: fn is NULL"); return CX_ERR_ARG; }
    pthread_mutex_lock(&g_cl_mu);
    bool ok = cl_push(&g_pending, (closure){ fn, arg, run_async });
    pthread_mutex_unlock(&g_cl_mu);
    if (!ok) { cx_set_error("add_step_closure: out of memory"); return CX_ERR_OOM; }
    cx_obs_set(OBS_CLOSURES, true);
    return CX_OK;
}

void cx_wait_step_closures(void)
{
    pthread_mutex_lock(&g_cl_mu);
    while (g_async_started && (g_async_busy || g_async_head != g_async_q.n)) pthread_cond_wait(&g_cl_cv, &g_cl_mu);
    pthread_mutex_unlock(&g_cl_mu);
}

static void run_closures(void)
{
    pthread_mutex_lock(&g_cl_mu);
    closure_list run = g_pending;   /* closures added while these run wait for the next step */
    g_pending = (closure_list){ 0 };
    cx_obs_set(OBS_CLOSURES, false);
    pthread_mutex_unlock(&g_cl_mu);
    for (int i = 0; i < run.n; i++) {
        closure c = run.v[i];
        if (!c.async) { c.fn(c.arg); continue; }
        pthread_mutex_lock(&g_cl_mu);
        bool queued = false;
        if (!g_async_started) {
            pthread_t th;
            pthread_attr_t at;
            pthread_attr_init(&at);
            pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
            g_async_started = pthread_create(&th, &at, async_main, NULL) == 0;
            pthread_attr_destroy(&at);
        }
        if (g_async_started && cl_push(&g_async_q, c)) {
            queued = true;
            g_async_busy = true;
            pthread_cond_broadcast(&g_cl_cv);
        }
        pthread_mutex_unlock(&g_cl_mu);
        if (!queued) c.fn(c.arg);   /* no thread or no memory: run it here, still in order */
    }
    free(run.v);
}

/* ---- step end ------------------------------------------------------------------------------------- */

static int64_t g_steps;
static int64_t g_compiles_at_warmup = -1;

void cx_obs_step_end(cx_status st)
{
    (void)st;
    int flags = cx_obs_get();
    g_steps++;
    if (flags & OBS_CLOSURES) run_closures();
    if (flags & OBS_METRICS_FILE) cx_obs_metrics_file_step(g_cfg.metrics_path, g_steps);
    if (flags & OBS_DEBUG) {
        /* PyTorch/XLA's auto-metrics analysis: after a warm-up, more than one
         * compile every other step means the graph keeps changing; more than
         * one device->host read every other step means values are read
         * every step. The counts printed are totals, as PyTorch/XLA's. */
        int64_t steps = cx_counter_value("MarkStep");
        cx_metric_stats ms;
        int64_t compiles = cx_metric_data("CompileTime", &ms) ? ms.total_samples : 0;
        int64_t reads = cx_metric_data("TransferFromDeviceTime", &ms) ? ms.total_samples : 0;
        bool close_it;
        FILE *f = NULL;
        /* compiles during the warm-up (parameter init, the first step's
         * graphs) do not count: only those after the 10th step */
        if (steps <= 10 || g_compiles_at_warmup < 0) g_compiles_at_warmup = compiles;
        bool warn_compile = steps > 10 && (compiles - g_compiles_at_warmup) * 2 > steps - 10;
        bool warn_read = steps > 0 && reads * 2 > steps;
        if ((warn_compile || warn_read) && (f = dbg_open(&close_it)) != NULL) {
            if (warn_compile)
                fprintf(f, "pt-xla-profiler: CompileTime too frequent: %lld counts during %lld steps\n", (long long)compiles,
                        (long long)steps);
            if (warn_read)
                fprintf(f, "pt-xla-profiler: TransferFromDeviceTime too frequent: %lld counts during %lld steps\n",
                        (long long)reads, (long long)steps);
            dbg_close(f, close_it);
        }
    }
}
