/* The image folder: decoding (PNG exact, JPEG as PIL and near the source
 * pixels), the eval transform against torchvision's values (golden, made by
 * tests/data/imagefolder_golden.py), the training transform's crop and flip
 * statistics, determinism over the loader's workers, bad files (skip and
 * stop) and the errors for bad roots. Folders from Fashion-MNIST come from
 * tests/data/make_imagefolder (skipped without dataset-fashion-mnist). */
#include <criterion/criterion.h>

#include <cxla/cxla.h>

#include "image_write.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static const float k_mean[3] = { 0.485f, 0.456f, 0.406f }, k_std[3] = { 0.229f, 0.224f, 0.225f };
static char g_dir[64];

static void make_dir(void)
{
    strcpy(g_dir, "/tmp/cxla-imagefolder-XXXXXX");
    cr_assert(mkdtemp(g_dir));
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    cr_expect(system(cmd) == 0);
}

/* g_dir/if from Fashion-MNIST: `args` after ROOT. */
static void make_folder(const char *args)
{
    struct stat st;
    if (stat(CX_FASHION_MNIST_DIR, &st) != 0) cr_skip_test("no %s (dataset-fashion-mnist)", CX_FASHION_MNIST_DIR);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s %s/if %s > /dev/null", MAKE_IMAGEFOLDER, g_dir, args);
    cr_assert(system(cmd) == 0, "%s failed", cmd);
}

static cx_dataset *open_folder(const char *root, bool train, int S, int R, bool fast, cx_image_errors on_error)
{
    cx_imagefolder_opts o = cx_imagefolder_default_opts();
    o.root = root;
    o.train = train;
    o.image_size = S;
    o.resize_size = R;
    o.jpeg_fast = fast;
    o.on_error = on_error;
    cx_dataset *ds = NULL;
    cr_assert_eq(cx_imagefolder_open(o, &ds), CX_OK, "%s", cx_last_error());
    return ds;
}

/* Item i of ds: its (3, S, S) values into img, its label returned. */
static int64_t get_item(cx_dataset *ds, int64_t i, float *img)
{
    int64_t label = -1;
    void *out[2] = { img, &label };
    cr_assert_eq(cx_dataset_gather(ds, &i, 1, out), CX_OK, "%s", cx_last_error());
    return label;
}

/* The golden file's line of `kind` ("decode" or "eval S R") for sample i,
 * its numbers after the header into v (at most n). @return how many. */
static int golden_line(const char *kind, int i, double *v, int n)
{
    FILE *f = fopen(GOLDEN_DIR "/golden_imagefolder.txt", "r");
    cr_assert(f, "no golden file");
    static char line[1 << 20];
    char want[64];
    snprintf(want, sizeof want, "%s %d ", kind, i);
    int got = -1;
    while (got < 0 && fgets(line, sizeof line, f)) {
        if (strncmp(line, want, strlen(want))) continue;
        char *p = line + strlen(want), *end;
        for (got = 0; got < n; got++, p = end) {
            v[got] = strtod(p, &end);
            if (end == p) break;
        }
    }
    fclose(f);
    cr_assert(got > 0, "no golden line '%s'", want);
    return got;
}

static float norm(int c, double p) { return ((float)p / 255.0f - k_mean[c]) / k_std[c]; }

/* The center S x S of PIL's decoded pixels (golden) against the eval
 * transform with S = R = the shorter side (an identity resize): PNGs and
 * (same libjpeg-turbo as PIL's) JPEGs exactly. */
Test(imagefolder, decode_as_pil)
{
    static double g[3 + 64 * 64 * 3];
    for (int i = 0; i < 5; i++) {
        golden_line("decode", i, g, 3 + 64 * 64 * 3);
        int w = (int)g[0], h = (int)g[1], S = w < h ? w : h;
        cx_dataset *ds = open_folder(GOLDEN_DIR "/golden_imagefolder", false, S, S, false, CX_IMAGE_ERRORS_STOP);
        float *img = malloc(sizeof(float) * 3 * (size_t)S * (size_t)S);
        cr_expect_eq(get_item(ds, i, img), i < 2 ? 0 : 1);
        int top = (int)nearbyint((h - S) / 2.0), left = (int)nearbyint((w - S) / 2.0), bad = 0;
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < S; y++)
                for (int x = 0; x < S; x++)
                    bad += img[(c * S + y) * S + x] != norm(c, g[2 + ((top + y) * w + left + x) * 3 + c]);
        cr_expect_eq(bad, 0, "sample %d (%s): %d values differ from PIL's decoding", i, cx_imagefolder_path(ds, i), bad);
        free(img);
        cx_dataset_free(ds);
    }
}

/* torchvision's Resize + CenterCrop + ToTensor + Normalize, to the bit.
 * With jpeg_fast the JPEGs, decoded at 1/2 scale, differ: on this
 * noise-like content (where libjpeg's 2x DCT reduction, a box-like filter,
 * and PIL's wider triangle differ most) by at most 0.8 in normalized
 * units (about 47 of 255) and 0.2 on average. */
