/* Host data sets: MNIST / Fashion-MNIST from IDX files, and fake data. */
#include "nn_internal.h"

#include <cxla/data.h>

#include <sys/stat.h>

struct cx_dataset {
    int64_t n;
    int c, h, w;
    int num_classes;
    uint8_t *pixels;     /* (n, c, h, w) */
    uint8_t *labels;     /* (n) */
    float mean, std;
    float lut[256];      /* normalized value of each pixel byte */
};

/* A data set's shape and normalization; the caller gives it its pixel and
 * label buffers. */
static cx_dataset *dataset_new(int64_t n, int c, int h, int w, int classes, float mean, float std)
{
    cx_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return NULL;
    ds->n = n; ds->c = c; ds->h = h; ds->w = w;
    ds->num_classes = classes;
    ds->mean = mean; ds->std = std;
    /* Same float32 arithmetic as ToTensor + Normalize: p / 255, then (x - mean) / std. */
    for (int p = 0; p < 256; p++) ds->lut[p] = ((float)p / 255.0f - mean) / std;
    return ds;
}

void cx_dataset_free(cx_dataset *ds)
{
    if (!ds) return;
    free(ds->pixels);
    free(ds->labels);
    free(ds);
}

cx_mnist_opts cx_mnist_default_opts(void)
{
    return (cx_mnist_opts){ .kind = CX_DATASET_FASHION_MNIST, .dir = NULL, .train = true };
}

static bool file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Finds <dir>/<stem>.gz or <dir>/<stem>; on failure reports the .gz path
 * and where the files come from. */
static cx_status find_file(const cx_mnist_opts *o, const char *dir, const char *stem, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s.gz", dir, stem);
    if (file_exists(path)) return CX_OK;
    char raw[4096];
    snprintf(raw, sizeof raw, "%s/%s", dir, stem);
    if (file_exists(raw)) { snprintf(path, cap, "%s", raw); return CX_OK; }
    if (o->kind == CX_DATASET_FASHION_MNIST)
        cx_set_last_error("Fashion-MNIST file not found: %s (provided by the Debian package "
                     "dataset-fashion-mnist: apt-get install dataset-fashion-mnist; or pass a directory "
                     "with the IDX files)", path);
    else
        cx_set_last_error("MNIST file not found: %s (no Debian package ships MNIST; put the four IDX files "
                     "there or pass their directory)", path);
    return CX_ERR_IO;
}

cx_status cx_mnist_load(cx_mnist_opts o, cx_dataset **out)
{
    if (!out) { cx_set_last_error("cx_mnist_load: out is NULL"); return CX_ERR_ARG; }
    *out = NULL;
    const char *dir = o.dir ? o.dir
                            : (o.kind == CX_DATASET_MNIST ? CX_MNIST_DIR : CX_FASHION_MNIST_DIR);
    const char *split = o.train ? "train" : "t10k";
    char stem[64], ipath[4200], lpath[4200];
    snprintf(stem, sizeof stem, "%s-images-idx3-ubyte", split);
    cx_status st = find_file(&o, dir, stem, ipath, sizeof ipath);
    if (st != CX_OK) return st;
    snprintf(stem, sizeof stem, "%s-labels-idx1-ubyte", split);
    st = find_file(&o, dir, stem, lpath, sizeof lpath);
    if (st != CX_OK) return st;

    cx_idx_array img, lab;
    if ((st = cx_idx_read(ipath, &img)) != CX_OK) return st;
    if ((st = cx_idx_read(lpath, &lab)) != CX_OK) { cx_idx_array_release(&img); return st; }
    if (img.ndim != 3 || lab.ndim != 1 || img.dims[0] != lab.dims[0] || img.dims[0] == 0) {
        cx_set_last_error("cx_mnist_load: %s (%d dims, %lld samples) and %s (%d dims, %lld labels) do not match",
                     ipath, img.ndim, (long long)img.dims[0], lpath, lab.ndim, (long long)lab.dims[0]);
        cx_idx_array_release(&img);
        cx_idx_array_release(&lab);
        return CX_ERR_IO;
    }
    for (int64_t i = 0; i < lab.dims[0]; i++) {
        if (lab.data[i] >= 10) {
            cx_set_last_error("cx_mnist_load: %s: label %d at %lld is not a class 0-9", lpath, lab.data[i], (long long)i);
            cx_idx_array_release(&img);
            cx_idx_array_release(&lab);
            return CX_ERR_IO;
        }
    }
    bool fashion = o.kind == CX_DATASET_FASHION_MNIST;
    cx_dataset *ds = dataset_new(img.dims[0], 1, (int)img.dims[1], (int)img.dims[2], 10, fashion ? 0.2860f : 0.1307f,
                                 fashion ? 0.3530f : 0.3081f);
    if (!ds) {
        cx_idx_array_release(&img);
        cx_idx_array_release(&lab);
        cx_set_last_error("cx_mnist_load: out of memory");
        return CX_ERR_OOM;
    }
    /* Take the IDX buffers over instead of copying 47 MB. */
    ds->pixels = img.data;
    ds->labels = lab.data;
    *out = ds;
    return CX_OK;
}

