/* cxla nn: modules and layers.
 *
 * A module is an opaque handle with a type table (forward, free), named
 * parameters (persistent tensors that require grad) and buffers, and named
 * children. Full names compose like PyTorch's state-dict keys: "conv1.weight",
 * "bn1.running_mean", and a Sequential names its children "0", "1", ...
 * Constructors initialize parameters as PyTorch does, from the seeded RNG
 * (cx_manual_seed), and materialize them, so call them outside a step.
 *
 * A parameter may be tied (cx_module_tie): one tensor under two names, as
 * GPT's lm_head.weight is transformer.wte.weight. Every list of the tree
 * (parameters, state dict, size) holds it once, under the name it has
 * first in state-dict order; the optimizer, DDP, FSDP and checkpoints see
 * it once; both uses' gradients add up in its one gradient.
 *
 * Ownership: a module owns its parameters, buffers, children and their
 * names; what the accessors return (cx_module_param, cx_module_buffer,
 * cx_module_get, cx_module_child, cx_module_find, cx_module_param_name,
 * cx_module_child_name) is borrowed while the module holds it (until the
 * module is freed or the slot replaced): never cx_free or free() it. The
 * lists (cx_module_parameters, _buffers, _state_dict, _tied_params) and
 * cx_module_signature are the caller's, each one allocation to release
 * with free(); a list's names sit in that allocation, its tensors stay the
 * module's. Threads: modules are not locked; build, run and free them on
 * the training thread (core.h).
 */
#ifndef CXLA_NN_H
#define CXLA_NN_H

#include <cxla/core.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cx_module cx_module;

/* What a kind of module does. `forward` records the module's ops on one
 * input and returns one output. `forward_many` (optional; a type needs
 * one of the two) takes n_in inputs and writes up to max_out outputs into
 * out: a model taking (x, targets) and giving (logits, loss). It returns
 * how many outputs it wrote (never more than max_out), or -1 with
 * cx_last_error set (e.g. a wrong number of inputs); cx_module_forward
 * calls it with one input and room for one output. `free` releases the
 * type's own state (`impl`), never the parameters, buffers or children,
 * which the module owns. Initialize with designated initializers
 * ({ CX_STRUCT_SIZE(cx_module_type), .name = ..., .forward = ... }):
 * members may be added at the end. cx_module_new copies it. */
typedef struct {
    size_t struct_size;                                    /* CX_STRUCT_SIZE(cx_module_type) */
    const char *name;                                      /* "Linear" */
    cx_tensor *(*forward)(cx_module *m, cx_tensor *x);
    void (*free)(void *impl);                              /* may be NULL */
    int (*forward_many)(cx_module *m, cx_tensor *const *in, int n_in, cx_tensor **out, int max_out);
} cx_module_type;

/* ---- building modules ------------------------------------------------- */

/* A new module of `type` (copied) in training mode; takes `impl` (released
 * with type->free when the module is freed, also on failure here).
 * @return the module, or NULL with cx_last_error set: out of memory, a
 * NULL type, a struct_size below the first version's, neither forward nor
 * forward_many. */
CX_API cx_module *cx_module_new(const cx_module_type *type, void *impl);
CX_API void *cx_module_impl(const cx_module *m);
/* The name string of the type table the module was made with ("(null)" for
 * NULL): the table is copied, the string is not. */
CX_API const char *cx_module_type_name(const cx_module *m);

/* Registers `t` (made persistent, materialized, marked requires-grad) as
 * parameter `name` (no dots). The module owns it from now on, also on failure.
 * @return the slot for cx_module_param (>= 0), or -1 with cx_last_error set
 * on a duplicate or bad name, a non-float tensor, or out of memory. */
CX_API int cx_module_register_parameter(cx_module *m, const char *name, cx_tensor *t);
/* As above for a buffer (persistent state without gradient, e.g. running
 * statistics). @return the slot for cx_module_buffer, or -1. */
CX_API int cx_module_register_buffer(cx_module *m, const char *name, cx_tensor *t);
/* Adds `child` under `name` (no dots); the module owns it from now on, also
 * on failure. @return the child's slot (>= 0), or -1 on a duplicate/bad name
 * or out of memory. */
CX_API int cx_module_add_child(cx_module *m, const char *name, cx_module *child);

/* Ties parameter `key` to parameter `source_key`, both full names under m
 * ("lm_head.weight", "transformer.wte.weight"): from now on both name one
 * tensor, the source's (PyTorch's `lm_head.weight = wte.weight`). If `key`
 * is a parameter already, it must have the source's dtype and shape; its
 * own tensor is released and its slot kept (the layer's forward reads the
 * source's tensor through it). Otherwise a new parameter slot is added to
 * the module that holds `key`. The tensor lives until the last module
 * naming it is freed. Tie before wrapping (DDP, FSDP) or building an
 * optimizer: they list the parameters when they are made.
 * @return CX_OK (also when already tied); CX_ERR_ARG with cx_last_error set
 * when source_key names no parameter, key's module does not exist or key
 * names a buffer or child; CX_ERR_SHAPE on another dtype or shape;
 * CX_ERR_OOM. */