Test(imagefolder, eval_transform_golden)
{
    static const int cfg[2][2] = { { 12, 16 }, { 20, 26 } };
    static double g[3 * 20 * 20];
    for (int k = 0; k < 2; k++) {
        int S = cfg[k][0], R = cfg[k][1];
        for (int draft = 0; draft < 2; draft++) {
            cx_dataset *ds = open_folder(GOLDEN_DIR "/golden_imagefolder", false, S, R, draft, CX_IMAGE_ERRORS_STOP);
            cr_assert_eq(cx_dataset_size(ds), 5);
            cr_expect_eq(cx_imagefolder_num_classes(ds), 2);
            cr_expect_str_eq(cx_imagefolder_class_name(ds, 1), "b");
            float img[3 * 20 * 20];
            char kind[32];
            snprintf(kind, sizeof kind, "eval %d %d", S, R);
            for (int i = 0; i < 5; i++) {
                cr_assert_eq(golden_line(kind, i, g, 3 * S * S), 3 * S * S);
                get_item(ds, i, img);
                double maxd = 0, sum = 0;
                for (int j = 0; j < 3 * S * S; j++) {
                    double d = fabs(img[j] - (float)g[j]);
                    maxd = d > maxd ? d : maxd;
                    sum += d;
                }
                if (!draft || i < 3) cr_expect_eq(maxd, 0.0, "S %d R %d sample %d: off by up to %g", S, R, i, maxd);
                else cr_expect(maxd < 0.8 && sum / (3 * S * S) < 0.2, "draft: S %d sample %d: max %g mean %g", S, i,
                               maxd, sum / (3 * S * S));
            }
            cx_dataset_free(ds);
        }
    }
}

/* Against the Fashion-MNIST pixels make_imagefolder wrote: PNGs exactly,
 * JPEGs (quality 95, 4:4:4) within 32 of 255 on any pixel and 2.5 on
 * average (measured: 23 and 1.5). */
