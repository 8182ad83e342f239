/* cxla data: data sets, a deterministic rank-aware shuffling sampler and a
 * prefetching loader (torch.utils.data's Dataset, DistributedSampler and
 * DataLoader, with MpDeviceLoader's step marking).
 *
 * A data set is `size` items, each made of the same named fields (a dtype
 * and a per-item shape). Its callbacks fill items into host buffers; the
 * loader's background thread gathers a batch that way and uploads it as one
 * tensor per field, (B, item shape...). Built in: IDX images (MNIST,
 * Fashion-MNIST), image folders (JPEG/PNG with the ImageNet transforms)
 * and fake images, in-memory arrays, and text corpora cut into windows of
 * tokens for language models.
 *
 * Threads: a loader has one background thread that runs the data set's
 * get/collate and makes each batch's tensors (leaves: core.h says why that
 * is allowed), and with num_workers > 0 for a data set declared
 * concurrent, that many more threads that only run get/collate; everything
 * else, the data set's set_epoch and the sampler included, runs on the
 * thread calling the loader, the training thread.
 * Ownership: a data set owns its description's ctx and copies its fields;
 * a loader borrows its data set and sampler and owns the batches it hands
 * out (valid until the next cx_loader_next, cx_loader_end_step or
 * cx_loader_free); an IDX array's data is released with
 * cx_idx_array_release. Nothing here is released with free().
 */
#ifndef CXLA_DATA_H
#define CXLA_DATA_H

#include <cxla/core.h>
#include <cxla/spmd.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- data sets ------------------------------------------------------------ */

typedef struct cx_dataset cx_dataset;

/* One field of every item: name, dtype and per-item shape (a batch of B
 * items is a tensor of shape (B, shape[0], ..., shape[ndim - 1])). */
typedef struct {
    const char *name;
    cx_dtype dtype;
    int ndim;                          /* 0 (one value per item) .. CX_MAX_DIMS - 1 */
    int64_t shape[CX_MAX_DIMS - 1];
} cx_field;

/* Fills item `index` (0 <= index < size): item[f] points to room for one
 * item of field f (the product of its shape elements of its dtype, row-major).
 * @return CX_OK, or an error with cx_set_last_error saying what went wrong. */
typedef cx_status (*cx_dataset_get_fn)(void *ctx, int64_t index, void *const *item);
/* Fills the `n` items `indices[0..n)` at once: batch[f] points to room for
 * (n, field f's shape) values. @return as get. */
typedef cx_status (*cx_dataset_collate_fn)(void *ctx, const int64_t *indices, int64_t n, void *const *batch);
/* Told that epoch `epoch` starts (e.g. to draw new windows or augmentations). */
typedef void (*cx_dataset_epoch_fn)(void *ctx, int64_t epoch);
typedef void (*cx_dataset_free_fn)(void *ctx);

/* A user-defined data set. get or collate (or both) must be set; the loader
 * uses collate when there is one. The callbacks run on the loader's thread,
 * one at a time, unless the description sets `concurrent`: then a loader
 * with num_workers > 0 calls get/collate from several threads at once, on
 * disjoint items and output rows. set_epoch runs on the caller's thread
 * while no batch is being filled. */
typedef struct {
    size_t struct_size;                /* CX_STRUCT_SIZE(cx_dataset_desc) */
    int64_t size;                      /* items, > 0 */
    int nfields;                       /* >= 1 */
    const cx_field *fields;            /* nfields, distinct non-empty names; copied */
    cx_dataset_get_fn get;
    cx_dataset_collate_fn collate;     /* optional */
    cx_dataset_epoch_fn set_epoch;     /* optional */
    cx_dataset_free_fn free;           /* optional: releases ctx */
    void *ctx;
    /* A later member (a struct_size from before it reads false): get and
     * collate may run on several threads at once, on different items. */
    bool concurrent;
} cx_dataset_desc;

/* A data set from a description. It owns desc->ctx from now on, also on
 * failure (then desc->free(ctx) has run).
 * @return the data set, or NULL with cx_last_error set: a struct_size
 * below the first version's, a size below 1, no
 * field, a field without a name or with a repeated one, a bad dtype, ndim or
 * non-positive dim (the message names the field), neither get nor collate,
 * or out of memory. */
