/* Sync: the values of pending tensors, computed in one graph. The phases,
 * in order: collect the tensors to materialize, pick their unique output
 * nodes, capture the graph, plan which outputs take their old buffer
 * (cx_assign), key it, find or compile the executable (memory LRU, then the
 * persistent cache, then the compiler), bind buffers and run, and settle
 * the outputs into the tensors. The public entry points that sync (step
 * end, sync, reads) live here too. */
#include "api.h"
#include "cx_vec.h"

#include <math.h>

typedef struct {
    const char *cause;
    int obs;                       /* observability flags for this sync */
    cx_status status;              /* poisoned tensors were skipped */
    char err_saved[1024];          /* ... and this was their message */
    cx_tensor **tens;              /* tensors to materialize, creation order */
    int n_t, cap_t;
    cx_node **outs;                /* unique output nodes */
    int nouts;
    int *tens_out;                 /* tensor -> output */
    int *out_alias;                /* output -> input ordinal whose buffer it takes, or -1 */
    cx_capture *cp;
    cx_key128 key;
    cx_executable *e;
    int source;                    /* 0 in-memory hit, 1 compiled, 2 persistent cache */
    cx_buffer **obufs;
} sync_job;

static _Thread_local cx_capture t_cap;   /* buffers reused between syncs */
static cx_exec_info g_last_info;

cx_exec_info cx_last_exec_info(void) { return g_last_info; }

/* Eager debug mode: a tensor whose node already holds its value becomes a
 * device-data tensor, with no execution. */
static void settle_value(cx_tensor *t)
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

/* @return false when out of memory. `each`: every poisoned tensor sets the
 * error (an explicit list), else only the first (the live list). */
static bool collect_one(sync_job *j, cx_tensor *t, bool each)
{
    if (t->node->op == OP_ERROR) {
        if (each || j->status == CX_OK) cx_set_last_error("%s", t->node->err);
        j->status = CX_ERR_SHAPE;
        return true;
    }
    if (t->node->op == OP_DATA) return true;
    if (t->node->buf) { settle_value(t); return true; }
    if (!CX_GROW(j->tens, j->cap_t, j->n_t + 1)) return false;
    j->tens[j->n_t++] = t;
    return true;
}

/* Phase 1: the pending tensors (all live ones when ts is NULL). */
static bool collect(sync_job *j, cx_tensor **ts, int nts)
{
    if (ts) {
        for (int i = 0; i < nts; i++)
            if (ts[i] && !collect_one(j, ts[i], true)) return false;
    } else {
        cx_tensor *first, *last;
        cx_live_range(&first, &last);
        for (cx_tensor *t = first; t; t = t == last ? NULL : t->next)
            if (!collect_one(j, t, false)) return false;
    }
    if (j->status != CX_OK) snprintf(j->err_saved, sizeof j->err_saved, "%s", cx_last_error());
    return true;
}

/* Phase 2: one output per distinct node, in tensor creation order. */
static bool pick_outputs(sync_job *j)
{
    j->outs = malloc(sizeof *j->outs * (size_t)j->n_t);
    j->tens_out = malloc(sizeof(int) * (size_t)j->n_t);
    j->out_alias = malloc(sizeof(int) * (size_t)j->n_t);
    if (!j->outs || !j->tens_out || !j->out_alias) return false;
    int out_mark = cx_mark_epoch();
    for (int i = 0; i < j->n_t; i++) {
        cx_node *x = j->tens[i]->node;
        if (x->mark == out_mark) { j->tens_out[i] = x->index; continue; }
        x->mark = out_mark;
        x->index = j->nouts;
        j->tens_out[i] = j->nouts;
        j->out_alias[j->nouts] = -1;
        j->outs[j->nouts++] = x;
    }
    return true;
}

/* The bytes of `n`'s value on this rank under `s` (NULL: whole). */
static int64_t local_bytes(const cx_node *n, const cx_sharding *s)
{
    int64_t local[CX_MAX_DIMS], numel = n->numel;
    if (s) {
        cx_sharding_local_shape(s, n->shape, local);
        numel = cx_shape_numel(local, n->ndim);
    }
    return numel * (int64_t)cx_dtype_size((cx_dtype)n->dtype);
}

/* Phase 4: a cx_assign'd output may take its old buffer when nothing else
 * can see that buffer any more. A sharded donor (an SPMD parameter, its
 * optimizer state) only when the output is annotated with its sharding
 * (cx_assign does that), so that both hold the same local shard. */
