/* Internals of the checkpoint module. Only checkpoint/ (and white-box
 * tests) include this file. */
#ifndef CX_CKPT_INTERNAL_H
#define CX_CKPT_INTERNAL_H

#include <cxla/checkpoint.h>
#include <cxla/spmd.h>

#include <hdf5.h>
#include <stdio.h>

#include "cx_hash.h"

#define CKPT_FORMAT_NAME "cxla-checkpoint"
#define CKPT_MARKER_MAGIC "cxla-checkpoint-commit"
/* The oldest format version still read (CX_CKPT_FORMAT_VERSION is the one
 * written): version 1 differs only in its checksums (cxh64). */
#define CKPT_OLDEST_VERSION 1
/* Elements moved per read/write when streaming: bounds the tool's buffers. */
#define CKPT_STREAM_ELEMS ((int64_t)4 << 20)

/* ---- errors (ckpt_error.c) ------------------------------------------------------ */

/* Sets this thread's one-line error from fmt, which may quote the previous
 * error (cx_last_error()) among its arguments. @return st */
cx_status ckpt_fail(cx_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- checksums (ckpt_hash.c) --------------------------------------------------
 * XXH3-64 since format version 2. Version-1 files carry cxh64, a 4-lane
 * multiply-rotate hash kept only to read them (ckpt_hash_v1.c). */

typedef struct {
    uint64_t v[4];
    uint64_t total;
    unsigned char buf[32];
    size_t nbuf;
} ckpt_cxh64_v1;

void ckpt_cxh64_v1_init(ckpt_cxh64_v1 *h);
void ckpt_cxh64_v1_update(ckpt_cxh64_v1 *h, const void *data, size_t n);
uint64_t ckpt_cxh64_v1_final(const ckpt_cxh64_v1 *h);

/* The checksum of one format version, over data fed in pieces. */
typedef struct {
    int version;
    cx_hash64_stream xxh3;   /* version >= 2 */
    ckpt_cxh64_v1 v1;        /* version 1 */
} ckpt_hasher;

/* @return 0, or -1 when out of memory (error set). */
int ckpt_hasher_begin(ckpt_hasher *h, int version);
void ckpt_hasher_update(ckpt_hasher *h, const void *data, size_t n);
/* The checksum; releases the hasher. */
uint64_t ckpt_hasher_end(ckpt_hasher *h);
/* Releases a hasher whose checksum is not wanted. */
void ckpt_hasher_drop(ckpt_hasher *h);
/* The checksum this library writes, of a whole buffer. */
uint64_t ckpt_hash_bytes(const void *data, size_t n);
/* The checksum attribute of a tensor dataset in files of `version`. */
const char *ckpt_hash_attr(int version);
/* Hashes a whole file with the checksum of `version` (optionally fsyncing
 * it first). */
cx_status ckpt_hash_file(const char *path, int version, bool fsync_first, uint64_t *hash, int64_t *size);

/* ---- HDF5 (ckpt_h5.c, ckpt_zstd.c) ---------------------------------------------- */

/* Turns off HDF5's automatic error printing (errors become one-line
 * messages) and registers the zstd filter. Idempotent. @return 0 or -1. */
int ckpt_h5_init(void);
/* The most specific message on HDF5's error stack ("" if none). */
/* Closes a file whose writes failed without leaving it to HDF5's exit handler. */
void ckpt_h5_discard_close(hid_t fid);
const char *ckpt_h5_msg(void);
int ckpt_zstd_register(void);
/* A compression level of the options: 0 (none) or a zstd level 1..22.
 * @return CX_OK, or CX_ERR_ARG naming `who`. */
cx_status ckpt_zstd_check_level(const char *who, int level);

hid_t ckpt_h5_type(cx_dtype dt);          /* file/memory type (native LE) */
/* The dtype t is saved in: f32 for a bf16 tensor under XLA_USE_BF16 /
 * XLA_DOWNCAST_BF16 (held as bf16, f32 to the program, as PyTorch/XLA
 * moves it to the CPU), else its own. */
cx_dtype ckpt_saved_dtype(const cx_tensor *t);
int ckpt_attr_write_str(hid_t obj, const char *name, const char *v);
int ckpt_attr_write_i64(hid_t obj, const char *name, int64_t v);
int ckpt_attr_write_u64(hid_t obj, const char *name, uint64_t v);
/* @return 0, or -1 when missing or of another kind. */
int ckpt_attr_read_str(hid_t obj, const char *name, char *out, size_t cap);
int ckpt_attr_read_i64(hid_t obj, const char *name, int64_t *v);
int ckpt_attr_read_u64(hid_t obj, const char *name, uint64_t *v);
/* An int64 array attribute of n values (a 1-D attribute; n may be 0). */
int ckpt_attr_write_i64s(hid_t obj, const char *name, const int64_t *v, int64_t n);
/* The same of `rank` dimensions (row-major values). */
int ckpt_attr_write_i64_array(hid_t obj, const char *name, const int64_t *v, int rank, const int64_t *dims);
/* Reads an int64 array attribute (any rank, row major) of at most cap
 * values into v, its number of values into *n. @return 0, or -1 when missing, not integers or longer than cap. */
int ckpt_attr_read_i64s(hid_t obj, const char *name, int64_t *v, int64_t cap, int64_t *n);
/* A group that tracks creation order, so iteration is the save order. */
hid_t ckpt_group_create(hid_t parent, const char *name);
/* parent/name, created (as above) unless it exists. On failure the error
 * names `file` and the group (`what`). @return the group or -1. */
hid_t ckpt_group_at(hid_t parent, const char *name, const char *file, const char *what);
/* The link names of a group, in creation order (name order for files
 * written without it). */
typedef struct {
    char **names;
    int n, cap;
} ckpt_name_list;
/* Lists parent/path (absent: an empty list). @return 0, or -1 (HDF5 error
 * or out of memory). */
int ckpt_list_group(hid_t parent, const char *path, ckpt_name_list *l);
void ckpt_name_list_free(ckpt_name_list *l);
/* Selects the row-major element range [a, b) of a dataspace with `dims`
 * as a union of boxes. @return 0 or -1. */
int ckpt_select_range(hid_t space, const hsize_t *dims, int ndim, int64_t a, int64_t b);
/* File creation with creation-order tracking and the 1.8 object format. */
hid_t ckpt_file_create(const char *path);

/* ---- the root attributes of a file (ckpt_root.c) ------------------------------------ */

typedef struct {
    int64_t format_version;
    char library_version[32];
    char strategy[32];
    int64_t world_size, rank, train_world_size;
    int64_t step, epoch, sampler_epoch, sampler_position;
    uint64_t rng_seed, rng_offset;
    char optimizer[32];
    int64_t optimizer_steps;
    char compression[32];
    int64_t consolidated_from_world_size;   /* 0: not consolidated */
    int64_t resharded_from_world_size;      /* 0: not resharded */
    char program_meta[CX_CKPT_META_MAX];    /* cx_ckpt_opts.meta; "": none */
} ckpt_root;

/* Creates `path` holding the root attributes of `r` (stamped with this
 * format and library version, sampler_epoch = epoch and the compression of
 * `level`) and an empty /model group. @return CX_OK with *fid and *model
 * open, or an error naming the file (nothing left open). */
cx_status ckpt_file_begin(const char *path, const ckpt_root *r, int level, hid_t *fid, hid_t *model);
/* Reads and checks the root attributes of an open file: the format magic,
 * a readable version, world size and rank. */
cx_status ckpt_root_read(hid_t fid, const char *path, ckpt_root *r);

/* ---- names (ckpt_names.c) --------------------------------------------------------- */

/* <prefix>_rank-<r>-of-<w>.h5 */
void ckpt_file_name(char *out, size_t cap, const char *prefix, int r, int w);
void ckpt_marker_name(char *out, size_t cap, const char *prefix);
/* The glob pattern of a prefix's files: the prefix (metacharacters
 * escaped) then `suffix` (NULL: CX_CKPT_DEFAULT_SUFFIX). */
void ckpt_glob_pattern(char *out, size_t cap, const char *prefix, const char *suffix);
/* Directory of a path ("." if none), and its last component. */
void ckpt_dir_of(const char *path, char *out, size_t cap);
const char *ckpt_base_name(const char *path);
/* Copies src into dst (cap bytes), truncating. */
void ckpt_strlcpy(char *dst, size_t cap, const char *src);
/* Splits "fc1.weight.exp_avg" at the last dot. @return 0 or -1. */
int ckpt_split_state(const char *full, char *param, size_t cap, const char **state);
/* "key" or "key.state", for messages. */
void ckpt_label(char *out, size_t cap, const char *key, const char *state);

/* ---- the commit marker (ckpt_marker.c) ---------------------------------------------- */

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
/* fsync of a path's directory (makes renames in it durable). */
int ckpt_fsync_dir(const char *path);

/* ---- the commit protocol (ckpt_commit.c) -------------------------------------------- */

/* Removes <prefix>.commit, if any: the checkpoint is uncommitted from here
 * on, before any of its files is replaced. */
cx_status ckpt_uncommit(const char *prefix);
/* Removes the files of `prefix` that a checkpoint of `nfiles` files does
 * not have (left by an earlier save with another world size). */
void ckpt_remove_stale(const char *prefix, int nfiles);
/* Makes the closed file `tmp` durable under its final name: fsync, hash
 * (this version's checksum), rename, fsync of the directory. Removes tmp
 * on failure. hash and size may be NULL. */
cx_status ckpt_publish(const char *tmp, const char *final, uint64_t *hash, int64_t *size);
/* Writes the marker listing the `world` files of `prefix`, with each
 * rank's file size and checksum. */
cx_status ckpt_commit(const char *prefix, int world, const char *strategy, int64_t step, const int64_t *sizes,
                      const uint64_t *hashes);

/* What each rank tells the others when a collective save or load ends. */
typedef struct {
    int32_t status;
    int32_t rank;
    int64_t size;
    uint64_t hash;
    char msg[480];
} ckpt_report;

/* Every rank learns every rank's outcome: a failure anywhere is returned
 * everywhere with the failing rank's message. With all_out (and success)
 * the reports of all ranks (the caller frees them). */
cx_status ckpt_agree(const char *tag, cx_status mine, ckpt_report *rep, ckpt_report **all_out);

/* Called at named points of a save ("file-written", "renamed", "before-marker",
 * "committed"), so tests can crash a save there. NULL in normal runs. */
extern void (*ckpt_test_hook)(const char *phase);
void ckpt_hook(const char *phase);

/* ---- shard metadata (an owned copy of cx_fsdp_unit_info; ckpt_meta.c) ----------- */

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

/* ---- what a save or load works on (ckpt_view.c) -------------------------------------- */

typedef struct {
    cx_ckpt_strategy strategy;
    bool sharded;          /* FSDP: flat shards and shard metadata */
    bool spmd;             /* SPMD: each rank's shards of the state dict, with their boxes */
    cx_module *module;     /* parameters (unsharded) and buffers */
    int nunits;            /* sharded: */
    ckpt_unit *units;      /*   layout of this rank (owned) */
    cx_tensor **flat;      /*   the local shard of each unit (borrowed) */
} ckpt_view;

cx_status ckpt_view_of(cx_ckpt_model m, ckpt_view *v);
/* Reads the caller's options as far as their struct_size goes, defaults for
 * the rest. @return CX_OK, or CX_ERR_ARG (error set, naming fn) for a
 * struct_size below the first version's. */
cx_status ckpt_take_opts(cx_ckpt_opts *opts, const char *fn);
void ckpt_view_release(ckpt_view *v);

/* ---- reading: any committed checkpoint as full tensors ------------------------------
 * From the bottom up, each file calling only those before it: the entry
 * table (ckpt_table.c); the listers of the full/FSDP (ckpt_entries.c) and
 * SPMD (ckpt_spmd_src.c) layouts, which fill it; the opener with the file
 * checks (ckpt_source.c); SPMD piece reads (ckpt_spmd_read.c); element
 * ranges of any entry (ckpt_read.c); boxes of any entry (ckpt_box.c). */

typedef struct {
    char *path;
    hid_t fid;
    ckpt_root root;        /* what the file says about itself */
    int rank;
    int64_t size;
    bool verified;
    uint64_t marker_hash;
    bool have_marker_hash;
} ckpt_file;

/* One dataset of an SPMD checkpoint: a rank's shard of a tensor, the
 * global boxes it holds and where each sits in the (padded) dataset. A
 * replicated tensor is one piece holding the whole. */
typedef struct {
    int file;              /* the rank (file) holding it */
    char *h5path;
    int64_t local_shape[CX_MAX_DIMS];   /* the dataset's shape (the padded local shard) */
    int nboxes;
    cx_shard_box *boxes;
} ckpt_piece;

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
    int npieces;           /* SPMD source: the shards holding it (else 0) */
    ckpt_piece *pieces;
} ckpt_entry;

