/* cxla FSDP: fully sharded data parallel (ZeRO-2 / ZeRO-3), as PyTorch/XLA's
 * XlaFullyShardedDataParallel.
 *
 * Each wrapped unit (the root, and nested submodules by choice or by an
 * auto-wrap policy) flattens the parameters it owns (not those of nested
 * units) into one flat parameter, zero-padded to a multiple of
 * world_size * shard_size_multiple; every rank keeps its contiguous shard,
 * and the optimizer only ever sees shards. The module's own parameter slots
 * hold value-less placeholders (names and shapes only) except during the
 * unit's forward, when they are views of the all-gathered flat parameter.
 * Gradients reach the shard through the all-gather's VJP, a reduce-scatter.
 *
 * Tied parameters (cx_module_tie) are supported when every module using
 * one is in the same unit (GPT keeps wte and lm_head in the root unit): the
 * unit flattens it once, under its first state-dict name, and all its slots
 * see the same gathered view, so both uses' gradients add up before the
 * reduce-scatter. A parameter tied across two units is an error of
 * cx_fsdp_wrap naming both names and units. Optimizer parameter groups
 * see flat parameters (one per unit); cx_fsdp_decay_masks lets a group
 * decay only some of a unit's elements (the 2-D weights).
 *
 * Ownership: both wrappers borrow their module and own what they make
 * (flat shards, names, metadata) until freed. The caller frees with free()
 * the arrays of cx_fsdp_parameters and cx_fsdp_decay_masks (and cx_free's
 * each mask first). Threads: wrapping, forward and backward record ops and
 * collectives: call them on the training thread (core.h).
 */
#ifndef CXLA_FSDP_H
#define CXLA_FSDP_H

#include <cxla/core.h>
#include <cxla/nn.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cx_fsdp cx_fsdp;

/* Start from cx_fsdp_default_opts() (it sets struct_size, core.h). */
typedef struct {
    size_t struct_size;
    bool reshard_after_forward;       /* true: ZeRO-3 (default); false: ZeRO-2 */
    int shard_size_multiple;          /* flat param padded to world * this (default 1) */
    /* nesting: every listed submodule path becomes its own unit ... */
    const char *const *wrap_paths;
    int n_wrap_paths;
    /* ... or an auto-wrap policy: submodules with >= min params (size), or
     * whose type name is listed ("Linear", "Conv2d", "TransformerBlock") */
    int64_t auto_wrap_min_params;     /* 0: off; all the submodule's parameters count, nested
                                       * units' included (FSDPv2's policy counts only the rest) */
    const char *const *auto_wrap_types;
    int n_auto_wrap_types;
    bool grad_ckpt;                   /* rematerialize each unit's forward in backward */
    /* mixed precision, as torch_xla's FSDP: CX_BF16 all-gathers each unit's
     * parameters as bf16 (half the bytes; the forward sees bf16 views, for
     * autocast) while the f32 shards stay the masters the optimizer steps;
     * CX_F32 (the default) gathers them as they are. */
    cx_dtype compute_dtype;
    /* with compute_dtype bf16: the gradients are reduce-scattered in f32
     * (the default; cast up before the reduction) rather than in bf16 */
    bool fp32_reduce_scatter;
} cx_fsdp_opts;
static inline cx_fsdp_opts cx_fsdp_default_opts(void)
{
    cx_fsdp_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.reshard_after_forward = true;
    o.shard_size_multiple = 1;
    o.compute_dtype = CX_F32;
    o.fp32_reduce_scatter = true;
    return o;
}

/* Wraps `m` (borrowed; it must outlive the wrapper). Checks that every rank
 * wraps the same model the same way (a mismatch is an error on every rank,
 * never a hang), takes rank 0's values, and shards them.
 * @return the wrapper, or NULL with cx_last_error set (also, on every
 * rank, for a parameter tied across two units; bad options (a
 * compute_dtype other than f32 or bf16, a struct_size below the first
 * version's) included). */
CX_API cx_fsdp *cx_fsdp_wrap(cx_module *m, cx_fsdp_opts opts);
CX_API void cx_fsdp_free(cx_fsdp *f);
CX_API cx_module *cx_fsdp_module(cx_fsdp *f);

/* The root module's forward (each unit gathers in its pre-hook).
 * @return its output, or a poisoned tensor. */
CX_API cx_tensor *cx_fsdp_forward(cx_fsdp *f, cx_tensor *x);
/* The same for many inputs and outputs (cx_module_forward_many).
 * @return the number of outputs written, or -1 with cx_last_error set. */
CX_API int cx_fsdp_forward_many(cx_fsdp *f, cx_tensor *const *in, int n_in, cx_tensor **out, int max_out);
/* Backward: gradients are reduce-scattered (mean over ranks) into each
 * shard's grad. With compute_dtype bf16 and fp32_reduce_scatter the
 * reduce-scatters are recorded here, after the backward walk, so call this
 * rather than cx_backward. Inside no_sync they accumulate unsharded per unit instead
 * (no reduce-scatter; a full-size gradient per unit, as PyTorch's FSDP) and
 * the next backward outside it reduce-scatters them onto its own. */
