/* Capture: the pending graph of a sync's outputs, its structural key, and
 * the cx_graph the compiler takes. */
#include "capture.h"
#include "cx_vec.h"
#include "sharding.h"
#include "cx_settings.h"

#include <cxla/cache.h>

#include <limits.h>
#include <pthread.h>

#ifndef CX_COMPILE_FLAGS
#define CX_COMPILE_FLAGS "default"
#endif

/* a node holding its value (eager debug mode) is a leaf */
static bool capture_follow(const cx_node *x, const cx_node *input)
{
    (void)input;
    return !x->buf;
}

static bool capture_visit(void *ctx, cx_node *x)
{
    cx_capture *cp = ctx;
    if (!CX_GROW(cp->nodes, cp->cap, cp->n + 1)) return false;
    x->index = cp->n;
    cp->nodes[cp->n++] = x;
    /* OP_DATA (a value-less placeholder too: binding it is the error that
     * names it), or a value computed by eager debug mode */
    if (x->buf || x->op == OP_DATA) {
        if (!CX_GROW(cp->inputs, cp->in_cap, cp->n_inputs + 1)) return false;
        cp->inputs[cp->n_inputs++] = x;
    } else if (x->op == OP_RTSCALAR) {
        if (!CX_GROW(cp->rts, cp->rt_cap, cp->n_rts + 1)) return false;
        cp->rts[cp->n_rts++] = x;
    }
    return true;
}

bool cx_capture_graph(cx_capture *cp, cx_node *const *outs, int nouts)
{
    cp->n = cp->n_inputs = cp->n_rts = 0;
    bool ok = cx_node_postorder(outs, nouts, capture_follow, capture_visit, cp);
    cp->n_graph_inputs = cp->n_inputs;
    return ok;
}

int cx_capture_add_input(cx_capture *cp, cx_node *x)
{
    if (!CX_GROW(cp->inputs, cp->in_cap, cp->n_inputs + 1)) return -1;
    cp->inputs[cp->n_inputs] = x;
    return cp->n_inputs++;
}

int cx_capture_input_ordinal(const cx_capture *cp, const cx_node *x)
{
    for (int i = 0; i < cp->n_inputs; i++) if (cp->inputs[i] == x) return i;
    return -1;
}

/* ---- the key ---------------------------------------------------------------------------- */

static uint64_t str_word(const char *s) { return cx_hash64(s, strlen(s)); }

enum { KEY_THREADS_WORD = 3 };

/* Every field of a node that changes what the graph computes, written at w;
 * a node that already holds its value (eager debug mode) is keyed as the
 * data leaf it becomes. @return the words written (at most node_words). */
static int node_words(const cx_node *x) { return 4 + x->ndim + x->nattrs + x->ninputs; }

static int put_node(uint64_t *w, const cx_node *x)
{
    bool value = x->buf && x->op != OP_DATA;
    int op = value ? OP_DATA : x->op, nattrs = value ? 0 : x->nattrs, nin = value ? 0 : x->ninputs, n = 0;
    w[n++] = (uint64_t)op << 48 | (uint64_t)x->dtype << 40 | (uint64_t)x->ndim << 32 | (uint64_t)nattrs;
    w[n++] = (uint64_t)nin;
    for (int d = 0; d < x->ndim; d++) w[n++] = (uint64_t)x->shape[d];
    w[n++] = x->sharding ? cx_sharding_hash(x->sharding) : 0;
    if (value) return n;
    for (int a = 0; a < nattrs; a++) w[n++] = (uint64_t)x->attrs[a];
    memcpy(&w[n++], &x->fval, sizeof x->fval);
    for (int k = 0; k < nin; k++) w[n++] = (uint64_t)x->inputs[k]->index;
    return n;
}

bool cx_capture_key(cx_capture *cp, cx_node *const *outs, int nouts, const int *out_alias, cx_key128 *key)
{
    /* one reservation for the whole key, then plain stores */
    int64_t need = 5 + 2 * (int64_t)(cp->n_inputs - cp->n_graph_inputs) + 2 * (int64_t)nouts;
    for (int i = 0; i < cp->n; i++) need += node_words(cp->nodes[i]);
    if (need > INT32_MAX || !CX_GROW(cp->words, cp->wcap, (int)need)) return false;
    uint64_t *w = cp->words;
    int n = 0;
    w[n++] = str_word(CX_VERSION_STRING);
    w[n++] = str_word(CX_COMPILE_FLAGS);
    w[n++] = str_word(cx_compile_options());
    CX_ASSERT(n == KEY_THREADS_WORD);
    /* conv scratch has one tile buffer per thread; an SPMD program is partitioned for one rank */
    w[n++] = (uint64_t)cx_get_num_threads() | (cx_is_spmd() ? (uint64_t)(cx_global_ordinal() + 1) << 32 : 0);
    for (int i = 0; i < cp->n; i++) n += put_node(w + n, cp->nodes[i]);
    w[n++] = (uint64_t)cp->n_inputs;
    for (int i = cp->n_graph_inputs; i < cp->n_inputs; i++) {   /* donors outside the graph */
        w[n++] = 0xd0d0ull;
        w[n++] = (uint64_t)cp->inputs[i]->numel;
    }
    for (int o = 0; o < nouts; o++) {
        w[n++] = (uint64_t)outs[o]->index;
        w[n++] = (uint64_t)(int64_t)out_alias[o];
    }
    CX_ASSERT(n <= need);
    cp->nwords = n;
    *key = cx_hash128(w, sizeof *w * (size_t)n);
    return true;
}