CX_API cx_dataset *cx_dataset_new(const cx_dataset_desc *desc);
/* Calls the data set's free on its ctx and releases it. NULL is fine. */
CX_API void cx_dataset_free(cx_dataset *ds);
/* @return the number of items (0 for NULL). */
CX_API int64_t cx_dataset_size(const cx_dataset *ds);
CX_API int cx_dataset_num_fields(const cx_dataset *ds);
/* @return field i (the data set's copy), or NULL outside [0, num_fields). */
CX_API const cx_field *cx_dataset_field(const cx_dataset *ds, int i);
/* @return the index of the field called `name`, or -1 if there is none. */
CX_API int cx_dataset_field_index(const cx_dataset *ds, const char *name);
/* Fills the items `indices[0..n)` into out[f], room for (n, field f's
 * shape) values of each field, through collate or item by item through get.
 * @return CX_OK; CX_ERR_ARG on an index outside [0, size) (named); the
 * callback's error; CX_ERR_OOM. */
CX_API cx_status cx_dataset_gather(cx_dataset *ds, const int64_t *indices, int64_t n, void *const *out);
/* Calls the set_epoch hook, if any (the loader does at each epoch start). */
CX_API void cx_dataset_set_epoch(cx_dataset *ds, int64_t epoch);
/* @return whether the description declared `concurrent` (false for NULL). */
CX_API bool cx_dataset_concurrent(const cx_dataset *ds);

/* ---- in-memory arrays (TensorDataset) -------------------------------------- */

/* `size` items over host arrays: data[f] holds `size` items of fields[f]
 * back to back, i.e. an array of shape (size, fields[f].shape...). The
 * arrays are borrowed: they must outlive the data set.
 * @return the data set, or NULL with cx_last_error set (as cx_dataset_new,
 * or a NULL array, named). */
CX_API cx_dataset *cx_dataset_from_arrays(int64_t size, int nfields, const cx_field *fields,
                                          const void *const *data);

/* ---- IDX files and image data sets --------------------------------------- */

/* The contents of one IDX file of unsigned bytes (type 0x08), the only type
 * MNIST-style sets use. */
typedef struct {
    int ndim;                  /* 1 (labels) or 3 (images) */
    int64_t dims[4];
    uint8_t *data;             /* numel bytes, row-major; owned */
} cx_idx_array;

/* Reads an IDX file, gzip-compressed or raw (detected from the content).
 * @return CX_OK and fills `out`; CX_ERR_IO if the file is missing, unreadable,
 * truncated or not an unsigned-byte IDX file (cx_last_error names the path);
 * CX_ERR_OOM. On error `out` is left empty. */
CX_API cx_status cx_idx_read(const char *path, cx_idx_array *out);
/* Releases the data of `a` (an empty or NULL array is fine). */
CX_API void cx_idx_array_release(cx_idx_array *a);

/* Image data sets (MNIST, Fashion-MNIST, fake) have two fields: "images",
 * f32 (C, H, W), the 8-bit pixels p normalized as ToTensor + Normalize do
 * ((p / 255 - mean) / std, with the set's mean and std), and "labels", i64
 * (), the class. */
#define CX_FIELD_IMAGES "images"
#define CX_FIELD_LABELS "labels"

typedef enum { CX_DATASET_FASHION_MNIST = 0, CX_DATASET_MNIST } cx_mnist_kind;

#define CX_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#define CX_MNIST_DIR "/usr/share/datasets/mnist"

/* Start from cx_mnist_default_opts() (it sets struct_size, core.h). */
typedef struct {
    size_t struct_size;
    cx_mnist_kind kind;
    const char *dir;   /* NULL: CX_FASHION_MNIST_DIR or CX_MNIST_DIR by kind */
    bool train;        /* train-* (60000) or t10k-* (10000) files */
} cx_mnist_opts;

