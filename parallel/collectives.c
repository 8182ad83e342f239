/* Eager host collectives (barrier, rendezvous, mesh_reduce), parameter
 * broadcast, and the bucketed gradient all-reduce behind both
 * xm.optimizer_step and DDP. */
#include "parallel_internal.h"

#include <cxla/metrics.h>

#include "cx_hash.h"
#include "cx_sbuf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cx_status mpi_err(int rc, const char *what)
{
    if (rc == MPI_SUCCESS) return CX_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    cx_set_last_error("%s failed on rank %d: %s", what, cx_global_ordinal(), msg);
    return CX_ERR_COMM;
}

static cx_status do_barrier(void *arg)
{
    (void)arg;
    return mpi_err(MPI_Barrier(cx_dist_world_comm()), "barrier");
}

cx_status cx_barrier(void)
{
    if (!cx_dist_uses_mpi()) return CX_OK;
    return cx_dist_run_on_progress(do_barrier, NULL);
}

/* ---- rendezvous ------------------------------------------------------------------- */

typedef struct {
    const char *tag;
    const void *payload;
    size_t n;
    void **out;
    size_t *sizes;
} rdv_args;

static cx_status do_rendezvous(void *p)
{
    rdv_args *a = p;
    MPI_Comm w = cx_dist_world_comm();
    int world = cx_world_size();
    uint64_t mine[2] = { cx_hash64(a->tag, strlen(a->tag)), (uint64_t)a->n };
    uint64_t *all = malloc(sizeof(uint64_t) * 2 * (size_t)world);
    if (!all) { cx_set_last_error("rendezvous: out of memory"); return CX_ERR_OOM; }
    cx_status st = mpi_err(MPI_Allgather(mine, 2, MPI_UINT64_T, all, 2, MPI_UINT64_T, w), "rendezvous");
    if (st != CX_OK) { free(all); return st; }
    size_t maxn = 0;
    for (int r = 0; r < world; r++) {
        if (all[2 * r] != mine[0]) {
            cx_set_last_error("rendezvous '%s': rank %d arrived with a different tag", a->tag, r);
            free(all);
            return CX_ERR_ARG;
        }
        if (all[2 * r + 1] > maxn) maxn = (size_t)all[2 * r + 1];
    }
    char *buf = calloc((size_t)world * (maxn ? maxn : 1), 1);
    char *mybuf = calloc(maxn ? maxn : 1, 1);
    if (!buf || !mybuf) { free(all); free(buf); free(mybuf); cx_set_last_error("rendezvous: out of memory"); return CX_ERR_OOM; }
    if (a->n) memcpy(mybuf, a->payload, a->n);
    st = mpi_err(MPI_Allgather(mybuf, (int)maxn, MPI_BYTE, buf, (int)maxn, MPI_BYTE, w), "rendezvous");
    free(mybuf);
    if (st == CX_OK) {
        if (a->sizes) for (int r = 0; r < world; r++) a->sizes[r] = (size_t)all[2 * r + 1];
        *a->out = buf;
    } else {
        free(buf);
    }
    free(all);
    return st;
}

cx_status cx_rendezvous(const char *tag, const void *payload, size_t n, void **out, size_t *sizes)
{
    if (!tag || !out || (n && !payload)) { cx_set_last_error("rendezvous: NULL argument"); return CX_ERR_ARG; }
    if (!cx_dist_uses_mpi()) {
        void *copy = malloc(n ? n : 1);
        if (!copy) { cx_set_last_error("rendezvous: out of memory"); return CX_ERR_OOM; }
        if (n) memcpy(copy, payload, n);
        *out = copy;
        if (sizes) sizes[0] = n;
        return CX_OK;
    }
    rdv_args a = { tag, payload, n, out, sizes };
    return cx_dist_run_on_progress(do_rendezvous, &a);
}

static void mean_reduce(const double *all, int world, int n, double *out)
{
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int r = 0; r < world; r++) s += all[r * n + i];
        out[i] = s / world;
    }
}

