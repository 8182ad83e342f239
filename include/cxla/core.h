/* cxla core: lazy tensors, steps, ops, autograd, RNG, metrics.
 *
 * Every op only records an IR node and checks shapes; nothing runs until a
 * sync (cx_step_end / cx_sync) or a read (cx_item / cx_to_host). A bad
 * argument never crashes: the op returns a poisoned tensor whose error
 * surfaces at the next sync, and cx_last_error() names the op and shapes.
 */
#ifndef CXLA_CORE_H
#define CXLA_CORE_H

#include <cxla/export.h>
#include <cxla/version.h>

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CX_MAX_DIMS 8

typedef enum {
    CX_F32 = 0,
    CX_BF16,
    CX_I32,
    CX_I64,
    CX_U8,
    CX_BOOL,
    CX_DTYPE_COUNT
} cx_dtype;

typedef enum {
    CX_OK = 0,
    CX_ERR_SHAPE,      /* shape mismatch or bad argument in an op */
    CX_ERR_ARG,        /* bad argument to an API call */
    CX_ERR_OOM,        /* allocation failed or memory limit exceeded */
    CX_ERR_IO,         /* file missing, unreadable, corrupt */
    CX_ERR_COMM,       /* collective / communication failure */
    CX_ERR_STATE,      /* API called in the wrong state */
} cx_status;

typedef struct cx_tensor cx_tensor;

/* Structs the library reads from the caller's memory (option structs,
 * descriptions, type tables) start with `size_t struct_size`, so they can
 * gain members without breaking programs built against older headers: the
 * library reads only the first struct_size bytes and takes defaults for
 * the rest. Set it through the struct's default function
 * (cx_ddp_default_opts(), ...) or, in a designated initializer, with
 * CX_STRUCT_SIZE: { CX_STRUCT_SIZE(cx_module_type), .name = "Mine", ... }.
 * A struct_size of 0 (a struct zeroed by hand) or below the struct's first
 * version is refused with an error naming the struct (docs/api.md). */
#define CX_STRUCT_SIZE(T) .struct_size = sizeof(T)

/* The default functions (cx_ddp_default_opts(), ...) are static inline so
 * they build the struct at the caller's size: a library function returning
 * it by value would write its own, possibly larger, struct into the
 * caller's smaller slot. They start from all zeros with this, which C11
 * ({ 0 }) and C++ ({}, warning-free under -Wextra) spell differently. */
#ifdef __cplusplus
#define CX_ZEROED_ {}
#else
#define CX_ZEROED_ { 0 }
#endif

/* A tensor with its state-dict name ("fc1.weight"): parameters, buffers,
 * optimizer state. The name is owned by whoever made the array. */
typedef struct {
    const char *name;
    cx_tensor *tensor;
} cx_named_tensor;

/* ---- threads and ownership --------------------------------------------
 *
 * The graph being recorded is one per process and unlocked (its node
 * table, reference counts, the RNG state): record ops, run forwards,
 * backward and optimizer steps, and call cx_step_begin / cx_step_end,
 * cx_sync, cx_item, cx_to_host and cx_assign on one thread, the training
 * thread. Per thread are the open steps (a handle belongs to the innermost
 * step of the thread that made it, so end a step on the thread that began
 * it), no-grad and remat regions, deferred-init regions (nn.h), profiler
 * regions and cx_last_error. Another thread may make leaf tensors
 * meanwhile (cx_from_host, cx_from_fill, cx_from_host_sharded): handles,
 * nodes and buffers are allocated under locks, and with no step open on
 * that thread the handle is persistent. The data loader's thread uploads
 * batches so, and the training thread frees them. Counters and metrics
 * (metrics.h), the memory figures, step closures (cx_add_step_closure)
 * and the log handler (logging.h) may be used from any thread.
 *
 * A tensor a function returns is the caller's handle to release with
 * cx_free (inside a step the step releases it unless kept), unless its
 * comment says whose it is (cx_grad: t's; a batch's fields: the
 * loader's). Other pointers into the library (names, shapes, metadata) are
 * borrowed, valid as the function's comment says. Results to release with
 * libc free() say so at the function; docs/api.md lists them. */

/* ---- version ---------------------------------------------------------- */

/* The version of the library running (cxla/version.h has the one compiled
 * against: compare with CX_VERSION_NUMBER to catch a stale libcxla).
 * @return MAJOR * 10000 + MINOR * 100 + PATCH (0.1.0: 100). Never fails. */
CX_API unsigned cx_version_number(void);