static bool plan_aliases(sync_job *j)
{
    for (int i = 0; i < j->n_t; i++) {
        cx_tensor *t = j->tens[i];
        int o = j->tens_out[i];
        cx_node *d = t->donor;
        if (!(t->flags & TF_ASSIGNED) || !d || j->out_alias[o] >= 0) continue;
        if (d->hrefs != 0 || !d->buf || d->buf->refs != 1 || d->op != OP_DATA) continue;
        if (d->sharding && !(j->outs[o]->sharding && cx_sharding_equal(d->sharding, j->outs[o]->sharding))) continue;
        if ((int64_t)d->buf->bytes != local_bytes(j->outs[o], d->sharding)) continue;
        int ord = cx_capture_input_ordinal(j->cp, d);
        if (ord < 0 && (ord = cx_capture_add_input(j->cp, d)) < 0) return false;
        bool taken = false;
        for (int q = 0; q < j->nouts; q++) if (j->out_alias[q] == ord) taken = true;
        if (!taken) j->out_alias[o] = ord;
    }
    return true;
}

/* SPMD: the global graph becomes this rank's (compile/partition.c), and
 * the executable keeps each output's sharding for settle_outputs. */
static bool partition_graph(sync_job *j, cx_graph *g, cx_sharding **out_sharding, int *inserted, cx_spmd_notes **notes)
{
    const cx_sharding **ann = calloc((size_t)g->n + 1, sizeof *ann);
    cx_sharding *osh = calloc((size_t)g->n_outputs + 1, sizeof *osh);
    /* an IR dump shows what the partitioner did */
    bool keep_notes = cx_obs_get() & (OBS_DUMP | OBS_PROGRAM_DUMP);
    cx_spmd_notes *nt = keep_notes ? calloc(1, sizeof *nt) : NULL;
    cx_graph local;
    bool ok = ann && osh && (nt || !keep_notes);
    for (int i = 0; ok && i < g->n; i++) ann[i] = j->cp->nodes[i]->sharding;
    if (ok) ok = cx_pass_partition(g, ann, cx_global_ordinal(), &local, osh, inserted, nt);
    else cx_set_last_error("compile: out of memory");
    free(ann);
    if (!ok) { free(osh); free(nt); return false; }
    cx_graph_release(g);
    *g = local;
    *out_sharding = osh;
    *notes = nt;
    static const char *const names[4] = { "SpmdAllReduce", "SpmdAllGather", "SpmdReduceScatter", "SpmdAllToAll" };
    for (int k = 0; k < 4; k++) if (inserted[k]) cx_counter_add(names[k], inserted[k]);
    cx_counter_add("SpmdPartitionedGraphs", 1);
    return true;
}

static bool graph_is_sharded(const cx_capture *cp)
{
    for (int i = 0; i < cp->n; i++) if (cp->nodes[i]->sharding) return true;
    return false;
}

static cx_status compile_graph(sync_job *j)
{
    double tc = cx_now();
    cx_graph g;
    cx_sharding *out_sharding = NULL;
    cx_spmd_notes *notes = NULL;
    int inserted[4] = { 0 };
    bool ok = cx_capture_to_graph(j->cp, j->outs, j->nouts, j->out_alias, &g);
    if (!ok) { cx_graph_release(&g); cx_set_last_error("compile: out of memory"); return CX_ERR_OOM; }
    if (cx_is_spmd() && graph_is_sharded(j->cp) && !partition_graph(j, &g, &out_sharding, inserted, &notes)) {
        cx_graph_release(&g);
        return CX_ERR_STATE;
    }
    j->e = cx_lower(&g);
    if (!j->e) { cx_graph_release(&g); free(out_sharding); cx_spmd_notes_free(notes); return CX_ERR_STATE; }
    j->e->out_sharding = out_sharding;
    j->e->spmd_notes = notes;
    memcpy(j->e->spmd_inserted, inserted, sizeof inserted);
    j->e->key_hi = j->key.hi;
    j->e->key_lo = j->key.lo;
    cx_key128 shared = cx_capture_shared_key(j->cp);
    j->e->shared_hi = shared.hi;
    j->e->shared_lo = shared.lo;
    if ((j->obs & OBS_PROGRAM_DUMP) && cx_obs_hooks.program) {   /* the lowered graph is still here */
        cx_obs_program_info pi = { j->key.hi, j->key.lo, j->cp->nodes, j->cp->n, j->outs, j->nouts, &g,
                                   out_sharding != NULL, notes, j->e };
        cx_obs_hooks.program(&pi);
    }
    cx_graph_release(&g);
    cx_exec_cache_insert(j->e);
    cx_counter_add("UncachedCompile", 1);
    double t1 = cx_now();
    cx_metric_add("CompileTime", t1 - tc);
    j->source = 1;
    if (cx_obs_hooks.compiled) cx_obs_hooks.compiled(j->e);   /* the persistent cache stores it */
    cx_obs_trace("compile", "compile", tc, t1, NULL);
    return CX_OK;
}

