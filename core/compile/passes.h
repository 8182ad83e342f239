/* The compiler's passes, in the order cx_lower runs them (lower.c):
 *
 *   1. group     (group.c)     which nodes are kernel roots, materialized into
 *                              a buffer; everything else fuses into its consumer
 *   2. codegen   (codegen.c)   one kernel per root; fused kernels get an SSA
 *                program.c     program whose views are affine index maps
 *                peephole.c    (relu patterns, dead code, dim coalescing)
 *   3. epilogue  (epilogue.c)  an elementwise kernel that only post-processes
 *                              a matmul/conv runs in place after it, or inside it
 *      order     (order.c)     the kernels reordered to free memory early (a
 *                              weight gradient right after the gradient it reads)
 *      recompute (recompute.c) an elementwise value of the inputs alone is
 *                              computed again for a late reader, not kept
 *   4. schedule  (schedule.c)  collectives in place, the DDP overlap order, the
 *                              FSDP gather prefetch, where each collective waits
 *   5. alias     (alias.c)     outputs that may take their donor input's buffer
 *   6. memory    (memory.c)    liveness and the arena plan
 *
 * Passes 3-6 work on the executable alone (executable/executable.h), so each can be tested on
 * a hand-built one; passes 1-2 on a hand-built cx_graph. Helpers every pass
 * shares to read and edit an executable live with the format
 * (executable/executable.c). */
#ifndef CX_COMPILE_PASSES_H
#define CX_COMPILE_PASSES_H

#include "graph.h"

/* ---- the graph's readers (lower.c) ---------------------------------------- */

typedef struct {
    int *count;     /* readers per node */
    int **list;     /* the reading nodes, in graph order */
    char *is_output;
} cx_uses;

/* @return false when out of memory (u is then freed). */
bool cx_uses_build(const cx_graph *g, cx_uses *u);
void cx_uses_free(const cx_graph *g, cx_uses *u);

/* ---- 0. SPMD partitioning (partition.c) ------------------------------------ */

struct cx_sharding;
struct cx_spmd_notes;
/* g with global shapes and ann[i] the sharding node i must have (data
 * leaves: the shard their buffer holds), or NULL -> out, this rank's graph
 * (release with cx_graph_release); out_sharding[o] receives each output's
 * sharding, inserted[0..4) the all-reduces, all-gathers, reduce-scatters
 * and all-to-alls added, and notes (may be NULL; free with
 * cx_spmd_notes_free) each node's sharding and where each collective went.
 * @return false with the error set (out of memory, an explicit collective
 * beside shardings). */
bool cx_pass_partition(const cx_graph *g, const struct cx_sharding *const *ann, int rank, cx_graph *out,
                       struct cx_sharding *out_sharding, int *inserted, struct cx_spmd_notes *notes);

/* ---- 1. grouping (group.c) --------------------------------------------------- */

/* Elementwise ops fuse into the kernel consuming them when every consumer is
 * in the same kernel (a chain is one loop, a chain feeding a reduction is its
 * prologue); views duplicate freely; data, reductions, contractions,
 * collectives, concat, interior padding, outputs and force_root[i] are roots.
 * Fills root[g->n]. @return false when out of memory. */
bool cx_pass_group(const cx_graph *g, const cx_uses *u, const char *force_root, char *root);
/* Ops that always get a kernel of their own, wherever they are used. */
bool cx_is_heavy_op(const cx_gnode *n);

/* ---- 2. code generation (codegen.c, program.c, peephole.c) ------------------------ */

/* Slots (inputs in ordinal order, then outputs, then one arena slot per other
 * root) and one kernel per root, in graph order.
 * @return -1 when done (or out of memory: *oom set), else the node whose
 * view could not be expressed affinely: make it a root and retry. */
int cx_pass_codegen(const cx_graph *g, const char *root, cx_executable *e, bool *oom);