CX_API cx_status cx_fsdp_backward(cx_fsdp *f, cx_tensor *loss);
CX_API void cx_fsdp_no_sync_begin(cx_fsdp *f);
CX_API void cx_fsdp_no_sync_end(cx_fsdp *f);

/* The local flat shards, one per unit, named "<unit path>.flat_param"
 * ("flat_param" for the root). Give these to the optimizer.
 * Release the array with free(); the names and shards in it are the
 * wrapper's, valid until cx_fsdp_free. */
CX_API cx_named_tensor *cx_fsdp_parameters(const cx_fsdp *f, int *n);

/* Weight-decay masks for the flat shards, in cx_fsdp_parameters' order:
 * one f32 tensor per shard, 1 over the elements of original parameters of
 * at least min_ndim dims and 0 elsewhere (padding included). Give them to
 * a parameter group (cx_param_group.decay_masks) to decay only the 2-D
 * weights (min_ndim 2), as the unwrapped model's groups would.
 * @return the masks (persistent: cx_free each, then free() the array) and
 * *n, or NULL with cx_last_error set for a NULL wrapper or out of memory. */
CX_API cx_tensor **cx_fsdp_decay_masks(const cx_fsdp *f, int min_ndim, int *n);

/* Global gradient-norm clipping across shards: local sum of squares, one
 * all-reduce. @return the total norm before clipping (lazy 0-d tensor). */
CX_API cx_tensor *cx_fsdp_clip_grad_norm(cx_fsdp *f, double max_norm);

/* ---- metadata and state dicts ------------------------------------------------ */

typedef struct {
    const char *name;                 /* full PyTorch key: "fc1.weight" */
    int ndim;
    int64_t shape[CX_MAX_DIMS];
    int64_t numel;
    int64_t offset;                   /* element offset in the unit's flat parameter */
} cx_fsdp_param_info;

typedef struct {
    const char *path;                 /* unit's module path ("" for the root) */
    const char *flat_name;            /* "<path>.flat_param" */
    int nparams;
    const cx_fsdp_param_info *params;
    int64_t flat_numel;               /* sum of numels, unpadded */
    int64_t padded_numel;             /* multiple of world_size * shard_size_multiple */
    int64_t shard_numel;              /* padded_numel / world_size */
    int64_t padding;                  /* padded_numel - flat_numel */
    int world_size, rank;
    int64_t shard_offset;             /* rank * shard_numel */
} cx_fsdp_unit_info;

/* Per unit, in wrap order. Owned by the wrapper: valid until cx_fsdp_free. */
CX_API const cx_fsdp_unit_info *cx_fsdp_shard_metadata(const cx_fsdp *f, int *nunits);

/* Full state dict gathered to rank 0 one unit at a time (never the whole
 * model on any rank): fn is called on rank 0 for every parameter with its
 * host data (f32, row-major); buffers follow under their keys.
 * @return CX_OK or the first error (from fn or communication). */
typedef cx_status (*cx_fsdp_tensor_fn)(void *ctx, const char *name, const int64_t *shape, int ndim,
                                       const float *data);
CX_API cx_status cx_fsdp_full_state_dict(cx_fsdp *f, cx_fsdp_tensor_fn fn, void *ctx);

/* Loads one full (unsharded) parameter into the local shard (the slice this
 * rank owns; any world size). @return CX_OK, CX_ERR_ARG for an unknown name
 * or a wrong numel. */
CX_API cx_status cx_fsdp_load_full_param(cx_fsdp *f, const char *name, const float *data, int64_t numel);

/* ---- gradient checkpointing ---------------------------------------------------- */

/* Marks module `m` for rematerialization: its forward is recorded again for
 * backward, so its activations die after their forward use. Under FSDP the
 * unit's gathered parameters are reused, not gathered twice.
 * @return CX_OK or CX_ERR_ARG. */
CX_API cx_status cx_checkpoint_module(cx_module *m);

/* ---- FSDPv2: FSDP through SPMD ------------------------------------------------------
 * As torch_xla's SpmdFullyShardedDataParallel: every parameter's first
 * dimension (or, with shard_maximal, its largest dimension that divides by
 * the axis' size) is sharded over the mesh axis named "fsdp" (padded when it
 * does not divide), and so is the output of the forward; the compiler's
 * SPMD partitioner then all-gathers each weight where it is used and
 * reduce-scatters its gradient, and the optimizer updates shards (its state
 * is split like each parameter: build the optimizer after wrapping). The
 * input batch is the caller's to shard over "fsdp" (cx_mark_sharding, or
 * the loader's input sharding). Needs cx_use_spmd. A deferred model
 * (cx_deferred_init_begin) materializes only each rank's shards.
 *
 * Nested wrapping (the seed's auto_wrap_policy): each submodule the policy
 * picks (by type name, e.g. GPT's "Block" or ResNet's "BasicBlock" and
 * "Bottleneck", as transformer_auto_wrap_policy; or by parameter count, as
 * size_based_auto_wrap_policy) gets its outputs sharded by shard_output
 * after its forward, and with grad_ckpt its forward is rematerialized in
 * backward (FSDPv2(checkpoint_module(block), mesh)). Parameters are sharded
 * alike wherever they sit. A parameter that is already SPMD-sharded over
 * other axes (tensor parallelism over "model", cx_gpt_tensor_parallel)
 * keeps them and adds "fsdp" on a dimension they leave whole (2-D
 * sharding); one whose every dimension is split stays as it is. */
