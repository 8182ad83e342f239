/* PT_XLA_DEBUG_LEVEL's recompilation explainer: when a graph compiles, the
 * closest graph compiled before and what differs. PyTorch/XLA's analysis
 * says a compilation happened; a user whose job keeps compiling needs to
 * know why: an input whose shape changed (and, under XLA_IR_DEBUG, the
 * line that made it), a Python-style float baked into the graph as a
 * constant, a changed sharding, or a different set of live tensors.
 *
 * Each compiled graph leaves a signature (per node: op, dtype, shape,
 * constant, attributes, sharding, location), the last SIGS of them kept. */
#include "obs_internal.h"

#include <cxla/metrics.h>

enum { SIGS = 32, MAX_SAID = 4 };

typedef struct {
    uint16_t op;
    uint8_t dtype, ndim, nattrs;
    bool leaf;
    bool out;           /* a live tensor's value: an output of the graph */
    uint32_t loc;
    int64_t shape[CX_MAX_DIMS];
    int64_t attrs[CX_MAX_ATTRS];
    double fval;
    uint64_t shard;
    char *shard_desc;   /* sharded nodes only (few) */
} sig_node;

typedef struct {
    uint64_t hi, lo;
    int64_t step;
    int n, nouts;
    sig_node *nodes;
    int *ops_hist;   /* per op */
} sig;

static sig g_sigs[SIGS];
static int g_next;

static bool is_leaf(const cx_node *x) { return x->op == OP_DATA || x->buf != NULL; }

static bool sig_make(sig *s, const cx_obs_graph_info *g)
{
    s->nodes = malloc(sizeof *s->nodes * ((size_t)g->n + 1));
    s->ops_hist = calloc(OP_COUNT, sizeof *s->ops_hist);
    if (!s->nodes || !s->ops_hist) { free(s->nodes); free(s->ops_hist); *s = (sig){ 0 }; return false; }
    s->hi = g->key_hi;
    s->lo = g->key_lo;
    s->step = cx_counter_value("MarkStep");
    s->n = g->n;
    s->nouts = g->nouts;
    for (int i = 0; i < g->n; i++) {
        const cx_node *x = g->nodes[i];
        sig_node *y = &s->nodes[i];
        memset(y, 0, sizeof *y);
        y->leaf = is_leaf(x);
        y->op = y->leaf ? OP_DATA : x->op;
        y->dtype = x->dtype;
        y->ndim = x->ndim;
        y->loc = x->loc;
        memcpy(y->shape, x->shape, sizeof(int64_t) * x->ndim);
        if (!y->leaf) {
            y->nattrs = (uint8_t)x->nattrs;
            memcpy(y->attrs, x->attrs, sizeof(int64_t) * (size_t)x->nattrs);
            y->fval = x->op == OP_RTSCALAR ? 0 : x->fval;
        }
        y->shard = x->sharding ? cx_sharding_hash(x->sharding) : 0;
        if (x->sharding) {
            char d[320];
            y->shard_desc = strdup(cx_sharding_describe(x->sharding, d, sizeof d));   /* NULL: said without it */
        }
        s->ops_hist[y->op]++;
    }
    for (int o = 0; o < g->nouts; o++) s->nodes[g->outs[o]->index].out = true;
    return true;
}

static void sig_free(sig *s)
{
    for (int i = 0; s->nodes && i < s->n; i++) free(s->nodes[i].shard_desc);
    free(s->nodes);
    free(s->ops_hist);
    *s = (sig){ 0 };
}

static bool same_ops(const sig *a, const sig *b)
{
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++) if (a->nodes[i].op != b->nodes[i].op) return false;
    return true;
}

/* Share of ops the two graphs have in common, 0..1. */
static double similarity(const sig *a, const sig *b)
{
    int64_t common = 0;
    for (int op = 0; op < OP_COUNT; op++) common += a->ops_hist[op] < b->ops_hist[op] ? a->ops_hist[op] : b->ops_hist[op];
    int m = a->n > b->n ? a->n : b->n;
    return m ? (double)common / m : 0;
}

