/* DistributedDataParallel: one model replica per rank, gradients averaged
 * by bucketed all-reduces recorded into the step graph (pinned, one per
 * bucket, reverse registration order, 1/world folded into the result). The
 * executor issues each as soon as its gradients are computed and waits only
 * where the optimizer needs them, so the rest of backward overlaps them. */
#include "parallel_internal.h"

#include "cx_struct.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cx_ddp {
    cx_module *m;
    cx_ddp_opts o;
    cx_named_tensor *params;
    cx_tensor **ptensors;     /* params' tensors, as the bucket policy takes them */
    int nparams;
    cx_named_tensor *buffers;
    int nbuffers;
    int *bucket_idx;          /* scratch for cx_bucket_next, nparams + 1 */
    int no_sync;
    int last_buckets;
};

/* Every rank must hold the same model before anything is exchanged; then
 * rank 0's parameters and buffers, in one execution. */
static cx_status take_master_model(cx_ddp *d)
{
    /* each replica holds the whole model: a deferred one gets its values
     * here, and then rank 0's are taken as for any model */
    cx_status st = cx_module_materialize(d->m);
    if (st == CX_OK) st = cx_agree_on_module(d->m, NULL, "ddp_wrap");
    if (st != CX_OK || cx_world_size() == 1) return st;
    st = cx_record_master_values(d->params, d->nparams);
    if (st == CX_OK) st = cx_record_master_values(d->buffers, d->nbuffers);
    return st == CX_OK ? cx_sync() : st;
}

cx_ddp *cx_ddp_wrap(cx_module *m, cx_ddp_opts opts)
{
    if (!m) { cx_set_last_error("ddp_wrap: module is NULL"); return NULL; }
    cx_ddp_opts own_opts = cx_ddp_default_opts();
    if (!CX_TAKE_STRUCT("ddp_wrap", cx_ddp_opts, own_opts, &opts, grad_comm)) return NULL;
    opts = own_opts;
    if (opts.grad_comm != CX_GRAD_COMM_F32 && opts.grad_comm != CX_GRAD_COMM_BF16) {
        cx_set_last_error("ddp_wrap: unknown grad_comm %d (CX_GRAD_COMM_F32, CX_GRAD_COMM_BF16)", (int)opts.grad_comm);
        return NULL;
    }
    if (opts.first_bucket_bytes <= 0 || opts.bucket_bytes <= 0) {
        cx_set_last_error("ddp_wrap: bucket sizes must be positive (got %lld and %lld)", (long long)opts.first_bucket_bytes,
                          (long long)opts.bucket_bytes);
        return NULL;
    }
    cx_ddp *d = calloc(1, sizeof *d);
    if (!d) { cx_set_last_error("ddp_wrap: out of memory"); return NULL; }
    d->m = m;
    d->o = opts;
    d->params = cx_module_parameters(m, &d->nparams);
    d->buffers = cx_module_buffers(m, &d->nbuffers);
    if (d->params) {
        d->ptensors = malloc(sizeof *d->ptensors * (size_t)(d->nparams + 1));
        d->bucket_idx = malloc(sizeof *d->bucket_idx * (size_t)(d->nparams + 1));
    }
    if (!d->params || !d->buffers || !d->ptensors || !d->bucket_idx) {
        cx_ddp_free(d);
        cx_set_last_error("ddp_wrap: out of memory");
        return NULL;
    }
    for (int i = 0; i < d->nparams; i++) d->ptensors[i] = d->params[i].tensor;
    if (take_master_model(d) != CX_OK) { cx_ddp_free(d); return NULL; }
    return d;
}

void cx_ddp_free(cx_ddp *d)
{
    if (!d) return;
    free(d->params);
    free(d->ptensors);
    free(d->bucket_idx);
    free(d->buffers);
    free(d);
}

cx_module *cx_ddp_module(cx_ddp *d) { return d ? d->m : NULL; }

/* torch DDP's buffer sync: rank 0's running stats before each forward. */
static cx_status sync_buffers(cx_ddp *d)
{
    if (!d->o.broadcast_buffers || !cx_module_is_training(d->m)) return CX_OK;
    return cx_record_master_values(d->buffers, d->nbuffers);
}

cx_tensor *cx_ddp_forward(cx_ddp *d, cx_tensor *x)
{
    if (!d) return cx_module_forward(NULL, x);
    if (sync_buffers(d) != CX_OK) return cx_poisoned("ddp_forward: broadcasting rank 0's buffers: %s", cx_last_error());
    return cx_module_forward(d->m, x);
}

int cx_ddp_forward_many(cx_ddp *d, cx_tensor *const *in, int n_in, cx_tensor **out, int max_out)
{
    if (!d) return cx_module_forward_many(NULL, in, n_in, out, max_out);
    if (sync_buffers(d) != CX_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cx_last_error());
        cx_set_last_error("ddp_forward_many: broadcasting rank 0's buffers: %s", msg);
        return -1;
    }
    return cx_module_forward_many(d->m, in, n_in, out, max_out);
}

cx_status cx_ddp_backward(cx_ddp *d, cx_tensor *loss)
{
    if (!d) { cx_set_last_error("ddp_backward: wrapper is NULL"); return CX_ERR_ARG; }
    cx_status st = cx_backward(loss);
    if (st != CX_OK || d->no_sync) return st;
    int b = cx_allreduce_gradients_as(d->ptensors, d->nparams, d->o.first_bucket_bytes, d->o.bucket_bytes,
                                      1.0 / cx_world_size(), d->o.grad_comm);
    if (b < 0) return CX_ERR_COMM;
    d->last_buckets = b;
    return CX_OK;
}

void cx_ddp_no_sync_begin(cx_ddp *d) { if (d) d->no_sync++; }
void cx_ddp_no_sync_end(cx_ddp *d) { if (d && d->no_sync > 0) d->no_sync--; }
int cx_ddp_num_buckets(const cx_ddp *d) { return d ? d->last_buckets : 0; }

int cx_ddp_predict_buckets(const cx_ddp *d)
{
    if (!d) return 0;
    /* the same policy over the parameters (a gradient has its parameter's size) */
    int buckets = 0, i = d->nparams - 1;
    while (cx_bucket_next(d->ptensors, &i, buckets, d->o.first_bucket_bytes, d->o.bucket_bytes, d->bucket_idx) > 0)
        buckets++;
    return buckets;
}