cx_status cx_mesh_reduce(const char *tag, const double *data, int n, cx_mesh_reduce_fn reduce, double *out)
{
    if (n < 0 || (n && (!data || !out))) { cx_set_last_error("mesh_reduce: bad arguments"); return CX_ERR_ARG; }
    void *all = NULL;
    cx_status st = cx_rendezvous(tag, data, sizeof(double) * (size_t)n, &all, NULL);
    if (st != CX_OK) return st;
    (reduce ? reduce : mean_reduce)(all, cx_world_size(), n, out);
    free(all);
    return CX_OK;
}

/* ---- module agreement and broadcast -------------------------------------------------- */

/* Every rank's signature against rank 0's; a difference is reported with
 * the same message on every rank, since every rank sees every signature.
 * `all` holds world texts `stride` bytes apart. */
static cx_status compare_signatures(const char *what, const char *all, const size_t *sizes, size_t stride, int world)
{
    enum { NAMED = 8 };   /* ranks listed before "and N more" */
    char list[NAMED * 14 + 32] = "";
    size_t len = 0;
    int first = -1, ndiff = 0;
    for (int r = 1; r < world; r++) {
        if (sizes[r] == sizes[0] && !memcmp(all, all + (size_t)r * stride, sizes[0])) continue;
        if (first < 0) first = r;
        if (++ndiff <= NAMED) len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", ndiff > 1 ? ", " : "", r);
    }
    if (first < 0) return CX_OK;
    if (ndiff > NAMED) snprintf(list + len, sizeof list - len, " and %d more", ndiff - NAMED);
    cx_module_sig_entry e0, er;
    cx_module_signature_diff(all, all + (size_t)first * stride, &e0, &er);
    cx_set_last_error("%s: rank%s %s set%s up the model differently from rank 0: rank 0 has '%.*s', rank %d has '%.*s'",
                      what, ndiff > 1 ? "s" : "", list, ndiff > 1 ? "" : "s", e0.len, e0.len ? e0.text : "(nothing)",
                      first, er.len, er.len ? er.text : "(nothing)");
    return CX_ERR_ARG;
}

cx_status cx_agree_on_module(const cx_module *m, const char *extra, const char *what)
{
    int world = cx_world_size();
    if (world == 1) return CX_OK;
    char *sig = cx_module_signature(m);
    if (sig && extra) {
        cx_sbuf text = { 0 };
        cx_sb_printf(&text, "%s%s", sig, extra);
        free(sig);
        sig = cx_sb_finish(&text);
    }
    size_t *sizes = calloc((size_t)world, sizeof *sizes);
    if (!sig || !sizes) { free(sig); free(sizes); cx_set_last_error("%s: out of memory", what); return CX_ERR_OOM; }
    void *all = NULL;
    cx_status st = cx_rendezvous(what, sig, strlen(sig) + 1, &all, sizes);
    free(sig);
    if (st == CX_OK) {
        size_t stride = 0;
        for (int r = 0; r < world; r++) if (sizes[r] > stride) stride = sizes[r];
        st = compare_signatures(what, all, sizes, stride, world);
    }
    free(all);
    free(sizes);
    return st;
}

cx_status cx_record_master_values(const cx_named_tensor *ts, int n)
{
    if (cx_world_size() == 1) return CX_OK;
    for (int i = 0; i < n; i++) {
        cx_tensor *b = cx_broadcast(ts[i].tensor, 0, NULL, true);
        cx_status st = cx_assign(ts[i].tensor, b);
        cx_free(b);
        if (st != CX_OK) return st;
    }
    return CX_OK;
}

static const char *const g_init_kind[] = { "constant", "uniform", "normal" };

char *cx_deferred_entries(const cx_module *m)
{
    int n = 0;
    cx_named_tensor *sd = cx_module_state_dict(m, &n);
    if (!sd) return NULL;
    cx_sbuf b = { 0 };
    for (int i = 0; i < n; i++) {
        cx_init_recipe r;
        if (!cx_deferred_recipe(sd[i].tensor, &r)) continue;
        cx_sb_printf(&b, "deferred %s: %s(%.17g, %.17g) at seed %llu offset %llu;", sd[i].name, g_init_kind[r.kind], r.a,
                     r.b, (unsigned long long)r.seed, (unsigned long long)r.offset);
    }
    free(sd);
    return cx_sb_finish(&b);
}