/* Phase 6: the in-memory cache, then the persistent one, then the compiler. */
static cx_status find_or_compile(sync_job *j)
{
    double tc = cx_now();
    if ((j->e = cx_exec_cache_find(j->key.hi, j->key.lo)) != NULL) {
        cx_counter_add("CachedCompile", 1);
        j->source = 0;
        return CX_OK;
    }
    if ((j->obs & OBS_DISK_CACHE) && cx_obs_hooks.cache_load &&
        (j->e = cx_obs_hooks.cache_load(j->key.hi, j->key.lo)) != NULL) {
        cx_exec_cache_insert(j->e);
        j->source = 2;
        cx_obs_trace("compile", "persistent_cache_load", tc, cx_now(), NULL);
        return CX_OK;
    }
    return compile_graph(j);
}

/* Marks in by_all_reduce[nouts] the outputs an all-reduce writes: their
 * buffers come from memory the node's other ranks write their shares of
 * the result into. */
static void all_reduce_outputs(const cx_executable *e, bool *by_all_reduce)
{
    for (int k = 0; k < e->nkernels; k++) {
        const cx_kernel *kk = &e->kernels[k];
        if (kk->kind == K_COLL && kk->coll_op == OP_ALL_REDUCE && e->slots[kk->out_slot].kind == SLOT_OUTPUT)
            by_all_reduce[e->slots[kk->out_slot].index] = true;
    }
}

/* Phase 7: input and output buffers, runtime scalars, and the run. */
static cx_status bind_and_run(sync_job *j)
{
    cx_capture *cp = j->cp;
    const cx_executable *e = j->e;
    void **inputs = malloc(sizeof(void *) * (size_t)(cp->n_inputs + 1));
    double *rt_f = malloc(sizeof(double) * (size_t)(cp->n_rts + 1));
    int64_t *rt_i = malloc(sizeof(int64_t) * (size_t)(cp->n_rts + 1));
    void **optr = malloc(sizeof(void *) * (size_t)(j->nouts + 1));
    j->obufs = calloc((size_t)j->nouts + 1, sizeof *j->obufs);
    bool *by_all_reduce = calloc((size_t)j->nouts + 1, sizeof *by_all_reduce);
    cx_status st = CX_OK;
    if (!inputs || !rt_f || !rt_i || !j->obufs || !optr || !by_all_reduce) {
        st = CX_ERR_OOM;
        cx_set_last_error("sync: out of memory");
    } else {
        all_reduce_outputs(e, by_all_reduce);
    }
    for (int i = 0; st == CX_OK && i < cp->n_inputs; i++) {
        if (!cp->inputs[i]->buf) {
            char b[160];
            cx_shape_str(b, sizeof b, cp->inputs[i]->shape, cp->inputs[i]->ndim);
            if (cp->inputs[i]->init)
                cx_set_last_error("sync: a deferred tensor of shape %s (built under cx_deferred_init_begin, never "
                                  "materialized) was used in a computation: materialize the module "
                                  "(cx_module_materialize) or shard it (cx_fsdp_wrap) first", b);
            else
                cx_set_last_error("sync: a value-less placeholder of shape %s was used in a computation", b);
            st = CX_ERR_STATE;
            break;
        }
        inputs[i] = cp->inputs[i]->buf->data;
    }
    for (int i = 0; st == CX_OK && i < cp->n_rts; i++) { rt_f[i] = cp->rts[i]->rt_f; rt_i[i] = cp->rts[i]->rt_i; }
    for (int o = 0; st == CX_OK && o < j->nouts; o++) {
        /* the executable's aliases, not the planned ones: the partitioner
         * drops an alias whose output does not hold its donor's shard, and the
         * program was compiled (alias-safety copies included) for what it kept */
        if (e->out_alias[o] >= 0) {
            j->obufs[o] = cp->inputs[e->out_alias[o]]->buf;
            cx_buffer_ref(j->obufs[o]);
        } else if (!(j->obufs[o] = by_all_reduce[o] ? cx_buffer_new_collective((size_t)e->out_bytes[o])
                                                    : cx_buffer_new((size_t)e->out_bytes[o]))) {
            st = CX_ERR_OOM;
            break;
        }
        optr[o] = j->obufs[o]->data;
    }
    if (st == CX_OK) {
        double te = cx_now();
        st = cx_execute(e, inputs, rt_f, rt_i, optr);
        double te1 = cx_now();
        cx_metric_add("ExecuteTime", te1 - te);
        if (j->obs & OBS_TRACE) {
            char args[96];
            snprintf(args, sizeof args, "\"kernels\": %d, \"hash\": \"%016llx%016llx\"", e->num_work_kernels,
                     (unsigned long long)e->key_hi, (unsigned long long)e->key_lo);
            cx_obs_trace("execute", "execute", te, te1, args);
        }
    }
    free(inputs); free(rt_f); free(rt_i); free(optr); free(by_all_reduce);
    return st;
}

