/* The executor: runs an executable's kernels in order. It binds the
 * slots (inputs, outputs, the arena), hands each kernel to the file of its
 * kind (exec_program.c, exec_heavy.c, exec_coll.c), settles the desync check
 * before the first collective, waits for in-flight collectives where their
 * results are first needed, and records per-kernel trace events while a
 * trace records. */
#include "exec_internal.h"
#include "backend.h"
#include "obs.h"

/* One profiler event for kernel ki (collectives carry their op and bytes). */
static void trace_kernel(const cx_executable *e, int ki, double t0, double t1)
{
    const cx_kernel *k = &e->kernels[ki];
    char args[112];
    if (k->kind == K_COLL) {
        int64_t bytes = k->in[0].numel * (int64_t)cx_dtype_size((cx_dtype)k->in[0].dtype);
        snprintf(args, sizeof args, "\"kernel\": %d, \"bytes\": %lld", ki, (long long)bytes);
        cx_obs_trace("collective", cx_op_table[k->coll_op].name, t0, t1, args);
    } else {
        snprintf(args, sizeof args, "\"kernel\": %d, \"numel\": %lld%s", ki, (long long)k->out_numel,
                 k->has_epilogue ? ", \"epilogue\": true" : "");
        cx_obs_trace("kernel", cx_kernel_kind_name(k->kind), t0, t1, args);
    }
}

cx_status cx_execute(const cx_executable *e, void *const *inputs, const double *rt_f, const int64_t *rt_i,
                     void *const *outputs)
{
    void *small[256];
    void **ptr = e->nslots <= 256 ? small : malloc(sizeof(void *) * (size_t)e->nslots);
    void **reqs = calloc((size_t)e->nkernels + 1, sizeof(void *));
    if (!ptr || !reqs) { if (ptr != small) free(ptr); free(reqs); cx_set_last_error("execute: out of memory"); return CX_ERR_OOM; }
    char *arena = NULL;
    if (e->arena_bytes > 0) {
        arena = cx_arena_get(e->arena_bytes);
        if (!arena) { if (ptr != small) free(ptr); free(reqs); return CX_ERR_OOM; }
    }
    for (int s = 0; s < e->nslots; s++) {
        const cx_slot *sl = &e->slots[s];
        ptr[s] = sl->kind == SLOT_INPUT ? inputs[sl->index] : sl->kind == SLOT_OUTPUT ? outputs[sl->index] : arena + sl->offset;
    }
    run_ctx rc = { e, ptr, rt_f, rt_i };
    const cx_comm_backend *be = cx_comm_get();
    cx_status st = CX_OK;
    /* profiler (trace.c): per-kernel events only while a trace records;
     * a collective's event spans its start to the end of its wait */
    double *coll_t0 = (cx_obs_get() & OBS_TRACE) ? calloc((size_t)e->nkernels + 1, sizeof(double)) : NULL;
    int outstanding = 0;   /* collectives started and not yet waited for */
    /* the desync check: started now, settled before the first collective */
    cx_desync_pending *check = cx_desync_begin_graph(e, &st);
    for (int ki = 0; ki < e->nkernels && st == CX_OK; ki++) {
        if (check && e->kernels[ki].kind == K_COLL) {
            st = cx_desync_end_graph(check, e);
            check = NULL;
            if (st != CX_OK) break;
        }
        /* wait for collectives whose result this kernel needs */
        for (int j = 0; outstanding && j < ki; j++)
            if (reqs[j] && e->kernels[j].wait_at <= ki) {
                cx_status w = be->wait(be->ctx, reqs[j]);
                reqs[j] = NULL;
                outstanding--;
                if (w != CX_OK && st == CX_OK) st = w;
                if (coll_t0) trace_kernel(e, j, coll_t0[j], cx_now());
            }
        if (st != CX_OK) break;
        const cx_kernel *k = &e->kernels[ki];
        double tk = coll_t0 ? cx_now() : 0;
        switch (k->kind) {
        case K_FUSED: cx_run_fused(&rc, k); break;
        case K_REDUCE: cx_run_reduce(&rc, k); break;
        case K_COLL:
            st = cx_run_coll(&rc, k, &reqs[ki], k->wait_at <= ki + 1);
            outstanding += reqs[ki] != NULL;
            break;
        default: st = cx_run_heavy(&rc, k); break;
        }
        if (coll_t0) {
            if (reqs[ki]) coll_t0[ki] = tk;
            else trace_kernel(e, ki, tk, cx_now());
        }
    }
    if (check) {   /* an error came first: the exchange still completes */
        cx_status c = cx_desync_end_graph(check, e);
        if (st == CX_OK) st = c;
    }
    for (int j = 0; j < e->nkernels; j++)
        if (reqs[j]) {
            cx_status w = be->wait(be->ctx, reqs[j]);
            if (w != CX_OK && st == CX_OK) st = w;
            if (coll_t0) trace_kernel(e, j, coll_t0[j], cx_now());
        }
    if (ptr != small) free(ptr);
    free(reqs);
    free(coll_t0);
    return st;
}