/* kind Fashion-MNIST, default dir, train split. */
static inline cx_mnist_opts cx_mnist_default_opts(void)
{
    cx_mnist_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.kind = CX_DATASET_FASHION_MNIST;
    o.dir = NULL;
    o.train = true;
    return o;
}

/* Loads images and labels of one split, 10 classes, normalized with mean
 * 0.2860, std 0.3530 (Fashion-MNIST) or 0.1307, 0.3081 (MNIST). Files are
 * looked up as <dir>/<split>-images-idx3-ubyte[.gz] and
 * <dir>/<split>-labels-idx1-ubyte[.gz].
 * @return CX_OK; CX_ERR_IO when a file is missing (the message names the
 * path and, for the default Fashion-MNIST dir, the Debian package
 * dataset-fashion-mnist that provides it), corrupt, or when images and labels
 * disagree; CX_ERR_ARG on a struct_size below the first version's; CX_ERR_OOM. */
CX_API cx_status cx_mnist_load(cx_mnist_opts opts, cx_dataset **out);

/* Start from cx_fake_data_default_opts() (it sets struct_size, core.h). */
typedef struct {
    size_t struct_size;
    int64_t size;        /* samples */
    int channels, height, width;
    int num_classes;
    uint64_t seed;       /* same seed, same data */
} cx_fake_data_opts;

/* 60000 samples of 1x28x28, 10 classes, seed 0. */
static inline cx_fake_data_opts cx_fake_data_default_opts(void)
{
    cx_fake_data_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.size = 60000;
    o.channels = 1;
    o.height = 28;
    o.width = 28;
    o.num_classes = 10;
    o.seed = 0;
    return o;
}
#define CX_FAKE_DATA_MAX_CLASSES 1000000
/* Random pixels and labels from a fixed seed, normalized like MNIST. Each
 * sample is generated from (seed, index) when a batch is collated: memory
 * stays flat whatever the size and shape (ImageNet-shaped: 3x224x224,
 * 1000 classes).
 * @return CX_OK, CX_ERR_ARG on a non-positive size or shape, an image of
 * 2^31 elements or more, more than CX_FAKE_DATA_MAX_CLASSES classes or a
 * struct_size below the first version's, CX_ERR_OOM. */
CX_API cx_status cx_fake_data(cx_fake_data_opts opts, cx_dataset **out);

/* ---- image folders (torchvision's ImageFolder) ------------------------------ */

