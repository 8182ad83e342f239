/* General data sets: user-defined fields and callbacks, in-memory arrays,
 * and text corpora cut into windows (bytes or nanoGPT's uint16 files):
 * the same windows for the same seed, epoch and rank, none shared between
 * ranks within a step, evaluation windows where the recipe puts them, and
 * a one-line error naming the thing for each mistake. */
#include <criterion/criterion.h>

#include <cxla/cxla.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- a user-defined data set: three fields of different dtypes and shapes ---- */

typedef struct {
    int gets, collates, epoch;
    bool freed;
} probe;

static cx_status probe_get(void *ctx, int64_t i, void *const *item)
{
    probe *p = ctx;
    p->gets++;
    float *a = item[0];
    int32_t *b = item[1];
    uint8_t *c = item[2];
    for (int k = 0; k < 6; k++) a[k] = (float)(i * 10 + k) + 0.5f * (float)p->epoch;
    *b = (int32_t)(-i);
    for (int k = 0; k < 4; k++) c[k] = (uint8_t)(i + k);
    return CX_OK;
}

static void probe_epoch(void *ctx, int64_t epoch) { ((probe *)ctx)->epoch = (int)epoch; }
static void probe_free(void *ctx) { ((probe *)ctx)->freed = true; }

static const cx_field k_probe_fields[3] = {
    { .name = "a", .dtype = CX_F32, .ndim = 2, .shape = { 2, 3 } },
    { .name = "b", .dtype = CX_I32, .ndim = 0 },
    { .name = "c", .dtype = CX_U8, .ndim = 1, .shape = { 4 } },
};

Test(data_general, user_fields_through_the_loader)
{
    probe p = { 0 };
    cx_dataset_desc d = { CX_STRUCT_SIZE(cx_dataset_desc), .size = 10, .nfields = 3, .fields = k_probe_fields, .get = probe_get,
                          .set_epoch = probe_epoch, .free = probe_free, .ctx = &p };
    cx_dataset *ds = cx_dataset_new(&d);
    cr_assert(ds, "%s", cx_last_error());
    cr_expect_eq(cx_dataset_num_fields(ds), 3);
    cr_expect_eq(cx_dataset_field_index(ds, "c"), 2);
    cr_expect_eq(cx_dataset_field_index(ds, "zz"), -1);
    cx_sampler_opts so = cx_sampler_default_opts();
    so.shuffle = false;
    cx_sampler *s = cx_sampler_new(10, so);
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = 4;
    cx_loader *l = cx_loader_new(ds, s, lo);
    cr_assert(l, "%s", cx_last_error());
    cr_assert_eq(cx_loader_set_epoch(l, 3, 0), CX_OK);
    cx_batch b;
    cr_assert(cx_loader_next(l, &b) == CX_LOADER_BATCH);
    cx_tensor *a = cx_batch_field(&b, "a"), *bb = cx_batch_field(&b, "b"), *c = cx_batch_field(&b, "c");
    cr_expect(cx_ndim(a) == 3 && cx_dim(a, 0) == 4 && cx_dim(a, 1) == 2 && cx_dim(a, 2) == 3);
    cr_expect(cx_ndim(bb) == 1 && cx_dtype_of(bb) == CX_I32);
    cr_expect(cx_ndim(c) == 2 && cx_dtype_of(c) == CX_U8 && cx_dim(c, 1) == 4);
    float av[24];
    int32_t bv[4];
    cr_assert_eq(cx_to_host(a, av, CX_F32), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_to_host(bb, bv, CX_I32), CX_OK);
    cr_expect_float_eq(av[6 + 1], 11.0f + 1.5f, 1e-6, "item 1, element 1, epoch 3 seen by the callback");
    cr_expect_eq(bv[3], -3);
    cx_tensor *none = cx_batch_field(&b, "labels");
    cr_expect(cx_tensor_error(none) && strstr(cx_tensor_error(none), "no field \"labels\"") &&
              strstr(cx_tensor_error(none), "\"a\", \"b\", \"c\""), "%s", cx_tensor_error(none));
    cx_loader_free(l);
    cx_sampler_free(s);
    cr_expect(p.gets >= 4);
    cx_dataset_free(ds);
    cr_expect(p.freed, "the data set releases its ctx");
}