typedef struct {
    char prefix[4096];
    int nfiles;
    ckpt_file *files;      /* by rank */
    int world;
    int version;           /* format version of the marker and every file */
    ckpt_root root;        /* rank 0's; strategy and step checked equal on every file */
    bool sharded;          /* FSDP layout (/shard_metadata) */
    bool spmd;             /* SPMD layout (/spmd_metadata): entries have pieces */
    int nunits;
    ckpt_unit *units;      /* rank 0's copy, checked equal on every file */
    int nentries, entries_cap;
    ckpt_entry *entries;   /* model then optimizer */
    int home;              /* file used for replicated data */
    bool per_dataset;      /* check each whole-dataset read against its own checksum */
} ckpt_src;

/* Opens and validates the committed checkpoint `prefix` (files matching
 * `suffix`), or with `single_file` one full file without a marker.
 * verify_all: check every checksum now (else lazily, per file read). */
cx_status ckpt_src_open(ckpt_src *s, const char *prefix, const char *suffix, const char *single_file,
                        bool verify_all, int home_rank);
void ckpt_src_close(ckpt_src *s);
/* Checks file r against the marker's checksum (once; ckpt_source.c).
 * @return CX_OK, or CX_ERR_IO naming the file. */
cx_status ckpt_src_verify(ckpt_src *s, int r);
/* Lists the tensors of the home file of a full or FSDP checkpoint as
 * entries (ckpt_entries.c). @return CX_OK, or the error naming the file
 * and dataset. */
