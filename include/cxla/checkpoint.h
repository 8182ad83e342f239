/* cxla checkpoint: HDF5 state dicts, full and sharded, with atomic commit,
 * resume, consolidation and resharding (docs/checkpoint-format.md).
 *
 * A checkpoint is named by a prefix ("run/ckpt-step-100"): its files are
 * <prefix>_rank-<r>-of-<w>.h5 and its commit marker <prefix>.commit. A save
 * writes every file under a temporary name, fsyncs and renames it; when every
 * rank has succeeded, rank 0 writes the marker listing each file with its
 * size and checksum. Loads accept only committed checkpoints whose files
 * match the marker, so a crash at any point of a save leaves the previous
 * committed checkpoint loadable.
 *
 * Unsharded runs (single process, DDP, xm) write one full file from rank 0
 * (w = 1); FSDP writes one file per rank holding that rank's flat shards
 * plus the shard metadata; SPMD writes one file per rank holding the shards
 * that rank holds of each tensor, with their global boxes. Any checkpoint
 * loads into any wrapping: a sharded one is stitched (or re-sliced) tensor
 * by tensor on the fly.
 *
 * Saves and loads sync and run collectives: call them on the training
 * thread (core.h), every rank alike where a call says it is collective.
 * cx_ckpt_manager_request_preemption alone may be called from anywhere
 * (a signal handler included). Results come back in the caller's buffers
 * (`out`, `cap`); only cx_ckpt_read_meta returns memory to free().
 */
#ifndef CXLA_CHECKPOINT_H
#define CXLA_CHECKPOINT_H

#include <cxla/core.h>
#include <cxla/nn.h>
#include <cxla/optim.h>
#include <cxla/parallel.h>
#include <cxla/fsdp.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The format version written; older ones still load (docs/checkpoint-format.md). */
#define CX_CKPT_FORMAT_VERSION 2
/* The default file-name pattern of the ranks' files after the prefix. */
#define CX_CKPT_DEFAULT_SUFFIX "_rank-*-of-*.h5"
/* The registered HDF5 filter id of zstd. */
#define CX_CKPT_ZSTD_FILTER 32015
/* The longest program metadata string a checkpoint holds, with its NUL
 * (cx_ckpt_opts.meta). */
#define CX_CKPT_META_MAX 4096

typedef enum {
    CX_CKPT_SINGLE = 0,   /* "none": one process */
    CX_CKPT_DDP,          /* "ddp": replicated parameters (DDP or xm.optimizer_step) */
    CX_CKPT_FSDP_ZERO2,   /* "fsdp-zero2" */
    CX_CKPT_FSDP_ZERO3,   /* "fsdp-zero3" */
    CX_CKPT_SPMD,         /* "spmd": SPMD-sharded tensors (cxla/spmd.h), each rank its own shards */
} cx_ckpt_strategy;

/* "none", "ddp", "fsdp-zero2", "fsdp-zero3", "spmd". */
CX_API const char *cx_ckpt_strategy_name(cx_ckpt_strategy s);

/* What is saved or loaded: a plain module (single, DDP: the wrapped module)
 * or an FSDP wrapper. Build it with one of the helpers below. */
typedef struct {
    cx_ckpt_strategy strategy;
    cx_module *module;    /* SINGLE / DDP */
    cx_fsdp *fsdp;        /* FSDP_* */
} cx_ckpt_model;

CX_API cx_ckpt_model cx_ckpt_model_single(cx_module *m);
/* A replicated module (DDP's cx_ddp_module, or the module of an
 * xm.optimizer_step run). */