/* root/<class>/<image>: the classes are root's subdirectories in sorted
 * (strcmp) order, label = position (torchvision's class_to_idx); the
 * samples are the regular files (symlinks followed) ending in .jpg, .jpeg
 * or .png (any case) under each class directory, class after class, walked
 * as torchvision walks them (sorted(os.walk()): a directory's files sorted
 * by name, then its subdirectories in sorted order, at most 32 levels
 * below the class directory: deeper ones are not walked); torchvision's other
 * extensions (.bmp, .webp, .tif, ...) are not read. An image's name on
 * something else (a FIFO, socket, device or dangling symlink) is left out
 * with a warning naming it at open. A subdirectory that is root, a class
 * directory or one already walked in the class (a symlink loop) is left
 * out with a warning naming it, so each image counts once. Files are decoded
 * when an item is read, by content (libjpeg-turbo, libspng), into 8-bit
 * RGB: grayscale and palette images are expanded, alpha is dropped (PIL's
 * convert("RGB")). Fields: "images" f32 (3, S, S) and "labels" i64 ().
 *
 * Transforms (torchvision's ImageNet recipe, S = image_size):
 *   train: RandomResizedCrop(S, scale=(0.08, 1), ratio=(3/4, 4/3)) with its
 *     10 tries and center-crop fallback, RandomHorizontalFlip(0.5);
 *   eval:  Resize(resize_size) of the shorter side, CenterCrop(S);
 *   both:  ToTensor + Normalize(mean, std), in f32.
 * Resizing is PIL's bilinear resampling as Image.resize does it (what
 * torchvision applies to PIL images): a triangle filter widened by the
 * scale factor when shrinking (antialiased), fixed-point 8-bit passes,
 * horizontal then vertical; so the eval transform gives torchvision's
 * values exactly (PNG, and JPEG where no DCT scaling applies: libjpeg-turbo
 * decodes as PIL does), except for 16-bit grayscale PNGs: PIL opens them
 * in mode "I" and its convert("RGB") clips values to 255, where this
 * takes each sample's high byte (v >> 8), which keeps the image. jpeg_fast takes libjpeg-turbo's fast
 * paths: a training crop decodes only the crop's pixels (cropped and
 * skipped scanlines: the same pixels, less work), and a JPEG whose crop
 * (train) or resize (eval) shrinks by 2x or more is decoded at 1/2, 1/4
 * or 1/8 scale by DCT scaling (PIL's draft mode), keeping at least the
 * output's size per side, then resampled: faster, slightly different
 * pixels.
 *
 * Randomness: item i's draws in epoch e come from a hash of (seed, e, i)
 * only, so they do not depend on the loader's workers or their order.
 *
 * Bad files (not an image, zero bytes, corrupt or truncated data, a CMYK
 * JPEG, an image under 1x1 or over 2^28 pixels, a file over 256 MB, which
 * is refused by its size before it is read, or one that is no longer a
 * regular file when read): a file is read whole only after its first
 * bytes show a JPEG or PNG signature. With on_error CX_IMAGE_ERRORS_STOP
 * the read fails with one line naming the file (the loader's batch fails: cx_loader_error); with
 * CX_IMAGE_ERRORS_SKIP the item is replaced by the next sample (in index
 * order, wrapping) that decodes, each bad file is logged once as a warning
 * naming it, and cx_imagefolder_skipped counts them. File names in errors
 * and warnings have control bytes, invalid UTF-8 and backslashes written
 * as \xNN. Items are safe to read
 * concurrently (the data set is declared `concurrent`). */
typedef enum { CX_IMAGE_ERRORS_STOP = 0, CX_IMAGE_ERRORS_SKIP } cx_image_errors;

/* Start from cx_imagefolder_default_opts() (it sets struct_size, core.h). */
typedef struct {
    size_t struct_size;
    const char *root;            /* the folder of class folders (copied) */
    bool train;                  /* the training transform, else eval's */
    int image_size;              /* S: 1 .. 8192 */
    int resize_size;             /* eval's shorter side, >= S; 0: S * 256 / 224 */
    float mean[3], std[3];       /* per RGB channel; std > 0 */
    uint64_t seed;               /* the training draws */
    cx_image_errors on_error;
    bool jpeg_fast;              /* JPEG: partial and DCT-scaled decoding */
} cx_imagefolder_opts;

/* train, S 224, resize 256, ImageNet's mean (0.485, 0.456, 0.406) and std
 * (0.229, 0.224, 0.225), seed 0, stop on bad files, jpeg_fast on. */
static inline cx_imagefolder_opts cx_imagefolder_default_opts(void)
{
    cx_imagefolder_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.root = NULL;
    o.train = true;
    o.image_size = 224;
    o.resize_size = 0;
    o.mean[0] = 0.485f, o.mean[1] = 0.456f, o.mean[2] = 0.406f;
    o.std[0] = 0.229f, o.std[1] = 0.224f, o.std[2] = 0.225f;
    o.seed = 0;
    o.on_error = CX_IMAGE_ERRORS_STOP;
    o.jpeg_fast = true;
    return o;
}
/* Lists root's classes and samples (no file is decoded yet).
 * @return CX_OK and *out; CX_ERR_IO when root is missing or unreadable, has
 * no class directory, or a class directory holds no image (the message
 * names the path); CX_ERR_ARG on a NULL root, an image_size outside
 * 1..8192, (eval) a resize_size below image_size or above 65536, a std not
 * > 0 (NaN included), a non-finite mean, a bad on_error, or a struct_size
 * below the first version's; CX_ERR_OOM. */
CX_API cx_status cx_imagefolder_open(cx_imagefolder_opts opts, cx_dataset **out);
/* @return the number of classes, or 0 when ds is not an image folder. */
CX_API int cx_imagefolder_num_classes(const cx_dataset *ds);
/* @return the name of class c (owned by the data set), or NULL when ds is
 * not an image folder or c is out of range. */