Test(imagefolder, decode_near_source, .init = make_dir, .fini = remove_dir)
{
    make_folder("--train 80 --val 0");
    char root[128];
    snprintf(root, sizeof root, "%s/if/train", g_dir);
    cx_dataset *ds = open_folder(root, false, 28, 28, false, CX_IMAGE_ERRORS_STOP);
    cr_assert_eq(cx_dataset_size(ds), 80);
    cx_idx_array src;
    cr_assert_eq(cx_idx_read(CX_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", &src), CX_OK, "%s", cx_last_error());
    float img[3 * 28 * 28];
    double jmax = 0, jsum = 0;
    int64_t jn = 0;
    for (int64_t i = 0; i < 80; i++) {
        get_item(ds, i, img);
        const char *path = cx_imagefolder_path(ds, i), *base = strrchr(path, '/') + 1;
        long k = strtol(base, NULL, 10);
        bool jpeg = strstr(base, ".jpg") != NULL, rgb = k % 2;
        for (int c = 0; c < 3; c++)
            for (int p = 0; p < 28 * 28; p++) {
                int s = src.data[k * 28 * 28 + p];
                double got = ((double)img[c * 28 * 28 + p] * k_std[c] + k_mean[c]) * 255.0;
                int want = rgb && c == 2 ? 255 - s : s;
                if (!jpeg) {
                    cr_expect_eq(img[c * 28 * 28 + p], norm(c, want), "%s: pixel %d channel %d", path, p, c);
                    continue;
                }
                double d = fabs(got - want);
                jmax = d > jmax ? d : jmax;
                jsum += d;
                jn++;
            }
    }
    cr_assert(jn > 0);
    cr_expect(jmax <= 32 && jsum / (double)jn <= 2.5, "JPEG: max %g mean %g of 255", jmax, jsum / (double)jn);
    cx_idx_array_release(&src);
    cx_dataset_free(ds);
}

/* A W x H PNG whose red is x and green y (ramps over 0..255), blue 128. */
static void write_ramp(const char *path, int W, int H)
{
    uint8_t *px = malloc((size_t)W * (size_t)H * 3), *buf;
    size_t len;
    char err[256];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            uint8_t *o = px + ((size_t)y * (size_t)W + (size_t)x) * 3;
            o[0] = (uint8_t)(x * 255 / (W - 1)), o[1] = (uint8_t)(y * 255 / (H - 1)), o[2] = 128;
        }
    cr_assert_eq(imgw_png(&buf, &len, px, W, H, 3, err, sizeof err), 0, "%s", err);
    cr_assert_eq(imgw_save(path, buf, len, err, sizeof err), 0, "%s", err);
    free(buf);
    free(px);
}

static double pixel(const float *img, int S, int c, int y, int x)
{
    return ((double)img[(c * S + y) * S + x] * k_std[c] + k_mean[c]) * 255.0;
}

/* RandomResizedCrop + flip read back from a ramp image over 600 draws
 * (epochs): the crop's area fraction spans (0.08, 1) with a mean near
 * torchvision's (0.435 for this 4:3 image, from 20000 draws of its
 * get_params: 10% under 0.15, 3% over 0.85), its aspect ratio stays in
 * [3/4, 4/3] (10% slack for the read-back), and about half are flipped. */
Test(imagefolder, train_crop_and_flip_statistics, .init = make_dir, .fini = remove_dir)
{
    char path[256];
    snprintf(path, sizeof path, "%s/c", g_dir);
    cr_assert(mkdir(path, 0777) == 0);
    snprintf(path, sizeof path, "%s/c/ramp.png", g_dir);
    const int W = 256, H = 192, S = 32, N = 600;
    write_ramp(path, W, H);
    cx_dataset *ds = open_folder(g_dir, true, S, 0, true, CX_IMAGE_ERRORS_STOP);
    float img[3 * 32 * 32];
    int flips = 0, small = 0, large = 0, bad_ratio = 0;
    double area_sum = 0;
    for (int e = 0; e < N; e++) {
        cx_dataset_set_epoch(ds, e);
        get_item(ds, 0, img);
        double xl = pixel(img, S, 0, S / 2, 0), xr = pixel(img, S, 0, S / 2, S - 1);
        double yt = pixel(img, S, 1, 0, S / 2), yb = pixel(img, S, 1, S - 1, S / 2);
        if (xl > xr) { flips++; double t = xl; xl = xr; xr = t; }
        /* the ramp's ends are half an output pixel inside the crop's */
        double cw = (xr - xl) * (W - 1) / 255.0 * S / (S - 1), ch = (yb - yt) * (H - 1) / 255.0 * S / (S - 1);
        double a = cw * ch / ((double)W * H), r = cw / ch;
        area_sum += a;
        small += a < 0.15;
        large += a > 0.85;
        bad_ratio += r < 0.75 * 0.9 || r > 4.0 / 3.0 * 1.1;
    }
    double mean_area = area_sum / N;
    cr_expect(flips > N * 0.4 && flips < N * 0.6, "%d of %d flipped", flips, N);
    cr_expect(mean_area > 0.37 && mean_area < 0.5, "mean area fraction %g", mean_area);
    cr_expect(small > 0 && large > 0, "%d crops under 0.15, %d over 0.85 of the area", small, large);
    cr_expect_eq(bad_ratio, 0, "%d crops outside the aspect ratios", bad_ratio);
    cx_dataset_free(ds);
}

/* Both epochs' batches of a loader with `workers` workers, concatenated
 * (images then labels per batch) into a malloc'ed buffer of *n bytes. */
static uint8_t *read_epochs(cx_dataset *ds, int workers, size_t *n)
{
    cx_sampler_opts so = cx_sampler_default_opts();
    so.seed = 7;
    cx_sampler *sm = cx_sampler_new(cx_dataset_size(ds), so);
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = 16;
    lo.num_workers = workers;
    lo.host_prefetch = 3;
    cx_loader *l = cx_loader_new(ds, sm, lo);
    cr_assert(l, "%s", cx_last_error());
    size_t cap = 0, at = 0;
    uint8_t *buf = NULL;
    for (int e = 0; e < 2; e++) {
        cr_assert_eq(cx_loader_set_epoch(l, e, 0), CX_OK);
        cx_batch b;
        while (cx_loader_next(l, &b) == CX_LOADER_BATCH) {
            size_t ib = (size_t)b.size * 3 * 24 * 24 * sizeof(float), lb = (size_t)b.size * sizeof(int64_t);
            if (at + ib + lb > cap) buf = realloc(buf, cap = 2 * (at + ib + lb));
            cr_assert(buf);
            cr_assert_eq(cx_to_host(cx_batch_field(&b, CX_FIELD_IMAGES), buf + at, CX_F32), CX_OK);
            cr_assert_eq(cx_to_host(cx_batch_field(&b, CX_FIELD_LABELS), buf + at + ib, CX_I64), CX_OK);
            at += ib + lb;
        }
        cr_assert_eq(cx_loader_error(l), CX_OK, "%s", cx_last_error());
    }
    cx_loader_free(l);
    cx_sampler_free(sm);
    *n = at;
    return buf;
}

/* The same batches whatever the number of workers (skip mode, with bad
 * files to step over, so the replacements are deterministic too). */
Test(imagefolder, deterministic_over_workers, .init = make_dir, .fini = remove_dir)
{
    make_folder("--train 120 --val 0 --corrupt 4");
    char root[128];
    snprintf(root, sizeof root, "%s/if/train", g_dir);
    cx_log_set_handler(NULL, NULL);
    uint8_t *ref = NULL;
    size_t nref = 0;
    static const int workers[] = { 0, 1, 2, 4 };
    for (int k = 0; k < 4; k++) {
        cx_dataset *ds = open_folder(root, true, 24, 0, true, CX_IMAGE_ERRORS_SKIP);
        size_t n;
        uint8_t *got = read_epochs(ds, workers[k], &n);
        cr_expect_eq(cx_imagefolder_skipped(ds), 4);
        if (!ref) {
            ref = got, nref = n;
            cr_expect_eq(n, 2 * 124 * (3 * 24 * 24 * sizeof(float) + sizeof(int64_t)));
        } else {
            cr_expect(n == nref && !memcmp(got, ref, n), "%d workers: batches differ from 0 workers'", workers[k]);
            free(got);
        }
        cx_dataset_free(ds);
    }
    free(ref);
}

typedef struct {
    pthread_mutex_t mu;
    int warnings;
    char lines[8][512];
} captured;

static void capture(cx_log_level level, const char *module, const char *msg, void *user)
{
    captured *c = user;
    (void)module;
    pthread_mutex_lock(&c->mu);
    if (level == CX_LOG_WARNING && c->warnings < 8) snprintf(c->lines[c->warnings], 512, "%s", msg);
    if (level == CX_LOG_WARNING) c->warnings++;
    pthread_mutex_unlock(&c->mu);
}

/* Skip: each bad file is warned about once, by name, and counted; the items
 * that were bad come out as the next good sample. */
Test(imagefolder, skip_counts_and_names_bad_files, .init = make_dir, .fini = remove_dir)
{
    make_folder("--train 40 --val 0 --corrupt 4");
    char root[128];
    snprintf(root, sizeof root, "%s/if/train", g_dir);
    cx_dataset *ds = open_folder(root, false, 28, 28, true, CX_IMAGE_ERRORS_SKIP);
    captured cap = { .mu = PTHREAD_MUTEX_INITIALIZER };
    cx_log_set_handler(capture, &cap);
    float img[3 * 28 * 28], next[3 * 28 * 28];
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = 0; i < cx_dataset_size(ds); i++) {
            int64_t label = get_item(ds, i, img);
            if (!strstr(cx_imagefolder_path(ds, i), "_bad.")) continue;
            int64_t j = i + 1;
            while (strstr(cx_imagefolder_path(ds, j % cx_dataset_size(ds)), "_bad.")) j++;
            cr_expect_eq(get_item(ds, j % cx_dataset_size(ds), next), label);
            cr_expect(!memcmp(img, next, sizeof img), "bad item %lld is not sample %lld", (long long)i, (long long)j);
        }
    cx_log_set_handler(NULL, NULL);
    cr_expect_eq(cx_imagefolder_skipped(ds), 4);
    cr_expect_eq(cap.warnings, 4, "%d warnings", cap.warnings);
    static const char *const why[] = { "corrupt JPEG", "corrupt PNG", "not a JPEG or PNG", "empty file" };
    for (int w = 0; w < 4 && w < cap.warnings; w++) {
        cr_expect(strstr(cap.lines[w], root) && strstr(cap.lines[w], "_bad."), "%s", cap.lines[w]);
        cr_expect(!strchr(cap.lines[w], '\n'), "not one line: %s", cap.lines[w]);
        int kinds = 0;
        for (int k = 0; k < 4; k++) kinds += strstr(cap.lines[w], why[k]) != NULL;
        cr_expect_eq(kinds, 1, "%s", cap.lines[w]);
    }
    cx_dataset_free(ds);
}