cx_key128 cx_capture_shared_key(cx_capture *cp)
{
    uint64_t threads = cp->words[KEY_THREADS_WORD];   /* and the rank */
    cp->words[KEY_THREADS_WORD] = 0;
    cx_key128 k = cx_hash128(cp->words, sizeof *cp->words * (size_t)cp->nwords);
    cp->words[KEY_THREADS_WORD] = threads;
    return k;
}

/* ---- the compiler's graph ------------------------------------------------------------------ */

static void graph_node(const cx_node *x, cx_gnode *gn, int *storage, int *in_ord, int *rt_ord)
{
    gn->dtype = x->dtype;
    gn->loc = x->loc;
    gn->ndim = x->ndim;
    memcpy(gn->shape, x->shape, sizeof gn->shape);
    gn->numel = x->numel;
    gn->inputs = storage;
    if (x->buf && x->op != OP_DATA) {   /* eager value: a data leaf */
        gn->op = OP_DATA;
        gn->input_ordinal = (*in_ord)++;
        return;
    }
    gn->op = x->op;
    gn->ninputs = x->ninputs;
    for (int k = 0; k < x->ninputs; k++) gn->inputs[k] = x->inputs[k]->index;
    gn->nattrs = x->nattrs;
    memcpy(gn->attrs, x->attrs, sizeof gn->attrs);
    gn->fval = x->fval;
    gn->input_ordinal = x->op == OP_DATA ? (*in_ord)++ : x->op == OP_RTSCALAR ? (*rt_ord)++ : -1;
}

bool cx_capture_to_graph(const cx_capture *cp, cx_node *const *outs, int nouts, const int *out_alias, cx_graph *g)
{
    memset(g, 0, sizeof *g);
    g->n = cp->n;
    g->nodes = calloc((size_t)cp->n + 1, sizeof *g->nodes);
    int total_inputs = 0;
    for (int i = 0; i < cp->n; i++) total_inputs += cp->nodes[i]->ninputs;
    g->input_storage = malloc(sizeof(int) * (size_t)(total_inputs + 1));
    g->outputs = malloc(sizeof(int) * (size_t)(nouts + 1));
    g->out_alias = malloc(sizeof(int) * (size_t)(nouts + 1));
    if (!g->nodes || !g->input_storage || !g->outputs || !g->out_alias) return false;
    int pos = 0, in_ord = 0, rt_ord = 0;
    for (int i = 0; i < cp->n; i++) {
        graph_node(cp->nodes[i], &g->nodes[i], g->input_storage + pos, &in_ord, &rt_ord);
        pos += g->nodes[i].ninputs;
    }
    g->n_inputs = cp->n_inputs;
    g->n_rts = cp->n_rts;
    g->n_outputs = nouts;
    for (int o = 0; o < nouts; o++) { g->outputs[o] = outs[o]->index; g->out_alias[o] = out_alias[o]; }
    return true;
}

void cx_graph_release(cx_graph *g)
{
    free(g->nodes);
    free(g->input_storage);
    free(g->outputs);
    free(g->out_alias);
    memset(g, 0, sizeof *g);
}

/* ---- compile options ------------------------------------------------------------------------ */

static char *g_opts;
static bool g_opts_set;
static pthread_mutex_t g_opts_mu = PTHREAD_MUTEX_INITIALIZER;

const char *cx_compile_options(void)
{
    if (!g_opts_set) {
        pthread_mutex_lock(&g_opts_mu);
        if (!g_opts_set) {
            const char *a = cx_setting_str("XLA_FLAGS"), *b = cx_setting_str("CX_COMPILE_OPTIONS");
            char buf[4096];
            snprintf(buf, sizeof buf, "%s%s%s%s", a && *a ? "XLA_FLAGS=" : "", a && *a ? a : "",
                     b && *b ? ";CX_COMPILE_OPTIONS=" : "", b && *b ? b : "");
            g_opts = strdup(buf);
            g_opts_set = true;
        }
        pthread_mutex_unlock(&g_opts_mu);
    }
    return g_opts ? g_opts : "";
}

void cx_set_compile_options(const char *opts)
{
    pthread_mutex_lock(&g_opts_mu);
    free(g_opts);
    g_opts = strdup(opts ? opts : "");
    g_opts_set = true;
    pthread_mutex_unlock(&g_opts_mu);
}

const char *cx_get_compile_options(void) { return cx_compile_options(); }
