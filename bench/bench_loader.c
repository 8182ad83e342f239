/* The image-folder loader's rate (bench.h says what is measured). The
 * images are synthetic but compress like photos: smooth color fields (a
 * few low-frequency waves), some flat shapes with edges, and a little
 * noise, about 1.5 to 2.5 bits per pixel at quality 90. */
#include "bench.h"

#include "image_write.h"

#include <cxla/cxla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define W 500
#define H 375

struct bench_loader {
    cx_dataset *ds;
    cx_sampler *sampler;
    cx_loader *loader;
    int64_t epoch;
};

static uint32_t lcg(uint32_t *s) { return *s = *s * 1664525u + 1013904223u; }
static double unit_rand(uint32_t *s) { return (double)(lcg(s) >> 8) / 16777216.0; }

/* Image k, (H, W, 3). Separable waves keep it cheap: row and column tables. */
static void synth(uint8_t *px, int k, float *col, float *row)
{
    uint32_t s = 0x9e3779b9u * (uint32_t)(k + 1);
    memset(px, 0, (size_t)W * H * 3);
    float *acc = calloc((size_t)W * H * 3, sizeof *acc);
    if (!acc) return;
    for (int wave = 0; wave < 3; wave++) {
        double fx = 0.002 + 0.03 * unit_rand(&s), fy = 0.002 + 0.03 * unit_rand(&s);
        double px0 = 6.28 * unit_rand(&s), py0 = 6.28 * unit_rand(&s), amp[3];
        for (int c = 0; c < 3; c++) amp[c] = 30 + 40 * unit_rand(&s);
        for (int x = 0; x < W; x++) col[x] = (float)cos(fx * x + px0);
        for (int y = 0; y < H; y++) row[y] = (float)cos(fy * y + py0);
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++)
                for (int c = 0; c < 3; c++) acc[((size_t)y * W + (size_t)x) * 3 + c] += (float)amp[c] * row[y] * col[x];
    }
    for (int r = 0; r < 6; r++) {   /* flat shapes: edges */
        int x0 = (int)(unit_rand(&s) * W), y0 = (int)(unit_rand(&s) * H), w = 20 + (int)(unit_rand(&s) * 150),
            h = 20 + (int)(unit_rand(&s) * 120);
        float v[3] = { (float)(unit_rand(&s) * 120 - 60), (float)(unit_rand(&s) * 120 - 60), (float)(unit_rand(&s) * 120 - 60) };
        for (int y = y0; y < y0 + h && y < H; y++)
            for (int x = x0; x < x0 + w && x < W; x++)
                for (int c = 0; c < 3; c++) acc[((size_t)y * W + (size_t)x) * 3 + c] += v[c];
    }
    for (size_t i = 0; i < (size_t)W * H * 3; i++) {
        float v = 128 + acc[i] + (float)((int)(lcg(&s) >> 28) - 8);
        px[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
    free(acc);
}

bool bench_loader_folder(char *dir)
{
    strcpy(dir, "/tmp/cxla-bench-images-XXXXXX");
    if (!mkdtemp(dir)) { perror("cxla-bench: mkdtemp"); return false; }
    char path[128], err[256];
    snprintf(path, sizeof path, "%s/photos", dir);
    uint8_t *px = malloc((size_t)W * H * 3);
    float *col = malloc(W * sizeof *col), *row = malloc(H * sizeof *row);
    bool ok = px && col && row && mkdir(path, 0777) == 0;
    for (int k = 0; ok && k < BENCH_LOADER_IMAGES; k++) {
        uint8_t *jpg;
        size_t len;
        synth(px, k, col, row);
        snprintf(path, sizeof path, "%s/photos/%04d.jpg", dir, k);
        ok = imgw_jpeg(&jpg, &len, px, W, H, 3, 90, true, err, sizeof err) == 0;
        if (ok) { ok = imgw_save(path, jpg, len, err, sizeof err) == 0; free(jpg); }
        if (!ok) fprintf(stderr, "cxla-bench: loader images: %s\n", err);
    }
    free(px);
    free(col);
    free(row);
    if (!ok) bench_loader_folder_remove(dir);
    return ok;
}

void bench_loader_folder_remove(const char *dir)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cxla-bench: cannot remove %s\n", dir);
}

