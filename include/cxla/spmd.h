/* SPMD: one program written with global shapes, a few tensors annotated with
 * how they split over a mesh of devices, and the compiler partitions the
 * rest (PyTorch/XLA's torch_xla.distributed.spmd). Each rank is one device
 * of the mesh. The partitioner propagates shardings through every op of the
 * graph of a sync (forward and backward together), reshards where two
 * shardings meet, and inserts the collectives; ops without a rule gather
 * their operands, so every program partitions correctly.
 *
 * The mesh's device count is cx_world_size (core.h). Meshes are never
 * freed, so a mesh and the axis names it holds (cx_mesh_axis_name) stay
 * valid for the process; the axis names and specs given are copied. The
 * mesh registry and the SPMD switch are not locked: set them up on the
 * training thread before other threads use them. */
#ifndef CXLA_SPMD_H
#define CXLA_SPMD_H

#include <cxla/core.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CX_MESH_MAX_DIMS 4
#define CX_MESH_AXIS_NAME_MAX 16

/* Turns SPMD mode on for the process (xr.use_spmd()): shardings annotated
 * with cx_mark_sharding are partitioned from then on. Call it after
 * cx_dist_init and before building tensors that will be sharded.
 * @return CX_OK. */
CX_API cx_status cx_use_spmd(void);
CX_API bool cx_is_spmd(void);

/* A logical mesh of devices (ranks). Meshes live as long as the process;
 * the same arguments give the same mesh. */
typedef struct cx_mesh cx_mesh;

/* A mesh of `ndim` axes of sizes `shape`, whose devices in row-major order
 * are `device_ids` (NULL: 0, 1, ...). `axis_names` may be NULL (axes are
 * then named by index only) or give ndim distinct names.
 * @return the mesh, or NULL with the error set when the shape's product is
 * not the number of devices, a device id is out of range or repeated, a
 * name is repeated or too long, or (on more than one rank) the ranks
 * passed different meshes. Collective: every rank calls it alike. */
CX_API cx_mesh *cx_mesh_new(const int *device_ids, int ndim, const int *shape, const char *const *axis_names);
/* The hybrid mesh (xs.HybridMesh): axis i has size ici_shape[i] *
 * dcn_shape[i]; the ICI part varies over the ranks of one node, the DCN
 * part over nodes, following the node layout the comm backend found
 * (cx_local_process_count ranks per node, nodes in rank order; one node
 * without a backend that says). @return as cx_mesh_new. */
CX_API cx_mesh *cx_hybrid_mesh_new(int ndim, const int *ici_shape, const int *dcn_shape,
                                   const char *const *axis_names);
/* The number of axes, and the size of each into shape[0 .. ndim). */
CX_API int cx_mesh_shape(const cx_mesh *mesh, int *shape);
/* The device of each mesh position, row major, into ids[0 .. devices):
 * the logical mesh (get_logical_mesh). @return the number of devices. */
CX_API int cx_mesh_device_ids(const cx_mesh *mesh, int *ids, int cap);
/* The index of the axis named `name`, or -1. */
CX_API int cx_mesh_axis_index(const cx_mesh *mesh, const char *name);
CX_API void cx_set_global_mesh(cx_mesh *mesh);
/* @return the global mesh, or NULL when none was set. */
CX_API cx_mesh *cx_get_global_mesh(void);

/* A partition spec: one entry per dimension of the tensor. An entry is
 * replicated (no axes), one mesh axis, or a tuple of axes that together
 * split the dimension (the first axis is the major one). Axes are given by
 * index or by name; names win when set.
 *
 * `blocks` > 1 splits the dimension as that many equal parts, each split
 * over the axes on its own: device i then holds the i-th piece of every
 * part. This is the layout tensor parallelism needs for a fused projection
 * (GPT's c_attn computes q, k and v as one (3C, C) matmul: with blocks = 3
 * each rank holds its heads' rows of each of q, k and v). The dimension
 * must divide by `blocks`. */
typedef struct {
    int naxes;                                  /* 0: replicated (None) */
    int axes[CX_MESH_MAX_DIMS];                 /* mesh axis indices ... */
    const char *names[CX_MESH_MAX_DIMS];        /* ... or names (NULL: use the index) */
    int blocks;                                 /* 0 or 1: one contiguous split; > 1: parts split alike */
} cx_spec_entry;

/* Shorthands for building specs. */
#define CX_SPEC_NONE ((cx_spec_entry){ 0, { 0 }, { 0 }, 0 })
#define CX_SPEC_AXIS(i) ((cx_spec_entry){ 1, { (i) }, { 0 }, 0 })
#define CX_SPEC_NAME(n) ((cx_spec_entry){ 1, { 0 }, { (n) }, 0 })
/* Mesh axis `n` (a name) splitting each of `b` equal parts of the dimension. */
#define CX_SPEC_BLOCKS(n, b) ((cx_spec_entry){ 1, { 0 }, { (n) }, (b) })