/* Stop: the item fails with the file's name, and a loader's batch with it. */
Test(imagefolder, stop_fails_naming_the_file, .init = make_dir, .fini = remove_dir)
{
    make_folder("--train 40 --val 0 --corrupt 4");
    char root[128];
    snprintf(root, sizeof root, "%s/if/train", g_dir);
    cx_dataset *ds = open_folder(root, true, 16, 0, true, CX_IMAGE_ERRORS_STOP);
    float img[3 * 16 * 16];
    int64_t label, bad = 0;
    for (int64_t i = 0; i < cx_dataset_size(ds); i++) {
        const char *path = cx_imagefolder_path(ds, i);
        void *out[2] = { img, &label };
        cx_status st = cx_dataset_gather(ds, &i, 1, out);
        if (!strstr(path, "_bad.")) { cr_expect_eq(st, CX_OK, "%s", cx_last_error()); continue; }
        bad++;
        cr_expect_eq(st, CX_ERR_IO);
        cr_expect(strstr(cx_last_error(), path), "'%s' does not name %s", cx_last_error(), path);
    }
    cr_expect_eq(bad, 4);
    cr_expect_eq(cx_imagefolder_skipped(ds), 0);
    for (int workers = 0; workers <= 2; workers += 2) {
        cx_sampler *sm = cx_sampler_new(cx_dataset_size(ds), cx_sampler_default_opts());
        cx_loader_opts lo = cx_loader_default_opts();
        lo.batch_size = 8;
        lo.num_workers = workers;
        cx_loader *l = cx_loader_new(ds, sm, lo);
        cx_batch b;
        cx_loader_result r;
        while ((r = cx_loader_next(l, &b)) == CX_LOADER_BATCH) {}
        cr_expect_eq(r, CX_LOADER_ERROR);
        cr_expect_eq(cx_loader_error(l), CX_ERR_IO);
        cr_expect(strstr(cx_last_error(), "_bad."), "%d workers: %s", workers, cx_last_error());
        cx_loader_free(l);
        cx_sampler_free(sm);
    }
    cx_dataset_free(ds);
}

