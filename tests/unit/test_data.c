/* Data: IDX files (raw and gzip), MNIST / Fashion-MNIST, fake data, the
 * sampler and the prefetching loader. */
#include <criterion/criterion.h>

#include <cxla/cxla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[64];

static void make_dir(void)
{
    strcpy(g_dir, "/tmp/cxla-data-XXXXXX");
    cr_assert(mkdtemp(g_dir));
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    cr_expect(system(cmd) == 0);
}

/* Writes an unsigned-byte IDX file with dims and bytes 0, 1, 2, ... */
static void write_idx(const char *path, const uint32_t *dims, int ndim, const uint8_t *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    uint8_t magic[4] = { 0, 0, 0x08, (uint8_t)ndim };
    fwrite(magic, 1, 4, f);
    for (int i = 0; i < ndim; i++) {
        uint8_t d[4] = { (uint8_t)(dims[i] >> 24), (uint8_t)(dims[i] >> 16), (uint8_t)(dims[i] >> 8),
                         (uint8_t)dims[i] };
        fwrite(d, 1, 4, f);
    }
    fwrite(data, 1, n, f);
    fclose(f);
}

Test(data, idx_raw_and_gzip, .init = make_dir, .fini = remove_dir)
{
    uint8_t px[2 * 3 * 4];
    for (int i = 0; i < 24; i++) px[i] = (uint8_t)(i * 10);
    uint32_t dims[3] = { 2, 3, 4 };
    char path[256], cmd[512];
    snprintf(path, sizeof path, "%s/a-idx3-ubyte", g_dir);
    write_idx(path, dims, 3, px, 24);
    cx_idx_array a;
    cr_assert_eq(cx_idx_read(path, &a), CX_OK, "%s", cx_last_error());
    cr_expect_eq(a.ndim, 3);
    cr_expect_eq(a.dims[0], 2);
    cr_expect_eq(a.dims[2], 4);
    cr_expect(memcmp(a.data, px, 24) == 0);
    cx_idx_array_release(&a);
    snprintf(cmd, sizeof cmd, "gzip -k %s", path);
    cr_assert(system(cmd) == 0);
    strcat(path, ".gz");
    cr_assert_eq(cx_idx_read(path, &a), CX_OK, "%s", cx_last_error());
    cr_expect(memcmp(a.data, px, 24) == 0);
    cx_idx_array_release(&a);
    cx_idx_array_release(NULL);
}

Test(data, idx_errors_name_the_file, .init = make_dir, .fini = remove_dir)
{
    char path[256];
    cx_idx_array a;
    snprintf(path, sizeof path, "%s/missing", g_dir);
    cr_expect_eq(cx_idx_read(path, &a), CX_ERR_IO);
    cr_expect(strstr(cx_last_error(), path) != NULL, "%s", cx_last_error());
    uint8_t px[4] = { 1, 2, 3, 4 };
    uint32_t dims[1] = { 10 };            /* claims 10 bytes, has 4 */
    snprintf(path, sizeof path, "%s/short", g_dir);
    write_idx(path, dims, 1, px, 4);
    cr_expect_eq(cx_idx_read(path, &a), CX_ERR_IO);
    cr_expect(strstr(cx_last_error(), "truncated") != NULL, "%s", cx_last_error());
    snprintf(path, sizeof path, "%s/text", g_dir);
    FILE *f = fopen(path, "w");
    fputs("hello world", f);
    fclose(f);
    cr_expect_eq(cx_idx_read(path, &a), CX_ERR_IO);
    cr_expect(strstr(cx_last_error(), "not an IDX") != NULL, "%s", cx_last_error());
    cr_expect(a.data == NULL);
}

Test(data, missing_fashion_mnist_names_path_and_package)
{
    cx_mnist_opts o = cx_mnist_default_opts();
    o.dir = "/nonexistent/fmnist";
    cx_dataset *ds = (cx_dataset *)1;
    cr_expect_eq(cx_mnist_load(o, &ds), CX_ERR_IO);
    cr_expect(ds == NULL);
    const char *e = cx_last_error();
    cr_expect(strstr(e, "/nonexistent/fmnist/train-images-idx3-ubyte.gz") != NULL, "%s", e);
    cr_expect(strstr(e, "dataset-fashion-mnist") != NULL, "%s", e);
    cr_expect(strchr(e, '\n') == NULL);
}