/* Phase 8: each tensor's node becomes a data node over its output buffer. */
static cx_status settle_outputs(sync_job *j)
{
    cx_node **newn = calloc((size_t)j->nouts + 1, sizeof *newn);
    cx_status st = newn ? CX_OK : CX_ERR_OOM;
    for (int o = 0; st == CX_OK && o < j->nouts; o++) {
        newn[o] = cx_node_data(j->obufs[o], (cx_dtype)j->outs[o]->dtype, j->outs[o]->shape, j->outs[o]->ndim);
        if (!newn[o]) { st = CX_ERR_OOM; break; }
        j->obufs[o] = NULL;
        newn[o]->loc = j->outs[o]->loc;   /* XLA_IR_DEBUG: the value was made where its node was */
        const cx_sharding *s = j->e->out_sharding ? &j->e->out_sharding[o] : NULL;
        if (!cx_sharding_is_replicated(s)) {   /* the buffer holds this rank's shard */
            if (!(newn[o]->sharding = malloc(sizeof *s))) { st = CX_ERR_OOM; break; }
            *newn[o]->sharding = *s;
        }
    }
    if (st != CX_OK) cx_set_last_error("sync: out of memory");
    if (st == CX_OK) {
        cx_counter_add("CreateDataHandles", j->nouts);
        for (int i = 0; i < j->n_t; i++) {
            cx_tensor *t = j->tens[i];
            cx_node *nn = newn[j->tens_out[i]];
            cx_set_node(t, nn);
            if (t->flags & TF_REQUIRES_GRAD) { nn->flags |= NF_REQUIRES_GRAD; nn->grad_leaf = t; }
            t->flags &= ~(uint32_t)TF_ASSIGNED;
            if (t->donor) { cx_node_unref(t->donor); t->donor = NULL; }
        }
    }
    for (int o = 0; newn && o < j->nouts; o++) if (newn[o]) cx_node_unref(newn[o]); /* tensors hold them now */
    free(newn);
    return st;
}

static void record_info(const cx_executable *e)
{
    int ncoll = 0;
    for (int k = 0; k < e->nkernels; k++) ncoll += e->kernels[k].kind == K_COLL;
    g_last_info = (cx_exec_info){ .num_kernels = e->num_work_kernels, .num_nodes = e->num_nodes,
                                  .arena_bytes = e->arena_bytes, .intermediate_bytes = e->intermediate_bytes,
                                  .num_inputs = e->n_inputs, .num_outputs = e->n_outputs, .num_aliased = e->num_aliased,
                                  .key_hi = e->key_hi, .key_lo = e->key_lo, .num_collectives = ncoll };
}