CX_API const char *cx_imagefolder_class_name(const cx_dataset *ds, int c);
/* @return the path of sample i (owned by the data set), or NULL when ds is
 * not an image folder or i is out of range. */
CX_API const char *cx_imagefolder_path(const cx_dataset *ds, int64_t i);
/* @return the distinct bad files skipped so far (skip mode), 0 when ds is
 * not an image folder. */
CX_API int64_t cx_imagefolder_skipped(const cx_dataset *ds);

/* ---- text ------------------------------------------------------------------ */

/* A text data set cuts a corpus into windows of block + 1 tokens. Its
 * fields are "x", the first block tokens, and "y", the last block (x
 * shifted by one: the next-token targets), both i64 (block).
 *
 * The corpus file is memory-mapped, never read into memory. It is either
 * CX_TEXT_BYTES, a text file whose bytes are the tokens (vocab 256), split
 * into train (the first floor(len * train_fraction) bytes) and val (the
 * rest); or CX_TEXT_U16, little-endian uint16 tokens (nanoGPT's train.bin /
 * val.bin), one split already, taken whole.
 *
 * Training windows (eval_windows 0): each epoch the split is cut into
 * n = max(1, floor((len - block) / (block + 1))) disjoint windows on a grid
 * of stride block + 1, window i starting at phase + i * (block + 1). The
 * phase is drawn from (seed, epoch), uniform in [0, len - n * (block + 1)],
 * a range that holds every offset 0..block once the split has 2 * block + 1
 * tokens; so the windows never overlap within an epoch, move from epoch to
 * epoch, and together with the sampler (disjoint indices per rank, shuffled
 * by its own seed and the epoch) depend only on the seeds, the epoch and
 * the rank. The loader sets the epoch (cx_loader_set_epoch).
 *
 * Evaluation windows (eval_windows = n > 0): n fixed windows, window w
 * starting at token w * floor((len - block - 1) / n), whatever the epoch.
 *
 * Tokens are checked against vocab_size as windows are read: a larger one
 * fails that batch (cx_loader_error) with a message naming the file, so a
 * large token file is never scanned as a whole. */
typedef enum { CX_TEXT_BYTES = 0, CX_TEXT_U16 } cx_text_format;

#define CX_FIELD_X "x"
#define CX_FIELD_Y "y"

/* Start from cx_text_default_opts() (it sets struct_size, core.h). */
typedef struct {
    size_t struct_size;
    const char *path;
    cx_text_format format;
    int64_t block;            /* tokens per x and per y, >= 1 */
    int64_t vocab_size;       /* tokens must be below it; 0: 256 (bytes) or 65536 (u16) */
    bool val;                 /* CX_TEXT_BYTES: the val split instead of train */
    double train_fraction;    /* CX_TEXT_BYTES: in (0, 1) */
    uint64_t seed;            /* training windows' phase */
    int64_t eval_windows;     /* 0: training windows; n > 0: n evenly spaced windows */
} cx_text_opts;

/* Bytes, block 256, vocab 256, train split of 0.9, seed 0, training windows. */
static inline cx_text_opts cx_text_default_opts(void)
{
    cx_text_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.path = NULL;
    o.format = CX_TEXT_BYTES;
    o.block = 256;
    o.vocab_size = 0;
    o.val = false;
    o.train_fraction = 0.9;
    o.seed = 0;
    o.eval_windows = 0;
    return o;
}
/* Opens (maps) a corpus as a text data set.
 * @return CX_OK and *out; CX_ERR_IO when the file is missing or unreadable,
 * a split is shorter than one window (block + 1 tokens), a token file has an
 * odd number of bytes, or the evaluation windows do not fit (more than
 * len - block - 1 of them, beyond one), the message naming the file;
 * CX_ERR_ARG on a bad block, vocab size, fraction, format or struct_size
 * (below the first version's); CX_ERR_OOM. */