static cx_status collate_only(void *ctx, const int64_t *idx, int64_t n, void *const *batch)
{
    probe *p = ctx;
    p->collates++;
    int64_t *x = batch[0];
    for (int64_t i = 0; i < n; i++) x[i] = idx[i] * idx[i];
    return CX_OK;
}

Test(data_general, collate_is_used_when_given)
{
    probe p = { 0 };
    cx_field f = { .name = "sq", .dtype = CX_I64, .ndim = 0 };
    cx_dataset_desc d = { CX_STRUCT_SIZE(cx_dataset_desc), .size = 5, .nfields = 1, .fields = &f, .collate = collate_only, .ctx = &p };
    cx_dataset *ds = cx_dataset_new(&d);
    cr_assert(ds);
    int64_t idx[3] = { 4, 0, 2 }, out[3];
    cr_assert_eq(cx_dataset_gather(ds, idx, 3, (void *const[]){ out }), CX_OK);
    cr_expect(out[0] == 16 && out[1] == 0 && out[2] == 4 && p.collates == 1);
    idx[1] = 5;
    cr_expect_eq(cx_dataset_gather(ds, idx, 3, (void *const[]){ out }), CX_ERR_ARG);
    cr_expect(strstr(cx_last_error(), "index 5 outside") != NULL, "%s", cx_last_error());
    cx_dataset_free(ds);
}

Test(data_general, bad_descriptions_are_named)
{
    probe p = { 0 };
    cx_field two[2] = { { .name = "x", .dtype = CX_F32 }, { .name = "x", .dtype = CX_F32 } };
    cx_dataset_desc d = { CX_STRUCT_SIZE(cx_dataset_desc), .size = 5, .nfields = 2, .fields = two, .get = probe_get, .free = probe_free, .ctx = &p };
    cr_expect_null(cx_dataset_new(&d));
    cr_expect(strstr(cx_last_error(), "two fields are called \"x\"") != NULL, "%s", cx_last_error());
    cr_expect(p.freed, "ctx released on failure too");
    cx_field bad = { .name = "img", .dtype = CX_F32, .ndim = 2, .shape = { 3, 0 } };
    d = (cx_dataset_desc){ CX_STRUCT_SIZE(cx_dataset_desc), .size = 5, .nfields = 1, .fields = &bad, .get = probe_get };
    cr_expect_null(cx_dataset_new(&d));
    cr_expect(strstr(cx_last_error(), "\"img\"") != NULL, "%s", cx_last_error());
    d = (cx_dataset_desc){ CX_STRUCT_SIZE(cx_dataset_desc), .size = 5, .nfields = 1, .fields = two };
    cr_expect_null(cx_dataset_new(&d));
    cr_expect(strstr(cx_last_error(), "get or collate") != NULL, "%s", cx_last_error());
}

Test(data_general, arrays)
{
    float feats[4][3] = { { 1, 2, 3 }, { 4, 5, 6 }, { 7, 8, 9 }, { 10, 11, 12 } };
    int64_t ys[4] = { 3, 1, 4, 1 };
    cx_field f[2] = { { .name = "feats", .dtype = CX_F32, .ndim = 1, .shape = { 3 } },
                      { .name = "y", .dtype = CX_I64, .ndim = 0 } };
    cx_dataset *ds = cx_dataset_from_arrays(4, 2, f, (const void *const[]){ feats, ys });
    cr_assert(ds, "%s", cx_last_error());
    int64_t idx[2] = { 2, 0 }, yo[2];
    float fo[6];
    cr_assert_eq(cx_dataset_gather(ds, idx, 2, (void *const[]){ fo, yo }), CX_OK);
    cr_expect(fo[0] == 7 && fo[5] == 3 && yo[0] == 4 && yo[1] == 3);
    cx_dataset_free(ds);
    cr_expect_null(cx_dataset_from_arrays(4, 2, f, (const void *const[]){ feats, NULL }));
    cr_expect(strstr(cx_last_error(), "\"y\"") != NULL, "%s", cx_last_error());
}