cx_status cx_take_master_state(cx_module *m, const char *what)
{
    if (cx_world_size() == 1) return CX_OK;
    int n = 0;
    cx_named_tensor *sd = cx_module_state_dict(m, &n);
    if (!sd) { cx_set_last_error("%s: out of memory", what); return CX_ERR_OOM; }
    /* deferred tensors have no values to send: the ranks agreed on their
     * recipes (cx_deferred_entries), which is agreeing on their values */
    int k = 0;
    for (int i = 0; i < n; i++) if (!cx_deferred_recipe(sd[i].tensor, NULL)) sd[k++] = sd[i];
    n = k;
    cx_status st = cx_record_master_values(sd, n);
    if (st == CX_OK) st = cx_sync();
    free(sd);
    return st;
}

cx_status cx_broadcast_master_params(cx_module *m)
{
    if (!m) { cx_set_last_error("broadcast_master_params: module is NULL"); return CX_ERR_ARG; }
    cx_status st = cx_module_materialize(m);
    if (st != CX_OK) return st;
    st = cx_agree_on_module(m, NULL, "broadcast_master_params");
    return st == CX_OK ? cx_take_master_state(m, "broadcast_master_params") : st;
}

/* ---- bucketed gradient all-reduce --------------------------------------------------------- */

int cx_bucket_next(cx_tensor *const *ts, int *i, int bucket, int64_t first_bucket_bytes, int64_t bucket_bytes,
                   int *members)
{
    int64_t cap = bucket == 0 ? first_bucket_bytes : bucket_bytes, bytes = 0;
    int k = 0;
    cx_dtype dt = CX_F32;
    for (; *i >= 0; (*i)--) {
        cx_tensor *t = ts[*i];
        if (!t) continue;
        int64_t b = cx_numel(t) * (int64_t)cx_dtype_size(cx_dtype_of(t));
        if (k > 0 && (bytes + b > cap || cx_dtype_of(t) != dt)) break;
        if (k == 0) dt = cx_dtype_of(t);
        members[k++] = *i;
        bytes += b;
    }
    return k;
}

typedef struct {
    const cx_tensor *t;
    int at;
} listed;

static int by_param(const void *a, const void *b)
{
    const listed *x = a, *y = b;
    if (x->t != y->t) return (uintptr_t)x->t < (uintptr_t)y->t ? -1 : 1;
    return x->at - y->at;
}

/* A tensor listed twice (a tied parameter named twice) has one gradient:
 * reducing it twice would scale it twice. Its later entries get no
 * gradient here, so the bucket policy skips them. @return false when out
 * of memory. */
static bool drop_repeats(cx_tensor *const *params, cx_tensor **grads, int n)
{
    listed *order = malloc(sizeof *order * (size_t)(n + 1));
    if (!order) return false;
    for (int j = 0; j < n; j++) order[j] = (listed){ params[j], j };
    qsort(order, (size_t)n, sizeof *order, by_param);
    for (int j = 1; j < n; j++)
        if (order[j].t == order[j - 1].t) grads[order[j].at] = NULL;
    free(order);
    return true;
}

/* One bucket's all-reduce, its bytes sent as `how` says. */
static cx_tensor *reduce_bucket(cx_tensor *cat, double scale, cx_grad_comm how)
{
    if (how != CX_GRAD_COMM_BF16 || cx_dtype_of(cat) == CX_BF16) return cx_all_reduce(cat, CX_RED_SUM, scale, NULL, true);
    cx_tensor *half = cx_cast(cat, CX_BF16);
    cx_tensor *red = cx_all_reduce(half, CX_RED_SUM, scale, NULL, true);
    cx_tensor *back = cx_cast(red, cx_dtype_of(cat));
    cx_free(half);
    cx_free(red);
    return back;
}

