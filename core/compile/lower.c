/* The compiler's driver: a captured graph in, an executable out, through the
 * passes of passes.h in order. A view that cannot be expressed affinely
 * makes its input a root, and the lowering restarts (rare). */
#include "passes.h"
#include "sharding.h"

bool cx_uses_build(const cx_graph *g, cx_uses *u)
{
    size_t n = (size_t)g->n + 1;
    u->count = calloc(n, sizeof(int));
    u->list = calloc(n, sizeof(int *));
    u->is_output = calloc(n, 1);
    if (!u->count || !u->list || !u->is_output) { cx_uses_free(g, u); return false; }
    for (int o = 0; o < g->n_outputs; o++) u->is_output[g->outputs[o]] = 1;
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i].ninputs; k++) u->count[g->nodes[i].inputs[k]]++;
    for (int i = 0; i < g->n; i++) {
        u->list[i] = malloc(sizeof(int) * (size_t)(u->count[i] + 1));
        if (!u->list[i]) { cx_uses_free(g, u); return false; }
        u->count[i] = 0;
    }
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i].ninputs; k++) {
            int x = g->nodes[i].inputs[k];
            u->list[x][u->count[x]++] = i;
        }
    return true;
}

void cx_uses_free(const cx_graph *g, cx_uses *u)
{
    for (int i = 0; u->list && i < g->n; i++) free(u->list[i]);
    free(u->list);
    free(u->count);
    free(u->is_output);
    *u = (cx_uses){ 0 };
}

/* Passes 3-6 on a freshly generated executable. */
static bool schedule_and_plan(cx_executable *e, const int *out_alias)
{
    cx_pass_fuse_epilogues(e);
    if (!cx_pass_order_by_memory(e)) return false;
    if (!cx_pass_recompute_input_values(e)) return false;
    cx_pass_collectives_in_place(e);
    if (!cx_pass_schedule_overlap(e)) return false;
    cx_pass_prefetch_gathers(e);
    cx_pass_collective_waits(e);
    if (!cx_pass_alias_outputs(e, out_alias)) { cx_set_last_error("compile: out of memory"); return false; }
    cx_pass_liveness(e);
    if (!cx_pass_plan_memory(e)) { cx_set_last_error("compile: out of memory"); return false; }
    return true;
}

static cx_executable *new_executable(const cx_graph *g)
{
    cx_executable *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->n_inputs = g->n_inputs;
    e->n_rts = g->n_rts;
    e->n_outputs = g->n_outputs;
    e->out_dtypes = calloc((size_t)g->n_outputs + 1, 1);
    e->out_bytes = calloc((size_t)g->n_outputs + 1, sizeof(int64_t));
    e->out_alias = calloc((size_t)g->n_outputs + 1, sizeof(int));
    e->out_slot = calloc((size_t)g->n_outputs + 1, sizeof(int));
    if (!e->out_dtypes || !e->out_bytes || !e->out_alias || !e->out_slot) { cx_executable_free(e); return NULL; }
    for (int o = 0; o < g->n_outputs; o++) {
        const cx_gnode *on = &g->nodes[g->outputs[o]];
        e->out_dtypes[o] = on->dtype;
        e->out_bytes[o] = on->numel * (int64_t)cx_dtype_size((cx_dtype)on->dtype);
        e->out_alias[o] = g->out_alias[o];
    }
    return e;
}

/* Passes 1-2, retried with one more forced root each time a view could not
 * be expressed. @return CX_OK, CX_ERR_OOM, or CX_ERR_STATE (error set). */
static cx_status group_and_generate(const cx_graph *g, cx_executable *e)
{
    cx_uses u;
    char *force_root = calloc((size_t)g->n + 1, 1), *root = calloc((size_t)g->n + 1, 1);
    if (!force_root || !root || !cx_uses_build(g, &u)) {
        free(force_root); free(root);
        cx_set_last_error("compile: out of memory");
        return CX_ERR_OOM;
    }
    cx_status st = CX_OK;
    for (int attempt = 0;; attempt++) {
        cx_exec_clear_kernels(e);
        bool oom = !cx_pass_group(g, &u, force_root, root);
        int fail = oom ? -1 : cx_pass_codegen(g, root, e, &oom);
        if (oom) { st = CX_ERR_OOM; cx_set_last_error("compile: out of memory"); break; }
        if (fail < 0) break;
        if (force_root[fail] || attempt > g->n) {
            st = CX_ERR_STATE;
            cx_set_last_error("compile: cannot lower %s (node %d)", cx_op_table[g->nodes[fail].op].name, fail);
            break;
        }
        force_root[fail] = 1;
    }
    cx_uses_free(g, &u);
    free(force_root);
    free(root);
    return st;
}

cx_executable *cx_lower(const cx_graph *g)
{
    cx_executable *e = new_executable(g);
    if (!e) { cx_set_last_error("compile: out of memory"); return NULL; }
    if (group_and_generate(g, e) != CX_OK || !schedule_and_plan(e, g->out_alias)) {
        cx_executable_free(e);
        return NULL;
    }
    e->num_nodes = g->n;
    e->num_work_kernels = e->nkernels;
    e->max_prog = 1;
    for (int k = 0; k < e->nkernels; k++) if (e->kernels[k].prog.n > e->max_prog) e->max_prog = e->kernels[k].prog.n;
    return e;
}