typedef struct cx_spmd_fsdp cx_spmd_fsdp;
struct cx_mesh;
/* Shards the forward's output (the seed's shard_output). @return CX_OK or an error. */
typedef cx_status (*cx_shard_output_fn)(cx_tensor *output, const struct cx_mesh *mesh, void *arg);
/* The same for every output of a forward (a tuple: out[0 .. n_out)). */
typedef cx_status (*cx_shard_outputs_fn)(cx_tensor **out, int n_out, const struct cx_mesh *mesh, void *arg);

/* Start from cx_spmd_fsdp_default_opts() (it sets struct_size, core.h). */
typedef struct {
    size_t struct_size;
    /* NULL: the default, which shards a single output's first (batch)
     * dimension over "fsdp", or the first element of a tuple (the
     * activation: (logits, loss) shards the logits); anything else (a 0-d
     * output or first element, no output) is an error asking for one */
    cx_shard_outputs_fn shard_output;
    void *shard_output_arg;
    /* auto-wrap: submodules whose type name is listed ... */
    const char *const *auto_wrap_types;
    int n_auto_wrap_types;
    /* ... or that hold at least this many parameters outside their
     * wrapped descendants (0: off; children are decided first, as
     * size_based_auto_wrap_policy's recursive wrap) */
    int64_t auto_wrap_min_params;
    bool grad_ckpt;       /* rematerialize each wrapped submodule's forward in backward */
    bool shard_maximal;   /* shard the largest dimension dividing by the fsdp axis, not the first */
} cx_spmd_fsdp_opts;
static inline cx_spmd_fsdp_opts cx_spmd_fsdp_default_opts(void)
{
    cx_spmd_fsdp_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    return o;
}

/* Wraps model (borrowed; it must outlive the wrapper) as opts say: shards
 * its parameters, and hooks shard_output (and checkpointing) onto each
 * submodule the auto-wrap policy picks. @return the wrapper, or NULL with
 * the error set (SPMD off, no "fsdp" axis, a parameter refused naming it,
 * a struct_size below the first version's, a negative
 * auto_wrap_min_params, more hooks than a module holds). */
CX_API cx_spmd_fsdp *cx_spmd_fsdp_wrap_opts(cx_module *model, const struct cx_mesh *mesh, cx_spmd_fsdp_opts opts);
/* The root only, with a one-tensor shard_output (NULL: the default).
 * @return as cx_spmd_fsdp_wrap_opts. */
CX_API cx_spmd_fsdp *cx_spmd_fsdp_wrap(cx_module *model, const struct cx_mesh *mesh, cx_shard_output_fn shard_output,
                                       void *arg);
/* The module's forward, its output sharded. @return the output (poisoned
 * on error, also for a wrapper whose shard_output takes a tuple and
 * refuses a single tensor). */
CX_API cx_tensor *cx_spmd_fsdp_forward(cx_spmd_fsdp *f, cx_tensor *x);
/* The same for many inputs and outputs (cx_module_forward_many: a GPT's
 * (idx, targets) -> (logits, loss)), the outputs sharded by shard_output.
 * @return the number of outputs written, or -1 with cx_last_error set (the
 * module's error, or shard_output's, which names what to pass). */
CX_API int cx_spmd_fsdp_forward_many(cx_spmd_fsdp *f, cx_tensor *const *in, int n_in, cx_tensor **out, int max_out);
/* The submodules the auto-wrap policy picked, depth first with children
 * before their parent (the root not among them): their count, and the
 * path of the i-th ("transformer.h.0"; "" past the end or for a NULL
 * wrapper; the wrapper's until freed). */
CX_API int cx_spmd_fsdp_num_wrapped(const cx_spmd_fsdp *f);
CX_API const char *cx_spmd_fsdp_wrapped_path(const cx_spmd_fsdp *f, int i);
CX_API cx_module *cx_spmd_fsdp_module(const cx_spmd_fsdp *f);
/* Removes the wrapper's hooks from the model (which keeps its shardings). NULL is fine. */
CX_API void cx_spmd_fsdp_free(cx_spmd_fsdp *f);

#ifdef __cplusplus
}
#endif
#endif
