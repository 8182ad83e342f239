/* Image data sets: MNIST / Fashion-MNIST from IDX files, and fake images.
 * MNIST keeps 8-bit pixels and byte labels on the host, fake images are
 * generated per sample; both collate a batch into the "images" (f32, normalized) and "labels" (i64) fields. */
#include "nn_internal.h"

#include "cx_struct.h"
#include "data_internal.h"

#include <cxla/data.h>

#include <sys/stat.h>

typedef struct {
    int64_t n;
    int c, h, w;
    uint8_t *pixels;     /* (n, c, h, w) */
    uint8_t *labels;     /* (n) */
    float lut[256];      /* normalized value of each pixel byte */
} images;

static void images_free(void *ctx)
{
    images *im = ctx;
    if (!im) return;
    free(im->pixels);
    free(im->labels);
    free(im);
}

/* batch[0]: (n, C, H, W) f32, batch[1]: (n) i64 */
static cx_status images_collate(void *ctx, const int64_t *idx, int64_t n, void *const *batch)
{
    const images *im = ctx;
    size_t per = (size_t)im->c * (size_t)im->h * (size_t)im->w;
    float *img = batch[0];
    int64_t *lab = batch[1];
    for (int64_t b = 0; b < n; b++) {
        const uint8_t *px = im->pixels + (size_t)idx[b] * per;
        float *dst = img + (size_t)b * per;
        for (size_t j = 0; j < per; j++) dst[j] = im->lut[px[j]];
        lab[b] = im->labels[idx[b]];
    }
    return CX_OK;
}

/* The data set over `im` (taken, also on failure), normalized as ToTensor +
 * Normalize do: (p / 255 - mean) / std. */