CX_API cx_ckpt_model cx_ckpt_model_ddp(cx_module *m);
/* `zero3`: the wrapper reshards after forward (recorded in the files). */
CX_API cx_ckpt_model cx_ckpt_model_fsdp(cx_fsdp *f, bool zero3);
/* A module whose tensors may be SPMD-sharded (cx_mark_sharding; an FSDPv2
 * wrapper's cx_spmd_fsdp_module). A save is collective: every rank writes
 * <prefix>_rank-<r>-of-<w>.h5 holding, for each parameter, buffer and
 * optimizer state, the shard it holds with the tensor's global shape and
 * the global boxes the shard covers (a shard several ranks hold is written
 * by the lowest of them, a replicated tensor by rank 0). A load, into any
 * mesh and world size or into one process without SPMD, gives each tensor
 * of the model the sharding it has when cx_ckpt_load is called (mark the
 * model's shardings first, as in PyTorch/XLA; an optimizer state takes its
 * parameter's) and reads only the parts of the files this rank's shards
 * cover. A single or DDP model that holds an SPMD-sharded tensor is saved
 * this way too. @return the handle (a NULL module is refused by the save or
 * load it is given to). */
CX_API cx_ckpt_model cx_ckpt_model_spmd(cx_module *m);

/* Training progress stored with the state. The RNG state is not here: a
 * save records cx_get_rng_state() and a load restores it with
 * cx_set_rng_state(), as the RNG is process-global. */
typedef struct {
    int64_t step;              /* optimizer steps done */
    int64_t epoch;             /* the epoch in progress (or next) */
    int64_t sampler_position;  /* samples taken in that epoch (cx_loader_position) */
} cx_ckpt_extra;

/* Start each options struct below from its default function (it sets
 * struct_size, core.h): a struct_size below the first version's is
 * refused with CX_ERR_ARG (NULL for cx_ckpt_manager_new). */
typedef struct {
    size_t struct_size;
    /* save: 0 = no compression (default), 1..22 = zstd level through HDF5
     * filter 32015 (chunked datasets) */
    int compress_level;
    /* save/load the optimizer state (default true; needs an optimizer) */
    bool with_optimizer;
    /* load: verify the files' sizes and checksums against the commit marker
     * (default true) */
    bool verify;
    /* save: the program's own metadata, e.g. the model config it needs to
     * rebuild the model before a load ("n_layer=4 n_head=4"), stored as the
     * root attribute program_meta of every file, carried into consolidated
     * and resharded files, read back with cx_ckpt_read_meta. At most
     * CX_CKPT_META_MAX - 1 bytes (a longer one is refused with CX_ERR_ARG).
     * The library never parses it. NULL or "" (default): none. Loads ignore
     * it. Every rank passes the same string. */
    const char *meta;
} cx_ckpt_opts;
static inline cx_ckpt_opts cx_ckpt_default_opts(void)
{
    cx_ckpt_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.compress_level = 0;
    o.with_optimizer = true;
    o.verify = true;
    o.meta = NULL;
    return o;
}

/* Saves a checkpoint. Collective: every rank calls it with the same prefix.
 * `opt` may be NULL (no optimizer state); `extra` may be NULL (step = the
 * optimizer's step count, epoch and position 0). Saving to a prefix that
 * already holds a checkpoint first removes its commit marker.
 * @return CX_OK on every rank once the commit marker is durable, or the
 * same error on every rank (cx_last_error names the file and the cause);
 * then no marker exists for this prefix. */
CX_API cx_status cx_ckpt_save(const char *prefix, cx_ckpt_model model, cx_optimizer *opt, const cx_ckpt_extra *extra);
CX_API cx_status cx_ckpt_save_opts(const char *prefix, cx_ckpt_model model, cx_optimizer *opt,
                            const cx_ckpt_extra *extra, cx_ckpt_opts opts);

/* Loads the committed checkpoint `prefix` (any strategy, any world size)
 * into `model` and `opt` (may be NULL), restores the RNG state and the
 * optimizer's step count, and fills `extra` (may be NULL). Collective.
 * Nothing is modified, on any rank, unless every file a rank reads verifies
 * and every tensor matches the model's names and (global) shapes. An
 * SPMD-sharded tensor of the model keeps its sharding: each rank reads only
 * the boxes its shard covers (cx_ckpt_model_spmd).
 * @return CX_OK, CX_ERR_IO (not committed, missing/corrupt file, checksum),
 * CX_ERR_SHAPE (a key missing or of another shape), CX_ERR_OOM. */