/* Phases 3-8 for outputs already picked. */
static cx_status run_graph(sync_job *j)
{
    cx_capture *cp = j->cp = &t_cap;
    if (!cx_capture_graph(cp, j->outs, j->nouts) || !plan_aliases(j) ||
        !cx_capture_key(cp, j->outs, j->nouts, j->out_alias, &j->key)) {
        cx_set_last_error("sync: out of memory");
        return CX_ERR_OOM;
    }
    cx_status st = find_or_compile(j);
    cx_obs_graph_info gi = { j->cause, j->key.hi, j->key.lo, cp->nodes, cp->n, j->outs, j->nouts, j->e, j->source };
    if (st == CX_OK && (j->obs & (OBS_DEBUG | OBS_DUMP))) {   /* analysis and dumps see the graph before it runs */
        if ((j->obs & OBS_DUMP) && cx_obs_hooks.dump) cx_obs_hooks.dump(&gi);
        if ((j->obs & OBS_DEBUG) && cx_obs_hooks.analysis) cx_obs_hooks.analysis(&gi);
    }
    if (st == CX_OK) {
        st = bind_and_run(j);
        record_info(j->e);
    }
    /* out of memory, a collective's error, a desync: the graph is kept */
    if (st != CX_OK && (j->obs & OBS_SAVE_FAILED) && cx_obs_hooks.failed) cx_obs_hooks.failed(&gi, st);
    if (st == CX_OK) st = settle_outputs(j);
    return st;
}

cx_status cx_materialize(cx_tensor **ts, int nts, const char *cause)
{
    sync_job j = { .cause = cause, .obs = cx_obs_get() };
    if (!collect(&j, ts, nts)) { free(j.tens); cx_set_last_error("sync: out of memory"); return CX_ERR_OOM; }
    if (j.n_t == 0) { free(j.tens); return j.status; }
    double t_start = cx_now();
    cx_status st = pick_outputs(&j) ? run_graph(&j) : (cx_set_last_error("sync: out of memory"), CX_ERR_OOM);
    for (int o = 0; j.obufs && o < j.nouts; o++) if (j.obufs[o]) cx_buffer_unref(j.obufs[o]);
    free(j.obufs); free(j.outs); free(j.tens_out); free(j.out_alias); free(j.tens);
    double t_end = cx_now();
    cx_metric_add("SyncTime", t_end - t_start);
    if (j.obs & OBS_TRACE) {
        char args[64];
        snprintf(args, sizeof args, "\"cause\": \"%s\", \"outputs\": %d", cause, j.nouts);
        cx_obs_trace("sync", "sync", t_start, t_end, args);
    }
    if (st != CX_OK) return st;
    if (j.status != CX_OK) cx_set_last_error("%s", j.err_saved);
    return j.status;
}

/* ---- the public entry points that sync ------------------------------------------------------- */

static struct {
    cx_step_observer_fn fn;
    void *arg;
    int64_t steps;
} g_step_observer;

void cx_set_step_observer(cx_step_observer_fn fn, void *arg)
{
    g_step_observer.fn = fn;
    g_step_observer.arg = arg;
}

static cx_status step_end(const char *cause)
{
    /* the step still ends: its handles are released and its graph runs, so
     * the program can report the error and go on */
    cx_status ac = cx_autocast_step_check();
    char ac_msg[256] = "";
    if (ac != CX_OK) snprintf(ac_msg, sizeof ac_msg, "%s", cx_last_error());
    if (!cx_step_close()) return CX_ERR_STATE;
    cx_status st = cx_materialize(NULL, 0, cause);
    cx_counter_add("MarkStep", 1);
    g_step_observer.steps++;
    if (st == CX_OK && g_step_observer.fn) g_step_observer.fn(g_step_observer.arg, g_step_observer.steps);
    /* after the step's graph ran: closures, XLA_METRICS_FILE, warnings */
    int obs = cx_obs_get();
    if (obs & OBS_CLOSURES) cx_closures_run();
    if ((obs & OBS_METRICS_FILE) && cx_obs_hooks.metrics_file) cx_obs_hooks.metrics_file();
    if ((obs & OBS_DEBUG) && cx_obs_hooks.step_warnings) cx_obs_hooks.step_warnings();
    if ((obs & OBS_PROFILE_SERVER) && cx_obs_hooks.profile_server) cx_obs_hooks.profile_server();
    if (st == CX_OK && ac != CX_OK) {
        cx_set_last_error("%s", ac_msg);
        return ac;
    }
    return st;
}

cx_status cx_step_end(void) { return step_end("step end"); }

cx_status cx_step_end_cause(cx_step_cause cause)
{
    return step_end(cause == CX_CAUSE_LOADER ? "loader" : "step end");
}

cx_status cx_sync(void) { return cx_materialize(NULL, 0, "user sync"); }

cx_status cx_sync_tensors(cx_tensor **ts, int n) { return cx_materialize(ts, n, "user sync"); }