/* ---- text windows ------------------------------------------------------------- */

/* A corpus of n bytes: byte i is i mod 251 (so a window's content says
 * where it starts). */
static char *corpus(int64_t n)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/cx_text_%d.txt", (int)getpid());
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    for (int64_t i = 0; i < n; i++) fputc((int)(i % 251), f);
    fclose(f);
    return path;
}

static cx_dataset *open_text(const char *path, int64_t block, bool val, uint64_t seed, int64_t eval)
{
    cx_text_opts o = cx_text_default_opts();
    o.path = path;
    o.block = block;
    o.val = val;
    o.seed = seed;
    o.eval_windows = eval;
    cx_dataset *ds = NULL;
    cr_assert_eq(cx_text_open(o, &ds), CX_OK, "%s", cx_last_error());
    return ds;
}

/* Start positions (within the split) of rank r's windows in its first
 * `steps` batches of `batch` at `epoch`. */
static void rank_starts(cx_dataset *ds, int rank, int world, uint64_t seed, int64_t epoch, int64_t batch, int steps,
                        int64_t *starts)
{
    cx_sampler_opts so = cx_sampler_default_opts();
    so.seed = seed;
    so.rank = rank;
    so.world_size = world;
    so.drop_last = true;
    cx_sampler *s = cx_sampler_new(cx_dataset_size(ds), so);
    cx_sampler_set_epoch(s, epoch);
    cx_dataset_set_epoch(ds, epoch);
    int64_t block = cx_dataset_field(ds, 0)->shape[0];
    int64_t *x = malloc(sizeof *x * (size_t)(batch * block)), *y = malloc(sizeof *y * (size_t)(batch * block));
    for (int st = 0; st < steps; st++) {
        int64_t idx[64];
        cr_assert_eq(cx_sampler_take(s, idx, batch), batch);
        cr_assert_eq(cx_dataset_gather(ds, idx, batch, (void *const[]){ x, y }), CX_OK, "%s", cx_last_error());
        for (int64_t b = 0; b < batch; b++) {
            starts[st * batch + b] = x[b * block];   /* the byte value names the start mod 251 */
            for (int64_t j = 0; j + 1 < block; j++) cr_assert_eq(y[b * block + j], x[b * block + j + 1], "y is x shifted");
        }
    }
    free(x);
    free(y);
    cx_sampler_free(s);
}

Test(data_general, text_windows_are_deterministic_and_disjoint_across_ranks)
{
    const char *path = corpus(20000);
    cx_dataset *ds = open_text(path, 32, false, 7, 0);
    /* train: 18000 bytes, windows of 33 on a grid */
    cr_expect_eq(cx_dataset_size(ds), (18000 - 32) / 33);
    int64_t a[4][8], again[8];
    for (int r = 0; r < 4; r++) rank_starts(ds, r, 4, 7, 2, 8, 1, a[r]);
    rank_starts(ds, 1, 4, 7, 2, 8, 1, again);
    cr_expect(memcmp(a[1], again, sizeof again) == 0, "same seed, epoch and rank: same windows");
    /* within the step, no two ranks (or windows) share a window: the grid
     * holds disjoint windows, the sampler gives each rank its own */
    cx_dataset *full = open_text(path, 32, false, 7, 0);
    cx_sampler_opts so = cx_sampler_default_opts();
    so.seed = 7;
    so.world_size = 4;
    so.drop_last = true;
    int64_t seen_idx[32];
    int k = 0;
    for (int r = 0; r < 4; r++) {
        so.rank = r;
        cx_sampler *s = cx_sampler_new(cx_dataset_size(full), so);
        cx_sampler_set_epoch(s, 2);
        cr_assert_eq(cx_sampler_take(s, seen_idx + k, 8), 8);
        k += 8;
        cx_sampler_free(s);
    }
    for (int i = 0; i < 32; i++)
        for (int j = 0; j < i; j++) cr_expect_neq(seen_idx[i], seen_idx[j], "ranks share window %lld", (long long)seen_idx[i]);
    /* another epoch moves the windows (a new phase on the grid) */
    int64_t e3[8];
    rank_starts(ds, 1, 4, 7, 3, 8, 1, e3);
    cr_expect(memcmp(a[1], e3, sizeof e3) != 0, "epoch 3 draws other windows than epoch 2");
    cx_dataset_free(ds);
    cx_dataset_free(full);
    unlink(path);
}

