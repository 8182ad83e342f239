/* Prefetching loader: a background thread gathers (through the data set's
 * callbacks) and uploads the next batches, one tensor per field, while the
 * current step runs (like MpDeviceLoader).
 *
 * Requests form a queue of sequence numbers: the calling thread posts batch
 * seq = posted++ (taking its indices from the sampler, which only it
 * touches), the worker fills seq = worked++, and the caller takes
 * seq = taken++. Slot of seq is seq % nslots.
 *
 * With num_workers > 0 (and a data set declared concurrent) the gathering
 * moves to a pool: the workers claim chunks of items of the oldest posted
 * batch that still has unclaimed ones (cursor `claiming`), each chunk
 * written to its own rows, and the last chunk done marks the slot
 * gathered; the background thread then uploads slots in sequence order,
 * at most `prefetch` ahead of the caller, while up to host_prefetch more
 * wait gathered. Which worker gathered which rows never shows in a batch;
 * of several failing items the lowest row's error is reported. */
#include "nn_internal.h"
#include "data_internal.h"

#include "cx_struct.h"

#include <cxla/data.h>

#include <pthread.h>

typedef struct {
    int64_t *idx;        /* (batch_size) sample indices */
    int64_t n;           /* samples in this batch */
    int64_t index;       /* batch number in the epoch */
    void **host;         /* per field: (batch_size, field shape) host staging */
    cx_tensor **t;       /* per field; persistent: made on the worker thread */
    cx_status status;
    char err[512];
    /* workers (under mu) */
    int64_t row0, nrows;  /* the rows this rank reads */
    int64_t claimed, done;
    int64_t err_row;      /* the lowest failing row so far */
} slot;

/* A gathering thread and its scratch: per field, where its chunk goes. */
typedef struct {
    cx_loader *l;
    void **out;           /* (nfields) */
} gatherer;

struct cx_loader {
    cx_dataset *ds;
    cx_sampler *sampler;
    cx_loader_opts o;
    int nfields;
    int nslots;
    slot *slots;
    pthread_t thread;
    bool thread_started;
    int nworkers;            /* gathering threads (0: the background thread gathers) */
    pthread_t *workers;
    gatherer *gatherers;     /* (nworkers) */
    void **fill_out;         /* (nfields) the background thread's gather scratch */
    int workers_started;
    int64_t claiming;        /* workers: the oldest batch that may have unclaimed items */
    pthread_cond_t gather_cv;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    int64_t posted, worked, taken;   /* sequence counters (under mu) */
    bool quit;
    /* caller-side state */
    int64_t next_batch_index;
    int64_t position;        /* samples handed out this epoch */
    bool at_end;
    bool step_open;
    cx_tensor **cur;         /* the batch handed out: nfields tensors */
    cx_spec_entry input_spec[CX_MAX_DIMS];   /* o.input_spec points here */
    cx_status error;
};

static void free_tensors(cx_tensor **t, int n)
{
    for (int f = 0; t && f < n; f++) {
        cx_free(t[f]);
        t[f] = NULL;
    }
}

/* The spec of field f under the loader's input sharding: the whole spec
 * for a field of its rank, else only the batch dimension's entry. */
static int field_spec(const cx_loader *l, int nd, cx_spec_entry *spec)
{
    const cx_spec_entry *in = l->o.input_spec;
    for (int d = 0; d < nd; d++) spec[d] = nd == l->o.input_nspec ? in[d] : d == 0 ? in[0] : CX_SPEC_NONE;
    return nd;
}

/* Uploads field f of slot s as (n, field shape); under an input sharding
 * the host buffer holds only rows [row0, ...) of the batch. @return an
 * error or NULL. */
static const char *upload(cx_loader *l, slot *s, int f, int64_t row0)
{
    const cx_field *fd = cx_dataset_field(l->ds, f);
    int64_t shape[CX_MAX_DIMS] = { s->n };
    for (int d = 0; d < fd->ndim; d++) shape[1 + d] = fd->shape[d];
    /* On this thread no step is open, so the handle is persistent; the
     * caller's thread releases it once its step has ended. */
    if (l->o.input_mesh) {
        cx_spec_entry spec[CX_MAX_DIMS];
        int nspec = field_spec(l, 1 + fd->ndim, spec);
        s->t[f] = cx_from_host_sharded(s->host[f], row0, shape, 1 + fd->ndim, fd->dtype, l->o.input_mesh, spec, nspec);
    } else {
        s->t[f] = cx_from_host(s->host[f], shape, 1 + fd->ndim, fd->dtype);
    }
    return !s->t[f] ? "out of memory" : cx_tensor_error(s->t[f]);
}

