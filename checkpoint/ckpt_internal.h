/* Internals of the checkpoint module. Only checkpoint/ (and white-box
 * tests) include this file. */
#ifndef CX_CKPT_INTERNAL_H
#define CX_CKPT_INTERNAL_H

#include <cxla/checkpoint.h>

#include <hdf5.h>
#include <stdio.h>

#define CKPT_FORMAT_NAME "cxla-checkpoint"
#define CKPT_MARKER_MAGIC "cxla-checkpoint-commit"
/* Elements moved per read/write when streaming: bounds the tool's buffers. */
#define CKPT_STREAM_ELEMS ((int64_t)4 << 20)

/* ---- checksum: a 64-bit, 4-lane multiply-rotate hash (fast enough to run
 * at memory speed, so verifying a file costs about one page-cache read) -- */

typedef struct {
    uint64_t v[4];
    uint64_t total;
    unsigned char buf[32];
    size_t nbuf;
} ckpt_hash;

void ckpt_hash_init(ckpt_hash *h);
void ckpt_hash_update(ckpt_hash *h, const void *data, size_t n);
uint64_t ckpt_hash_final(const ckpt_hash *h);
uint64_t ckpt_hash_bytes(const void *data, size_t n);
/* Hashes a whole file (optionally fsyncing it first). */
cx_status ckpt_hash_file(const char *path, bool fsync_first, uint64_t *hash, int64_t *size);

/* ---- HDF5 --------------------------------------------------------------- */

/* Turns off HDF5's automatic error printing (errors become one-line
 * messages) and registers the zstd filter. Idempotent. @return 0 or -1. */
int ckpt_h5_init(void);
/* The most specific message on HDF5's error stack ("" if none). */
const char *ckpt_h5_msg(void);
int ckpt_zstd_register(void);

hid_t ckpt_h5_type(cx_dtype dt);          /* file/memory type (native LE) */
int ckpt_attr_write_str(hid_t obj, const char *name, const char *v);
int ckpt_attr_write_i64(hid_t obj, const char *name, int64_t v);
int ckpt_attr_write_u64(hid_t obj, const char *name, uint64_t v);
/* @return 0, or -1 when missing or of another kind. */
int ckpt_attr_read_str(hid_t obj, const char *name, char *out, size_t cap);
int ckpt_attr_read_i64(hid_t obj, const char *name, int64_t *v);
int ckpt_attr_read_u64(hid_t obj, const char *name, uint64_t *v);
/* A group that tracks creation order, so iteration is the save order. */
hid_t ckpt_group_create(hid_t parent, const char *name);
/* Selects the row-major element range [a, b) of a dataspace with `dims`
 * as a union of boxes. @return 0 or -1. */
int ckpt_select_range(hid_t space, const hsize_t *dims, int ndim, int64_t a, int64_t b);

/* ---- shard metadata (an owned copy of cx_fsdp_unit_info) ------------------ */

typedef struct {
    char *name;
    int ndim;
    int64_t shape[CX_MAX_DIMS];
    int64_t numel, offset;
} ckpt_pinfo;

typedef struct {
    char *path, *flat_name;
    int nparams;
    ckpt_pinfo *params;
    int64_t flat_numel, padded_numel, shard_numel, padding;
    int world, rank;
    int64_t shard_offset;
} ckpt_unit;

void ckpt_units_free(ckpt_unit *u, int n);
cx_status ckpt_units_write(hid_t file, const ckpt_unit *u, int n);
/* Reads /shard_metadata. */
cx_status ckpt_units_read(hid_t file, const char *path, ckpt_unit **out, int *n);
/* Units of `world` ranks (rank `rank`) over the same parameters. */
cx_status ckpt_units_relayout(const ckpt_unit *src, int n, int world, int rank, int multiple, ckpt_unit **out);

/* ---- what a save or load works on ------------------------------------------ */

typedef struct {
    cx_ckpt_strategy strategy;
    bool sharded;
    cx_module *module;     /* parameters (unsharded) and buffers */
    int nunits;            /* sharded: */
    ckpt_unit *units;      /*   layout of this rank (owned) */
    cx_tensor **flat;      /*   the local shard of each unit (borrowed) */
} ckpt_view;

cx_status ckpt_view_of(cx_ckpt_model m, ckpt_view *v);
void ckpt_view_release(ckpt_view *v);
cx_status ckpt_save_view(const char *prefix, const ckpt_view *v, cx_optimizer *opt, const cx_ckpt_extra *extra,
                         cx_ckpt_opts opts);
cx_status ckpt_load_view(const char *prefix, const char *single_file, const ckpt_view *v, cx_optimizer *opt,
                         cx_ckpt_extra *extra, cx_ckpt_opts opts);