CX_API cx_status cx_text_open(cx_text_opts opts, cx_dataset **out);

/* ---- sampler ------------------------------------------------------------ */

/* Like torch.utils.data.DistributedSampler: each epoch a permutation of the
 * data set (seeded by seed + epoch) is padded (or, with drop_last, cut) to a
 * multiple of world_size, and rank r takes every world_size-th index from r. */
/* Start from cx_sampler_default_opts() (it sets struct_size, core.h). */
typedef struct {
    size_t struct_size;
    bool shuffle;
    uint64_t seed;
    int rank;
    int world_size;
    bool drop_last;
} cx_sampler_opts;

typedef struct cx_sampler cx_sampler;

/* shuffle on, seed 0, rank 0 of 1, drop_last off. */
static inline cx_sampler_opts cx_sampler_default_opts(void)
{
    cx_sampler_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.shuffle = true;
    o.seed = 0;
    o.rank = 0;
    o.world_size = 1;
    o.drop_last = false;
    return o;
}
/* @return a sampler over `dataset_size` indices, or NULL with cx_last_error
 * set when the rank is outside [0, world_size), the size is not positive or
 * the struct_size is below the first version's. */
CX_API cx_sampler *cx_sampler_new(int64_t dataset_size, cx_sampler_opts opts);
CX_API void cx_sampler_free(cx_sampler *s);
/* Starts epoch `epoch` at position 0 (its own permutation). */
CX_API void cx_sampler_set_epoch(cx_sampler *s, int64_t epoch);
CX_API int64_t cx_sampler_epoch(const cx_sampler *s);
/* Indices this rank takes per epoch. */
CX_API int64_t cx_sampler_len(const cx_sampler *s);
/* Indices already taken this epoch: save it in a checkpoint, restore it with
 * cx_sampler_set_position to resume mid-epoch. */
CX_API int64_t cx_sampler_position(const cx_sampler *s);
/* @return CX_OK, CX_ERR_ARG outside [0, cx_sampler_len]. */
CX_API cx_status cx_sampler_set_position(cx_sampler *s, int64_t pos);
/* Takes up to `n` next indices into `out`. @return how many (0 at the end). */
CX_API int64_t cx_sampler_take(cx_sampler *s, int64_t *out, int64_t n);

/* ---- loader --------------------------------------------------------------- */

/* Start from cx_loader_default_opts() (it sets struct_size, core.h). */
typedef struct {
    size_t struct_size;
    int64_t batch_size;
    bool drop_last;     /* drop the last, incomplete batch of an epoch */
    int prefetch;       /* batches prepared ahead of the one in use (>= 1) */
    /* Like MpDeviceLoader: cx_loader_next ends the step the loader began for
     * the previous batch and begins a new one; the last call (returning
     * CX_LOADER_END or CX_LOADER_ERROR) ends the last step. Off: the caller
     * marks steps itself. */
    bool mark_step;
    /* SPMD (MpDeviceLoader's input_sharding): each batch is global, and this
     * rank reads and uploads only its shard of it. input_spec applies to
     * every field of rank input_nspec; other fields split their batch
     * dimension as input_spec[0] does (the entries are copied; axis names
     * must stay valid). NULL mesh: off. */
    const cx_mesh *input_mesh;
    const cx_spec_entry *input_spec;
    int input_nspec;
    /* Later members (a struct_size from before them reads the defaults).
     * num_workers 0: one background thread gathers and uploads each batch
     * in turn (the data set's callbacks one at a time). num_workers N > 0,
     * for a data set declared `concurrent` (others keep the one thread):
     * N threads gather the items of the posted batches in parallel, up to
     * host_prefetch gathered batches (the seed's loader_prefetch_size) wait
     * beyond the `prefetch` ones uploaded ahead (device_prefetch_size), and
     * one thread uploads them in order. A batch's contents never depend on
     * N or on which thread gathered what. */
    int num_workers;    /* 0 .. 256 */
    int host_prefetch;  /* >= 1; used when num_workers > 0 */
} cx_loader_opts;

