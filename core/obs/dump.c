/* The IR as text or Graphviz: cx_ir_text / cx_ir_dot for pending tensors,
 * and the XLA_SAVE_TENSORS_FILE record of every executed graph. */
#include "obs_internal.h"
#include "cx_vec.h"

#include <cxla/comm.h>
#include <cxla/debug.h>

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
    if (x->sharding) {
        char d[320];
        cx_sb_printf(b, ", sharding=%s", cx_sharding_describe(x->sharding, d, sizeof d));
    }
}

/* What the SPMD partitioner made of the graph: the collectives it added and
 * each output's sharding. */
static void spmd_str(cx_sbuf *b, const cx_executable *e)
{
    if (!e || !e->out_sharding) return;
    const int *k = e->spmd_inserted;
    cx_sb_printf(b, "SPMD: partitioned for rank %d; the partitioner added %d all-reduce, %d all-gather, "
                    "%d reduce-scatter, %d all-to-all\n", cx_global_ordinal(), k[0], k[1], k[2], k[3]);
    for (int o = 0; o < e->n_outputs; o++) {
        char d[320];
        if (!cx_sharding_is_replicated(&e->out_sharding[o]))
            cx_sb_printf(b, "SPMD: ROOT=%d sharding=%s\n", o, cx_sharding_describe(&e->out_sharding[o], d, sizeof d));
    }
}

static const char *op_name(const cx_node *x)
{
    return is_leaf_value(x) ? "device_data" : cx_op_table[x->op].name;
}

/* Node i's sharding as the partitioner propagated it (where no annotation
 * shows it already), and the collectives it added to move node i's value. */
static void spmd_node_str(cx_sbuf *b, const cx_spmd_notes *notes, const cx_node *x, int i, const char *sep)
{
    char d[320];
    if (!notes || notes->n <= i) return;
    const cx_sharding *s = &notes->sh[i];
    if (!x->sharding && !cx_sharding_is_replicated(s)) cx_sb_printf(b, "%sspmd=%s", sep, cx_sharding_describe(s, d, sizeof d));
    for (int k = 0; k < notes->ncoll; k++)
        if (notes->coll[k].node == i)
            cx_sb_printf(b, "%s+ spmd %s", sep, cx_spmd_coll_describe(&notes->coll[k], s->mesh, d, sizeof d));
}

/* XLA_IR_DEBUG: ", location=fn@file:line", PyTorch/XLA's spelling */
static void loc_str(cx_sbuf *b, uint32_t loc, const char *sep)
{
    const cx_obs_frame *fr = loc ? cx_obs_site(loc) : NULL;
    if (!fr) return;
    if (fr->line > 0) cx_sb_printf(b, "%slocation=%s@%s:%d", sep, fr->fn, fr->file, fr->line);
    else cx_sb_printf(b, "%slocation=%s@%s", sep, fr->fn, fr->file);
}

/* nodes: topological, each node's ->index is its position; roots: outputs */
void cx_obs_format_text(cx_sbuf *b, cx_node *const *nodes, int n, cx_node *const *roots, int nroots,
                        cx_tensor *const *named, const cx_spmd_notes *notes)
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
        spmd_node_str(b, notes, x, i, ", ");
        loc_str(b, x->loc, ", ");
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

/* The same, with line breaks as the label's. */
static void dot_escape_lines(cx_sbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\n') cx_sb_printf(b, "\\n");
        else if (*s == '"' || *s == '\\') cx_sb_printf(b, "\\%c", *s);
        else if ((unsigned char)*s >= 32) cx_sb_printf(b, "%c", *s);
    }
}