/* ---- reads ------------------------------------------------------------------------------------------ */

void cx_convert_values(void *out, cx_dtype odt, const void *in, cx_dtype idt, int64_t n)
{
    if (odt == idt) { memcpy(out, in, (size_t)n * cx_dtype_size(idt)); return; }
    for (int64_t i = 0; i < n; i++) {
        double v;
        switch (idt) {
        case CX_F32: v = ((const float *)in)[i]; break;
        case CX_BF16: v = cx_bf16_to_f32_inline(((const uint16_t *)in)[i]); break;
        case CX_I32: v = ((const int32_t *)in)[i]; break;
        case CX_I64: v = (double)((const int64_t *)in)[i]; break;
        case CX_U8: v = ((const uint8_t *)in)[i]; break;
        default: v = ((const uint8_t *)in)[i] != 0; break;
        }
        switch (odt) {
        case CX_F32: ((float *)out)[i] = (float)v; break;
        case CX_BF16: ((uint16_t *)out)[i] = cx_f32_to_bf16_inline((float)v); break;
        case CX_I32: ((int32_t *)out)[i] = (int32_t)v; break;
        case CX_I64: ((int64_t *)out)[i] = (int64_t)v; break;
        case CX_U8: ((uint8_t *)out)[i] = (uint8_t)v; break;
        default: ((uint8_t *)out)[i] = v != 0; break;
        }
    }
}

cx_status cx_to_host(cx_tensor *t, void *out, cx_dtype dtype)
{
    if (!t || (!out && t->node->numel)) { cx_set_last_error("to_host: NULL argument"); return CX_ERR_ARG; }
    if ((unsigned)dtype >= CX_DTYPE_COUNT) { cx_set_last_error("to_host: unknown dtype %d", (int)dtype); return CX_ERR_ARG; }
    if (t->node->op == OP_ERROR) { cx_set_last_error("%s", t->node->err); return CX_ERR_SHAPE; }
    if (t->node->op != OP_DATA) {
        cx_status st = cx_materialize(&t, 1, "value read");
        if (st != CX_OK) return st;
    }
    if (!t->node->buf) {
        char b[160];
        cx_set_last_error("to_host: tensor%s%s of shape %s is %s", t->name ? " " : "", t->name ? t->name : "",
                     cx_shape_str(b, sizeof b, t->node->shape, t->node->ndim),
                     t->node->init ? "deferred (not materialized yet)" : "a value-less placeholder");
        return CX_ERR_STATE;
    }
    double t0 = cx_now();
    if (t->node->sharding) {   /* every rank reads a sharded value together */
        cx_node *x = t->node;
        void *whole = malloc((size_t)x->numel * cx_dtype_size((cx_dtype)x->dtype) + 1);
        cx_status st = whole ? cx_spmd_gather_value(x, whole) : CX_ERR_OOM;
        if (!whole) cx_set_last_error("to_host: out of memory gathering a sharded tensor");
        if (st == CX_OK) cx_convert_values(out, dtype, whole, (cx_dtype)x->dtype, x->numel);
        free(whole);
        if (st != CX_OK) return st;
    } else {
        cx_convert_values(out, dtype, t->node->buf->data, (cx_dtype)t->node->dtype, t->node->numel);
    }
    double t1 = cx_now();
    cx_metric_add("TransferFromDeviceTime", t1 - t0);
    if (cx_obs_get() & OBS_TRACE) {
        char args[48];
        snprintf(args, sizeof args, "\"bytes\": %zu", t->node->buf->bytes);
        cx_obs_trace("transfer", "TransferFromDevice", t0, t1, args);
    }
    return CX_OK;
}

double cx_item(cx_tensor *t)
{
    if (!t) { cx_set_last_error("item: NULL tensor"); return NAN; }
    if (t->node->op != OP_ERROR && t->node->numel != 1) {
        char b[160];
        cx_set_last_error("item: tensor of shape %s has %lld elements, not 1",
                     cx_shape_str(b, sizeof b, t->node->shape, t->node->ndim), (long long)t->node->numel);
        return NAN;
    }
    if (cx_dtype_is_float((cx_dtype)t->node->dtype) || t->node->op == OP_ERROR) {
        float f;
        if (cx_to_host(t, &f, CX_F32) != CX_OK) return NAN;
        return f;
    }
    int64_t i;
    if (cx_to_host(t, &i, CX_I64) != CX_OK) return NAN;
    return (double)i;
}