CX_API cx_status cx_ckpt_load(const char *prefix, cx_ckpt_model model, cx_optimizer *opt, cx_ckpt_extra *extra);
CX_API cx_status cx_ckpt_load_opts(const char *prefix, cx_ckpt_model model, cx_optimizer *opt, cx_ckpt_extra *extra,
                            cx_ckpt_opts opts);

/* Loads one full (consolidated) file, e.g. consolidate_ckpts' output, into
 * a model of any wrapping; `opt` may be NULL (the file's optimizer state,
 * if any, is then ignored). The file's sampler position counts the samples
 * of every rank of the run that saved it; extra gets this process's share
 * (divided by cx_world_size(), outside SPMD, whose one sampler takes it
 * all). Per-tensor checksums are verified for every
 * tensor read whole; an FSDP or SPMD-sharded target reads only its own
 * ranges of a tensor, which HDF5 cannot checksum alone (its metadata is
 * checksummed). Not collective: each rank reads the file itself.
 * @return as cx_ckpt_load. */
CX_API cx_status cx_ckpt_load_full(const char *path, cx_ckpt_model model, cx_optimizer *opt, cx_ckpt_extra *extra);

/* The program metadata (cx_ckpt_opts.meta) of a checkpoint: the committed
 * checkpoint `path_or_prefix` (rank 0's file; e.g. what cx_ckpt_latest
 * gives), or, when that names a file, one full (consolidated) file. Every
 * file is opened and checked as a load would (marker, sizes, format, ranks,
 * layout), without checksums and without a model. Not collective.
 * @return a string the caller frees with free(): "" when the checkpoint has
 * no metadata (saved without any, or by a library before it had them); NULL
 * with cx_last_error set when the checkpoint is missing, uncommitted or
 * corrupt, or out of memory. */
CX_API char *cx_ckpt_read_meta(const char *path_or_prefix);

/* @return true when `prefix` has a commit marker whose files all exist with
 * the listed sizes (checksums are not read). */
CX_API bool cx_ckpt_is_committed(const char *prefix);

/* Finds the committed checkpoint with the highest step in `dir` (by its
 * marker; files are size-checked). @return CX_OK and the prefix in `out`,
 * CX_ERR_IO when there is none (cx_last_error says so), CX_ERR_ARG when
 * `out` is too small. */
CX_API cx_status cx_ckpt_latest(const char *dir, char *out, size_t cap);

/* ---- checkpoint manager and preemption -------------------------------- */

/* Like PyTorch/XLA's CheckpointManager: checkpoints DIR/ckpt-step-<N> on an
 * interval, the newest max_to_keep kept, and preemption (SIGTERM, as a
 * scheduler or `xla-launch` sends it) turned into a step at which every
 * rank saves and stops. */
typedef struct cx_ckpt_manager cx_ckpt_manager;

typedef struct {
    size_t struct_size;
    int64_t save_interval;   /* should_save every N steps; 0: never (only preemption or the caller) */
    int max_to_keep;         /* committed checkpoints kept, newest first; 0: all */
    bool watch_sigterm;      /* SIGTERM and a first SIGINT (Ctrl-C) request preemption */
    /* written into every checkpoint the manager saves, as cx_ckpt_opts.meta
     * (copied by cx_ckpt_manager_new); NULL: none */
    const char *meta;
} cx_ckpt_manager_opts;

