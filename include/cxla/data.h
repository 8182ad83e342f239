/* cxla data: IDX files (MNIST, Fashion-MNIST), fake data, a deterministic
 * rank-aware shuffling sampler and a prefetching loader.
 *
 * A data set lives on the host as 8-bit pixels plus per-set normalization
 * (pixels / 255, then (p - mean) / std); a batch is normalized on the host by
 * the loader's background thread and uploaded as (B, C, H, W) f32 images and
 * (B) i64 labels.
 */
#ifndef CXLA_DATA_H
#define CXLA_DATA_H

#include <cxla/core.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- IDX files ---------------------------------------------------------- */

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

/* ---- data sets ------------------------------------------------------------ */

typedef struct cx_dataset cx_dataset;

typedef enum { CX_DATASET_FASHION_MNIST = 0, CX_DATASET_MNIST } cx_mnist_kind;

#define CX_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#define CX_MNIST_DIR "/usr/share/datasets/mnist"

typedef struct {
    cx_mnist_kind kind;
    const char *dir;   /* NULL: CX_FASHION_MNIST_DIR or CX_MNIST_DIR by kind */
    bool train;        /* train-* (60000) or t10k-* (10000) files */
} cx_mnist_opts;

/* kind Fashion-MNIST, default dir, train split. */
CX_API cx_mnist_opts cx_mnist_default_opts(void);

/* Loads images and labels of one split. Files are looked up as
 * <dir>/<split>-images-idx3-ubyte[.gz] and <dir>/<split>-labels-idx1-ubyte[.gz].
 * @return CX_OK; CX_ERR_IO when a file is missing (the message names the
 * path and, for the default Fashion-MNIST dir, the Debian package
 * dataset-fashion-mnist that provides it), corrupt, or when images and labels
 * disagree; CX_ERR_OOM. */
CX_API cx_status cx_mnist_load(cx_mnist_opts opts, cx_dataset **out);

typedef struct {
    int64_t size;        /* samples */
    int channels, height, width;
    int num_classes;
    uint64_t seed;       /* same seed, same data */
} cx_fake_data_opts;

/* 60000 samples of 1x28x28, 10 classes, seed 0. */
CX_API cx_fake_data_opts cx_fake_data_default_opts(void);
/* Random pixels and labels from a fixed seed, normalized like MNIST.
 * @return CX_OK, CX_ERR_ARG on a non-positive size, CX_ERR_OOM. */
CX_API cx_status cx_fake_data(cx_fake_data_opts opts, cx_dataset **out);

CX_API void cx_dataset_free(cx_dataset *ds);
CX_API int64_t cx_dataset_size(const cx_dataset *ds);
/* Per-sample image shape (C, H, W). */
CX_API void cx_dataset_image_shape(const cx_dataset *ds, int64_t chw[3]);
CX_API int cx_dataset_num_classes(const cx_dataset *ds);
/* Raw pixels of sample i (C*H*W bytes) and its label. */
CX_API const uint8_t *cx_dataset_pixels(const cx_dataset *ds, int64_t i);
CX_API int64_t cx_dataset_label(const cx_dataset *ds, int64_t i);
/* The normalization applied to pixels / 255. */
CX_API void cx_dataset_normalization(const cx_dataset *ds, float *mean, float *std);
/* Writes the normalized images (n, C, H, W) and labels (n) of the samples
 * `idx[0..n)` into `images` and `labels` (either may be NULL). */
CX_API void cx_dataset_gather(const cx_dataset *ds, const int64_t *idx, int64_t n,
                       float *images, int64_t *labels);

/* ---- sampler ------------------------------------------------------------ */

/* Like torch.utils.data.DistributedSampler: each epoch a permutation of the
 * data set (seeded by seed + epoch) is padded (or, with drop_last, cut) to a
 * multiple of world_size, and rank r takes every world_size-th index from r. */
typedef struct {
    bool shuffle;
    uint64_t seed;
    int rank;
    int world_size;
    bool drop_last;
} cx_sampler_opts;

typedef struct cx_sampler cx_sampler;

/* shuffle on, seed 0, rank 0 of 1, drop_last off. */
CX_API cx_sampler_opts cx_sampler_default_opts(void);
/* @return a sampler over `dataset_size` indices, or NULL with cx_last_error
 * set when the rank is outside [0, world_size) or the size is not positive. */
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

typedef struct {
    int64_t batch_size;
    bool drop_last;     /* drop the last, incomplete batch of an epoch */
    int prefetch;       /* batches prepared ahead of the one in use (>= 1) */
    /* Like MpDeviceLoader: cx_loader_next ends the step the loader began for
     * the previous batch and begins a new one; the last call (returning
     * false) ends the last step. Off: the caller marks steps itself. */
    bool mark_step;
} cx_loader_opts;

/* batch 64, drop_last off, prefetch 2, mark_step on. */
CX_API cx_loader_opts cx_loader_default_opts(void);

typedef struct cx_loader cx_loader;

typedef struct {
    cx_tensor *images;   /* (B, C, H, W) f32, normalized; owned by the loader */
    cx_tensor *labels;   /* (B) i64; owned by the loader */
    int64_t size;        /* B */
    int64_t index;       /* batch number within the epoch */
} cx_batch;

/* A loader over `ds` in the order of `sampler` (both borrowed; they must
 * outlive it, and the sampler is only touched by the thread calling the
 * loader). A background thread gathers, normalizes and uploads the next
 * batches while the current step runs.
 * @return a loader, or NULL with cx_last_error set (bad batch size, no
 * thread). */
CX_API cx_loader *cx_loader_new(const cx_dataset *ds, cx_sampler *sampler, cx_loader_opts opts);
/* Stops the background thread and frees the batches still held. NULL is fine. */
CX_API void cx_loader_free(cx_loader *l);
/* Batches per epoch. */
CX_API int64_t cx_loader_len(const cx_loader *l);
/* Starts epoch `epoch` (sampler permutation) at sample position `position`
 * (0, or a checkpoint's cx_loader_position to resume).
 * @return CX_OK or CX_ERR_ARG on a bad position. */
CX_API cx_status cx_loader_set_epoch(cx_loader *l, int64_t epoch, int64_t position);
/* Samples handed out so far this epoch (prefetched ones excluded). */
CX_API int64_t cx_loader_position(const cx_loader *l);
/* Hands out the next batch. The previous batch's tensors are released here
 * (after its step ended, when mark_step is on), so a batch is valid until the
 * next call. @return true with `out` filled, false at the end of the epoch or
 * on an error (then cx_last_error is set: check cx_loader_error). */
CX_API bool cx_loader_next(cx_loader *l, cx_batch *out);
/* With mark_step: ends the step begun for the current batch and releases the
 * batch, e.g. when a loop stops before the end of the epoch (prefetched
 * batches stay; the next cx_loader_next continues with them). Harmless when
 * no step is open. @return the status of cx_step_end (CX_OK when none). */
CX_API cx_status cx_loader_end_step(cx_loader *l);
/* @return CX_OK, or the error that ended the last epoch early (a failed
 * upload or step). */
CX_API cx_status cx_loader_error(const cx_loader *l);

#ifdef __cplusplus
}
#endif
#endif
