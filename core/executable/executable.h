/* The executable format: a flat list of kernel instructions over buffer
 * slots, produced by the compiler (compile/) from a captured graph and run
 * by the runtime (runtime/). It holds no pointers into the IR, so it can be
 * cached and reused by any later trace with the same key. Its one home:
 * the types here, the helpers that build and edit it (executable.c), the
 * geometry of its heavy kernels (geometry.c), and its serialized form with
 * the rules every field must meet (serialize.c). */
#ifndef CX_EXECUTABLE_H
#define CX_EXECUTABLE_H

#include "base.h"
#include "op_set.h"
#include "kernels.h"
#include "sharding.h"
#include "cx_sbuf.h"

#define CX_BLK 256

/* An affine map from a kernel's iteration index to an element offset of a
 * buffer, with optional validity ranges per iteration dim (padding). */
typedef struct {
    int64_t offset;
    int64_t strides[CX_MAX_DIMS];
    bool masked;
    int64_t lo[CX_MAX_DIMS], hi[CX_MAX_DIMS];
} cx_view;

typedef enum {
    P_LOAD,    /* slot, view, src dtype */
    P_CONST,   /* f / i */
    P_RT,      /* slot = runtime scalar index */
    P_IOTA,    /* value = view address */
    P_RNG,     /* slot = seed rt, a = offset rt (as rt index), i = kind; counter = offset + view address */
    P_UN,      /* op, a */
    P_BIN,     /* op, a, b */
    P_WHERE,   /* a ? b : c */
    P_CAST,    /* a -> dtype */
    P_MASK,    /* view mask ? a : f */
    P_RELU,    /* a > 0 ? a : 0        (from where(0 < a, a, 0)) */
    P_POSMASK, /* a > 0 ? b : 0        (from where(0 < a, b, 0): relu's gradient) */
} cx_pkind;

typedef struct {
    uint8_t kind;
    uint8_t op;      /* cx_op for P_UN / P_BIN */
    uint8_t dtype;   /* logical dtype of the result */
    uint8_t src_dtype;
    int32_t a, b, c;
    int32_t slot;
    int32_t view;
    double f;
    int64_t i;
} cx_pinstr;

typedef struct {
    int n, cap;
    cx_pinstr *ins;
    int nviews, vcap;
    cx_view *views;
    int result;
} cx_program;

typedef enum {
    K_FUSED, K_REDUCE, K_MATMUL, K_CONV, K_CONV_BI, K_CONV_BW, K_MAXPOOL, K_MAXPOOL_BWD,
    K_AVGPOOL, K_AVGPOOL_BWD, K_GATHER, K_SCATTER_ADD, K_CONCAT, K_PAD, K_COLL,
    K_ATTENTION, K_ATTENTION_BWD, K_LAYER_NORM, K_LAYER_NORM_BWD, K_COPY,
} cx_kkind;

#define CX_MAX_KERNEL_INPUTS 5   /* attention's backward: q, k, v, out, dout */

typedef struct {
    int slot;
    cx_view view;    /* over the kernel's iteration space (heavy ops: identity or matmul layout) */
    uint8_t dtype;
    int64_t numel;
    int ndim;
    int64_t shape[CX_MAX_DIMS];
    /* matmul operands: element offset, transposed layout, stride between batches */
    int64_t offset;
    bool trans;
    int64_t batch_stride;
} cx_kin;

/* How a heavy kernel's epilogue runs: the program in place after it, or
 * folded into the kernel itself (decided once, when lowering). */
typedef enum {
    EPI_PROG,         /* run prog over the output */
    EPI_BIAS,         /* conv: + bias[channel]; matmul: + bias[column] (read by prog's instruction epi_load) */
    EPI_BIAS_RELU,    /* the same, then relu */
    EPI_POSMASK,      /* conv input gradient, max-pool backward: keep where mask (epi_load) > 0 */
    EPI_BIAS_ADD,     /* f32 matmul: + bias[column], then + an f32 addend of the output's shape
                         (cx_kernel_epi_addend: a linear layer and its residual) */
} cx_epi;