static bool same_type(const sig_node *a, const sig_node *b)
{
    return a->dtype == b->dtype && a->ndim == b->ndim && !memcmp(a->shape, b->shape, sizeof a->shape);
}

static int node_diffs(const sig *a, const sig *b)
{
    int d = 0;
    for (int i = 0; i < a->n; i++) {
        const sig_node *x = &a->nodes[i], *y = &b->nodes[i];
        d += !same_type(x, y) || x->nattrs != y->nattrs || x->fval != y->fval || x->shard != y->shard || x->out != y->out;
    }
    return d;
}

/* The cached graph most like s, compiled in an earlier step: the same ops
 * in the same order with the fewest differing nodes, else the most ops in
 * common (at least half). Graphs of the same step are different programs
 * (the layers' initializations, a forward read mid-step), not a step's
 * program compiled again. */
static const sig *closest(const sig *s)
{
    const sig *best = NULL;
    int best_d = 0;
    double best_sim = 0.5;
    bool best_same = false;
    for (int k = 0; k < SIGS; k++) {
        const sig *c = &g_sigs[k];
        if (!c->nodes || c->step >= s->step || (c->hi == s->hi && c->lo == s->lo)) continue;
        if (same_ops(c, s)) {
            int d = node_diffs(c, s);
            if (!best_same || d < best_d) { best = c; best_d = d; best_same = true; }
        } else if (!best_same) {
            double sim = similarity(c, s);
            if (sim >= best_sim) { best = c; best_sim = sim; }
        }
    }
    return best;
}

static void shape_str(char *buf, size_t cap, const sig_node *x)
{
    int n = snprintf(buf, cap, "%s[", cx_dtype_name((cx_dtype)x->dtype));
    for (int d = 0; d < x->ndim && n > 0 && (size_t)n < cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%lld", d ? "," : "", (long long)x->shape[d]);
    if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "]");
}

static void at_str(char *buf, size_t cap, uint32_t loc)
{
    char s[600];
    /* under XLA_IR_DEBUG, a node without a line was made by a thread of the
     * library's own: the data loader's, which uploads batches */
    if (!loc && cx_obs_cfg.ir_debug) { snprintf(buf, cap, " (made by the data loader's thread)"); return; }
    if (!loc) { snprintf(buf, cap, " (set XLA_IR_DEBUG=1 to see the line that made it)"); return; }
    cx_obs_site_str(loc, s, sizeof s);
    snprintf(buf, cap, ", made at %s", s);
}

/* An input whose shape or dtype changed: which dimensions. */
static void say_input(FILE *f, const char *p, int ordinal, const sig_node *was, const sig_node *now)
{
    char a[200], b[200], at[700];
    shape_str(a, sizeof a, was);
    shape_str(b, sizeof b, now);
    at_str(at, sizeof at, now->loc);
    fprintf(f, "%s   differs: input %d is %s, was %s", p, ordinal, b, a);
    if (was->ndim == now->ndim && was->dtype == now->dtype)
        for (int d = 0; d < now->ndim; d++)
            if (was->shape[d] != now->shape[d])
                fprintf(f, "; dimension %d changed: %lld -> %lld", d, (long long)was->shape[d], (long long)now->shape[d]);
    fprintf(f, "%s\n", at);
}

static const char *desc_of(const sig_node *x) { return x->shard_desc ? x->shard_desc : x->shard ? "sharded" : "replicated"; }

/* Same ops in the same order: the inputs whose shape or dtype changed;
 * else the constants, shardings and attributes that differ (a changed
 * input changes shapes and constants such as a mean's 1/n after it, which
 * would only repeat it). @return how many lines were said. */