cx_fake_data_opts cx_fake_data_default_opts(void)
{
    return (cx_fake_data_opts){ .size = 60000, .channels = 1, .height = 28, .width = 28,
                                .num_classes = 10, .seed = 0 };
}

cx_status cx_fake_data(cx_fake_data_opts o, cx_dataset **out)
{
    if (!out) { cx_set_last_error("cx_fake_data: out is NULL"); return CX_ERR_ARG; }
    *out = NULL;
    if (o.size <= 0 || o.channels <= 0 || o.height <= 0 || o.width <= 0 || o.num_classes <= 0 ||
        o.num_classes > 256) {
        cx_set_last_error("cx_fake_data: bad shape: size %lld, %dx%dx%d, %d classes (want positive, <= 256 classes)",
                     (long long)o.size, o.channels, o.height, o.width, o.num_classes);
        return CX_ERR_ARG;
    }
    size_t per = (size_t)o.channels * (size_t)o.height * (size_t)o.width;
    cx_dataset *ds = dataset_new(o.size, o.channels, o.height, o.width, o.num_classes, 0.1307f, 0.3081f);
    if (ds) {
        ds->pixels = malloc((size_t)o.size * per);
        ds->labels = malloc((size_t)o.size);
    }
    if (!ds || !ds->pixels || !ds->labels) {
        cx_dataset_free(ds);
        cx_set_last_error("cx_fake_data: out of memory for %lld samples", (long long)o.size);
        return CX_ERR_OOM;
    }
    uint64_t s = o.seed;
    for (int64_t i = 0; i < o.size; i++) {
        ds->labels[i] = (uint8_t)(cx_splitmix64(&s) % (uint64_t)o.num_classes);
        uint8_t *px = ds->pixels + (size_t)i * per;
        for (size_t j = 0; j < per; j++) px[j] = (uint8_t)(cx_splitmix64(&s) >> 56);
    }
    *out = ds;
    return CX_OK;
}

int64_t cx_dataset_size(const cx_dataset *ds) { return ds ? ds->n : 0; }

void cx_dataset_image_shape(const cx_dataset *ds, int64_t chw[3])
{
    chw[0] = ds->c; chw[1] = ds->h; chw[2] = ds->w;
}

int cx_dataset_num_classes(const cx_dataset *ds) { return ds->num_classes; }

const uint8_t *cx_dataset_pixels(const cx_dataset *ds, int64_t i)
{
    CX_ASSERT(i >= 0 && i < ds->n);
    return ds->pixels + (size_t)i * (size_t)ds->c * (size_t)ds->h * (size_t)ds->w;
}

int64_t cx_dataset_label(const cx_dataset *ds, int64_t i)
{
    CX_ASSERT(i >= 0 && i < ds->n);
    return ds->labels[i];
}

void cx_dataset_normalization(const cx_dataset *ds, float *mean, float *std)
{
    if (mean) *mean = ds->mean;
    if (std) *std = ds->std;
}

void cx_dataset_gather(const cx_dataset *ds, const int64_t *idx, int64_t n, float *images, int64_t *labels)
{
    size_t per = (size_t)ds->c * (size_t)ds->h * (size_t)ds->w;
    for (int64_t b = 0; b < n; b++) {
        CX_ASSERT(idx[b] >= 0 && idx[b] < ds->n);
        if (images) {
            const uint8_t *px = ds->pixels + (size_t)idx[b] * per;
            float *dst = images + (size_t)b * per;
            for (size_t j = 0; j < per; j++) dst[j] = ds->lut[px[j]];
        }
        if (labels) labels[b] = ds->labels[idx[b]];
    }
}
