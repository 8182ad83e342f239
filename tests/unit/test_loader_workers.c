/* The loader's workers on a user-defined data set: a data set declared
 * concurrent has its items read on several threads at once and gets the
 * same batches as with no workers; one not declared keeps the single
 * background thread whatever num_workers says; an older cx_dataset_desc
 * (a struct_size without `concurrent`) is not concurrent. */
#include <criterion/criterion.h>

#include <cxla/cxla.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <stddef.h>

#define N 64

typedef struct {
    atomic_int inside, max_inside;   /* get calls running at once */
} probe;

static cx_status slow_get(void *ctx, int64_t index, void *const *item)
{
    probe *p = ctx;
    int now = atomic_fetch_add(&p->inside, 1) + 1;
    for (int m = atomic_load(&p->max_inside); now > m && !atomic_compare_exchange_weak(&p->max_inside, &m, now);) {}
    struct timespec ts = { 0, 2000000 };   /* 2 ms: long enough for the calls to overlap */
    nanosleep(&ts, NULL);
    ((float *)item[0])[0] = (float)index * 0.5f;
    ((int64_t *)item[1])[0] = index * 7;
    atomic_fetch_sub(&p->inside, 1);
    return CX_OK;
}

static cx_dataset *make(probe *p, bool concurrent, size_t struct_size)
{
    static const cx_field fields[2] = { { "v", CX_F32, 1, { 1 } }, { "k", CX_I64, 0, { 0 } } };
    cx_dataset_desc d = { .struct_size = struct_size, .size = N, .nfields = 2, .fields = fields, .get = slow_get,
                          .ctx = p, .concurrent = concurrent };
    cx_dataset *ds = cx_dataset_new(&d);
    cr_assert(ds, "%s", cx_last_error());
    return ds;
}

/* One epoch's values of field v, in order. */
static void run(cx_dataset *ds, int workers, float *v)
{
    cx_sampler *sm = cx_sampler_new(N, cx_sampler_default_opts());
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = 8;
    lo.num_workers = workers;
    cx_loader *l = cx_loader_new(ds, sm, lo);
    cr_assert(l, "%s", cx_last_error());
    cx_batch b;
    int at = 0;
    while (cx_loader_next(l, &b) == CX_LOADER_BATCH) {
        cr_assert_eq(cx_to_host(cx_batch_field(&b, "v"), v + at, CX_F32), CX_OK);
        at += (int)b.size;
    }
    cr_expect_eq(at, N);
    cx_loader_free(l);
    cx_sampler_free(sm);
}

Test(loader_workers, concurrent_data_set_runs_in_parallel_with_the_same_batches)
{
    probe p = { 0 }, q = { 0 };
    float a[N], b[N];
    cx_dataset *ds = make(&p, true, sizeof(cx_dataset_desc));
    cr_expect(cx_dataset_concurrent(ds));
    run(ds, 0, a);
    cr_expect_eq(atomic_load(&p.max_inside), 1);
    cx_dataset_free(ds);
    ds = make(&q, true, sizeof(cx_dataset_desc));
    run(ds, 4, b);
    cr_expect_gt(atomic_load(&q.max_inside), 1, "4 workers never read two items at once");
    cr_expect(!memcmp(a, b, sizeof a), "batches differ with 4 workers");
    cx_dataset_free(ds);
}

Test(loader_workers, not_concurrent_keeps_one_thread)
{
    probe p = { 0 }, q = { 0 };
    float v[N];
    cx_dataset *ds = make(&p, false, sizeof(cx_dataset_desc));
    run(ds, 4, v);
    cr_expect_eq(atomic_load(&p.max_inside), 1);
    cx_dataset_free(ds);
    /* the first version of the description ended at ctx: concurrent unread */
    ds = make(&q, true, offsetof(cx_dataset_desc, ctx) + sizeof(void *));
    cr_expect(!cx_dataset_concurrent(ds));
    run(ds, 4, v);
    cr_expect_eq(atomic_load(&q.max_inside), 1);
    cx_dataset_free(ds);
}