/* interval 0, keep all, watch SIGTERM, no metadata. */
static inline cx_ckpt_manager_opts cx_ckpt_manager_default_opts(void)
{
    cx_ckpt_manager_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.save_interval = 0;
    o.max_to_keep = 0;
    o.watch_sigterm = true;
    o.meta = NULL;
    return o;
}
/* Creates `dir` if needed. With watch_sigterm, SIGTERM and the first SIGINT
 * no longer end the process: they request preemption (see
 * reached_preemption); a second SIGINT ends it at once.
 * @return the manager, or NULL with cx_last_error set (bad options, the
 * directory cannot be made, out of memory). */
CX_API cx_ckpt_manager *cx_ckpt_manager_new(const char *dir, cx_ckpt_manager_opts opts);
CX_API void cx_ckpt_manager_free(cx_ckpt_manager *m);
/* @return true when step (> 0) is a multiple of the save interval. */
CX_API bool cx_ckpt_manager_should_save(const cx_ckpt_manager *m, int64_t step);
/* Collective (every rank calls it at the same steps, e.g. each step): true
 * on every rank once any rank has been asked to stop (SIGTERM or
 * cx_ckpt_manager_request_preemption). The caller then saves and exits. */
CX_API bool cx_ckpt_manager_reached_preemption(cx_ckpt_manager *m, int64_t step);
/* Requests preemption as a SIGTERM would (async-signal-safe). */
CX_API void cx_ckpt_manager_request_preemption(void);
/* The prefix of step's checkpoint: DIR/ckpt-step-<step>. */
CX_API void cx_ckpt_manager_prefix(const cx_ckpt_manager *m, int64_t step, char *out, size_t cap);
/* Saves step's checkpoint (collective, as cx_ckpt_save, with the manager's
 * meta), then deletes the
 * committed checkpoints beyond max_to_keep: their commit markers first,
 * then their files. @return cx_ckpt_save's status, or CX_ERR_COMM. */
CX_API cx_status cx_ckpt_manager_save(cx_ckpt_manager *m, int64_t step, cx_ckpt_model model, cx_optimizer *opt,
                                      const cx_ckpt_extra *extra);
/* The newest committed checkpoint in the manager's directory (cx_ckpt_latest). */
CX_API cx_status cx_ckpt_manager_latest(const cx_ckpt_manager *m, char *out, size_t cap);

/* ---- consolidation and resharding (the consolidate_ckpts tool) -------- */

typedef struct {
    size_t struct_size;
    const char *suffix;       /* glob after the prefix (CX_CKPT_DEFAULT_SUFFIX) */
    bool with_optimizer;      /* also stitch the optimizer state (false) */
    int compress_level;       /* output compression, 0 = none */
    int shard_size_multiple;  /* reshard: flat params padded to N * this (1) */
} cx_ckpt_consolidate_opts;
static inline cx_ckpt_consolidate_opts cx_ckpt_consolidate_default_opts(void)
{
    cx_ckpt_consolidate_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.suffix = NULL;
    o.with_optimizer = false;
    o.compress_level = 0;
    o.shard_size_multiple = 1;
    return o;
}

/* The files of `prefix` matching `suffix` (NULL: the default pattern), for
 * reporting. @return how many, or -1 (error set). */
CX_API int cx_ckpt_count_files(const char *prefix, const char *suffix);

/* Stitches the committed checkpoint `prefix` into one full file `out_path`
 * (streaming: peak memory is a few MiB of buffers, not the model). Every
 * file is validated first: count, ranks, world sizes, format, metadata,
 * sizes and checksums against the commit marker. On any error no output is
 * left behind. */
CX_API cx_status cx_ckpt_consolidate(const char *prefix, const char *out_path, cx_ckpt_consolidate_opts opts);

/* Rewrites the committed checkpoint `prefix` as a committed FSDP checkpoint
 * `out_prefix` for `world` ranks (same units; an unsharded source becomes
 * one root unit "flat_param" over all parameters in state-dict order).
 * Streaming, validated, nothing left behind on error. */
CX_API cx_status cx_ckpt_reshard(const char *prefix, const char *out_prefix, int world, cx_ckpt_consolidate_opts opts);

#ifdef __cplusplus
}
#endif
#endif