static void expect_open_error(const char *root, const char *needle, const char *needle2)
{
    cx_imagefolder_opts o = cx_imagefolder_default_opts();
    o.root = root;
    cx_dataset *ds = (cx_dataset *)1;
    cr_expect_eq(cx_imagefolder_open(o, &ds), CX_ERR_IO, "%s opened", root);
    cr_expect_null(ds);
    cr_expect(strstr(cx_last_error(), needle) && strstr(cx_last_error(), needle2), "%s: '%s'", root, cx_last_error());
}

/* A missing root, an empty one, a class directory without an image. */
Test(imagefolder, bad_roots, .init = make_dir, .fini = remove_dir)
{
    char path[256], file[300];
    snprintf(path, sizeof path, "%s/missing", g_dir);
    expect_open_error(path, path, "no such directory");
    expect_open_error(g_dir, g_dir, "no class directory");
    snprintf(path, sizeof path, "%s/cls", g_dir);
    cr_assert(mkdir(path, 0777) == 0);
    snprintf(file, sizeof file, "%s/readme.txt", path);
    FILE *f = fopen(file, "w");
    cr_assert(f);
    fputs("not an image\n", f);
    fclose(f);
    expect_open_error(g_dir, path, "holds no image");
    cx_imagefolder_opts o = cx_imagefolder_default_opts();
    cx_dataset *ds = NULL;
    cr_expect_eq(cx_imagefolder_open(o, &ds), CX_ERR_ARG);
    cr_expect(strstr(cx_last_error(), "root is NULL"), "%s", cx_last_error());
    o.root = g_dir;
    o.image_size = 0;
    cr_expect_eq(cx_imagefolder_open(o, &ds), CX_ERR_ARG);
    cr_expect(strstr(cx_last_error(), "image_size"), "%s", cx_last_error());
}

/* With workers: a loader resumed mid-epoch (cx_loader_set_epoch with a
 * position, as from a checkpoint) hands out the rest of the epoch's
 * batches exactly, a loader freed mid-epoch stops its threads, and bad
 * worker options are refused by name. */
Test(imagefolder, workers_resume_and_options, .init = make_dir, .fini = remove_dir)
{
    make_folder("--train 96 --val 0");
    char root[128];
    snprintf(root, sizeof root, "%s/if/train", g_dir);
    cx_dataset *ds = open_folder(root, true, 24, 0, true, CX_IMAGE_ERRORS_STOP);
    const size_t per = 3 * 24 * 24;
    float *whole = malloc(96 * per * sizeof(float)), *tail = malloc(96 * per * sizeof(float));
    cr_assert(whole && tail);
    for (int pass = 0; pass < 3; pass++) {
        cx_sampler *sm = cx_sampler_new(96, cx_sampler_default_opts());
        cx_loader_opts lo = cx_loader_default_opts();
        lo.batch_size = 16;
        lo.num_workers = 2;
        lo.host_prefetch = 2;
        lo.prefetch = 1;
        cx_loader *l = cx_loader_new(ds, sm, lo);
        cr_assert(l, "%s", cx_last_error());
        cr_assert_eq(cx_loader_set_epoch(l, 3, pass == 1 ? 48 : 0), CX_OK);
        float *dst = pass == 1 ? tail : whole;
        cx_batch b;
        while (cx_loader_next(l, &b) == CX_LOADER_BATCH) {
            cr_assert_eq(cx_to_host(cx_batch_field(&b, CX_FIELD_IMAGES), dst, CX_F32), CX_OK);
            dst += (size_t)b.size * per;
            if (pass == 2) break;   /* freed with batches in flight */
        }
        cr_expect_eq(cx_loader_error(l), CX_OK, "%s", cx_last_error());
        if (pass == 1) cr_expect_eq(cx_loader_position(l), 96);
        cx_loader_free(l);
        cx_sampler_free(sm);
    }
    cr_expect(!memcmp(whole + 48 * per, tail, 48 * per * sizeof(float)), "resumed batches differ");
    free(whole);
    free(tail);
    cx_sampler *sm = cx_sampler_new(96, cx_sampler_default_opts());
    cx_loader_opts lo = cx_loader_default_opts();
    lo.num_workers = 300;
    cr_expect_null(cx_loader_new(ds, sm, lo));
    cr_expect(strstr(cx_last_error(), "num_workers 300"), "%s", cx_last_error());
    lo.num_workers = 2;
    lo.host_prefetch = 0;
    cr_expect_null(cx_loader_new(ds, sm, lo));
    cr_expect(strstr(cx_last_error(), "host_prefetch 0"), "%s", cx_last_error());
    cx_sampler_free(sm);
    cx_dataset_free(ds);
}

/* jpeg_fast decodes a training crop's pixels only (cropped and skipped
 * scanlines): where no DCT scaling applies (a crop never reaches 2 S on
 * both sides) the values are those of the whole decode, bit for bit, for
 * a 4:2:0 JPEG (fancy upsampling at the partial rows' ends). A truncated
 * JPEG fails in every epoch, whatever part the crop needs. */