/* Multi-index map: node dim k = off[k] + sum_d A[k][d] * it_d. */
typedef struct {
    int nd;
    int64_t off[CX_MAX_DIMS];
    int64_t A[CX_MAX_DIMS][CX_MAX_DIMS];
    bool masked;
    int64_t lo[CX_MAX_DIMS], hi[CX_MAX_DIMS];
} cx_mview;
void cx_mview_identity(cx_mview *m, int nd);
/* The address view of a node-shaped map over a contiguous buffer. */
void cx_mview_to_view(const cx_mview *m, int it_nd, const int64_t *shape, cx_view *v);
/* reshape: output multi-index -> linear offset -> input multi-index; affine
 * only when no digit carries across input dims. @return false otherwise. */
bool cx_mview_unravel(const cx_mview *m, int it_nd, const int64_t *it_shape, const int64_t *out_shape,
                      const int64_t *in_shape, int in_nd, cx_mview *r);

/* Generates the program computing node `i` of g through map m at every
 * point of the iteration space it_shape (it_nd dims), reading roots through
 * slot_of[] as loads. body: i is a root itself; generate what it computes,
 * not a load of it. The result register goes to prog->result.
 * @return -1 on success, -2 when out of memory, else the node that must
 * become a root (its view is not affine). */
int cx_program_build(const cx_graph *g, const char *root, const int *slot_of, int i, bool body, const cx_mview *m,
                     int it_nd, const int64_t *it_shape, cx_program *prog);

/* Rewrites where(0 < x, y, 0) into P_RELU / P_POSMASK and drops dead
 * instructions (renumbering registers). */
void cx_prog_peephole(cx_program *p);
/* Drops size-1 iteration dims and merges adjacent dims every view reads
 * linearly; dims before *split never merge with dims after it (reduce:
 * kept | reduced). @return the new rank; *split follows. */
int cx_prog_coalesce(cx_program *p, int64_t *shape, int nd, int *split);

/* ---- 3-4. epilogues, order and schedule (epilogue.c, order.c, schedule.c) ------------------------------ */

void cx_pass_fuse_epilogues(cx_executable *e);
/* A list schedule: among the kernels whose inputs exist, first one that
 * reads an intermediate, the most arena bytes freed net of those
 * allocated first; else the one the lowered order needs soonest. Graphs with all-gathers (FSDP) keep
 * their order. @return false when out of memory (error set). */
bool cx_pass_order_by_memory(cx_executable *e);
/* A fused kernel that loads only inputs (and is short) gets a copy right
 * before each reader that would otherwise find its buffer idle across more
 * than twice its size of other writes, unless an output taking one of its
 * inputs' buffers is written before that reader.
 * @return false when out of memory (error set). */
bool cx_pass_recompute_input_values(cx_executable *e);
/* An all-reduce / broadcast whose input only it reads writes over that input
 * (MPI_IN_PLACE). */
void cx_pass_collectives_in_place(cx_executable *e);
/* DDP: gradient collectives as early as their inputs allow, their readers as
 * late as possible. @return false when out of memory (error set). */
bool cx_pass_schedule_overlap(cx_executable *e);
/* FSDP: each all-gather one unit ahead of its use. */
void cx_pass_prefetch_gathers(cx_executable *e);
/* Each collective waits right before the first reader of its result. */
void cx_pass_collective_waits(cx_executable *e);

/* ---- 5-6. aliasing and memory (alias.c, memory.c) ---------------------------------------- */

/* Outputs with a donor input (out_alias[o] >= 0) take its buffer when every
 * read of it comes first; others are computed into the arena and copied
 * over it at the end. @return false when out of memory. */
bool cx_pass_alias_outputs(cx_executable *e, const int *out_alias);
/* First write and last read of every slot (an async collective keeps its
 * buffers alive until its wait). */
void cx_pass_liveness(cx_executable *e);
/* Packs arena slots by lifetime, largest first, each at the lowest offset
 * free for its lifetime. @return false when out of memory. */
bool cx_pass_plan_memory(cx_executable *e);

#endif