/* Annotates t with a sharding over mesh: dimension d splits over the axes
 * of spec[d] (nspec must equal t's rank). A dimension that does not divide
 * evenly is padded to the next multiple. A host value (cx_from_host, or any
 * computed value) keeps only this rank's shard; every rank must pass the
 * same values. A pending value is resharded where the graph computes it.
 * A deferred tensor (cx_deferred_init_begin) materializes straight into
 * this rank's shard, bit-identical to the same slice of the whole init. A
 * tensor that requires grad stays a leaf; its gradient comes out sharded
 * like it. @return CX_OK; CX_ERR_ARG naming the problem for a missing or
 * repeated axis, a spec of the wrong length, SPMD mode off, or a
 * value-less placeholder; CX_ERR_OOM. */
CX_API cx_status cx_mark_sharding(cx_tensor *t, const cx_mesh *mesh, const cx_spec_entry *spec, int nspec);
/* The rows [*row0, *row0 + *nrows) of dimension 0 (of size dim0) that this
 * rank's shard holds under spec (clipped to dim0; nrows may be 0 where the
 * padding is all there is): what a loader must read. @return CX_OK, or
 * CX_ERR_ARG as cx_mark_sharding. */
CX_API cx_status cx_shard_rows(const cx_mesh *mesh, const cx_spec_entry *spec, int nspec, int64_t dim0, int64_t *row0,
                               int64_t *nrows);
/* A sharded tensor of global_shape built from host rows: `rows` holds rows
 * row0 .. of the global value (every other dimension whole), at least the
 * rows cx_shard_rows names for this rank; only this rank's shard is kept.
 * The loader's input sharding uses it so that each rank reads and uploads
 * only its part of a batch. @return the tensor, or a poisoned one naming
 * the problem. */
CX_API cx_tensor *cx_from_host_sharded(const void *rows, int64_t row0, const int64_t *global_shape, int ndim, cx_dtype dtype,
                                       const cx_mesh *mesh, const cx_spec_entry *spec, int nspec);
/* Makes t replicated again (gathering a sharded value at the next sync).
 * @return CX_OK, or as cx_mark_sharding. */
CX_API cx_status cx_clear_sharding(cx_tensor *t);
/* A readable description of t's sharding into buf, as
 * "{devices=[2,1] mesh=(data=2,model=2) spec=(data, None)}" or
 * "replicated". @return buf. */
CX_API const char *cx_sharding_spec(cx_tensor *t, char *buf, size_t cap);
/* Copies this rank's shard of t (syncing it if pending) into out, with no
 * communication: the local shard's shape goes to shape[0 .. rank) (padded
 * dimensions included). A replicated tensor's shard is the whole value.
 * @return CX_OK, or the sync's error. */
CX_API cx_status cx_local_shard_to_host(cx_tensor *t, void *out, size_t cap_bytes, cx_dtype dtype, int64_t *shape);

/* ---- the geometry of shards (for checkpoints and custom I/O) ------------ */

/* t's sharding as its mesh and a partition spec (axes by index, names
 * NULL) into spec[0 .. rank). @return t's rank with *mesh set, or 0 with
 * *mesh = NULL when t is replicated, NULL, or cap is below its rank. */
CX_API int cx_get_sharding(cx_tensor *t, const cx_mesh **mesh, cx_spec_entry *spec, int cap);
/* The name of mesh axis a ("" when unnamed). @return NULL when a is out of range. */
CX_API const char *cx_mesh_axis_name(const cx_mesh *mesh, int a);

/* One box of a shard: the global elements [start, start + count) of each
 * dimension, which sit in the (padded) local shard from local_start on. */
typedef struct {
    int64_t start[CX_MAX_DIMS], count[CX_MAX_DIMS], local_start[CX_MAX_DIMS];
} cx_shard_box;

/* The padded shape of rank `rank`'s shard of a tensor of global_shape under
 * spec, into local[0 .. ndim). @return CX_OK, or CX_ERR_ARG as
 * cx_mark_sharding. */
CX_API cx_status cx_shard_local_shape(const cx_mesh *mesh, const cx_spec_entry *spec, int nspec, const int64_t *global_shape,
                                      int ndim, int64_t *local);
/* The parts of the global value that rank `rank`'s shard holds: one box,
 * or one per combination of blocks when a dimension is blocked. Padding is
 * in no box, so a box may be empty (a count of 0). Boxes are written up to
 * cap. @return the number of boxes, or -1 with the error set (a bad spec,
 * a rank outside the mesh). */
CX_API int cx_shard_boxes(const cx_mesh *mesh, const cx_spec_entry *spec, int nspec, const int64_t *global_shape, int ndim,
                          int rank, cx_shard_box *boxes, int cap);
/* A tensor of global_shape sharded over mesh as spec says, from this
 * rank's own shard: `local` holds the padded local shape row-major in
 * dtype, as cx_local_shard_to_host gives it. No communication. @return
 * the tensor, or a poisoned one naming the problem. */
CX_API cx_tensor *cx_from_local_shard(const void *local, const int64_t *global_shape, int ndim, cx_dtype dtype,
                                      const cx_mesh *mesh, const cx_spec_entry *spec, int nspec);

#ifdef __cplusplus
}
#endif
#endif