CX_API cx_status cx_module_tie(cx_module *m, const char *key, const char *source_key);

/* A tie as the tree lists it: `key` names the same tensor as `source`, the
 * name under which the parameter lists are holding it. */
typedef struct {
    const char *key;       /* "lm_head.weight" */
    const char *source;    /* "transformer.wte.weight" */
    cx_tensor *tensor;
} cx_tied_param;

/* Every later name of a parameter that the tree names more than once, in
 * state-dict order. One allocation: release it with free().
 * @return the array (n = 0 and a non-NULL array without ties), or NULL
 * with cx_last_error set for a NULL module or out of memory. */
CX_API cx_tied_param *cx_module_tied_params(const cx_module *m, int *n);

/* Direct access by slot (for forward functions: no string lookups). A tied
 * slot gives the shared tensor. Borrowed: the module's. */
CX_API cx_tensor *cx_module_param(const cx_module *m, int slot);
CX_API cx_tensor *cx_module_buffer(const cx_module *m, int slot);
CX_API cx_module *cx_module_child(const cx_module *m, int slot);
CX_API int cx_module_num_children(const cx_module *m);
/* Replaces the tensor in a parameter or buffer slot (the module takes `t`,
 * frees the old one). For wrappers that swap parameters (FSDP views). The
 * replacement goes to the value, not the slot: every slot a tied parameter
 * has sees it. */
CX_API void cx_module_set_param(cx_module *m, int slot, cx_tensor *t);
CX_API void cx_module_set_buffer(cx_module *m, int slot, cx_tensor *t);

/* Forward hooks, as PyTorch's forward pre/post hooks: `pre` runs before the
 * module's forward, `post` after it (post hooks in reverse order), for
 * cx_module_forward and cx_module_forward_many alike. Used by FSDP (gather
 * parameters) and gradient checkpointing (remat region). `outputs` (may be
 * NULL) runs just before the same hook's `post` and sees the forward's
 * outputs, which it may annotate in place (FSDPv2's shard_output); an
 * error from it fails the forward: cx_module_forward gives a poisoned
 * tensor naming it, cx_module_forward_many -1. */
#define CX_MODULE_MAX_HOOKS 4
typedef struct {
    size_t struct_size;   /* CX_STRUCT_SIZE(cx_module_hooks) */
    void (*pre)(cx_module *m, void *ctx);
    void (*post)(cx_module *m, void *ctx);
    void *ctx;
    cx_status (*outputs)(cx_module *m, cx_tensor **out, int n_out, void *ctx);
} cx_module_hooks;
/* @return the hook's index, or -1 with cx_last_error set (too many hooks,
 * NULL argument, a struct_size below the first version's). */
CX_API int cx_module_add_hooks(cx_module *m, const cx_module_hooks *h);
/* Removes every hook registered with `ctx`. */
CX_API void cx_module_remove_hooks(cx_module *m, void *ctx);
/* The module's own parameter slots (not its children's), tied ones
 * included: count, names, slots. */
CX_API int cx_module_num_own_params(const cx_module *m);
CX_API const char *cx_module_param_name(const cx_module *m, int slot);
CX_API int cx_module_param_slot(const cx_module *m, const char *name);
CX_API const char *cx_module_child_name(const cx_module *m, int slot);

/* ---- using modules ---------------------------------------------------- */

/* Records the module's forward on x, between its hooks. @return its output
 * (a step tensor when called inside a step), or a poisoned tensor for a
 * NULL module or when a forward_many type gives no output or an error. */
CX_API cx_tensor *cx_module_forward(cx_module *m, cx_tensor *x);
/* Records the module's forward on n_in inputs into up to max_out outputs,
 * between its hooks (out[0..max_out) is NULLed first). A type with only
 * `forward` takes exactly one input into one output.
 * @return the number of outputs written (0..max_out), or -1 with
 * cx_last_error set: NULL module, bad lists, a one-input type given other
 * than one input, or the type's own error. */
CX_API int cx_module_forward_many(cx_module *m, cx_tensor *const *in, int n_in, cx_tensor **out, int max_out);
/* Training (true) or evaluation mode, for the module and all children. */
CX_API void cx_module_train(cx_module *m, bool on);
CX_API bool cx_module_is_training(const cx_module *m);
/* Frees the module, its parameters, buffers and children. NULL is fine. */
CX_API void cx_module_free(cx_module *m);