Test(data, fashion_mnist_from_debian_package)
{
    if (access(CX_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0) {
        cr_skip_test("dataset-fashion-mnist is not installed");
    }
    cx_dataset *train = NULL, *test = NULL;
    cx_mnist_opts o = cx_mnist_default_opts();
    cr_assert_eq(cx_mnist_load(o, &train), CX_OK, "%s", cx_last_error());
    o.train = false;
    cr_assert_eq(cx_mnist_load(o, &test), CX_OK, "%s", cx_last_error());
    cr_expect_eq(cx_dataset_size(train), 60000);
    cr_expect_eq(cx_dataset_size(test), 10000);
    const cx_field *f = cx_dataset_field(train, 0);
    cr_expect_str_eq(f->name, CX_FIELD_IMAGES);
    cr_expect(f->ndim == 3 && f->shape[0] == 1 && f->shape[1] == 28 && f->shape[2] == 28);
    cr_expect_eq(cx_dataset_field(train, 1)->dtype, CX_I64);
    /* Normalized pixels average ~0 with std ~1 over many images. */
    int64_t idx[1000], labels[1000];
    for (int i = 0; i < 1000; i++) idx[i] = i * 60;
    float *img = malloc(1000 * 784 * sizeof *img);
    cr_assert(img);
    cr_assert_eq(cx_dataset_gather(train, idx, 1000, (void *const[]){ img, labels }), CX_OK);
    cr_expect_eq(labels[0], 9);   /* the first training image is an ankle boot */
    double s = 0, s2 = 0;
    for (int i = 0; i < 1000 * 784; i++) { s += img[i]; s2 += (double)img[i] * img[i]; }
    double m = s / (1000 * 784), sd = sqrt(s2 / (1000 * 784) - m * m);
    cr_expect(fabs(m) < 0.05 && fabs(sd - 1.0) < 0.05, "normalized mean %g std %g", m, sd);
    cr_expect_float_eq(img[0], (0.0f / 255.0f - 0.2860f) / 0.3530f, 1e-6);
    free(img);
    cx_dataset_free(train);
    cx_dataset_free(test);
}

Test(data, fake_data_is_deterministic)
{
    cx_fake_data_opts o = cx_fake_data_default_opts();
    o.size = 100;
    o.seed = 5;
    cx_dataset *a, *b, *c;
    cr_assert_eq(cx_fake_data(o, &a), CX_OK);
    cr_assert_eq(cx_fake_data(o, &b), CX_OK);
    o.seed = 6;
    cr_assert_eq(cx_fake_data(o, &c), CX_OK);
    static float pa[100 * 784], pb[100 * 784], pc[100 * 784];
    int64_t la[100], lb[100], lc[100], idx[100];
    for (int i = 0; i < 100; i++) idx[i] = i;
    cr_assert_eq(cx_dataset_gather(a, idx, 100, (void *const[]){ pa, la }), CX_OK);
    cr_assert_eq(cx_dataset_gather(b, idx, 100, (void *const[]){ pb, lb }), CX_OK);
    cr_assert_eq(cx_dataset_gather(c, idx, 100, (void *const[]){ pc, lc }), CX_OK);
    cr_expect(memcmp(pa, pb, sizeof pa) == 0 && memcmp(la, lb, sizeof la) == 0);
    cr_expect(memcmp(pa, pc, 784 * sizeof(float)) != 0);
    for (int i = 0; i < 100; i++) cr_expect(la[i] >= 0 && la[i] < 10);
    cx_dataset_free(a);
    cx_dataset_free(b);
    cx_dataset_free(c);
    o.size = 0;
    cx_dataset *d;
    cr_expect_eq(cx_fake_data(o, &d), CX_ERR_ARG);
    cx_dataset_free(NULL);
}

static uint64_t seq_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Samples are made from (seed, index) when gathered: in any order they are
 * the values the stored set held (drawn in order: label, then pixels), and
 * an ImageNet-shaped set of a million samples costs no memory. */
Test(data, fake_data_per_sample)
{
    cx_fake_data_opts o = cx_fake_data_default_opts();
    o.size = 6;
    o.seed = 3;
    o.channels = 2;
    o.height = o.width = 5;
    cx_dataset *ds;
    cr_assert_eq(cx_fake_data(o, &ds), CX_OK);
    float px[6 * 50], want[6 * 50];
    int64_t lab[6], want_lab[6], idx[6] = { 5, 2, 0, 4, 1, 3 };
    uint64_t s = o.seed;
    for (int i = 0; i < 6; i++) {
        want_lab[i] = (int64_t)(seq_splitmix(&s) % 10);
        for (int j = 0; j < 50; j++) want[i * 50 + j] = ((float)(seq_splitmix(&s) >> 56) / 255.0f - 0.1307f) / 0.3081f;
    }
    cr_assert_eq(cx_dataset_gather(ds, idx, 6, (void *const[]){ px, lab }), CX_OK);
    for (int b = 0; b < 6; b++) {
        cr_expect_eq(lab[b], want_lab[idx[b]]);
        cr_expect(memcmp(px + b * 50, want + idx[b] * 50, 50 * sizeof(float)) == 0, "sample %lld", (long long)idx[b]);
    }
    cx_dataset_free(ds);

    o.size = 1281167;
    o.channels = 3;
    o.height = o.width = 224;
    o.num_classes = 1000;
    cr_assert_eq(cx_fake_data(o, &ds), CX_OK, "%s", cx_last_error());
    float *img = malloc(3 * 224 * 224 * sizeof *img);
    cr_assert(img);
    bool above_255 = false;
    for (int64_t i = 1281167 - 64; i < 1281167; i++) {
        cr_assert_eq(cx_dataset_gather(ds, &i, 1, (void *const[]){ img, lab }), CX_OK);
        cr_expect(lab[0] >= 0 && lab[0] < 1000);
        above_255 |= lab[0] > 255;
    }
    cr_expect(above_255, "1000 classes: no label above 255 in 64 samples");
    free(img);
    cx_dataset_free(ds);
    o.num_classes = CX_FAKE_DATA_MAX_CLASSES + 1;
    cr_expect_eq(cx_fake_data(o, &ds), CX_ERR_ARG);
}

/* ---- sampler ------------------------------------------------------------- */

static int64_t take_all(cx_sampler *s, int64_t *out)
{
    int64_t n = 0, k;
    while ((k = cx_sampler_take(s, out + n, 3)) > 0) n += k;
    return n;
}

Test(data, sampler_partitions_ranks)
{
    int64_t seen[100] = { 0 }, buf[100];
    for (int r = 0; r < 4; r++) {
        cx_sampler_opts o = cx_sampler_default_opts();
        o.seed = 42;
        o.rank = r;
        o.world_size = 4;
        cx_sampler *s = cx_sampler_new(100, o);
        cr_assert(s);
        cr_expect_eq(cx_sampler_len(s), 25);
        cr_expect_eq(take_all(s, buf), 25);
        for (int i = 0; i < 25; i++) seen[buf[i]]++;
        cx_sampler_free(s);
    }
    for (int i = 0; i < 100; i++) cr_expect_eq(seen[i], 1, "index %d taken %lld times", i, (long long)seen[i]);
}

Test(data, sampler_padding_and_drop_last)
{
    cx_sampler_opts o = cx_sampler_default_opts();
    o.world_size = 3;
    o.rank = 2;
    o.shuffle = false;
    cx_sampler *s = cx_sampler_new(10, o);
    int64_t buf[10];
    cr_expect_eq(cx_sampler_len(s), 4);          /* ceil(10 / 3), padded by wrapping */
    cr_expect_eq(take_all(s, buf), 4);
    cr_expect(buf[0] == 2 && buf[1] == 5 && buf[2] == 8 && buf[3] == 1);   /* 11 % 10 */
    cx_sampler_free(s);
    o.drop_last = true;
    s = cx_sampler_new(10, o);
    cr_expect_eq(cx_sampler_len(s), 3);
    cx_sampler_free(s);
    o.rank = 3;
    cr_expect(cx_sampler_new(10, o) == NULL);
    cr_expect(strstr(cx_last_error(), "rank 3") != NULL, "%s", cx_last_error());
}

Test(data, sampler_shuffles_deterministically_per_epoch)
{
    cx_sampler_opts o = cx_sampler_default_opts();
    o.seed = 7;
    cx_sampler *a = cx_sampler_new(50, o), *b = cx_sampler_new(50, o);
    int64_t x[50], y[50], z[50];
    take_all(a, x);
    take_all(b, y);
    cr_expect(memcmp(x, y, sizeof x) == 0, "same seed and epoch, same order");
    int64_t sum = 0;
    bool identity = true;
    for (int i = 0; i < 50; i++) { sum += x[i]; identity &= x[i] == i; }
    cr_expect_eq(sum, 49 * 50 / 2);
    cr_expect(!identity);
    cx_sampler_set_epoch(a, 1);
    cr_expect_eq(cx_sampler_epoch(a), 1);
    take_all(a, z);
    cr_expect(memcmp(x, z, sizeof x) != 0, "another epoch, another order");
    /* Resume mid-epoch from a saved position. */
    cx_sampler_set_epoch(b, 1);
    cr_expect_eq(cx_sampler_set_position(b, 20), CX_OK);
    cr_expect_eq(cx_sampler_position(b), 20);
    cr_expect_eq(take_all(b, y), 30);
    cr_expect(memcmp(y, z + 20, 30 * sizeof *y) == 0);
    cr_expect_eq(cx_sampler_set_position(b, 51), CX_ERR_ARG);
    cx_sampler_free(a);
    cx_sampler_free(b);
    cx_sampler_free(NULL);
}

/* ---- loader ---------------------------------------------------------------- */

static cx_dataset *fake(int64_t n)
{
    cx_fake_data_opts o = cx_fake_data_default_opts();
    o.size = n;
    o.height = o.width = 4;
    cx_dataset *ds;
    cr_assert_eq(cx_fake_data(o, &ds), CX_OK);
    return ds;
}

Test(data, loader_batches_match_the_sampler)
{
    cx_dataset *ds = fake(50);
    cx_sampler_opts so = cx_sampler_default_opts();
    so.seed = 3;
    cx_sampler *s = cx_sampler_new(50, so), *ref = cx_sampler_new(50, so);
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = 16;
    lo.prefetch = 3;
    cx_loader *l = cx_loader_new(ds, s, lo);
    cr_assert(l, "%s", cx_last_error());
    cr_expect_eq(cx_loader_len(l), 4);
    cx_batch b;
    int batches = 0;
    int64_t total = 0;
    while (cx_loader_next(l, &b) == CX_LOADER_BATCH) {
        cr_expect_eq(b.index, batches);
        cx_tensor *images = cx_batch_field(&b, CX_FIELD_IMAGES), *blabels = cx_batch_field(&b, CX_FIELD_LABELS);
        cr_expect_eq(cx_dim(images, 0), b.size);
        cr_expect_eq(cx_dim(images, 1), 1);
        cr_expect_eq(cx_dim(images, 3), 4);
        cr_expect_eq(cx_dtype_of(blabels), CX_I64);
        int64_t idx[16];
        int64_t k = cx_sampler_take(ref, idx, 16);
        cr_assert_eq(k, b.size);
        float want[16 * 16], got[16 * 16];
        int64_t wl[16], gl[16];
        cr_assert_eq(cx_dataset_gather(ds, idx, k, (void *const[]){ want, wl }), CX_OK);
        cr_assert_eq(cx_to_host(images, got, CX_F32), CX_OK, "%s", cx_last_error());
        cr_assert_eq(cx_to_host(blabels, gl, CX_I64), CX_OK);
        cr_expect(memcmp(want, got, (size_t)k * 16 * sizeof(float)) == 0);
        cr_expect(memcmp(wl, gl, (size_t)k * sizeof(int64_t)) == 0);
        total += b.size;
        batches++;
        cr_expect_eq(cx_loader_position(l), total);
    }
    cr_expect_eq(batches, 4);
    cr_expect_eq(total, 50);
    cr_expect_eq(cx_loader_error(l), CX_OK);
    cr_expect_eq(cx_loader_next(l, &b), CX_LOADER_END, "stays at the end until the next epoch");
    cx_loader_free(l);
    cx_sampler_free(s);
    cx_sampler_free(ref);
    cx_dataset_free(ds);
}

Test(data, loader_drop_last_epochs_and_resume)
{
    cx_dataset *ds = fake(50);
    cx_sampler_opts so = cx_sampler_default_opts();
    cx_sampler *s = cx_sampler_new(50, so);
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = 16;
    lo.drop_last = true;
    cx_loader *l = cx_loader_new(ds, s, lo);
    cr_expect_eq(cx_loader_len(l), 3);
    cx_batch b;
    int n = 0;
    int64_t first_labels[16];
    while (cx_loader_next(l, &b) == CX_LOADER_BATCH) {
        cr_expect_eq(b.size, 16);
        if (n == 1) cx_to_host(cx_batch_field(&b, CX_FIELD_LABELS), first_labels, CX_I64);
        n++;
    }
    cr_expect_eq(n, 3);
    /* Resume epoch 0 at position 16: the first batch is the old second one. */
    cr_expect_eq(cx_loader_set_epoch(l, 0, 16), CX_OK);
    cr_assert(cx_loader_next(l, &b) == CX_LOADER_BATCH);
    cr_expect_eq(b.index, 1);
    int64_t labels[16];
    cx_to_host(cx_batch_field(&b, CX_FIELD_LABELS), labels, CX_I64);
    cr_expect(memcmp(labels, first_labels, sizeof labels) == 0);
    /* Stop early; the loader frees what it holds. */
    cr_expect_eq(cx_loader_end_step(l), CX_OK);
    cr_expect_eq(cx_loader_set_epoch(l, 1, 0), CX_OK);
    n = 0;
    while (cx_loader_next(l, &b) == CX_LOADER_BATCH) n++;
    cr_expect_eq(n, 3);
    cr_expect_eq(cx_loader_set_epoch(l, 1, 99), CX_ERR_ARG);
    cx_loader_free(l);
    cx_loader_free(NULL);
    cx_sampler_free(s);
    cx_dataset_free(ds);
}

Test(data, loader_marks_steps)
{
    cx_dataset *ds = fake(32);
    cx_sampler *s = cx_sampler_new(32, cx_sampler_default_opts());
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = 8;
    cx_loader *l = cx_loader_new(ds, s, lo);
    int64_t marks0 = cx_counter_value("MarkStep");
    cx_batch b;
    int n = 0;
    while (cx_loader_next(l, &b) == CX_LOADER_BATCH) {
        /* Inside the loader's step: a step tensor, kept past it. */
        cx_tensor *t = cx_sum(cx_batch_field(&b, CX_FIELD_IMAGES), NULL, 0, false);
        cr_expect(!cx_is_persistent(t));
        cr_expect(cx_is_persistent(cx_batch_field(&b, CX_FIELD_IMAGES)), "batches are made outside any step");
        n++;
    }
    cr_expect_eq(n, 4);
    cr_expect_eq(cx_counter_value("MarkStep") - marks0, 4);
    cx_loader_free(l);

    lo.mark_step = false;
    l = cx_loader_new(ds, s, lo);
    cx_loader_set_epoch(l, 0, 0);
    marks0 = cx_counter_value("MarkStep");
    while (cx_loader_next(l, &b) == CX_LOADER_BATCH) {}
    cr_expect_eq(cx_counter_value("MarkStep"), marks0);
    cx_loader_free(l);
    cx_sampler_free(s);
    cx_dataset_free(ds);
    cr_expect(cx_loader_new(NULL, NULL, lo) == NULL);
    cr_expect(strstr(cx_last_error(), "cx_loader_new") != NULL);
}