Test(imagefolder, fast_jpeg_crop_is_exact, .init = make_dir, .fini = remove_dir)
{
    const int W = 161, H = 121, S = 64;
    uint8_t *px = malloc((size_t)W * H * 3), *jpg;
    size_t len;
    char err[256], path[256];
    uint32_t r = 1;
    for (int i = 0; i < W * H * 3; i++) {
        r = r * 1664525u + 1013904223u;
        px[i] = (uint8_t)((i % (W * 3)) / 3 + (i / (W * 3)) + (r >> 29));   /* ramps and noise */
    }
    cr_assert_eq(imgw_jpeg(&jpg, &len, px, W, H, 3, 90, true, err, sizeof err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/c", g_dir);
    cr_assert(mkdir(path, 0777) == 0);
    snprintf(path, sizeof path, "%s/c/a.jpg", g_dir);
    cr_assert_eq(imgw_save(path, jpg, len, err, sizeof err), 0, "%s", err);
    cx_dataset *fast = open_folder(g_dir, true, S, 0, true, CX_IMAGE_ERRORS_STOP);
    cx_dataset *whole = open_folder(g_dir, true, S, 0, false, CX_IMAGE_ERRORS_STOP);
    static float a[3 * 64 * 64], b[3 * 64 * 64];
    int differ = 0;
    for (int e = 0; e < 200; e++) {
        cx_dataset_set_epoch(fast, e);
        cx_dataset_set_epoch(whole, e);
        get_item(fast, 0, a);
        get_item(whole, 0, b);
        differ += memcmp(a, b, sizeof a) != 0;
    }
    cr_expect_eq(differ, 0, "%d of 200 crops differ from the whole decode's", differ);
    cx_dataset_free(fast);
    cx_dataset_free(whole);
    cr_assert_eq(imgw_save(path, jpg, len * 3 / 5, err, sizeof err), 0, "%s", err);
    fast = open_folder(g_dir, true, S, 0, true, CX_IMAGE_ERRORS_STOP);
    int failed = 0;
    for (int e = 0; e < 50; e++) {
        cx_dataset_set_epoch(fast, e);
        int64_t i = 0, label;
        void *out[2] = { a, &label };
        failed += cx_dataset_gather(fast, &i, 1, out) == CX_ERR_IO && strstr(cx_last_error(), "corrupt JPEG");
    }
    cr_expect_eq(failed, 50, "the truncated JPEG failed in %d of 50 epochs", failed);
    cx_dataset_free(fast);
    free(jpg);
    free(px);
}

/* The walk: classes sorted, a class's files sorted and then its
 * subdirectories', other files ignored, extensions in any case, and the
 * content (not the name) deciding the decoder. */
Test(imagefolder, listing_order, .init = make_dir, .fini = remove_dir)
{
    static const char *const dirs[] = { "c1", "c0", "c1/sub" };
    static const char *const files[] = { "c1/b.png", "c1/sub/0.png", "c1/a.PNG", "c0/x.jpg", "c0/readme.txt" };
    char path[256], err[256];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, dirs[i]);
        cr_assert(mkdir(path, 0777) == 0);
    }
    uint8_t px[4 * 4 * 3] = { 0 }, *png;
    size_t len;
    cr_assert_eq(imgw_png(&png, &len, px, 4, 4, 3, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, files[i]);
        cr_assert_eq(imgw_save(path, png, len, err, sizeof err), 0, "%s", err);
    }
    free(png);
    cx_dataset *ds = open_folder(g_dir, false, 4, 4, true, CX_IMAGE_ERRORS_STOP);
    static const char *const want[] = { "c0/x.jpg", "c1/a.PNG", "c1/b.png", "c1/sub/0.png" };
    cr_assert_eq(cx_dataset_size(ds), 4);
    cr_expect_eq(cx_imagefolder_num_classes(ds), 2);
    cr_expect_str_eq(cx_imagefolder_class_name(ds, 0), "c0");
    float img[3 * 4 * 4];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, want[i]);
        cr_expect_str_eq(cx_imagefolder_path(ds, i), path);
        cr_expect_eq(get_item(ds, i, img), i == 0 ? 0 : 1);
    }
    cr_expect_null(cx_imagefolder_path(ds, 4));
    cr_expect_eq(cx_imagefolder_num_classes(NULL), 0);
    cx_dataset_free(ds);
}

/* Damaged files never crash: a 4:2:0 JPEG and an RGB PNG with random bytes
 * overwritten or cut at random places, 150 of each, read with both
 * transforms; each read gives an image or an error naming the file. */