/* Parameters of the module and its children in registration order (own
 * parameters first, then each child's), with full names; a tied parameter
 * once, under its first name in this order. One allocation: release it
 * with free(). @return the array (n = 0 and a non-NULL array for a module
 * without parameters), NULL when out of memory. */
CX_API cx_named_tensor *cx_module_parameters(const cx_module *m, int *n);
/* Buffers, likewise. */
CX_API cx_named_tensor *cx_module_buffers(const cx_module *m, int *n);
/* The state dict, PyTorch's order: per module its parameters then its
 * buffers, then each child's; a tied parameter once, under its first name
 * (cx_module_tied_params lists the others). Release with free(). */
CX_API cx_named_tensor *cx_module_state_dict(const cx_module *m, int *n);
/* The parameter or buffer with full name `key` ("fc1.weight"; any name of
 * a tied parameter), NULL if none. Borrowed: the module's. */
CX_API cx_tensor *cx_module_get(const cx_module *m, const char *key);
/* The submodule with full name `path` ("layer1.0"), NULL if none. */
CX_API cx_module *cx_module_find(cx_module *m, const char *path);
/* Total number of parameter elements (sum of numel, a tied one once). */
CX_API int64_t cx_module_num_params(const cx_module *m);
/* The structural signature of `m`: one entry per parameter and buffer in
 * state-dict order, "name:dtype:(d0, d1, ...);" for a parameter,
 * "buffer name:dtype:(...);" for a buffer ("0.weight:f32:(16, 8);") and
 * "tie name=first;" at each later name of a tied parameter. Values play no
 * part: two modules have equal signatures exactly when they have the same
 * names, kinds, dtypes, shapes and ties in the same order. DDP and
 * FSDP exchange it to check that every rank holds the same model.
 * @return the text (release with free(); "" for a module without
 * parameters or buffers), or NULL with cx_last_error set for a NULL module
 * or out of memory. */
CX_API char *cx_module_signature(const cx_module *m);

/* One entry of a signature, without its ';' (len 0 past the last entry). */
typedef struct {
    const char *text;
    int len;
} cx_module_sig_entry;

/* Compares two signatures (also ones a wrapper extended with entries of its
 * own in the same "entry;" form). NULL reads as "".
 * @return false when they are equal; true when they differ, with *ea and
 * *eb (either may be NULL) set to the entry of each that holds the first
 * difference. */
CX_API bool cx_module_signature_diff(const char *a, const char *b, cx_module_sig_entry *ea, cx_module_sig_entry *eb);

/* Overwrites the parameter/buffer `key` with host data of its own shape
 * (converted from `dtype`), materializing it at once.
 * @return CX_OK, CX_ERR_ARG for an unknown key, or the sync error. */
CX_API cx_status cx_module_load(cx_module *m, const char *key, const void *data, cx_dtype dtype);

/* ---- initialization (PyTorch's torch.nn.init, from the seeded RNG) ---- */

/* fan_in of a weight (out, in, ...): in * prod(kernel dims). */
CX_API int64_t cx_init_fan_in(const int64_t *shape, int ndim);
/* New persistent tensors (materialized). */
CX_API cx_tensor *cx_init_uniform(const int64_t *shape, int ndim, double lo, double hi);
CX_API cx_tensor *cx_init_normal(const int64_t *shape, int ndim, double mean, double std);
/* kaiming_uniform_(w, a): bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)). */
CX_API cx_tensor *cx_init_kaiming_uniform(const int64_t *shape, int ndim, double a);

/* A persistent tensor filled with `value` (biases, norms, buffers). */
CX_API cx_tensor *cx_init_constant(const int64_t *shape, int ndim, double value, cx_dtype dtype);

/* ---- deferred construction (PyTorch's meta device) -------------------- */

/* Between begin and end (they nest; per thread), the cx_init_* functions,
 * and with them every layer constructor, give deferred tensors (core.h:
 * shape, dtype and init recipe, no memory) instead of values, and advance
 * the RNG exactly as the eager draws would. A model built so costs no
 * device memory; its parameters get their values later, whole
 * (cx_module_materialize) or straight into each rank's shard
 * (cx_fsdp_wrap), bit-identical to an eager build from the same seed.
 * A custom module is deferred as long as it makes its parameters with the
 * cx_init_* functions; a tensor it makes otherwise stays a value. */
CX_API void cx_deferred_init_begin(void);
CX_API void cx_deferred_init_end(void);
CX_API bool cx_deferred_init_enabled(void);
/* The number of the module tree's parameters and buffers (a tied one once)
 * that are still deferred. 0 for NULL. */
CX_API int cx_module_num_deferred(const cx_module *m);
/* Gives every deferred parameter and buffer its whole values, in place.
 * @return CX_OK (also when none is deferred); CX_ERR_OOM (CX_MEMORY_LIMIT
 * included) naming the tensor, or CX_ERR_ARG for NULL. What was
 * materialized before a failure stays so. */