cx_status ckpt_src_list(ckpt_src *s);

/* What an entry is made from (ckpt_src_add_entry copies the strings). */
typedef struct {
    const char *key, *state, *h5path;
    bool is_param;
    int ndim;
    const int64_t *shape;
    cx_dtype dtype;
    int unit, pidx;        /* -1 when not in a flat layout */
    bool replicated;
} ckpt_entry_spec;

/* The entry table (ckpt_table.c). Appends an entry without pieces.
 * @return CX_OK, or CX_ERR_OOM (error set; s unchanged). */
cx_status ckpt_src_add_entry(ckpt_src *s, const ckpt_entry_spec *x);
/* The entry of key and state (NULL: a /model tensor), NULL if none. */
const ckpt_entry *ckpt_src_find(const ckpt_src *s, const char *key, const char *state);
void ckpt_entry_free(ckpt_entry *e);
/* Reads the row-major elements [a, b) of an entry (its dtype) into buf. */
cx_status ckpt_src_read(ckpt_src *s, const ckpt_entry *e, int64_t a, int64_t b, void *buf);
/* Reads the global box [start, start + count) of an entry (its dtype) into
 * `mem`, a row-major array of mem_shape, at mem_off: SPMD pieces and whole
 * datasets through hyperslab selections (only the box is read), FSDP flat
 * shards row by row. */
