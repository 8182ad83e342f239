/* General data sets (fields + callbacks) and the in-memory arrays one. */
#include "nn_internal.h"

#include <cxla/data.h>

#include "cx_struct.h"
#include "data_internal.h"

struct cx_dataset {
    int64_t size;
    int nfields;
    cx_field *fields;      /* names point into `names` */
    char *names;           /* the field names, NUL-separated */
    size_t *item_bytes;    /* (nfields) bytes of one item of each field */
    cx_dataset_get_fn get;
    cx_dataset_collate_fn collate;
    cx_dataset_epoch_fn set_epoch;
    cx_dataset_free_fn free_ctx;
    void *ctx;
    bool concurrent;
};

/* @return bytes of one item of `f`, or 0 with cx_last_error set when the
 * field is malformed. */
static size_t check_field(const cx_field *f, int i)
{
    if (!f->name || !f->name[0]) {
        cx_set_last_error("cx_dataset_new: field %d has no name", i);
        return 0;
    }
    if ((unsigned)f->dtype >= CX_DTYPE_COUNT || f->ndim < 0 || f->ndim > CX_MAX_DIMS - 1) {
        cx_set_last_error("cx_dataset_new: field \"%s\": bad dtype %d or ndim %d (want 0..%d)", f->name,
                          (int)f->dtype, f->ndim, CX_MAX_DIMS - 1);
        return 0;
    }
    size_t bytes = cx_dtype_size(f->dtype);
    for (int d = 0; d < f->ndim; d++) {
        /* The bound keeps a whole batch's byte count far from overflowing. */
        if (f->shape[d] <= 0 || f->shape[d] > ((int64_t)1 << 40) || bytes > ((size_t)1 << 40) / (size_t)f->shape[d]) {
            cx_set_last_error("cx_dataset_new: field \"%s\": bad dim %d of size %lld", f->name, d,
                              (long long)f->shape[d]);
            return 0;
        }
        bytes *= (size_t)f->shape[d];
    }
    return bytes;
}

static cx_status check_desc(const cx_dataset_desc *d)
{
    if (d->size < 1 || d->nfields < 1 || !d->fields || (!d->get && !d->collate)) {
        cx_set_last_error("cx_dataset_new: want a size >= 1 (got %lld), at least one field (got %d) and a get or "
                          "collate callback (%s)", (long long)d->size, d->nfields,
                          d->get || d->collate ? "set" : "neither set");
        return CX_ERR_ARG;
    }
    for (int i = 0; i < d->nfields; i++) {
        if (!check_field(&d->fields[i], i)) return CX_ERR_ARG;
        for (int j = 0; j < i; j++) {
            if (!strcmp(d->fields[i].name, d->fields[j].name)) {
                cx_set_last_error("cx_dataset_new: two fields are called \"%s\"", d->fields[i].name);
                return CX_ERR_ARG;
            }
        }
    }
    return CX_OK;
}

/* Copies the fields and their names into `ds`. @return false when out of memory. */
static bool copy_fields(cx_dataset *ds, const cx_dataset_desc *d)
{
    size_t chars = 0;
    for (int i = 0; i < d->nfields; i++) chars += strlen(d->fields[i].name) + 1;
    ds->fields = malloc((size_t)d->nfields * sizeof *ds->fields);
    ds->item_bytes = malloc((size_t)d->nfields * sizeof *ds->item_bytes);
    ds->names = malloc(chars);
    if (!ds->fields || !ds->item_bytes || !ds->names) return false;
    char *p = ds->names;
    for (int i = 0; i < d->nfields; i++) {
        ds->fields[i] = d->fields[i];
        size_t len = strlen(d->fields[i].name) + 1;
        memcpy(p, d->fields[i].name, len);
        ds->fields[i].name = p;
        p += len;
        ds->item_bytes[i] = check_field(&ds->fields[i], i);
    }
    ds->nfields = d->nfields;
    return true;
}

cx_dataset *cx_dataset_new(const cx_dataset_desc *desc)
{
    if (!desc) { cx_set_last_error("cx_dataset_new: desc is NULL"); return NULL; }
    cx_dataset_desc own = { 0 }, *d = &own;
    char err[256];
    cx_dataset *ds = NULL;
    /* every header with struct_size has free and ctx: they release ctx even when refused */
    if (!cx_struct_take(&own, sizeof own, desc, desc->struct_size, CX_SIZE_THROUGH(cx_dataset_desc, ctx),
                        "cx_dataset_desc", err, sizeof err)) {
        cx_set_last_error("cx_dataset_new: %s", err);
        own.free = desc->free;
        own.ctx = desc->ctx;
    } else if (check_desc(d) == CX_OK) {
        ds = calloc(1, sizeof *ds);
        if (!ds || !copy_fields(ds, d)) {
            cx_dataset_free(ds);   /* its free_ctx is not set yet: ctx is freed below */
            ds = NULL;
            cx_set_last_error("cx_dataset_new: out of memory for %d fields", d->nfields);
        }
    }
    if (!ds) {
        if (d->free) d->free(d->ctx);
        return NULL;
    }
    ds->size = d->size;
    ds->get = d->get;
    ds->collate = d->collate;
    ds->set_epoch = d->set_epoch;
    ds->free_ctx = d->free;
    ds->ctx = d->ctx;
    ds->concurrent = d->concurrent;
    return ds;
}