static int say_node_diffs(FILE *f, const char *p, const sig *was, const sig *now)
{
    int said = 0, ordinal = 0;
    for (int i = 0; i < now->n; i++) {
        const sig_node *a = &was->nodes[i], *b = &now->nodes[i];
        if (!b->leaf) continue;
        bool shape = !same_type(a, b);
        if (shape && said < MAX_SAID) { say_input(f, p, ordinal, a, b); said++; }
        else if (a->shard != b->shard && said < MAX_SAID) {
            char at[700];
            at_str(at, sizeof at, b->loc);
            fprintf(f, "%s   differs: the sharding of input %d changed: %s, was %s%s\n", p, ordinal, desc_of(b),
                    desc_of(a), at);
            said++;
        }
        ordinal++;
    }
    char at[700];
    bool inputs_said = said > 0;
    for (int i = 0; i < now->n && !inputs_said && said < MAX_SAID; i++) {
        const sig_node *a = &was->nodes[i], *b = &now->nodes[i];
        if (b->leaf) continue;
        bool shape = !same_type(a, b);
        at_str(at, sizeof at, b->loc);
        if (a->fval != b->fval)
            fprintf(f, "%s   differs: a new scalar baked in as a constant: %%%d %s holds %.9g, was %.9g%s; a value that "
                       "changes every step belongs in a tensor (cx_runtime_scalar), not in the graph\n",
                    p, i, cx_op_table[b->op].name, b->fval, a->fval, at);
        else if (a->shard != b->shard)
            fprintf(f, "%s   differs: the sharding of %%%d %s changed: %s, was %s%s\n", p, i, cx_op_table[b->op].name,
                    desc_of(b), desc_of(a), at);
        else if (shape || a->nattrs != b->nattrs || memcmp(a->attrs, b->attrs, sizeof(int64_t) * b->nattrs))
            fprintf(f, "%s   differs: %%%d %s has another %s%s\n", p, i, cx_op_table[b->op].name,
                    shape ? "shape" : "attribute", at);
        else continue;
        said++;
    }
    return said;
}

/* The live tensors a step computes are its outputs: one kept alive (or
 * no longer) makes another graph. @return how many lines were said. */
static int say_outputs(FILE *f, const char *p, const sig *was, const sig *now)
{
    int said = 0;
    if (was->nouts != now->nouts) {
        fprintf(f, "%s   differs: a different set of live tensors: the graph computes %d outputs, the cached one %d "
                   "(a tensor kept alive, or no longer, changes what a step computes)\n", p, now->nouts, was->nouts);
        said++;
    }
    if (!same_ops(was, now)) return said;
    char at[700];
    for (int i = 0; i < now->n && said < MAX_SAID; i++) {
        const sig_node *a = &was->nodes[i], *b = &now->nodes[i];
        if (a->out == b->out) continue;
        at_str(at, sizeof at, b->loc);
        fprintf(f, "%s   differs: a different set of live tensors: %%%d %s %s%s\n", p, i, cx_op_table[b->op].name,
                b->out ? "is an output now (a tensor still alive)" : "is no longer an output", at);
        said++;
    }
    return said;
}

static void say_structure(FILE *f, const char *p, const sig *was, const sig *now)
{
    int i = 0;
    while (i < now->n && i < was->n && now->nodes[i].op == was->nodes[i].op) i++;
    char at[700];
    if (i < now->n) {
        at_str(at, sizeof at, now->nodes[i].loc);
        fprintf(f, "%s   differs: other ops: %d nodes, the cached graph %d; the first that differs is %%%d %s (cached: %s)%s\n",
                p, now->n, was->n, i, cx_op_table[now->nodes[i].op].name,
                i < was->n ? cx_op_table[was->nodes[i].op].name : "none", at);
    }
}

void cx_obs_explain(FILE *f, const char *p, const cx_obs_graph_info *g)
{
    sig now;
    if (!sig_make(&now, g)) return;
    const sig *was = f ? closest(&now) : NULL;
    if (was) {
        fprintf(f, "%s   Closest cached graph: %016llx%016llx, compiled in step %lld\n", p, (unsigned long long)was->hi,
                (unsigned long long)was->lo, (long long)was->step);
        int said = say_outputs(f, p, was, &now);
        if (same_ops(was, &now)) said += say_node_diffs(f, p, was, &now);
        else { say_structure(f, p, was, &now); said++; }
        if (said == 0) fprintf(f, "%s   differs: only in compile options or the aliasing of outputs\n", p);
    }
    sig_free(&g_sigs[g_next]);
    g_sigs[g_next] = now;
    g_next = (g_next + 1) % SIGS;
}