Test(imagefolder, damaged_files_never_crash, .init = make_dir, .fini = remove_dir)
{
    const int W = 40, H = 30;
    uint8_t px[40 * 30 * 3], *enc[2];
    size_t len[2];
    char err[256], path[256];
    for (int i = 0; i < W * H * 3; i++) px[i] = (uint8_t)(i * 7 + i / 97);
    cr_assert_eq(imgw_jpeg(&enc[0], &len[0], px, W, H, 3, 80, true, err, sizeof err), 0, "%s", err);
    cr_assert_eq(imgw_png(&enc[1], &len[1], px, W, H, 3, err, sizeof err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/c", g_dir);
    cr_assert(mkdir(path, 0777) == 0);
    snprintf(path, sizeof path, "%s/c/f.jpg", g_dir);
    uint32_t r = 12345;
    int failed = 0;
    float img[3 * 16 * 16];
    for (int t = 0; t < 300; t++) {
        int k = t % 2;
        uint8_t *d = malloc(len[k]);
        memcpy(d, enc[k], len[k]);
        size_t n = len[k];
        r = r * 1664525u + 1013904223u;
        if (r >> 31) n = (r >> 8) % n;   /* cut */
        for (int m = 0; m < 4; m++) {   /* and/or overwrite */
            r = r * 1664525u + 1013904223u;
            if (n) d[(r >> 8) % n] = (uint8_t)r;
        }
        cr_assert_eq(imgw_save(path, d, n, err, sizeof err), 0, "%s", err);
        free(d);
        for (int train = 0; train < 2; train++) {
            cx_dataset *ds = open_folder(g_dir, train, 16, 0, true, CX_IMAGE_ERRORS_STOP);
            int64_t i = 0, label;
            void *out[2] = { img, &label };
            if (cx_dataset_gather(ds, &i, 1, out) != CX_OK) {
                failed++;
                cr_expect(strstr(cx_last_error(), path) && !strchr(cx_last_error(), '\n'), "%s", cx_last_error());
            }
            cx_dataset_free(ds);
        }
    }
    cr_expect(failed > 0, "no damaged file failed");
    free(enc[0]);
    free(enc[1]);
}

/* A 4x4 PNG at g_dir/rel. */
static void write_png(const char *rel)
{
    uint8_t px[4 * 4 * 3] = { 0 }, *png;
    size_t len;
    char err[256], path[512];
    cr_assert_eq(imgw_png(&png, &len, px, 4, 4, 3, err, sizeof err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    cr_assert_eq(imgw_save(path, png, len, err, sizeof err), 0, "%s", err);
    free(png);
}

static void make_sub(const char *rel)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    cr_assert(mkdir(path, 0777) == 0, "mkdir %s", path);
}

/* A FIFO named like an image is not listed (warned about by name), and a
 * file swapped for a FIFO after the listing is a bad file, not a read that
 * blocks forever (the timeout turns a regression into a failure). */
Test(imagefolder, fifo_neither_listed_nor_read, .init = make_dir, .fini = remove_dir, .timeout = 30)
{
    make_sub("c");
    write_png("c/a.png");
    char fifo[512], png[512];
    snprintf(fifo, sizeof fifo, "%s/c/x.jpg", g_dir);
    snprintf(png, sizeof png, "%s/c/a.png", g_dir);
    cr_assert(mkfifo(fifo, 0666) == 0);
    captured cap = { .mu = PTHREAD_MUTEX_INITIALIZER };
    cx_log_set_handler(capture, &cap);
    cx_dataset *ds = open_folder(g_dir, false, 4, 4, true, CX_IMAGE_ERRORS_STOP);
    cx_log_set_handler(NULL, NULL);
    cr_assert_eq(cx_dataset_size(ds), 1);
    cr_expect_str_eq(cx_imagefolder_path(ds, 0), png);
    cr_assert_eq(cap.warnings, 1);
    cr_expect(strstr(cap.lines[0], fifo) && strstr(cap.lines[0], "FIFO"), "%s", cap.lines[0]);
    cr_assert(unlink(png) == 0 && mkfifo(png, 0666) == 0);
    float img[3 * 4 * 4];
    int64_t i = 0, label;
    void *out[2] = { img, &label };
    cr_expect_eq(cx_dataset_gather(ds, &i, 1, out), CX_ERR_IO);
    cr_expect(strstr(cx_last_error(), png) && strstr(cx_last_error(), "a FIFO, not a regular file"), "%s",
              cx_last_error());
    cx_dataset_free(ds);
}

/* This process's data segment in bytes (VmData), 0 if unknown. */
static long long vm_data(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmData: %lld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

/* A sparse g_dir/rel of `size` bytes starting with head. */
static void write_sparse(const char *rel, const char *head, size_t n, off_t size)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(head, 1, n, f), n);
    cr_assert(ftruncate(fileno(f), size) == 0);
    fclose(f);
}

/* Huge files are refused before being read: one over the size limit (with
 * a JPEG's signature) by its size, one under it that is not an image by its
 * first bytes. Outside ASan (whose shadow memory would count) the data
 * segment may not grow by 64 MB, so reading either whole fails the test. */
Test(imagefolder, huge_files_refused_unread, .init = make_dir, .fini = remove_dir)
{
    make_sub("c");
    write_png("c/a.png");
    write_sparse("c/big.jpg", "\xff\xd8\xff\xe0", 4, (off_t)300 << 20);
    write_sparse("c/zero.png", "", 0, (off_t)200 << 20);
    cx_dataset *ds = open_folder(g_dir, false, 4, 4, true, CX_IMAGE_ERRORS_STOP);
    cr_assert_eq(cx_dataset_size(ds), 3);
    struct rlimit was;
    cr_assert(getrlimit(RLIMIT_DATA, &was) == 0 && vm_data() > 0);
#if !defined(__SANITIZE_ADDRESS__)
    struct rlimit rl = was;
    rl.rlim_cur = (rlim_t)(vm_data() + (64 << 20));
    cr_assert(setrlimit(RLIMIT_DATA, &rl) == 0);
#endif
    static const char *const want[] = { NULL, "314572800 bytes, above the 256 MB limit",
                                        "not a JPEG or PNG image (209715200 bytes" };
    float img[3 * 4 * 4];
    int64_t label;
    void *out[2] = { img, &label };
    for (int64_t i = 0; i < 3; i++) {
        cx_status st = cx_dataset_gather(ds, &i, 1, out);
        if (!want[i]) { cr_expect_eq(st, CX_OK, "%s", cx_last_error()); continue; }
        cr_expect_eq(st, CX_ERR_IO, "item %lld: %s", (long long)i, cx_last_error());
        cr_expect(strstr(cx_last_error(), cx_imagefolder_path(ds, i)) && strstr(cx_last_error(), want[i]), "%s",
                  cx_last_error());
    }
    cr_assert(setrlimit(RLIMIT_DATA, &was) == 0);   /* Criterion's own reporting after the test allocates */
    cx_dataset_free(ds);
}

/* Symlinks back to root and to the class's own directory are each walked
 * once (warned about by name), so every image counts once. */
Test(imagefolder, symlink_loops_count_once, .init = make_dir, .fini = remove_dir)
{
    make_sub("c0");
    make_sub("c0/sub");
    make_sub("c1");
    write_png("c0/a.png");
    write_png("c0/sub/b.png");
    write_png("c1/d.png");
    char path[512];
    snprintf(path, sizeof path, "%s/c0/loop", g_dir);
    cr_assert(symlink("..", path) == 0);
    snprintf(path, sizeof path, "%s/c0/sub/up", g_dir);
    cr_assert(symlink("..", path) == 0);
    captured cap = { .mu = PTHREAD_MUTEX_INITIALIZER };
    cx_log_set_handler(capture, &cap);
    cx_dataset *ds = open_folder(g_dir, false, 4, 4, true, CX_IMAGE_ERRORS_STOP);
    cx_log_set_handler(NULL, NULL);
    static const char *const want[] = { "c0/a.png", "c0/sub/b.png", "c1/d.png" };
    cr_assert_eq(cx_dataset_size(ds), 3);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, want[i]);
        cr_expect_str_eq(cx_imagefolder_path(ds, i), path);
    }
    cr_assert_eq(cap.warnings, 2);
    static const char *const loops[] = { "c0/loop", "c0/sub/up" };
    for (int w = 0; w < 2; w++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, loops[w]);
        cr_expect(strstr(cap.lines[w], path) && strstr(cap.lines[w], "already walked"), "%s", cap.lines[w]);
    }
    cx_dataset_free(ds);
}