bench_loader *bench_loader_new(const char *dir, int num_workers, bool jpeg_fast)
{
    bench_loader *l = calloc(1, sizeof *l);
    cx_imagefolder_opts o = cx_imagefolder_default_opts();
    o.root = dir;
    o.jpeg_fast = jpeg_fast;
    if (!l || cx_imagefolder_open(o, &l->ds) != CX_OK) {
        fprintf(stderr, "cxla-bench: loader: %s\n", l ? cx_last_error() : "out of memory");
        free(l);
        return NULL;
    }
    l->sampler = cx_sampler_new(cx_dataset_size(l->ds), cx_sampler_default_opts());
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = BENCH_LOADER_BATCH;
    lo.mark_step = false;
    lo.num_workers = num_workers;
    lo.host_prefetch = 4;
    lo.prefetch = 2;
    l->loader = l->sampler ? cx_loader_new(l->ds, l->sampler, lo) : NULL;
    if (!l->loader) {
        fprintf(stderr, "cxla-bench: loader: %s\n", cx_last_error());
        bench_loader_free(l);
        return NULL;
    }
    return l;
}

double bench_loader_epoch(void *p)
{
    bench_loader *l = p;
    cx_loader_set_epoch(l->loader, l->epoch++, 0);   /* drains: nothing decoded ahead of the clock */
    double t0 = bench_now();
    cx_batch b;
    int64_t images = 0;
    while (cx_loader_next(l->loader, &b) == CX_LOADER_BATCH) images += b.size;
    double dt = bench_now() - t0;
    if (cx_loader_error(l->loader) != CX_OK || images != BENCH_LOADER_IMAGES) {
        fprintf(stderr, "cxla-bench: loader: %s\n", cx_loader_error(l->loader) != CX_OK ? cx_last_error() : "short epoch");
        return -1;
    }
    return dt;
}

void bench_loader_free(bench_loader *l)
{
    if (!l) return;
    cx_loader_free(l->loader);
    cx_sampler_free(l->sampler);
    cx_dataset_free(l->ds);
    free(l);
}

int bench_loader_figure(const bench_cfg *cfg, const char *dir, const char *name, int num_workers, bench_side ref,
                        double ref_images)
{
    bench_loader *l = bench_loader_new(dir, num_workers, true);
    bench_series fig = { 0 };
    int rc = l ? 0 : 1;
    bench_side sides[2] = { { .unit = bench_loader_epoch, .ctx = l }, ref };
    for (int r = 0; r < cfg->rounds && !rc; r++) {
        double sec[2];
        if (!bench_round(cfg, r, sides, 2, sec)) rc = 1;
        else bench_add(&fig, BENCH_LOADER_IMAGES / sec[0], ref_images / sec[1]);
    }
    if (!rc) bench_emit(name, "images/s", BENCH_HIGHER, &fig);
    bench_loader_free(l);
    return rc;
}

/* workers 0, 1, 2 with jpeg_fast, and 2 without */
#define N_LOADERS 4

int bench_train_loader(const bench_cfg *cfg, const char *dir)
{
    /* side i runs loader i; figure i is side `side`'s rate over side `ref`'s:
     * the last one is 2 workers with jpeg_fast (side 2) over whole decodes (side 3) */
    static const struct { int workers; bool fast; const char *name; int side, ref; } k[N_LOADERS] = {
        { 0, true, "imagefolder_loader_w0_images_per_s", 0, 0 },
        { 1, true, "imagefolder_loader_w1_vs_w0", 1, 0 },
        { 2, true, "imagefolder_loader_w2_vs_w0", 2, 0 },
        { 2, false, "imagefolder_loader_w2_fast_vs_whole", 2, 3 },
    };
    bench_loader *l[N_LOADERS] = { 0 };
    bench_side sides[N_LOADERS];
    int rc = 0;
    for (int i = 0; i < N_LOADERS && !rc; i++) {
        if (!(l[i] = bench_loader_new(dir, k[i].workers, k[i].fast))) rc = 1;
        sides[i] = (bench_side){ .unit = bench_loader_epoch, .ctx = l[i] };
    }
    bench_series fig[N_LOADERS] = { { 0 } };
    for (int r = 0; r < cfg->rounds && !rc; r++) {
        double sec[N_LOADERS];
        if (!bench_round(cfg, r, sides, N_LOADERS, sec)) { rc = 1; break; }
        for (int i = 0; i < N_LOADERS; i++)
            bench_add(&fig[i], BENCH_LOADER_IMAGES / sec[k[i].side], BENCH_LOADER_IMAGES / sec[k[i].ref]);
    }
    for (int i = 0; i < N_LOADERS && !rc; i++) bench_emit(k[i].name, "images/s", BENCH_HIGHER, &fig[i]);
    for (int i = 0; i < N_LOADERS; i++) bench_loader_free(l[i]);
    return rc;
}