cx_status ckpt_src_read_box(ckpt_src *s, const ckpt_entry *e, const int64_t *start, const int64_t *count, void *mem,
                            const int64_t *mem_shape, const int64_t *mem_off);

/* ---- the SPMD layout (ckpt_spmd_save.c, ckpt_spmd_src.c, ckpt_spmd_read.c) --------- */

/* Writes this rank's part of tensor t under parent/name: its shard with
 * the global shape, boxes and sharding when t is SPMD-sharded and no lower
 * rank holds the same boxes; the whole tensor from rank 0 when replicated;
 * else nothing. *written counts the datasets written. */
cx_status ckpt_spmd_write_tensor(hid_t parent, const char *name, cx_tensor *t, const char *kind, int level,
                                 const char *path, int64_t *written);
/* The /spmd_metadata group of a rank's file. */
cx_status ckpt_spmd_write_meta(hid_t fid, const char *path, int rank, int world, int64_t datasets);
/* Lists the tensors of every file of an SPMD checkpoint, each with its
 * pieces, checking shapes, dtypes, boxes and that the pieces cover each
 * tensor exactly once. */
cx_status ckpt_spmd_list(ckpt_src *s);
/* Elements [a, b) of an entry with pieces (ckpt_src_read does this). */
cx_status ckpt_src_read_spmd(ckpt_src *s, const ckpt_entry *e, int64_t a, int64_t b, void *buf);
/* Whether a piece holds any element of the box [start, start + count). */
bool ckpt_piece_hits(const ckpt_piece *p, int ndim, const int64_t *start, const int64_t *count);
/* Reads the part of the box in piece p (see ckpt_src_read_box). */
cx_status ckpt_spmd_read_piece(ckpt_src *s, const ckpt_entry *e, const ckpt_piece *p, const int64_t *start,
                               const int64_t *count, void *mem, const int64_t *mem_shape, const int64_t *mem_off);

/* ---- tensor datasets (ckpt_h5.c) ------------------------------------------------------ */

/* Shape of a dataset. @return 0 or -1. */
int ckpt_dataset_shape(hid_t d, int *ndim, int64_t *shape, int64_t *numel);
/* The cxla dtype of a dataset: its "dtype" attribute, else (a file written
 * by another tool) its stored type. @return 0, or -1 when neither is one. */
int ckpt_dataset_dtype(hid_t d, cx_dtype *dt);
/* Creates a dataset (chunked + zstd when level > 0). @return id or -1. */
hid_t ckpt_dataset_create(hid_t parent, const char *name, cx_dtype dt, const int64_t *shape, int ndim, int level);
int ckpt_dataset_write_all(hid_t d, cx_dtype dt, const void *buf, int64_t numel);
int ckpt_dataset_write_range(hid_t d, cx_dtype dt, const int64_t *shape, int ndim, int64_t a, int64_t b,
                             const void *buf);
/* The attributes of a tensor dataset: dtype, kind and the checksum of this
 * format version. */
int ckpt_dataset_attrs(hid_t d, cx_dtype dt, const char *kind, uint64_t hash);

#endif