static void format_dot(cx_sbuf *b, const char *title, cx_node *const *nodes, int n, cx_node *const *roots, int nroots,
                       const cx_spmd_notes *notes)
{
    cx_sb_printf(b, "digraph G {\n  label=\"");
    dot_escape(b, title);
    cx_sb_printf(b, "\";\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
    for (int i = 0; i < n; i++) {
        const cx_node *x = nodes[i];
        cx_sb_printf(b, "  n%d [label=\"%%%d %s\\n", i, i, op_name(x));
        type_str(b, x);
        if (x->sharding) {
            char d[320];
            cx_sb_printf(b, "\\n");
            dot_escape(b, cx_sharding_describe(x->sharding, d, sizeof d));
        }
        for (int r = 0; r < nroots; r++) if (roots[r] == x) cx_sb_printf(b, "\\nROOT=%d", r);
        cx_sbuf sp = { 0 };
        spmd_node_str(&sp, notes, x, i, "\n");
        loc_str(&sp, x->loc, "\n");
        if (sp.s) dot_escape_lines(b, sp.s);
        bool moved = sp.s && strstr(sp.s, "+ spmd");
        free(sp.s);
        cx_sb_printf(b, "\"");
        if (moved) cx_sb_printf(b, ", color=\"#d04000\", penwidth=2");
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

/* what a sync would capture: a node holding its value is a leaf */
static bool dump_follow(const cx_node *x, const cx_node *input)
{
    (void)input;
    return !is_leaf_value(x);
}

typedef struct { cx_node **order; int n, cap; } node_list;

static bool dump_visit(void *ctx, cx_node *x)
{
    node_list *l = ctx;
    if (!CX_GROW(l->order, l->cap, l->n + 1)) return false;
    x->index = l->n;
    l->order[l->n++] = x;
    return true;
}

static char *ir_string(cx_tensor *const *ts, int nts, bool dot)
{
    if (nts < 0 || (nts > 0 && !ts)) { cx_set_last_error("ir dump: bad tensor list"); return NULL; }
    cx_node **roots = calloc((size_t)nts + 1, sizeof *roots);
    for (int r = 0; roots && r < nts; r++) roots[r] = ts[r] ? ts[r]->node : NULL;
    node_list l = { 0 };
    cx_sbuf b = { 0 };
    bool ok = roots && cx_node_postorder(roots, nts, dump_follow, dump_visit, &l);
    if (ok) {
        if (dot) format_dot(&b, "pending tensors", l.order, l.n, roots, nts, NULL);
        else cx_obs_format_text(&b, l.order, l.n, roots, nts, ts, NULL);
    }
    free(l.order);
    free(roots);
    char *s = cx_sb_finish(&b);
    if (!ok) { free(s); s = NULL; }
    if (!s) cx_set_last_error("ir dump: out of memory");
    return s;
}

/* SPMD: this rank's graph, as a sync would partition it. */
static bool partition_for_dump(const cx_capture *cp, cx_graph *g, cx_sharding **osh)
{
    bool sharded = false;
    for (int i = 0; i < cp->n; i++) sharded = sharded || cp->nodes[i]->sharding;
    if (!cx_is_spmd() || !sharded) return true;
    const cx_sharding **ann = calloc((size_t)g->n + 1, sizeof *ann);
    *osh = calloc((size_t)g->n_outputs + 1, sizeof **osh);
    int inserted[4] = { 0 };
    cx_graph local;
    bool ok = ann && *osh;
    for (int i = 0; ok && i < g->n; i++) ann[i] = cp->nodes[i]->sharding;
    if (ok) ok = cx_pass_partition(g, ann, cx_global_ordinal(), &local, *osh, inserted, NULL);
    else cx_set_last_error("ir dump: out of memory");
    free(ann);
    if (!ok) return false;
    cx_graph_release(g);
    *g = local;
    return true;
}

/* The pending nodes of ts, without repeats or values already computed. */
static int pending_outputs(cx_tensor *const *ts, int nts, cx_node **outs)
{
    int n = 0;
    for (int r = 0; r < nts; r++) {
        cx_node *x = ts[r] ? ts[r]->node : NULL;
        if (!x || is_leaf_value(x) || x->op == OP_ERROR) continue;
        bool seen = false;
        for (int k = 0; k < n; k++) seen = seen || outs[k] == x;
        if (!seen) outs[n++] = x;
    }
    return n;
}

/* XLA_SAVE_TENSORS_FMT=hlo: the program a sync of ts would run, compiled
 * here (nothing runs, nothing is cached). */
static char *ir_program(cx_tensor *const *ts, int nts)
{
    cx_node **outs = calloc((size_t)nts + 1, sizeof *outs);
    int *alias = calloc((size_t)nts + 1, sizeof *alias);
    cx_capture cp = { 0 };
    cx_graph g = { 0 };
    cx_sharding *osh = NULL;
    cx_executable *e = NULL;
    cx_key128 key = { 0, 0 };
    cx_sbuf b = { 0 };
    int nouts = outs && alias ? pending_outputs(ts, nts, outs) : 0;
    for (int o = 0; o < nouts; o++) alias[o] = -1;
    bool ok = outs && alias && cx_capture_graph(&cp, outs, nouts) && cx_capture_key(&cp, outs, nouts, alias, &key) &&
              cx_capture_to_graph(&cp, outs, nouts, alias, &g);
    if (!ok) cx_set_last_error("ir dump: out of memory");
    if (ok && nouts == 0) cx_sb_printf(&b, "no pending computation\n");
    else if (ok && partition_for_dump(&cp, &g, &osh) && (e = cx_lower(&g)) != NULL) {
        cx_key128 shared = cx_capture_shared_key(&cp);
        e->key_hi = key.hi;
        e->key_lo = key.lo;
        e->shared_hi = shared.hi;
        e->shared_lo = shared.lo;
        cx_obs_format_program(&b, &g, e, cx_obs_cfg.hlo_debug);
    }
    bool made = ok && (nouts == 0 || e);
    cx_executable_free(e);
    cx_graph_release(&g);
    free(osh);
    free(cp.nodes); free(cp.inputs); free(cp.rts); free(cp.words);
    free(outs);
    free(alias);
    char *s = cx_sb_finish(&b);
    if (!made) { free(s); return NULL; }
    if (!s) cx_set_last_error("ir dump: out of memory");
    return s;
}

char *cx_ir_text(cx_tensor *const *ts, int n)
{
    cx_obs_get();
    if (cx_obs_cfg.dump_hlo) {
        if (n < 0 || (n > 0 && !ts)) { cx_set_last_error("ir dump: bad tensor list"); return NULL; }
        return ir_program(ts, n);
    }
    return ir_string(ts, n, false);
}
char *cx_ir_dot(cx_tensor *const *ts, int n) { return ir_string(ts, n, true); }

static int64_t g_graph_seq;

/* One XLA_SAVE_TENSORS_FILE record per executed graph. */
static void dump_graph(const cx_obs_graph_info *gi)
{
    const char *cause = gi->cause;
    uint64_t hi = gi->key_hi, lo = gi->key_lo;
    int source = gi->source;
    g_graph_seq++;
    cx_sbuf b = { 0 };
    char title[160];
    snprintf(title, sizeof title, "graph %lld: hash %016llx%016llx, cause %s", (long long)g_graph_seq,
             (unsigned long long)hi, (unsigned long long)lo, cause);
    if (cx_obs_cfg.dump_hlo) {
        cx_sb_printf(&b, "[cx_graph %lld]\nCause: %s\nCompile: %s\n## BEGIN_PROGRAM\n", (long long)g_graph_seq, cause,
                     source == 1 ? "compiled" : source == 2 ? "persistent cache hit" : "cache hit");
        cx_obs_format_program_ir(&b, gi->nodes, gi->n, gi->e, cx_obs_cfg.hlo_debug);
        cx_sb_printf(&b, "## END_PROGRAM\n\n");
    } else if (cx_obs_cfg.dump_dot) {
        cx_sb_printf(&b, "// [cx_graph %lld] Graph Hash: %016llx%016llx; cause: %s; %s\n", (long long)g_graph_seq,
                  (unsigned long long)hi, (unsigned long long)lo, cause,
                  source == 1 ? "compiled" : source == 2 ? "persistent cache hit" : "cache hit");
        format_dot(&b, title, gi->nodes, gi->n, gi->outs, gi->nouts, gi->e ? gi->e->spmd_notes : NULL);
    } else {
        cx_sb_printf(&b, "[cx_graph %lld]\nCause: %s\nGraph Hash: %016llx%016llx\nCompile: %s\n", (long long)g_graph_seq,
                  cause, (unsigned long long)hi, (unsigned long long)lo,
                  source == 1 ? "compiled" : source == 2 ? "persistent cache hit" : "cache hit");
        spmd_str(&b, gi->e);
        cx_sb_printf(&b, "## BEGIN_GRAPH\n");
        cx_obs_format_text(&b, gi->nodes, gi->n, gi->outs, gi->nouts, NULL, gi->e ? gi->e->spmd_notes : NULL);
        cx_sb_printf(&b, "## END_GRAPH\n\n");
    }
    if (b.oom) { free(b.s); return; }
    char path[4096];
    cx_obs_rank_path(path, sizeof path, cx_obs_cfg.dump_path);
    FILE *f = fopen(path, "a");
    if (f) {
        fputs(b.s, f);
        fclose(f);
    }
    free(b.s);
}

__attribute__((constructor)) static void register_dump(void) { cx_obs_hooks.dump = dump_graph; }