/* Uploads every field of slot s (its host rows start at batch row row0). */
static void upload_all(cx_loader *l, slot *s, int64_t row0)
{
    for (int f = 0; f < l->nfields; f++) {
        const char *e = upload(l, s, f, row0);
        if (!e) continue;
        s->status = CX_ERR_OOM;
        snprintf(s->err, sizeof s->err, "loader: uploading field \"%s\" of batch %lld failed: %s",
                 cx_dataset_field(l->ds, f)->name, (long long)s->index, e);
        free_tensors(s->t, l->nfields);
        return;
    }
}

/* The oldest posted slot with unclaimed rows, or NULL (under mu). */
static slot *claimable(cx_loader *l)
{
    for (; l->claiming < l->posted; l->claiming++) {
        slot *s = &l->slots[l->claiming % l->nslots];
        if (s->claimed < s->nrows) return s;
    }
    return NULL;
}

/* Gathers rows [r, r + n) of this rank's part of slot s into their places,
 * through the caller's scratch out (nfields). @return the gather's status,
 * its message in err. */
static cx_status gather_rows(void **out, char *err, size_t errn, cx_loader *l, slot *s, int64_t r, int64_t n)
{
    if (n == 0) return CX_OK;
    for (int f = 0; f < l->nfields; f++) out[f] = (char *)s->host[f] + (size_t)r * cx_dataset_item_bytes(l->ds, f);
    cx_status st = cx_dataset_gather(l->ds, s->idx + s->row0 + r, n, out);
    if (st != CX_OK) snprintf(err, errn, "loader: batch %lld: %s", (long long)s->index, cx_last_error());
    return st;
}

/* Without workers: gathers this rank's rows of slot s, then uploads them. */
static void fill_slot(cx_loader *l, slot *s)
{
    if (s->status != CX_OK) return;   /* bad input sharding (slot_prepare) */
    s->status = gather_rows(l->fill_out, s->err, sizeof s->err, l, s, 0, s->nrows);
    if (s->status == CX_OK) upload_all(l, s, s->row0);
}

/* Whether the background thread has a slot to work on (under mu): with
 * workers, the next one in order once gathered, and no more than prefetch
 * uploaded ahead of the caller. */
static bool upload_ready(const cx_loader *l)
{
    if (l->worked == l->posted) return false;
    if (!l->nworkers) return true;
    const slot *s = &l->slots[l->worked % l->nslots];
    return s->done == s->nrows && l->worked - l->taken < l->o.prefetch;
}