static cx_dataset *images_dataset(images *im, float mean, float std)
{
    cx_normalize_lut(im->lut, mean, std);
    cx_field fields[2] = {
        { .name = CX_FIELD_IMAGES, .dtype = CX_F32, .ndim = 3, .shape = { im->c, im->h, im->w } },
        { .name = CX_FIELD_LABELS, .dtype = CX_I64, .ndim = 0 },
    };
    cx_dataset_desc d = { CX_STRUCT_SIZE(cx_dataset_desc), .size = im->n, .nfields = 2, .fields = fields, .collate = images_collate,
                          .free = images_free, .ctx = im };
    return cx_dataset_new(&d);
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

/* Checks that images and labels belong together. @return CX_OK or CX_ERR_IO. */
static cx_status check_pair(const cx_idx_array *img, const char *ipath, const cx_idx_array *lab, const char *lpath)
{
    if (img->ndim != 3 || lab->ndim != 1 || img->dims[0] != lab->dims[0] || img->dims[0] == 0) {
        cx_set_last_error("cx_mnist_load: %s (%d dims, %lld samples) and %s (%d dims, %lld labels) do not match",
                     ipath, img->ndim, (long long)img->dims[0], lpath, lab->ndim, (long long)lab->dims[0]);
        return CX_ERR_IO;
    }
    for (int64_t i = 0; i < lab->dims[0]; i++) {
        if (lab->data[i] >= 10) {
            cx_set_last_error("cx_mnist_load: %s: label %d at %lld is not a class 0-9", lpath, lab->data[i], (long long)i);
            return CX_ERR_IO;
        }
    }
    return CX_OK;
}

cx_status cx_mnist_load(cx_mnist_opts given, cx_dataset **out)
{
    if (!out) { cx_set_last_error("cx_mnist_load: out is NULL"); return CX_ERR_ARG; }
    *out = NULL;
    cx_mnist_opts o = cx_mnist_default_opts();
    if (!CX_TAKE_STRUCT("cx_mnist_load", cx_mnist_opts, o, &given, train)) return CX_ERR_ARG;
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
    st = check_pair(&img, ipath, &lab, lpath);
    images *im = st == CX_OK ? calloc(1, sizeof *im) : NULL;
    if (!im) {
        if (st == CX_OK) { cx_set_last_error("cx_mnist_load: out of memory"); st = CX_ERR_OOM; }
        cx_idx_array_release(&img);
        cx_idx_array_release(&lab);
        return st;
    }
    /* Take the IDX buffers over instead of copying 47 MB. */
    *im = (images){ .n = img.dims[0], .c = 1, .h = (int)img.dims[1], .w = (int)img.dims[2], .pixels = img.data,
                    .labels = lab.data };
    bool fashion = o.kind == CX_DATASET_FASHION_MNIST;
    *out = images_dataset(im, fashion ? 0.2860f : 0.1307f, fashion ? 0.3530f : 0.3081f);
    return *out ? CX_OK : CX_ERR_OOM;
}

/* Fake images are generated when a batch is collated, never stored: at
 * 3x224x224 a stored set of 60000 would be 9 GB. SplitMix64 is a counter
 * (each draw adds one constant to the state), so sample i's first draw
 * starts from seed + i * (1 + C*H*W) * gamma: the same values as drawing
 * the samples in order (label, then its pixels), which is what the set
 * held when it was stored. */
typedef struct {
    size_t per;              /* C * H * W */
    uint64_t seed, classes;
    float lut[256];
} fake_images;

static cx_status fake_collate(void *ctx, const int64_t *idx, int64_t n, void *const *batch)
{
    const fake_images *f = ctx;
    float *img = batch[0];   // (n, C, H, W)
    int64_t *lab = batch[1];
    for (int64_t b = 0; b < n; b++) {
        uint64_t s = f->seed + (uint64_t)idx[b] * (uint64_t)(1 + f->per) * 0x9e3779b97f4a7c15ull;
        lab[b] = (int64_t)(cx_splitmix64(&s) % f->classes);
        float *dst = img + (size_t)b * f->per;
        for (size_t j = 0; j < f->per; j++) dst[j] = f->lut[cx_splitmix64(&s) >> 56];
    }
    return CX_OK;
}

cx_status cx_fake_data(cx_fake_data_opts given, cx_dataset **out)
{
    if (!out) { cx_set_last_error("cx_fake_data: out is NULL"); return CX_ERR_ARG; }
    *out = NULL;
    cx_fake_data_opts o = cx_fake_data_default_opts();
    if (!CX_TAKE_STRUCT("cx_fake_data", cx_fake_data_opts, o, &given, seed)) return CX_ERR_ARG;
    if (o.size <= 0 || o.channels <= 0 || o.height <= 0 || o.width <= 0 || o.num_classes <= 0 ||
        o.num_classes > CX_FAKE_DATA_MAX_CLASSES ||
        (double)o.channels * (double)o.height * (double)o.width > (double)(INT32_MAX)) {
        cx_set_last_error("cx_fake_data: bad shape: size %lld, %dx%dx%d, %d classes (want positive, an image "
                          "below 2^31 elements, <= %d classes)", (long long)o.size, o.channels, o.height, o.width,
                          o.num_classes, CX_FAKE_DATA_MAX_CLASSES);
        return CX_ERR_ARG;
    }
    fake_images *f = calloc(1, sizeof *f);
    if (!f) {
        cx_set_last_error("cx_fake_data: out of memory");
        return CX_ERR_OOM;
    }
    *f = (fake_images){ .per = (size_t)o.channels * (size_t)o.height * (size_t)o.width, .seed = o.seed,
                        .classes = (uint64_t)o.num_classes };
    /* normalized like MNIST, as ToTensor + Normalize (float32) */
    cx_normalize_lut(f->lut, 0.1307f, 0.3081f);
    cx_field fields[2] = {
        { .name = CX_FIELD_IMAGES, .dtype = CX_F32, .ndim = 3, .shape = { o.channels, o.height, o.width } },
        { .name = CX_FIELD_LABELS, .dtype = CX_I64, .ndim = 0 },
    };
    cx_dataset_desc d = { CX_STRUCT_SIZE(cx_dataset_desc), .size = o.size, .nfields = 2, .fields = fields,
                          .collate = fake_collate, .free = free, .ctx = f };
    *out = cx_dataset_new(&d);
    return *out ? CX_OK : CX_ERR_OOM;
}