CX_API cx_status cx_module_materialize(cx_module *m);

/* ---- layers ----------------------------------------------------------- */

/* Linear: y = x W^T + b, W (out, in), b (out); x (..., in). */
CX_API cx_module *cx_nn_linear(int64_t in_features, int64_t out_features, bool bias);

/* Start from cx_conv2d_default_opts() (it sets struct_size, core.h). */
typedef struct {
    size_t struct_size;
    int stride, padding, dilation, groups;
    bool bias;
} cx_conv2d_opts;
/* stride 1, padding 0, dilation 1, groups 1, bias on. */
static inline cx_conv2d_opts cx_conv2d_default_opts(void)
{
    cx_conv2d_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.stride = 1;
    o.padding = 0;
    o.dilation = 1;
    o.groups = 1;
    o.bias = true;
    return o;
}
/* Conv2d with a square kernel: x (N, in, H, W), W (out, in/groups, k, k).
 * @return the module, or NULL with cx_last_error set on bad sizes or
 * options (a struct_size below the first version's included). */
CX_API cx_module *cx_nn_conv2d(int64_t in_channels, int64_t out_channels, int kernel_size, cx_conv2d_opts opts);

/* stride 0 means stride = kernel (PyTorch's default). */
CX_API cx_module *cx_nn_max_pool2d(int kernel_size, int stride, int padding);
CX_API cx_module *cx_nn_avg_pool2d(int kernel_size, int stride, int padding);
/* Output (N, C, out_h, out_w) with PyTorch's window boundaries. */
CX_API cx_module *cx_nn_adaptive_avg_pool2d(int out_h, int out_w);
/* Flattens dims start..end (negative counts from the end); (1, -1) as PyTorch. */
CX_API cx_module *cx_nn_flatten(int start_dim, int end_dim);

CX_API cx_module *cx_nn_relu(void);
CX_API cx_module *cx_nn_gelu(bool tanh_approx);
CX_API cx_module *cx_nn_silu(void);
CX_API cx_module *cx_nn_tanh(void);
CX_API cx_module *cx_nn_sigmoid(void);
/* log_softmax / softmax over `dim`. */
CX_API cx_module *cx_nn_log_softmax(int dim);
/* Zeroes elements with probability p and scales the rest by 1/(1-p) in
 * training mode; identity in evaluation mode. NULL for p outside [0, 1]. */
CX_API cx_module *cx_nn_dropout(double p);

/* Start from cx_batch_norm_default_opts() (it sets struct_size, core.h). */
typedef struct {
    size_t struct_size;
    double eps, momentum;
    bool affine, track_running_stats;
} cx_batch_norm_opts;
/* eps 1e-5, momentum 0.1, affine, tracking running stats. */
static inline cx_batch_norm_opts cx_batch_norm_default_opts(void)
{
    cx_batch_norm_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.eps = 1e-5;
    o.momentum = 0.1;
    o.affine = true;
    o.track_running_stats = true;
    return o;
}
/* BatchNorm2d over (N, C, H, W): parameters weight, bias; buffers
 * running_mean, running_var, num_batches_tracked. Training mode normalizes
 * with the batch statistics and updates the running ones (unbiased
 * variance); evaluation mode uses the running ones. @return the module, or
 * NULL with cx_last_error set on bad options (a struct_size below the first
 * version's included). */
CX_API cx_module *cx_nn_batch_norm2d(int64_t num_features, cx_batch_norm_opts opts);

/* LayerNorm over the last dim of size `dim` (weight 1, bias 0). */
CX_API cx_module *cx_nn_layer_norm(int64_t dim, double eps, bool elementwise_affine);
/* Embedding (num, dim) with N(0, 1) weights; input: integer indices. */
CX_API cx_module *cx_nn_embedding(int64_t num_embeddings, int64_t dim);

/* Sequential: children "0", "1", ... applied in order. Takes the modules
 * (also on failure; NULL entries make the call fail). */
CX_API cx_module *cx_nn_sequential(cx_module **mods, int n);
/* Appends a child to a Sequential. @return its slot or -1. */
CX_API int cx_nn_sequential_append(cx_module *seq, cx_module *child);

/* Causal multi-head self-attention: qkv Linear(d, 3d), scaled dot product
 * with a causal mask, proj Linear(d, d); x (B, T, d). */
CX_API cx_module *cx_nn_causal_self_attention(int64_t d_model, int n_heads);
/* Pre-norm Transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)) with
 * mlp = Sequential(Linear(d, 4d), GELU, Linear(4d, d)). Children: ln_1,
 * attn (qkv, proj), ln_2, mlp ("0", "2"). x (B, T, d). */
CX_API cx_module *cx_nn_transformer_block(int64_t d_model, int n_heads);

#ifdef __cplusplus
}
#endif
#endif