static void *worker_main(void *arg)
{
    cx_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->quit && !upload_ready(l)) pthread_cond_wait(&l->work_cv, &l->mu);
        if (l->quit) break;
        slot *s = &l->slots[l->worked % l->nslots];
        pthread_mutex_unlock(&l->mu);
        if (!l->nworkers) fill_slot(l, s);
        else if (s->status == CX_OK) upload_all(l, s, s->row0);
        pthread_mutex_lock(&l->mu);
        l->worked++;
        pthread_cond_broadcast(&l->done_cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static void *gatherer_main(void *arg)
{
    gatherer *g = arg;
    cx_loader *l = g->l;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        slot *s = NULL;
        while (!l->quit && !(s = claimable(l))) pthread_cond_wait(&l->gather_cv, &l->mu);
        if (l->quit) break;
        /* chunks of a quarter of a worker's share: few lock trips, balanced ends */
        int64_t r = s->claimed, n = s->nrows / (4 * l->nworkers);
        if (n < 1) n = 1;
        if (n > s->nrows - r) n = s->nrows - r;
        s->claimed += n;
        if (s->claimed == s->nrows) l->claiming++;
        pthread_mutex_unlock(&l->mu);
        char err[sizeof s->err];
        cx_status st = gather_rows(g->out, err, sizeof err, l, s, r, n);
        pthread_mutex_lock(&l->mu);
        if (st != CX_OK && r < s->err_row) {
            s->err_row = r;
            s->status = st;
            memcpy(s->err, err, sizeof err);
        }
        s->done += n;
        if (s->done == s->nrows) pthread_cond_signal(&l->work_cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Readies a just-filled slot for gathering: this rank's rows, nothing
 * claimed yet (a slot with no rows, or a bad sharding, is gathered at once:
 * done == nrows). */
static void slot_prepare(cx_loader *l, slot *s)
{
    s->status = CX_OK;
    s->row0 = 0;
    s->nrows = s->n;
    if (l->o.input_mesh &&
        cx_shard_rows(l->o.input_mesh, l->o.input_spec, l->o.input_nspec, s->n, &s->row0, &s->nrows) != CX_OK) {
        s->status = CX_ERR_ARG;
        s->nrows = 0;
        snprintf(s->err, sizeof s->err, "loader: input sharding: %s", cx_last_error());
    }
    s->claimed = s->done = 0;
    s->err_row = INT64_MAX;
}

/* Posts the next batch of the sampler if there is one and a free slot.
 * @return true if posted. */
static bool post_one(cx_loader *l)
{
    pthread_mutex_lock(&l->mu);
    bool full = l->posted - l->taken >= l->nslots;
    int64_t seq = l->posted;
    pthread_mutex_unlock(&l->mu);
    if (full) return false;
    slot *s = &l->slots[seq % l->nslots];
    int64_t bs = l->o.batch_size;
    int64_t left = cx_sampler_len(l->sampler) - cx_sampler_position(l->sampler);
    if (left <= 0 || (l->o.drop_last && left < bs)) return false;
    s->n = cx_sampler_take(l->sampler, s->idx, bs);
    s->index = l->next_batch_index++;
    slot_prepare(l, s);
    pthread_mutex_lock(&l->mu);
    l->posted++;
    pthread_cond_signal(&l->work_cv);
    if (l->nworkers) pthread_cond_broadcast(&l->gather_cv);
    pthread_mutex_unlock(&l->mu);
    return true;
}

static void release_current(cx_loader *l)
{
    free_tensors(l->cur, l->nfields);
}

/* Waits for every posted batch and frees them (epoch change, shutdown). */
static void drain(cx_loader *l)
{
    pthread_mutex_lock(&l->mu);
    /* one by one: with workers, uploads wait for the caller to take */
    while (l->taken < l->posted) {
        while (l->worked <= l->taken) pthread_cond_wait(&l->done_cv, &l->mu);
        free_tensors(l->slots[l->taken % l->nslots].t, l->nfields);
        l->taken++;
        pthread_cond_signal(&l->work_cv);
    }
    pthread_mutex_unlock(&l->mu);
}

/* Staging for one slot: indices and each field's host batch. @return false when out of memory. */
static bool slot_alloc(cx_loader *l, slot *s)
{
    int64_t bs = l->o.batch_size;
    s->idx = malloc((size_t)bs * sizeof *s->idx);
    s->host = calloc((size_t)l->nfields, sizeof *s->host);
    s->t = calloc((size_t)l->nfields, sizeof *s->t);
    if (!s->idx || !s->host || !s->t) return false;
    for (int f = 0; f < l->nfields; f++) {
        size_t bytes = cx_dataset_item_bytes(l->ds, f) * (size_t)bs;
        if (!(s->host[f] = malloc(bytes ? bytes : 1))) return false;
    }
    return true;
}

static void slot_release(cx_loader *l, slot *s)
{
    free(s->idx);
    for (int f = 0; s->host && f < l->nfields; f++) free(s->host[f]);
    free(s->host);
    free(s->t);
}

cx_loader *cx_loader_new(cx_dataset *ds, cx_sampler *sampler, cx_loader_opts o)
{
    cx_loader_opts own_o = cx_loader_default_opts();
    if (!CX_TAKE_STRUCT("cx_loader_new", cx_loader_opts, own_o, &o, input_nspec)) return NULL;
    o = own_o;
    if (!ds || !sampler || o.batch_size <= 0 || o.prefetch < 1 || o.num_workers < 0 || o.num_workers > 256 ||
        o.host_prefetch < 1) {
        cx_set_last_error("cx_loader_new: bad arguments (data set %s, sampler %s, batch size %lld, prefetch %d, "
                          "num_workers %d (want 0..256), host_prefetch %d (want >= 1))",
                          ds ? "set" : "NULL", sampler ? "set" : "NULL", (long long)o.batch_size, o.prefetch,
                          o.num_workers, o.host_prefetch);
        return NULL;
    }
    cx_loader *l = calloc(1, sizeof *l);
    int64_t r0, nr;
    if (o.input_mesh && (!o.input_spec || o.input_nspec < 1 ||
                         cx_shard_rows(o.input_mesh, o.input_spec, o.input_nspec, o.batch_size, &r0, &nr) != CX_OK)) {
        char why[512];
        snprintf(why, sizeof why, "%s", o.input_spec && o.input_nspec >= 1 ? cx_last_error() : "no partition spec given");
        free(l);
        cx_set_last_error("cx_loader_new: input sharding: %s", why);
        return NULL;
    }
    if (!l) { cx_set_last_error("cx_loader_new: out of memory"); return NULL; }
    if (o.input_mesh) {
        if (o.input_nspec > CX_MAX_DIMS) o.input_nspec = CX_MAX_DIMS;
        memcpy(l->input_spec, o.input_spec, sizeof *o.input_spec * (size_t)o.input_nspec);
        o.input_spec = l->input_spec;
    }
    l->ds = ds;
    l->sampler = sampler;
    l->o = o;
    l->nfields = cx_dataset_num_fields(ds);
    l->nworkers = cx_dataset_concurrent(ds) ? o.num_workers : 0;
    l->nslots = o.prefetch + (l->nworkers ? o.host_prefetch : 0);
    l->slots = calloc((size_t)l->nslots, sizeof *l->slots);
    l->cur = calloc((size_t)l->nfields, sizeof *l->cur);
    l->workers = l->nworkers ? calloc((size_t)l->nworkers, sizeof *l->workers) : NULL;
    l->gatherers = l->nworkers ? calloc((size_t)l->nworkers, sizeof *l->gatherers) : NULL;
    l->fill_out = calloc((size_t)l->nfields + 1, sizeof *l->fill_out);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->work_cv, NULL);
    pthread_cond_init(&l->done_cv, NULL);
    pthread_cond_init(&l->gather_cv, NULL);
    if (!l->slots || !l->cur || !l->fill_out || (l->nworkers && (!l->workers || !l->gatherers)))
        goto oom;
    for (int w = 0; w < l->nworkers; w++) {
        l->gatherers[w].l = l;
        if (!(l->gatherers[w].out = calloc((size_t)l->nfields + 1, sizeof *l->gatherers[w].out))) goto oom;
    }
    for (int i = 0; i < l->nslots; i++)
        if (!slot_alloc(l, &l->slots[i])) goto oom;
    cx_dataset_set_epoch(ds, cx_sampler_epoch(sampler));
    if (pthread_create(&l->thread, NULL, worker_main, l) != 0) {
        cx_loader_free(l);
        cx_set_last_error("cx_loader_new: cannot start the prefetch thread");
        return NULL;
    }
    l->thread_started = true;
    for (; l->workers_started < l->nworkers; l->workers_started++) {
        if (pthread_create(&l->workers[l->workers_started], NULL, gatherer_main, &l->gatherers[l->workers_started]) != 0) {
            int n = l->workers_started;
            cx_loader_free(l);
            cx_set_last_error("cx_loader_new: cannot start loader worker %d of %d", n + 1, o.num_workers);
            return NULL;
        }
    }
    l->position = cx_sampler_position(sampler);
    return l;
oom:
    cx_loader_free(l);
    cx_set_last_error("cx_loader_new: out of memory for %d batches of %lld", o.prefetch, (long long)o.batch_size);
    return NULL;
}

void cx_loader_free(cx_loader *l)
{
    if (!l) return;
    if (l->thread_started) {
        cx_loader_end_step(l);
        drain(l);
        pthread_mutex_lock(&l->mu);
        l->quit = true;
        pthread_cond_signal(&l->work_cv);
        pthread_cond_broadcast(&l->gather_cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
        for (int w = 0; w < l->workers_started; w++) pthread_join(l->workers[w], NULL);
    }
    release_current(l);
    for (int i = 0; l->slots && i < l->nslots; i++) slot_release(l, &l->slots[i]);
    free(l->slots);
    free(l->cur);
    free(l->workers);
    for (int w = 0; l->gatherers && w < l->nworkers; w++) free(l->gatherers[w].out);
    free(l->gatherers);
    free(l->fill_out);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->work_cv);
    pthread_cond_destroy(&l->done_cv);
    pthread_cond_destroy(&l->gather_cv);
    free(l);
}

int64_t cx_loader_len(const cx_loader *l)
{
    int64_t n = cx_sampler_len(l->sampler), bs = l->o.batch_size;
    return l->o.drop_last ? n / bs : (n + bs - 1) / bs;
}

cx_status cx_loader_set_epoch(cx_loader *l, int64_t epoch, int64_t position)
{
    cx_loader_end_step(l);
    drain(l);
    /* no batch is being filled: the data set may change its windows */
    cx_dataset_set_epoch(l->ds, epoch);
    cx_sampler_set_epoch(l->sampler, epoch);
    cx_status st = cx_sampler_set_position(l->sampler, position);
    if (st != CX_OK) return st;
    l->position = position;
    l->next_batch_index = position / l->o.batch_size;
    l->at_end = false;
    l->error = CX_OK;
    return CX_OK;
}

int64_t cx_loader_position(const cx_loader *l) { return l->position; }
cx_status cx_loader_error(const cx_loader *l) { return l->error; }

cx_status cx_loader_end_step(cx_loader *l)
{
    cx_status st = CX_OK;
    if (l->step_open) {
        l->step_open = false;
        st = cx_step_end_cause(CX_CAUSE_LOADER);
        if (st != CX_OK && l->error == CX_OK) l->error = st;
    }
    release_current(l);
    return st;
}

cx_loader_result cx_loader_next(cx_loader *l, cx_batch *out)
{
    memset(out, 0, sizeof *out);
    bool was_at_end = l->at_end;
    if (cx_loader_end_step(l) != CX_OK) {
        l->at_end = true;
        return was_at_end ? CX_LOADER_END : CX_LOADER_ERROR;   /* an error is reported once */
    }
    if (l->at_end) return CX_LOADER_END;
    while (post_one(l)) {}   /* keep the pipeline full */

    pthread_mutex_lock(&l->mu);
    if (l->taken == l->posted) {      /* nothing in flight: the epoch is over */
        pthread_mutex_unlock(&l->mu);
        l->at_end = true;
        return CX_LOADER_END;
    }
    while (l->worked <= l->taken) pthread_cond_wait(&l->done_cv, &l->mu);
    slot *s = &l->slots[l->taken % l->nslots];
    l->taken++;
    pthread_cond_signal(&l->work_cv);   /* with workers, one more may be uploaded */
    pthread_mutex_unlock(&l->mu);

    for (int f = 0; f < l->nfields; f++) {
        l->cur[f] = s->t[f];
        s->t[f] = NULL;
    }
    int64_t n = s->n, index = s->index;
    if (s->status != CX_OK) {
        cx_set_last_error("%s", s->err);
        l->error = s->status;
        l->at_end = true;
        release_current(l);
        return CX_LOADER_ERROR;
    }
    post_one(l);              /* refill the slot just freed (s is reused from here) */
    l->position += n;
    if (l->o.mark_step) {
        cx_step_begin();
        l->step_open = true;
    }
    out->fields = l->cur;
    out->nfields = l->nfields;
    out->size = n;
    out->index = index;
    out->dataset = l->ds;
    return CX_LOADER_BATCH;
}

cx_tensor *cx_batch_field(const cx_batch *b, const char *name)
{
    int f = b && name ? cx_dataset_field_index(b->dataset, name) : -1;
    if (f >= 0 && f < b->nfields) return b->fields[f];
    char names[256] = "";
    for (int i = 0; b && b->dataset && i < cx_dataset_num_fields(b->dataset); i++) {
        size_t at = strlen(names);
        snprintf(names + at, sizeof names - at, "%s\"%s\"", i ? ", " : "", cx_dataset_field(b->dataset, i)->name);
    }
    return cx_poisoned("batch: no field \"%s\" (its fields: %s)", name ? name : "(null)", names[0] ? names : "none");
}