/* A file name holding an ESC reaches messages as \x1b (UTF-8 letters as
 * they are): in the error (stop), the warning (skip) and the listing's. */
Test(imagefolder, names_escaped_in_messages, .init = make_dir, .fini = remove_dir)
{
    make_sub("c");
    write_png("c/a.png");
    char path[512];
    snprintf(path, sizeof path, "%s/c/b\x1b[31m\xc3\xa9.jpg", g_dir);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fputs("not an image", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/c/f\x1b]0;x\x07.png", g_dir);
    cr_assert(mkfifo(path, 0666) == 0);
    char want[512];
    snprintf(want, sizeof want, "%s/c/b\\x1b[31m\xc3\xa9.jpg: not a JPEG or PNG", g_dir);
    captured cap = { .mu = PTHREAD_MUTEX_INITIALIZER };
    cx_log_set_handler(capture, &cap);
    for (int skip = 0; skip < 2; skip++) {
        cx_dataset *ds = open_folder(g_dir, false, 4, 4, true, skip ? CX_IMAGE_ERRORS_SKIP : CX_IMAGE_ERRORS_STOP);
        cr_assert_eq(cx_dataset_size(ds), 2);
        float img[3 * 4 * 4];
        int64_t i = 1, label;
        void *out[2] = { img, &label };
        cr_expect_eq(cx_dataset_gather(ds, &i, 1, out), skip ? CX_OK : CX_ERR_IO);
        if (!skip) cr_expect(strstr(cx_last_error(), want) && !strchr(cx_last_error(), 0x1b), "%s", cx_last_error());
        cx_dataset_free(ds);
    }
    cx_log_set_handler(NULL, NULL);
    cr_assert_eq(cap.warnings, 3);   /* the FIFO at each open, the bad file when skipped */
    cr_expect(strstr(cap.lines[0], "/c/f\\x1b]0;x\\x07.png: a FIFO") && !strchr(cap.lines[0], 0x1b), "%s",
              cap.lines[0]);
    cr_expect(strstr(cap.lines[2], want) && !strchr(cap.lines[2], 0x1b), "%s", cap.lines[2]);
}