void cx_dataset_free(cx_dataset *ds)
{
    if (!ds) return;
    if (ds->free_ctx) ds->free_ctx(ds->ctx);
    free(ds->fields);
    free(ds->names);
    free(ds->item_bytes);
    free(ds);
}

int64_t cx_dataset_size(const cx_dataset *ds) { return ds ? ds->size : 0; }
int cx_dataset_num_fields(const cx_dataset *ds) { return ds ? ds->nfields : 0; }

const cx_field *cx_dataset_field(const cx_dataset *ds, int i)
{
    return ds && i >= 0 && i < ds->nfields ? &ds->fields[i] : NULL;
}

int cx_dataset_field_index(const cx_dataset *ds, const char *name)
{
    if (!ds || !name) return -1;
    for (int i = 0; i < ds->nfields; i++)
        if (!strcmp(ds->fields[i].name, name)) return i;
    return -1;
}

void cx_dataset_set_epoch(cx_dataset *ds, int64_t epoch)
{
    if (ds && ds->set_epoch) ds->set_epoch(ds->ctx, epoch);
}

/* Item by item through get: item[f] walks along out[f]. */
static cx_status gather_items(cx_dataset *ds, const int64_t *indices, int64_t n, void *const *out)
{
    void **item = malloc((size_t)ds->nfields * sizeof *item);
    if (!item) { cx_set_last_error("cx_dataset_gather: out of memory"); return CX_ERR_OOM; }
    cx_status st = CX_OK;
    for (int64_t b = 0; b < n && st == CX_OK; b++) {
        for (int f = 0; f < ds->nfields; f++) item[f] = (char *)out[f] + (size_t)b * ds->item_bytes[f];
        st = ds->get(ds->ctx, indices[b], item);
    }
    free(item);
    return st;
}

cx_status cx_dataset_gather(cx_dataset *ds, const int64_t *indices, int64_t n, void *const *out)
{
    if (!ds || (n > 0 && (!indices || !out))) {
        cx_set_last_error("cx_dataset_gather: data set, indices or out is NULL");
        return CX_ERR_ARG;
    }
    for (int64_t b = 0; b < n; b++) {
        if (indices[b] < 0 || indices[b] >= ds->size) {
            cx_set_last_error("cx_dataset_gather: index %lld outside the data set's %lld items",
                              (long long)indices[b], (long long)ds->size);
            return CX_ERR_ARG;
        }
    }
    if (n <= 0) return CX_OK;
    return ds->collate ? ds->collate(ds->ctx, indices, n, out) : gather_items(ds, indices, n, out);
}

/* ---- in-memory arrays -------------------------------------------------------- */

typedef struct {
    int nfields;
    const void **data;
    size_t *item_bytes;
} arrays;

static cx_status arrays_get(void *ctx, int64_t index, void *const *item)
{
    const arrays *a = ctx;
    for (int f = 0; f < a->nfields; f++)
        memcpy(item[f], (const char *)a->data[f] + (size_t)index * a->item_bytes[f], a->item_bytes[f]);
    return CX_OK;
}

static void arrays_free(void *ctx)
{
    arrays *a = ctx;
    if (!a) return;
    free(a->data);
    free(a->item_bytes);
    free(a);
}

cx_dataset *cx_dataset_from_arrays(int64_t size, int nfields, const cx_field *fields, const void *const *data)
{
    if (nfields > 0 && fields && !data) {
        cx_set_last_error("cx_dataset_from_arrays: data is NULL");
        return NULL;
    }
    for (int f = 0; f < nfields && fields; f++) {
        if (!data[f]) {
            cx_set_last_error("cx_dataset_from_arrays: the array of field %d (\"%s\") is NULL", f,
                              fields[f].name ? fields[f].name : "");
            return NULL;
        }
    }
    arrays *a = calloc(1, sizeof *a);
    if (a && nfields > 0) {
        a->data = malloc((size_t)nfields * sizeof *a->data);
        a->item_bytes = malloc((size_t)nfields * sizeof *a->item_bytes);
    }
    if (!a || (nfields > 0 && (!a->data || !a->item_bytes))) {
        arrays_free(a);
        cx_set_last_error("cx_dataset_from_arrays: out of memory");
        return NULL;
    }
    a->nfields = nfields;
    cx_dataset_desc d = { CX_STRUCT_SIZE(cx_dataset_desc), .size = size, .nfields = nfields, .fields = fields, .get = arrays_get,
                          .free = arrays_free, .ctx = a };
    cx_dataset *ds = cx_dataset_new(&d);   /* validates the fields; frees `a` on failure */
    if (!ds) return NULL;
    for (int f = 0; f < nfields; f++) {
        a->data[f] = data[f];
        a->item_bytes[f] = ds->item_bytes[f];
    }
    return ds;
}

bool cx_dataset_concurrent(const cx_dataset *ds) { return ds && ds->concurrent; }

void *cx_dataset_ctx_of(const cx_dataset *ds, cx_dataset_get_fn get)
{
    return ds && ds->get == get ? ds->ctx : NULL;
}

size_t cx_dataset_item_bytes(const cx_dataset *ds, int f)
{
    return ds->item_bytes[f];
}