/* batch 64, drop_last off, prefetch 2, mark_step on, no workers, host_prefetch 2. */
static inline cx_loader_opts cx_loader_default_opts(void)
{
    cx_loader_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.batch_size = 64;
    o.drop_last = false;
    o.prefetch = 2;
    o.mark_step = true;
    o.num_workers = 0;
    o.host_prefetch = 2;
    return o;
}

typedef struct cx_loader cx_loader;

/* One batch: a tensor per field of the data set, in its field order. */
typedef struct {
    cx_tensor *const *fields;    /* nfields tensors (size, field shape...); owned by the loader */
    int nfields;
    int64_t size;                /* B */
    int64_t index;               /* batch number within the epoch */
    const cx_dataset *dataset;   /* whose fields these are */
} cx_batch;

/* @return the tensor of the field called `name` (owned by the loader), or,
 * when there is no such field, a poisoned tensor naming it (a new handle,
 * like any op's result), so the error surfaces at the step's sync. */
CX_API cx_tensor *cx_batch_field(const cx_batch *b, const char *name);

/* A loader over `ds` in the order of `sampler` (both borrowed; they must
 * outlive it, and both are only touched by the thread calling the loader,
 * apart from the data set's get/collate on the loader's own thread). A
 * background thread gathers and uploads the next batches while the current
 * step runs. The data set's set_epoch is called here with the sampler's
 * epoch, and at each cx_loader_set_epoch.
 * @return a loader, or NULL with cx_last_error set (bad batch size,
 * prefetch, num_workers or host_prefetch, a struct_size below the first
 * version's, no thread, out of memory). */
CX_API cx_loader *cx_loader_new(cx_dataset *ds, cx_sampler *sampler, cx_loader_opts opts);
/* Stops the background thread and frees the batches still held. NULL is fine. */
CX_API void cx_loader_free(cx_loader *l);
/* Batches per epoch. */
CX_API int64_t cx_loader_len(const cx_loader *l);
/* Starts epoch `epoch` (the data set's set_epoch, then the sampler's
 * permutation) at sample position `position` (0, or a checkpoint's
 * cx_loader_position to resume).
 * @return CX_OK or CX_ERR_ARG on a bad position. */
CX_API cx_status cx_loader_set_epoch(cx_loader *l, int64_t epoch, int64_t position);
/* Samples handed out so far this epoch (prefetched ones excluded). */
CX_API int64_t cx_loader_position(const cx_loader *l);
/* What cx_loader_next handed out. Only a batch is > 0, so loop with
 * `while ((r = cx_loader_next(l, &b)) > 0)` and test r < 0 after the loop:
 * an error ends the epoch early and must not pass for its end. */
typedef enum {
    CX_LOADER_ERROR = -1,   /* cx_last_error and cx_loader_error say what failed */
    CX_LOADER_END = 0,      /* the epoch is over: cx_loader_set_epoch starts the next */
    CX_LOADER_BATCH = 1,    /* `out` holds the next batch */
} cx_loader_result;

/* Hands out the next batch. The previous batch's tensors are released here
 * (after its step ended, when mark_step is on), so a batch is valid until the
 * next call. @return CX_LOADER_BATCH with `out` filled; CX_LOADER_END at the
 * end of the epoch (and at every call after it); CX_LOADER_ERROR when a
 * gather, upload or the ended step failed (once: later calls give
 * CX_LOADER_END, while cx_loader_error keeps the error). `out` is zeroed
 * unless a batch is given. */
CX_API cx_loader_result cx_loader_next(cx_loader *l, cx_batch *out);
/* With mark_step: ends the step begun for the current batch and releases the
 * batch, e.g. when a loop stops before the end of the epoch (prefetched
 * batches stay; the next cx_loader_next continues with them). Harmless when
 * no step is open. @return the status of cx_step_end (CX_OK when none). */
CX_API cx_status cx_loader_end_step(cx_loader *l);
/* @return CX_OK, or the error that ended the last epoch early (a failed
 * gather, upload or step). */
CX_API cx_status cx_loader_error(const cx_loader *l);

#ifdef __cplusplus
}
#endif
#endif
