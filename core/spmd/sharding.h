/* The SPMD layer: meshes, shardings and the geometry of a shard, as plain
 * data over base/ (no tensors, no nodes). The ops that put shardings on
 * tensors are ops/sharding_ops.c, the partitioner compile/partition.c. */
#ifndef CX_SPMD_INTERNAL_H
#define CX_SPMD_INTERNAL_H

#include "base.h"

#include <cxla/spmd.h>
#include <stdbool.h>
#include <stdint.h>

struct cx_mesh {
    int id;                                        /* registry index + 1 */
    int ndim;
    int shape[CX_MESH_MAX_DIMS];
    char names[CX_MESH_MAX_DIMS][CX_MESH_AXIS_NAME_MAX];
    int ndevices;
    int *device_ids;                               /* row major */
    uint64_t hash;                                 /* of shape, names and devices */
};

/* How one tensor splits over one mesh. Dimension d splits over the mesh
 * axes axes[d][0 .. naxes[d]) (major first); with blocks[d] > 1 it is that
 * many equal parts each split alike (cx_spec_entry.blocks); `partial` marks
 * mesh axes over which each device holds a summand of the value (a
 * contraction split there), never set on a value a user can see. */
typedef struct cx_sharding {
    const cx_mesh *mesh;
    uint8_t ndim;
    uint8_t naxes[CX_MAX_DIMS];
    uint8_t axes[CX_MAX_DIMS][CX_MESH_MAX_DIMS];
    uint8_t blocks[CX_MAX_DIMS];                   /* 0: one contiguous split (kept 0 when naxes is 0) */
    uint8_t partial;                               /* bit a: partial over mesh axis a */
} cx_sharding;

/* A replicated sharding of rank nd on mesh. */
cx_sharding cx_sharding_replicated(const cx_mesh *mesh, int nd);
bool cx_sharding_is_replicated(const cx_sharding *s);
bool cx_sharding_equal(const cx_sharding *a, const cx_sharding *b);
/* A fingerprint for keys: equal across ranks for equal shardings. */
uint64_t cx_sharding_hash(const cx_sharding *s);
/* The number of shards of dimension d. */
int cx_sharding_ways(const cx_sharding *s, int d);
/* The shard of dimension d that `rank` holds (0 .. ways). */
int cx_sharding_index(const cx_sharding *s, int d, int rank);
/* Each dimension's shard size: ceil(global / ways), per block when blocked. */
void cx_sharding_local_shape(const cx_sharding *s, const int64_t *global, int64_t *local);
/* The parts of a blocked dimension d (1 when it is not blocked). */
int cx_sharding_blocks(const cx_sharding *s, int d);
bool cx_sharding_has_blocks(const cx_sharding *s);
/* The same layout with each blocked dimension seen as two, (blocks, size /
 * blocks), the split on the second: what holds for plain splits then holds
 * for blocked ones. @return false when that needs more than CX_MAX_DIMS
 * dimensions (error set). */
bool cx_sharding_unblocked(const cx_sharding *s, const int64_t *global, cx_sharding *u, int64_t *ushape);
/* The replica groups of the ranks that differ only along `axes` (in that
 * order, the first the major one), interned for a collective's attribute.
 * @return the group id (0: every rank), -1 with the error set. */
int64_t cx_mesh_axes_group(const cx_mesh *mesh, const uint8_t *axes, int naxes, int *group_size);
/* Bit mask of mesh axes -> their indices in increasing order. @return count. */
int cx_axes_of_mask(unsigned mask, uint8_t *axes);
/* "(data, None)" style. */
const char *cx_sharding_describe(const cx_sharding *s, char *buf, size_t cap);

/* The registered mesh with this hash and rank, NULL when this process has
 * none (a loaded executable's shardings point at it). */
const cx_mesh *cx_mesh_find(uint64_t hash, int ndim);
/* The rank's position in the mesh: coords[0 .. ndim), false if absent. */
bool cx_mesh_coords(const cx_mesh *mesh, int rank, int *coords);


/* A spec checked against mesh into a sharding for a tensor of rank nd;
 * shape (may be NULL) checks that blocked dimensions divide.
 * @return CX_OK or CX_ERR_ARG naming the problem (mark_sharding's errors). */
cx_status cx_spec_to_sharding(const cx_mesh *mesh, const cx_spec_entry *spec, int nspec, int nd, const int64_t *shape,
                              cx_sharding *s);
/* A heap copy of s, or NULL when s is replicated or out of memory. */
cx_sharding *cx_sharding_dup(const cx_sharding *s);
/* Moves rank's shard between a global array and its padded local buffer
 * (to_local: global -> shard, zeros in the padding; else shard -> global,
 * padding dropped). */
void cx_shard_copy(const cx_sharding *s, const int64_t *global, int rank, size_t es, void *local_buf, void *global_buf,
                   bool to_local);

/* The same for the rows [row0, ...) of the global array only (the rows a
 * caller holds); rows outside the shard are skipped. */
void cx_shard_copy_rows(const cx_sharding *s, const int64_t *global, int rank, size_t es, void *local_buf,
                        void *global_buf, bool to_local, int64_t row0);

/* What the partitioner did, kept for IR dumps (XLA_SAVE_TENSORS_FILE):
 * each node's sharding in the global graph (partial sums marked), and each
 * collective it added, with the node whose value the collective moves. */
typedef struct cx_spmd_coll {
    int node;
    uint8_t kind;      /* 0 all-reduce, 1 all-gather, 2 reduce-scatter, 3 all-to-all */
    uint8_t axes;      /* bit a: over mesh axis a */
} cx_spmd_coll;

typedef struct cx_spmd_notes {
    int n;
    cx_sharding *sh;
    int ncoll, coll_cap;
    cx_spmd_coll *coll;
} cx_spmd_notes;
void cx_spmd_notes_free(cx_spmd_notes *notes);
/* "all-reduce over (model)" style. */
const char *cx_spmd_coll_describe(const cx_spmd_coll *k, const cx_mesh *mesh, char *buf, size_t cap);

#endif