/* ---- file names and the commit marker ---------------------------------------- */

/* <prefix>_rank-<r>-of-<w>.h5 */
void ckpt_file_name(char *out, size_t cap, const char *prefix, int r, int w);
void ckpt_marker_name(char *out, size_t cap, const char *prefix);

typedef struct {
    char name[512];    /* base name */
    int64_t size;
    uint64_t hash;
} ckpt_marker_file;

typedef struct {
    int version;
    int world;
    char strategy[32];
    int64_t step;
    int nfiles;
    ckpt_marker_file *files;
} ckpt_marker;

/* Writes <prefix>.commit atomically (temp, fsync, rename, fsync dir). */
cx_status ckpt_marker_write(const char *prefix, const ckpt_marker *m);
/* @return CX_OK, CX_ERR_IO when missing or malformed. */
cx_status ckpt_marker_read(const char *prefix, ckpt_marker *m);
void ckpt_marker_release(ckpt_marker *m);
/* Directory of a path ("." if none) and fsync of it (renames durable). */
void ckpt_dir_of(const char *path, char *out, size_t cap);
int ckpt_fsync_dir(const char *path);

/* ---- reading: any committed checkpoint as full tensors ------------------------ */

typedef struct {
    char *path;
    hid_t fid;
    int rank;
    int64_t size;
    bool verified;
    uint64_t marker_hash;
    bool have_marker_hash;
} ckpt_file;

typedef struct {
    char *key;             /* "fc1.weight" */
    char *state;           /* NULL for /model, else "exp_avg" */
    char *h5path;          /* the dataset holding it ("/model/flat_param" when sharded) */
    bool is_param;         /* model: parameter (true) or buffer */
    int ndim;
    int64_t shape[CX_MAX_DIMS];
    int64_t numel;
    cx_dtype dtype;
    int unit, pidx;        /* sharded params/state: where in the flat layout; -1 otherwise */
    bool replicated;       /* read from one file (buffers, 0-d state, unsharded) */
} ckpt_entry;

typedef struct {
    char prefix[4096];
    int nfiles;
    ckpt_file *files;      /* by rank */
    int world;
    char strategy[32];
    char optimizer[32];
    int64_t step, epoch, sampler_position, optimizer_steps;
    uint64_t rng_seed, rng_offset;
    bool sharded;
    int nunits;
    ckpt_unit *units;      /* rank 0's copy, checked equal on every file */
    int nentries;
    ckpt_entry *entries;   /* model then optimizer */
    int home;              /* file used for replicated data */
    bool per_dataset;      /* check each whole-dataset read against its cxh64 */
} ckpt_src;

/* Opens and validates the committed checkpoint `prefix` (files matching
 * `suffix`), or with `single_file` one full file without a marker.
 * verify_all: check every checksum now (else lazily, per file read). */
cx_status ckpt_src_open(ckpt_src *s, const char *prefix, const char *suffix, const char *single_file,
                        bool verify_all, int home_rank);
void ckpt_src_close(ckpt_src *s);
/* Checks file r against the marker's checksum (once). */
cx_status ckpt_src_verify(ckpt_src *s, int r);
const ckpt_entry *ckpt_src_find(const ckpt_src *s, const char *key, const char *state);
/* Reads the row-major elements [a, b) of an entry (its dtype) into buf. */
cx_status ckpt_src_read(ckpt_src *s, const ckpt_entry *e, int64_t a, int64_t b, void *buf);

/* ---- writing ---------------------------------------------------------------- */

/* Creates a dataset (chunked + zstd when level > 0). @return id or -1. */
hid_t ckpt_dataset_create(hid_t parent, const char *name, cx_dtype dt, const int64_t *shape, int ndim, int level);
/* Writes the whole dataset from buf and sets its "cxh64" attribute. */
int ckpt_dataset_write_all(hid_t d, cx_dtype dt, const void *buf, int64_t numel);
int ckpt_dataset_write_range(hid_t d, cx_dtype dt, const int64_t *shape, int ndim, int64_t a, int64_t b,
                             const void *buf);
int ckpt_dataset_attrs(hid_t d, cx_dtype dt, const char *kind, uint64_t hash);
/* Copies src into dst (cap bytes), truncating. */
void ckpt_strlcpy(char *dst, size_t cap, const char *src);
/* Splits "fc1.weight.exp_avg" at the last dot. @return 0 or -1. */
int ckpt_split_state(const char *full, char *param, size_t cap, const char **state);

/* ---- test hooks ---------------------------------------------------------------- */

/* Called at named points of a save ("file-written", "renamed", "before-marker",
 * "committed"), so tests can crash a save there. NULL in normal runs. */
extern void (*ckpt_test_hook)(const char *phase);

#endif