int cx_allreduce_gradients(cx_tensor *const *params, int n, int64_t first_bucket_bytes, int64_t bucket_bytes, double scale)
{
    return cx_allreduce_gradients_as(params, n, first_bucket_bytes, bucket_bytes, scale, CX_GRAD_COMM_F32);
}

int cx_allreduce_gradients_as(cx_tensor *const *params, int n, int64_t first_bucket_bytes, int64_t bucket_bytes,
                              double scale, cx_grad_comm how)
{
    if (how != CX_GRAD_COMM_F32 && how != CX_GRAD_COMM_BF16) {
        cx_set_last_error("allreduce_gradients: unknown gradient communication %d (CX_GRAD_COMM_F32, CX_GRAD_COMM_BF16)",
                          (int)how);
        return -1;
    }
    int buckets = 0;
    int i = n - 1;
    cx_tensor **flats = malloc(sizeof *flats * (size_t)(n + 1));
    cx_tensor **grads = malloc(sizeof *grads * (size_t)(n + 1));
    int *idx = malloc(sizeof *idx * (size_t)(n + 1));
    if (!flats || !grads || !idx) {
        free(flats); free(grads); free(idx);
        cx_set_last_error("allreduce_gradients: out of memory");
        return -1;
    }
    for (int j = 0; j < n; j++) grads[j] = cx_grad(params[j]);
    if (!drop_repeats(params, grads, n)) {
        free(flats); free(grads); free(idx);
        cx_set_last_error("allreduce_gradients: out of memory");
        return -1;
    }
    for (;;) {
        int k = cx_bucket_next(grads, &i, buckets, first_bucket_bytes, bucket_bytes, idx);
        if (k == 0) break;
        for (int j = 0; j < k; j++) {
            int64_t all = -1;
            flats[j] = cx_reshape(grads[idx[j]], &all, 1);
        }
        cx_tensor *cat = k == 1 ? cx_alias(flats[0]) : cx_concat(flats, k, 0);
        cx_tensor *red = reduce_bucket(cat, scale, how);
        int64_t off = 0;
        cx_status st = CX_OK;
        for (int j = 0; j < k; j++) {
            cx_tensor *g = grads[idx[j]];
            int64_t cnt = cx_numel(g);
            cx_tensor *piece = cx_slice(red, 0, off, off + cnt, 1);
            cx_tensor *shaped = cx_reshape(piece, cx_shape(g), cx_ndim(g));
            if (st == CX_OK) st = cx_assign(g, shaped);
            cx_free(piece);
            cx_free(shaped);
            off += cnt;
        }
        for (int j = 0; j < k; j++) cx_free(flats[j]);
        cx_free(cat);
        cx_free(red);
        if (st != CX_OK) { free(flats); free(grads); free(idx); return -1; }
        buckets++;
    }
    free(flats);
    free(grads);
    free(idx);
    cx_counter_add("GradientBuckets", buckets);
    return buckets;
}

cx_status cx_optimizer_step(cx_optimizer *opt) { return cx_optimizer_step_as(opt, CX_GRAD_COMM_F32); }

cx_status cx_optimizer_step_as(cx_optimizer *opt, cx_grad_comm how)
{
    int n = 0;
    cx_named_tensor *ps = cx_optim_params(opt, &n);
    if (!ps) { cx_set_last_error("optimizer_step: out of memory"); return CX_ERR_OOM; }
    cx_tensor **ts = malloc(sizeof *ts * (size_t)(n + 1));
    if (!ts) { free(ps); cx_set_last_error("optimizer_step: out of memory"); return CX_ERR_OOM; }
    for (int i = 0; i < n; i++) ts[i] = ps[i].tensor;
    int world = cx_world_size();
    int b = world > 1 ? cx_allreduce_gradients_as(ts, n, 1 << 20, 25 << 20, 1.0 / world, how) : 0;
    free(ts);
    free(ps);
    if (b < 0) return CX_ERR_COMM;
    return cx_optim_step(opt);
}