/* ---- errors ---------------------------------------------------------
 *
 * How errors are reported. No function of the library ends the process on
 * a failure; each reports it in one of these ways, and its comment says
 * which:
 *
 *  - cx_status: CX_OK, or an error code, with the message in
 *    cx_last_error(). Most calls that do something (sync, load, save, init).
 *  - Ops and tensor constructors return a poisoned tensor, never NULL for
 *    a bad argument: the message is in cx_tensor_error(t) and
 *    cx_last_error(), poison flows through later ops, and cx_sync /
 *    cx_step_end return the error. Free a poisoned tensor like any other.
 *  - Other constructors (modules, optimizers, wrappers, loaders) return
 *    NULL with cx_last_error set.
 *  - Counts and slots (int) are -1 on error, with cx_last_error set.
 *  - cx_item returns NaN on error with cx_last_error set; a NaN value is
 *    also NaN, so to tell them apart read with cx_to_host (a cx_status).
 *  - cx_loader_next tells a batch, the end of the epoch and an error apart
 *    (cx_loader_result, data.h).
 *
 * The message is per thread, one line, and stays until the next failure
 * or cx_clear_error: a success does not clear it, so read it only after a
 * failure was reported. A function returning void either cannot fail or
 * says what it does instead (most treat NULL as a no-op).
 */

/* @return the last error message of this thread ("" if none). The pointer
 * stays valid for the thread's life; the text changes with the next error. */
CX_API const char *cx_last_error(void);
CX_API void cx_clear_error(void);
/* Sets this thread's last error (for modules and programs built on the
 * core: nn, optim, parallel, user layers). printf-style; the arguments may
 * point into cx_last_error() itself ("%s: while loading", cx_last_error())
 * and the message is cut at 1023 bytes. */
CX_API void cx_set_last_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* @return the code's name ("CX_ERR_IO"), a static string; "CX_ERR_UNKNOWN"
 * for a value that is no cx_status. Never NULL. */
CX_API const char *cx_status_str(cx_status s);
/* A poisoned tensor carrying a one-line message, also set as the last
 * error (for modules built on the core). printf-style. */