typedef struct {
    cx_kkind kind;
    int out_slot;
    uint8_t out_dtype;
    int64_t out_numel;
    int ndim;
    int64_t shape[CX_MAX_DIMS];      /* iteration shape (fused/reduce) or output shape */
    cx_program prog;                 /* K_FUSED, K_REDUCE, and epilogues */
    bool has_epilogue;               /* heavy op followed by prog in place */
    uint8_t epi;                     /* cx_epi: how the epilogue runs */
    int epi_load;                    /* folded: prog's load of the bias or mask (slot rewrites stay in one place) */
    int red_op;                      /* OP_REDUCE_SUM / OP_REDUCE_MAX / OP_ARGMAX */
    uint8_t coll_op;                 /* K_COLL: OP_ALL_REDUCE ... OP_BROADCAST */
    int nkeep;                       /* reduce: leading kept iteration dims */
    int nin;
    cx_kin in[CX_MAX_KERNEL_INPUTS];
    int nattrs;
    int64_t attrs[CX_MAX_ATTRS];     /* the node's (op_attrs.h), read with CX_ATTR */
    double fval;
    int64_t scratch_bytes;
    int scratch_slot;
    int wait_at;                     /* K_COLL: kernel index before which to wait */
    /* for dumps and messages only, never run: the lowered graph's node the
     * kernel computes (-1: a copy the alias pass added) and its location
     * (XLA_IR_DEBUG); a loaded executable has -1 and 0 */
    int node;
    uint32_t loc;
} cx_kernel;

typedef enum { SLOT_INPUT, SLOT_OUTPUT, SLOT_ARENA } cx_slot_kind;

typedef struct {
    cx_slot_kind kind;
    int index;          /* input / output ordinal */
    int64_t bytes;
    int64_t offset;     /* arena */
    int def, last;      /* kernel indices of first write and last read */
} cx_slot;

typedef struct cx_executable {
    uint64_t key_hi, key_lo;
    /* the key without this process's thread count: the same on every rank
     * running the same graph (desync.c compares it) */
    uint64_t shared_hi, shared_lo;
    int n_inputs, n_rts, n_outputs;
    uint8_t *out_dtypes;
    int64_t *out_bytes;
    int *out_alias;     /* input ordinal whose buffer the output takes, or -1 */
    int *out_slot;
    int nslots, slots_cap;
    cx_slot *slots;
    int nkernels, kernels_cap;
    cx_kernel *kernels;
    int64_t arena_bytes, intermediate_bytes;
    int num_nodes, num_work_kernels, num_aliased;
    int max_prog;       /* largest program (registers per thread) */
    /* SPMD: each output's sharding (NULL when the graph was not
     * partitioned); serialized with its mesh's hash */
    struct cx_sharding *out_sharding;
    int spmd_inserted[4];
    struct cx_spmd_notes *spmd_notes;   /* for IR dumps: kept when XLA_SAVE_TENSORS_FILE was set at compile time */   /* the partitioner's all-reduces, all-gathers, reduce-scatters, all-to-alls */
} cx_executable;

/* ---- editing an executable (executable.c) ------------------------------------------------ */

/* @return the new slot's index, -1 when out of memory. */
int cx_exec_add_slot(cx_executable *e, cx_slot_kind kind, int index, int64_t bytes);
/* @return the new zeroed kernel (no scratch, no wait), NULL when out of memory.
 * Pointers to earlier kernels may move. */
cx_kernel *cx_exec_add_kernel(cx_executable *e);
/* Calls fn for every slot kernel k reads: program loads, inputs, scratch. */
void cx_kernel_each_read(const cx_kernel *k, void (*fn)(void *ctx, int slot), void *ctx);
bool cx_kernel_reads(const cx_kernel *k, int slot);
/* @return how many kernels read `slot`; *only = the last of them. */
int cx_exec_count_readers(const cx_executable *e, int slot, int *only);
/* @return the first kernel after `after` that reads slot (nkernels if none). */
int cx_exec_first_reader(const cx_executable *e, int slot, int after);
/* @return the first kernel writing slot, -1 if none. */
int cx_exec_first_writer(const cx_executable *e, int slot);
/* Every write and read of slot `from` goes to `to` instead. */
void cx_exec_rename_slot(cx_executable *e, int from, int to);
void cx_prog_rename_loads(cx_program *p, int from, int to);
/* A view that reads its buffer in the iteration's own element order. */
bool cx_view_is_identity(const cx_view *v, const int64_t *shape, int nd);
void cx_contiguous_strides(const int64_t *shape, int nd, int64_t *strides);