Test(data_general, eval_windows_are_evenly_spaced_through_val)
{
    const char *path = corpus(10000);
    cx_dataset *val = open_text(path, 16, true, 0, 64);
    cr_assert_eq(cx_dataset_size(val), 64);
    /* val = bytes [9000, 10000): window w starts at w * floor((1000 - 17) / 64) = 15 w */
    int64_t idx[2] = { 0, 63 }, x[32], y[32];
    cr_assert_eq(cx_dataset_gather(val, idx, 2, (void *const[]){ x, y }), CX_OK);
    cr_expect_eq(x[0], 9000 % 251);
    cr_expect_eq(x[16], (9000 + 63 * 15) % 251);
    cr_expect_eq(y[15], (9000 + 16) % 251);
    cx_dataset_set_epoch(val, 5);   /* evaluation windows ignore the epoch */
    cr_assert_eq(cx_dataset_gather(val, idx, 1, (void *const[]){ x, y }), CX_OK);
    cr_expect_eq(x[0], 9000 % 251);
    cx_dataset_free(val);
    unlink(path);
}

Test(data_general, u16_token_files_and_errors)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/cx_tok_%d.bin", (int)getpid());
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 300; i++) { uint16_t t = (uint16_t)(1000 + i); fwrite(&t, 2, 1, f); }
    fclose(f);
    cx_text_opts o = cx_text_default_opts();
    o.path = path;
    o.format = CX_TEXT_U16;
    o.block = 8;
    o.eval_windows = 4;
    cx_dataset *ds = NULL;
    cr_assert_eq(cx_text_open(o, &ds), CX_OK, "%s", cx_last_error());
    int64_t idx[1] = { 1 }, x[8], y[8];
    cr_assert_eq(cx_dataset_gather(ds, idx, 1, (void *const[]){ x, y }), CX_OK);
    cr_expect_eq(x[0], 1000 + (300 - 9) / 4);   /* little-endian uint16 */
    cx_dataset_free(ds);
    /* a token beyond the vocab fails the batch, naming the file */
    o.vocab_size = 1100;
    cr_assert_eq(cx_text_open(o, &ds), CX_OK);
    idx[0] = 3;
    cr_expect_eq(cx_dataset_gather(ds, idx, 1, (void *const[]){ x, y }), CX_ERR_IO);
    cr_expect(strstr(cx_last_error(), path) && strstr(cx_last_error(), "vocab size 1100"), "%s", cx_last_error());
    cx_dataset_free(ds);
    /* an odd byte count */
    f = fopen(path, "ab");
    fputc(1, f);
    fclose(f);
    o.vocab_size = 0;
    cr_expect_eq(cx_text_open(o, &ds), CX_ERR_IO);
    cr_expect(strstr(cx_last_error(), "not a whole number of uint16 tokens"), "%s", cx_last_error());
    unlink(path);
    /* a missing file */
    cr_expect_eq(cx_text_open(o, &ds), CX_ERR_IO);
    cr_expect(strstr(cx_last_error(), path) && strstr(cx_last_error(), "No such file"), "%s", cx_last_error());
    /* a split shorter than one window */
    const char *small = corpus(100);
    o = cx_text_default_opts();
    o.path = small;
    o.block = 16;
    o.val = true;
    cr_expect_eq(cx_text_open(o, &ds), CX_ERR_IO);
    cr_expect(strstr(cx_last_error(), "val split") && strstr(cx_last_error(), "fewer than one window"), "%s",
              cx_last_error());
    unlink(small);
}