CX_API cx_tensor *cx_poisoned(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* @return the message of a poisoned tensor (t's: valid while t lives),
 * NULL if t is healthy. */
CX_API const char *cx_tensor_error(const cx_tensor *t);

/* ---- dtypes --------------------------------------------------------- */

CX_API size_t cx_dtype_size(cx_dtype dt);
CX_API const char *cx_dtype_name(cx_dtype dt);   /* a static string; "?" for no dtype */
CX_API bool cx_dtype_is_float(cx_dtype dt);
/* bfloat16 <-> float32 for host data of CX_BF16 tensors: round to nearest
 * even, NaN stays a (quiet) NaN. The _row forms convert n values. */
CX_API float cx_bf16_to_f32(uint16_t h);
CX_API uint16_t cx_f32_to_bf16(float f);
CX_API void cx_bf16_to_f32_row(float *dst, const uint16_t *src, int64_t n);
CX_API void cx_f32_to_bf16_row(uint16_t *dst, const float *src, int64_t n);
/* Which instructions multiply bf16 matmuls on this machine, as chosen at
 * run time, capped by CX_CPU_ISA and routed by CX_BF16_GEMM: "amx"
 * (oneDNN's AMX kernels), "avx512_bf16" (cxla's vdpbf16ps tiles),
 * "avx512_bf16 (oneDNN)" (oneDNN's vdpbf16ps kernels), or "none (converted
 * to f32)" (tiles widened for the f32 kernels). On an AMX CPU the first
 * call may ask the kernel for AMX's tile state (arch_prctl), once.
 * @return a static string, never NULL. */
CX_API const char *cx_bf16_path(void);

/* ---- tensor creation and lifetime ----------------------------------- */

/* Copies `data` (host memory, `dtype`, row-major `shape`) into a new device
 * buffer. Counts TransferToDeviceTime. Under XLA_USE_BF16 or
 * XLA_DOWNCAST_BF16 f32 data is held (and reported by cx_dtype_of) as
 * bf16, rounded to nearest even; so in every cx_from_* function.
 * @return a new tensor, or a poisoned tensor on a bad shape/dtype. */
CX_API cx_tensor *cx_from_host(const void *data, const int64_t *shape, int ndim, cx_dtype dtype);
/* Like cx_from_host, but `fill` writes the values straight into the new
 * device buffer (`bytes` = numel * dtype size): one copy fewer for loaders
 * that read from files. @return the tensor, or a poisoned tensor carrying
 * fill's error (a non-CX_OK return; its message via cx_last_error). */
typedef cx_status (*cx_fill_fn)(void *ctx, void *dst, size_t bytes);
CX_API cx_tensor *cx_from_fill(const int64_t *shape, int ndim, cx_dtype dtype, cx_fill_fn fill, void *ctx);
/* A constant filled with `value` (part of the graph: changing it recompiles). */
CX_API cx_tensor *cx_full(const int64_t *shape, int ndim, double value, cx_dtype dtype);
CX_API cx_tensor *cx_zeros(const int64_t *shape, int ndim, cx_dtype dtype);
CX_API cx_tensor *cx_ones(const int64_t *shape, int ndim, cx_dtype dtype);
/* A 0-d constant. */
CX_API cx_tensor *cx_scalar(double value, cx_dtype dtype);
/* A 0-d value passed at run time: changing it never recompiles (learning
 * rates, step counters). */
CX_API cx_tensor *cx_runtime_scalar(double value, cx_dtype dtype);
/* A value-less tensor: shape and dtype only. Using it in a computation or
 * reading it is an error naming it (FSDP keeps these in module slots while
 * the values live sharded). Persistent. */
CX_API cx_tensor *cx_placeholder(const int64_t *shape, int ndim, cx_dtype dtype);
/* ---- deferred initialization ---------------------------------------------- */

/* How a deferred tensor's values are made. The random kinds draw from the
 * counter-based RNG: the value at row-major position p depends only on
 * (rng.seed, rng.offset + p), so any range of it can be generated alone,
 * bit-identical to the same range of the whole (sharded construction). */
typedef enum { CX_INIT_CONSTANT, CX_INIT_UNIFORM, CX_INIT_NORMAL } cx_init_kind;
typedef struct {
    cx_init_kind kind;
    double a, b;          /* constant: value a; uniform: [a, b); normal: mean a, std b */
    uint64_t seed;        /* random kinds: the stream ... */
    uint64_t offset;      /* ... and the counter of element 0 */
} cx_init_recipe;

/* A value-less tensor, as cx_placeholder, that carries the recipe of its
 * values: nothing is allocated until someone generates them. Using it in a
 * computation or reading it is an error naming it as deferred. Persistent.
 * @return the tensor, or a poisoned one for a bad shape, dtype or kind. */
CX_API cx_tensor *cx_deferred(const int64_t *shape, int ndim, cx_dtype dtype, const cx_init_recipe *recipe);
/* @return true when t is a deferred tensor, with its recipe in *out (may be
 * NULL); false for any other tensor (also NULL). */
CX_API bool cx_deferred_recipe(const cx_tensor *t, cx_init_recipe *out);
/* Elements [start, start + count) of the recipe's row-major values, as a
 * lazy 1-d tensor of `dtype`: the same bits as the same range of the whole.
 * @return the tensor, or a poisoned one for a negative range, a bad dtype
 * or kind. */
CX_API cx_tensor *cx_init_range(const cx_init_recipe *r, int64_t start, int64_t count, cx_dtype dtype);
/* Gives deferred tensor t its values, in place: the same handle (its name,
 * requires-grad, the modules and optimizers holding it) now holds the
 * whole, materialized. A tensor that is not deferred is left alone.
 * @return CX_OK; CX_ERR_OOM (CX_MEMORY_LIMIT included) or another sync
 * error with cx_last_error set, t still deferred. */
CX_API cx_status cx_deferred_materialize(cx_tensor *t);

/* 0..n-1 along a 1-d tensor. */
CX_API cx_tensor *cx_arange(int64_t n, cx_dtype dtype);

/* Releases a handle. NULL is fine. Tensors created inside a step are
 * released by cx_step_end unless kept. */
CX_API void cx_free(cx_tensor *t);
/* Releases a temporary made while recording: outside a step it is freed at
 * once, inside a step the step releases it (so layer code can drop its
 * intermediates the same way in both). Tensors that require grad are kept.
 * NULL is fine. */
CX_API void cx_drop(cx_tensor *t);
/* Makes a step tensor survive the current step (it is materialized at step
 * end if pending) so it can be read after it; it is released at the end of
 * the next step at the same depth (cx_persist holds it longer). @return t. */
CX_API cx_tensor *cx_keep(cx_tensor *t);
/* Makes t persistent: never released by a step; only cx_free releases it.
 * @return t. */
CX_API cx_tensor *cx_persist(cx_tensor *t);
/* A new handle to the same value (shares the node). */
CX_API cx_tensor *cx_alias(cx_tensor *t);

/* Updates persistent `dst` in place with `value` (same shape and dtype).
 * At sync the new value is materialized and, where dst's old buffer is
 * otherwise dead, written over it.
 * @return CX_OK, CX_ERR_SHAPE on a shape/dtype mismatch, CX_ERR_STATE if dst
 * is not persistent. */
CX_API cx_status cx_assign(cx_tensor *dst, cx_tensor *value);

/* ---- steps and synchronization -------------------------------------- */

/* Starts a step: handles created from now on belong to it. Steps nest. */
CX_API void cx_step_begin(void);
/* Releases the step's handles that were not kept, then syncs.
 * @return the status of the sync. */
CX_API cx_status cx_step_end(void);
/* Who ends a step, as the debug analysis (PT_XLA_DEBUG_LEVEL) and the graph
 * dumps name it: PyTorch/XLA tells the user's mark_step from the one its
 * parallel loader issues. */
typedef enum { CX_CAUSE_USER = 0, CX_CAUSE_LOADER } cx_step_cause;
/* cx_step_end on behalf of `cause` (the data loader ends its steps with
 * CX_CAUSE_LOADER). Same returns as cx_step_end. */
CX_API cx_status cx_step_end_cause(cx_step_cause cause);

/* Called on the thread that ends a step, after each cx_step_end whose graph
 * ran, with the number of steps ended in this process so far. */
typedef void (*cx_step_observer_fn)(void *arg, int64_t steps);
/* Sets the one step observer (a runtime reporting progress, as the comm
 * layer does for xla-launch's restart figures); NULL removes it. */
CX_API void cx_set_step_observer(cx_step_observer_fn fn, void *arg);
/* Compiles (or hits the cache) and runs every live tensor with pending IR,
 * materializing each. @return CX_OK, or the first error (poisoned tensor,
 * out of memory, collective failure); poisoned tensors stay poisoned. */
CX_API cx_status cx_sync(void);
/* Materializes just `n` tensors (runs only what they need). */
CX_API cx_status cx_sync_tensors(cx_tensor **ts, int n);

/* ---- eager mode (torch_xla.experimental.eager_mode, torch_xla.compile) ---- */

/* Switches eager mode for the process: when on, every op runs when it is
 * recorded (as XLA_USE_EAGER_DEBUG_MODE=1 does from the start; results equal
 * lazy mode's). Call it between steps. cx_debug_reload_env reads the
 * variable again and overrides it.
 * @return CX_OK, or CX_ERR_STATE inside an open step or compile region
 * (the error says which). */
CX_API cx_status cx_set_eager(bool on);
/* @return whether eager mode is on. */
CX_API bool cx_is_eager(void);
/* Opens a compile region on this thread: ops recorded until cx_compile_end
 * are traced, not run, even in eager mode; cx_compile_end then compiles (or
 * finds in the caches) and runs them as one graph. In lazy mode the region
 * only ends in that sync. Regions do not nest, and one closes in the step
 * it opened in.
 * @return CX_OK, or CX_ERR_STATE when a region is already open. */
CX_API cx_status cx_compile_begin(void);
/* Closes the region and syncs every pending tensor (cx_sync).
 * @return the sync's status, or CX_ERR_STATE without an open region or when
 * the step depth differs from cx_compile_begin's (the region is closed
 * without a sync). */
CX_API cx_status cx_compile_end(void);

/* ---- step closures (xm.add_step_closure) ---------------------------- */

typedef void (*cx_step_closure_fn)(void *arg);
/* Runs fn(arg) after the current step's graph has run and materialized (at
 * the next cx_step_end), in the order added; tensors kept for the step can
 * be read in it without another execution. run_async: run on a background
 * thread instead (still in order among the async closures).
 * @return CX_OK, CX_ERR_ARG (fn NULL) or CX_ERR_OOM. */
CX_API cx_status cx_add_step_closure(cx_step_closure_fn fn, void *arg, bool run_async);
/* Waits until every async closure added so far has run. */
CX_API void cx_wait_step_closures(void);

/* Reads a one-element tensor as double (runs its subgraph if pending and
 * counts a TransferFromDevice). @return NaN on error (see cx_last_error). */
CX_API double cx_item(cx_tensor *t);
/* Copies the value into `out` converted to `dtype` (numel elements). An
 * SPMD-sharded tensor (cxla/spmd.h) is gathered from every rank: then every
 * rank must call it (cx_local_shard_to_host reads this rank's shard alone).
 * @return CX_OK or an error. */
CX_API cx_status cx_to_host(cx_tensor *t, void *out, cx_dtype dtype);

/* ---- introspection -------------------------------------------------- */

CX_API int cx_ndim(const cx_tensor *t);
CX_API int64_t cx_dim(const cx_tensor *t, int axis);   /* negative axes count from the end */
/* t's dimensions, borrowed: a sync, step end, cx_assign or sharding change
 * may give t a new node and free the old one, so copy them to keep them. */
CX_API const int64_t *cx_shape(const cx_tensor *t);
CX_API int64_t cx_numel(const cx_tensor *t);
CX_API cx_dtype cx_dtype_of(const cx_tensor *t);
CX_API bool cx_is_pending(const cx_tensor *t);
CX_API bool cx_is_persistent(const cx_tensor *t);
/* An optional debug name (kept in IR dumps; copied). cx_get_name's
 * pointer is t's: valid until the next cx_set_name or cx_free of t. */
CX_API void cx_set_name(cx_tensor *t, const char *name);
CX_API const char *cx_get_name(const cx_tensor *t);

/* ---- elementwise (numpy broadcasting, type promotion) --------------- */

CX_API cx_tensor *cx_neg(cx_tensor *a);
CX_API cx_tensor *cx_exp(cx_tensor *a);
CX_API cx_tensor *cx_log(cx_tensor *a);
CX_API cx_tensor *cx_sqrt(cx_tensor *a);
CX_API cx_tensor *cx_rsqrt(cx_tensor *a);
CX_API cx_tensor *cx_tanh(cx_tensor *a);
CX_API cx_tensor *cx_erf(cx_tensor *a);
CX_API cx_tensor *cx_abs(cx_tensor *a);
CX_API cx_tensor *cx_sign(cx_tensor *a);
CX_API cx_tensor *cx_cast(cx_tensor *a, cx_dtype dtype);
CX_API cx_tensor *cx_add(cx_tensor *a, cx_tensor *b);
CX_API cx_tensor *cx_sub(cx_tensor *a, cx_tensor *b);
CX_API cx_tensor *cx_mul(cx_tensor *a, cx_tensor *b);
CX_API cx_tensor *cx_div(cx_tensor *a, cx_tensor *b);
CX_API cx_tensor *cx_maximum(cx_tensor *a, cx_tensor *b);
CX_API cx_tensor *cx_minimum(cx_tensor *a, cx_tensor *b);
CX_API cx_tensor *cx_pow(cx_tensor *a, cx_tensor *b);
CX_API cx_tensor *cx_lt(cx_tensor *a, cx_tensor *b);
CX_API cx_tensor *cx_le(cx_tensor *a, cx_tensor *b);
CX_API cx_tensor *cx_eq(cx_tensor *a, cx_tensor *b);
CX_API cx_tensor *cx_gt(cx_tensor *a, cx_tensor *b);
CX_API cx_tensor *cx_ge(cx_tensor *a, cx_tensor *b);
CX_API cx_tensor *cx_where(cx_tensor *cond, cx_tensor *a, cx_tensor *b);
/* Scalar conveniences (the scalar is a constant of a's dtype). */
CX_API cx_tensor *cx_add_scalar(cx_tensor *a, double s);
CX_API cx_tensor *cx_mul_scalar(cx_tensor *a, double s);
CX_API cx_tensor *cx_pow_scalar(cx_tensor *a, double s);

/* ---- reductions ------------------------------------------------------ */

/* axes: list of axes (negative allowed); naxes == 0 reduces all. */
CX_API cx_tensor *cx_sum(cx_tensor *a, const int *axes, int naxes, bool keepdim);
CX_API cx_tensor *cx_max(cx_tensor *a, const int *axes, int naxes, bool keepdim);
CX_API cx_tensor *cx_mean(cx_tensor *a, const int *axes, int naxes, bool keepdim);
/* Population (correction = 0) or sample (correction = 1) variance. */
CX_API cx_tensor *cx_var(cx_tensor *a, const int *axes, int naxes, int correction, bool keepdim);
CX_API cx_tensor *cx_argmax(cx_tensor *a, int axis, bool keepdim);  /* i64 */
CX_API cx_tensor *cx_logsumexp(cx_tensor *a, int axis, bool keepdim);

/* ---- movement (views) ------------------------------------------------ */

/* One entry of `shape` may be -1 (inferred). */
CX_API cx_tensor *cx_reshape(cx_tensor *a, const int64_t *shape, int ndim);
CX_API cx_tensor *cx_permute(cx_tensor *a, const int *perm);
CX_API cx_tensor *cx_transpose(cx_tensor *a, int axis0, int axis1);
CX_API cx_tensor *cx_expand(cx_tensor *a, const int64_t *shape, int ndim);
/* Elements start..end-1 with `step` (> 0) along `axis`; end is clamped. */
CX_API cx_tensor *cx_slice(cx_tensor *a, int axis, int64_t start, int64_t end, int64_t step);
/* Zero (or `value`) padding, lo/hi per dim (ndim entries each, >= 0). */
CX_API cx_tensor *cx_pad(cx_tensor *a, const int64_t *lo, const int64_t *hi, double value);
CX_API cx_tensor *cx_concat(cx_tensor **ts, int n, int axis);
CX_API cx_tensor *cx_flatten(cx_tensor *a, int start_axis, int end_axis);
CX_API cx_tensor *cx_unsqueeze(cx_tensor *a, int axis);
CX_API cx_tensor *cx_squeeze(cx_tensor *a, int axis);

/* ---- contractions and friends --------------------------------------- */

/* Batched matmul with numpy broadcasting over batch dims; 1-d operands are
 * promoted as in torch.matmul. */
CX_API cx_tensor *cx_matmul(cx_tensor *a, cx_tensor *b);
/* x (N, C, H, W), w (O, C/groups, KH, KW), bias (O) or NULL. */
CX_API cx_tensor *cx_conv2d(cx_tensor *x, cx_tensor *w, cx_tensor *bias,
                     int stride_h, int stride_w, int pad_h, int pad_w,
                     int dil_h, int dil_w, int groups);
/* x (N, C, H, W). */
CX_API cx_tensor *cx_max_pool2d(cx_tensor *x, int kh, int kw, int sh, int sw, int ph, int pw);
/* count_include_pad as PyTorch's default (true). */
CX_API cx_tensor *cx_avg_pool2d(cx_tensor *x, int kh, int kw, int sh, int sw, int ph, int pw);
/* out[i][j] = src[index[i][j]][j] along `axis` (torch.gather); index i64/i32. */
CX_API cx_tensor *cx_gather(cx_tensor *src, int axis, cx_tensor *index);
/* out = base, then out[index[i][j]][j] += src[i][j] along `axis`. */
CX_API cx_tensor *cx_scatter_add(cx_tensor *base, int axis, cx_tensor *index, cx_tensor *src);
/* Rows of weight (V, D) selected by integer `index` (any shape) -> (..., D). */
CX_API cx_tensor *cx_embedding(cx_tensor *weight, cx_tensor *index);
/* (..., num_classes) of dtype. */
CX_API cx_tensor *cx_one_hot(cx_tensor *index, int64_t num_classes, cx_dtype dtype);

/* ---- composites ----------------------------------------------------- */

CX_API cx_tensor *cx_relu(cx_tensor *a);
CX_API cx_tensor *cx_sigmoid(cx_tensor *a);
CX_API cx_tensor *cx_silu(cx_tensor *a);
CX_API cx_tensor *cx_gelu(cx_tensor *a, bool tanh_approx);
CX_API cx_tensor *cx_softmax(cx_tensor *a, int axis);
CX_API cx_tensor *cx_log_softmax(cx_tensor *a, int axis);
/* Normalizes over the last `nnorm` dims; weight/bias may be NULL. */
CX_API cx_tensor *cx_layer_norm(cx_tensor *a, int nnorm, cx_tensor *weight, cx_tensor *bias, double eps);
/* Attention as torch.nn.functional.scaled_dot_product_attention: q (B, H, T,
 * D), k and v (B, H, S, D), all f32; softmax(scale * q k^T) v per head,
 * with is_causal query i seeing keys j <= i + S - T (bottom-right aligned,
 * as flash attention and torch's causal_lower_right; torch's own is_causal
 * aligns top-left, j <= i, which differs only where T != S). scale <= 0:
 * 1/sqrt(D).
 * One fused kernel (blocks of query rows against their keys; key tiles with
 * an online softmax beyond 1024 keys): the (T, S) scores are never written.
 * A query that sees no key gives 0. @return (B, H, T, D), or a poisoned
 * tensor on bad shapes or dtypes. */
CX_API cx_tensor *cx_scaled_dot_product_attention(cx_tensor *q, cx_tensor *k, cx_tensor *v, bool is_causal,
                                                  double scale);

/* How a loss reduces its per-sample terms. Its values and cx_reduce_op's
 * (collectives) are disjoint, so a member of the wrong family is refused
 * rather than read as some member of this one. */
typedef enum { CX_REDUCE_MEAN = 0, CX_REDUCE_SUM, CX_REDUCE_NONE } cx_reduction;
/* The losses: logp (N, C), target (N) integer; ignore_index < 0 and not
 * -100: none. @return the loss (0-d, or (N,) / a's shape for
 * CX_REDUCE_NONE), or a poisoned tensor for bad shapes or dtypes, or a
 * `red` that is not a cx_reduction (the message names the value and, for a
 * cx_reduce_op, says so). */
CX_API cx_tensor *cx_nll_loss(cx_tensor *logp, cx_tensor *target, cx_reduction red, int64_t ignore_index);
CX_API cx_tensor *cx_cross_entropy(cx_tensor *logits, cx_tensor *target, cx_reduction red,
                            int64_t ignore_index, double label_smoothing);
CX_API cx_tensor *cx_mse_loss(cx_tensor *a, cx_tensor *b, cx_reduction red);

/* ---- collectives (IR ops; run by the registered comm backend) ------- */

/* A collective's reduction. Starts at 0x100, away from cx_reduction. */
typedef enum { CX_RED_SUM = 0x100, CX_RED_MEAN, CX_RED_MAX, CX_RED_MIN } cx_reduce_op;

/* The number of ranks in the world (xr.world_size(); also the number of
 * devices of the global SPMD mesh, one per rank) and this process's rank in
 * it, 0 .. world size - 1 (xr.global_ordinal()). Both come from the
 * registered comm backend: 1 and 0 without one, before cx_dist_init and
 * after cx_dist_finalize. */
CX_API int cx_world_size(void);
CX_API int cx_global_ordinal(void);

/* A replica group list: `ngroups` groups of `group_size` ranks each, row
 * major in `ranks`. NULL = one group of every rank. */
typedef struct {
    int ngroups;
    int group_size;
    const int *ranks;
} cx_replica_groups;

/* `pin` makes the collective unique: CSE never merges it with another.
 * @return the collective's result, or a poisoned tensor for bad axes or
 * groups, or an `op` that is not a cx_reduce_op (the message names the
 * value and, for a cx_reduction, says so; reduce_scatter also refuses
 * MAX and MIN). */
CX_API cx_tensor *cx_all_reduce(cx_tensor *a, cx_reduce_op op, double scale,
                         const cx_replica_groups *groups, bool pin);
CX_API cx_tensor *cx_all_gather(cx_tensor *a, int axis, const cx_replica_groups *groups, bool pin);
CX_API cx_tensor *cx_reduce_scatter(cx_tensor *a, cx_reduce_op op, double scale, int axis,
                             const cx_replica_groups *groups, bool pin);
CX_API cx_tensor *cx_all_to_all(cx_tensor *a, int split_axis, int concat_axis,
                         const cx_replica_groups *groups, bool pin);
CX_API cx_tensor *cx_broadcast(cx_tensor *a, int root, const cx_replica_groups *groups, bool pin);

/* ---- RNG (counter-based: seed and offset are runtime scalars) ------- */

CX_API void cx_manual_seed(uint64_t seed);
typedef struct { uint64_t seed; uint64_t offset; } cx_rng_state;
CX_API cx_rng_state cx_get_rng_state(void);
CX_API void cx_set_rng_state(cx_rng_state s);
CX_API cx_tensor *cx_rand(const int64_t *shape, int ndim, double lo, double hi, cx_dtype dtype);
CX_API cx_tensor *cx_randn(const int64_t *shape, int ndim, double mean, double std, cx_dtype dtype);
/* 1 with probability p (dtype of the result: `dtype`). */
CX_API cx_tensor *cx_bernoulli(const int64_t *shape, int ndim, double p, cx_dtype dtype);

/* ---- autograd -------------------------------------------------------- */

/* Marks a float tensor (a parameter: persistent) as a leaf that
 * accumulates gradients, or (on false) no longer. A tensor not computed
 * yet, the pending result of ops on tensors that require no grad (a cast,
 * a random init), is computed first, as cx_sync_tensors does.
 * @return t. On error t is left as it was and cx_last_error says why: a
 * dtype that is not float, the result of ops on tensors that require grad
 * (not a leaf), or the computation failed. */
CX_API cx_tensor *cx_requires_grad(cx_tensor *t, bool on);
CX_API bool cx_get_requires_grad(const cx_tensor *t);
/* Accumulates d(loss)/d(leaf) into each reachable leaf's grad (a persistent
 * tensor updated with cx_assign). loss must have one element.
 * @return CX_OK, or CX_ERR_ARG/CX_ERR_SHAPE. */
CX_API cx_status cx_backward(cx_tensor *loss);
/* `value` again, as a node where backward stops and accumulates the
 * gradient reaching it into sink's grad (sink: a persistent float tensor of
 * the same shape, e.g. a placeholder; its dtype may differ from value's,
 * the gradient is cast to it). For wrappers that accumulate the gradient
 * of a computed value (FSDP's no_sync, its f32 reduce-scatter of bf16
 * gathers). */
CX_API cx_tensor *cx_grad_tap(cx_tensor *value, cx_tensor *sink);
/* The gradient of t (NULL if none yet). Owned by t. */
CX_API cx_tensor *cx_grad(cx_tensor *t);
/* Sets t's grad to none (frees it). */
CX_API void cx_zero_grad(cx_tensor *t);
/* Replaces t's grad with `g` (takes a new persistent handle); NULL clears. */
CX_API void cx_set_grad(cx_tensor *t, cx_tensor *g);
/* A value equal to t that carries no gradient. */
CX_API cx_tensor *cx_detach(cx_tensor *t);
/* No-grad regions nest; ops recorded inside carry no gradient. */
CX_API void cx_no_grad_begin(void);
CX_API void cx_no_grad_end(void);
CX_API bool cx_grad_enabled(void);
/* Autocast, as torch.autocast("cpu", torch.bfloat16): regions are
 * per thread and nest, like no_grad. Inside a bf16 region matmul (linear,
 * batched), conv2d and attention cast their float inputs to bf16 (casts
 * recorded in the graph, accumulation in f32) and give bf16; softmax,
 * log-softmax, layer norm, the losses, sum/mean/logsumexp and exp/log cast
 * bf16 inputs to f32; other ops run in their inputs' dtype. Backward is
 * recorded with autocast off: gradients take the forward's dtypes, and a
 * cast's gradient casts back, so f32 parameters get f32 gradients. A region
 * opened inside a step must close before cx_step_end, which otherwise
 * closes it and fails with CX_ERR_STATE (after ending the step).
 * cx_autocast_begin(CX_F32) turns autocast off until its end.
 * @return CX_OK; CX_ERR_ARG for a dtype other than bf16 or f32;
 * CX_ERR_STATE when nested deeper than 16. */
CX_API cx_status cx_autocast_begin(cx_dtype dtype);
/* Closes the innermost region. @return CX_OK, or CX_ERR_STATE if none is open. */
CX_API cx_status cx_autocast_end(void);
/* The dtype the bf16-list ops take now: CX_BF16 inside a bf16 region, else
 * CX_F32 (no region, or one turned off). */
CX_API cx_dtype cx_autocast_dtype(void);
/* Rematerialization (gradient checkpointing): nodes recorded between begin
 * and end are recomputed in backward from a fresh, unmerged copy. */
CX_API void cx_remat_begin(void);
CX_API void cx_remat_end(void);


/* Facts about the last executable that ran (debug queries). */
typedef struct {
    int num_kernels;          /* instructions that do work (excludes no-op views) */
    int num_nodes;            /* IR nodes in the traced graph */
    int64_t arena_bytes;      /* packed intermediates */
    int64_t intermediate_bytes; /* sum of all intermediates' sizes, unpacked */
    int num_inputs, num_outputs, num_aliased;
    uint64_t key_hi, key_lo;
    int num_collectives;      /* collective kernels among num_kernels */
} cx_exec_info;
CX_API cx_exec_info cx_last_exec_info(void);

/* Device memory accounting: bytes of live device buffers + arena now, and
 * the peak since the last reset. */
CX_API int64_t cx_memory_in_use(void);
CX_API int64_t cx_memory_peak(void);
CX_API void cx_memory_reset_peak(void);

/* ---- runtime configuration --------------------------------------------- */

/* Compute threads (CX_NUM_THREADS overrides the default: all cores). The
 * worker pool owns them all: each gemm is split across the pool into
 * single-threaded OpenBLAS calls, so nothing oversubscribes the cores. */
CX_API void cx_set_num_threads(int n);
CX_API int cx_get_num_threads(void);

#ifdef __cplusplus
}
#endif
#endif