/* One value read at every index: an unmasked view at a non-negative
 * offset with stride 0 on every dim longer than 1. */
bool cx_view_is_broadcast(const cx_view *v, const int64_t *shape, int nd);

/* A gather's or scatter-add's index read one value per (outer, axis) row
 * (an embedding's row index expanded over the row): an unmasked view with
 * stride 0 on every dim after `axis` and outer dims that collapse to one
 * stride. @return whether ix is one; row (o, i) is then at view offset
 * + o * *outer_stride + i * *axis_stride. */
bool cx_index_is_rows(const cx_kin *ix, int axis, int64_t *outer_stride, int64_t *axis_stride);

/* Drops every kernel and slot (the codegen retry starts over). */
void cx_exec_clear_kernels(cx_executable *e);
/* Frees e and everything it owns (NULL is fine). */
void cx_executable_free(cx_executable *e);

/* @return the kind's name as traces and dumps print it ("kernel" for an
 * unknown kind). */
const char *cx_kernel_kind_name(int kind);

/* ---- the geometry of heavy kernels (geometry.c) ---- */

/* The geometry of a conv, pool or attention kernel, from its inputs and
 * attributes: what the compiler sizes scratch by and the runtime runs. */
void cx_kernel_conv_geom(const cx_kernel *k, cx_conv_geom *g);
void cx_kernel_pool_geom(const cx_kernel *k, cx_pool_geom *g);
/* Whether k is a pool or a pool's gradient (the kernels with a pool geometry). */
static inline bool cx_kernel_is_pool(const cx_kernel *k)
{
    return k->kind == K_MAXPOOL || k->kind == K_AVGPOOL || k->kind == K_MAXPOOL_BWD || k->kind == K_AVGPOOL_BWD;
}
void cx_kernel_attn_geom(const cx_kernel *k, cx_attn_geom *g);
/* Whether k is a bf16 matmul that took its reader's cast to f32 (the
 * epilogue pass): bf16 operands, its f32 sums out, no epilogue program. */
static inline bool cx_kernel_is_matmul_f32_sums(const cx_kernel *k)
{
    return k->kind == K_MATMUL && k->nin > 0 && k->in[0].dtype == CX_BF16 && k->out_dtype == CX_F32;
}

/* The instruction of k's program that loads an EPI_BIAS_ADD epilogue's
 * addend: its one load of neither the output nor the bias (epi_load).
 * @return its index, or -1 when there is no such one load. */
static inline int cx_kernel_epi_addend(const cx_kernel *k)
{
    int found = -1;
    for (int i = 0; i < k->prog.n; i++) {
        const cx_pinstr *in = &k->prog.ins[i];
        if (in->kind != P_LOAD || i == k->epi_load || in->slot == k->out_slot) continue;
        if (found >= 0) return -1;
        found = i;
    }
    return found;
}

/* ---- the serialized form (serialize.c) ---- */

/* A fingerprint of the raw layout the serialized form copies: a different
 * compiler or struct change must not reinterpret old bytes. */
uint32_t cx_exec_layout_fingerprint(void);
/* Appends e's serialized form to w (w->oom set when out of memory). */
void cx_exec_serialize(cx_sbuf *w, const cx_executable *e);
/* Reads a serialized executable from untrusted bytes and checks every
 * field against the format's rules. @return the executable, or NULL when
 * the bytes are not a valid one (or out of memory). */
cx_executable *cx_exec_deserialize(const unsigned char *p, size_t n);

#endif
