/* cxla optim: SGD, Adam, AdamW, learning-rate schedules, gradient clipping.
 *
 * An optimizer step only records IR: every parameter and state update is a
 * cx_assign, so forward, backward and update compile into one graph.
 * Hyper-parameters (learning rate, bias corrections, ...) enter that graph as
 * runtime scalars, so changing them (a schedule) never recompiles. State
 * tensors are persistent, created (zero-filled, materialized) with the
 * optimizer, which makes the first step's graph the same as every other's;
 * the state of an SPMD-sharded parameter (cx_mark_sharding, FSDPv2) is
 * split like it when the optimizer is made, so shard the parameters first.
 *
 * Ownership: an optimizer borrows its parameters (they must outlive it),
 * copies their names, and owns its state tensors. cx_optim_state and
 * cx_optim_params return one allocation each, names included, to release
 * with free(); the state tensors in them stay the optimizer's, the
 * parameters the caller's. cx_optim_name is a static string. Threads: an optimizer step
 * records ops, so use optimizers on the training thread (core.h).
 */
#ifndef CXLA_OPTIM_H
#define CXLA_OPTIM_H

#include <cxla/core.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cx_optimizer cx_optimizer;

/* Start from cx_sgd_default_opts() (it sets struct_size, core.h). */
typedef struct {
    size_t struct_size;
    double lr, momentum, dampening, weight_decay;
    bool nesterov;
} cx_sgd_opts;
/* lr 0.01, momentum 0, dampening 0, weight_decay 0, nesterov off. */
static inline cx_sgd_opts cx_sgd_default_opts(void)
{
    cx_sgd_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.lr = 0.01;
    o.momentum = 0.0;
    o.dampening = 0.0;
    o.weight_decay = 0.0;
    o.nesterov = false;
    return o;
}

/* Start from cx_adam_default_opts() or cx_adamw_default_opts() (they set
 * struct_size, core.h). */
typedef struct {
    size_t struct_size;
    double lr, beta1, beta2, eps, weight_decay;
    bool amsgrad;
} cx_adam_opts;
/* lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0 (cx_adamw_default_opts:
 * 0.01), amsgrad off. */
static inline cx_adam_opts cx_adam_default_opts(void)
{
    cx_adam_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.lr = 1e-3;
    o.beta1 = 0.9;
    o.beta2 = 0.999;
    o.eps = 1e-8;
    o.weight_decay = 0.0;
    o.amsgrad = false;
    return o;
}
static inline cx_adam_opts cx_adamw_default_opts(void)
{
    cx_adam_opts o = cx_adam_default_opts();
    o.weight_decay = 1e-2;
    return o;
}

/* Optimizers over `n` named parameters (e.g. from cx_module_parameters; the
 * names are copied, the tensors borrowed: they must outlive the optimizer),
 * one group with the options' weight decay.
 * @return the optimizer, or NULL with cx_last_error set on bad
 * hyper-parameters (negative lr, momentum, ..., nesterov without momentum or
 * with dampening, betas outside [0, 1)), a struct_size below the first
 * version's, a tensor listed twice (it would be stepped twice) or out of
 * memory. */
CX_API cx_optimizer *cx_optim_sgd(const cx_named_tensor *params, int n, cx_sgd_opts opts);
/* Adam: L2 weight decay added to the gradient. */
CX_API cx_optimizer *cx_optim_adam(const cx_named_tensor *params, int n, cx_adam_opts opts);
/* AdamW: decoupled weight decay, param *= 1 - lr * weight_decay. */
CX_API cx_optimizer *cx_optim_adamw(const cx_named_tensor *params, int n, cx_adam_opts opts);
CX_API void cx_optim_free(cx_optimizer *opt);

/* ---- parameter groups (PyTorch's param_groups) -------------------------------- */

/* Parameters that share options: their own weight decay (replacing the
 * options' weight_decay for them) and a learning-rate scale (their rate is
 * the optimizer's, cx_optim_set_lr, times lr_scale, so one schedule drives
 * every group). Both enter the step as runtime scalars; a group whose
 * weight_decay is 0 records no decay at all. */
typedef struct {
    size_t struct_size;     /* set by cx_param_group_of, or CX_STRUCT_SIZE(cx_param_group) */
    const cx_named_tensor *params;
    int n;
    double weight_decay;    /* >= 0 */
    double lr_scale;        /* > 0 (a zero-initialized group is refused, not frozen) */
    /* Optional, one per parameter (NULL, or entries NULL): a float tensor
     * (f32, or bf16 as XLA_USE_BF16 holds f32 ones) of the parameter's
     * shape whose elements (0 or 1) scale the weight decay element by
     * element. FSDP's flat shards hold weights and biases side
     * by side: cx_fsdp_decay_masks makes the masks that decay the weights
     * only. Borrowed: they must outlive the optimizer. */
    cx_tensor *const *decay_masks;
} cx_param_group;

/* A group of `n` parameters with `weight_decay` and lr_scale 1 (and its
 * struct_size set). */
static inline cx_param_group cx_param_group_of(const cx_named_tensor *params, int n, double weight_decay)
{
    cx_param_group g = CX_ZEROED_;
    g.struct_size = sizeof g;
    g.params = params;
    g.n = n;
    g.weight_decay = weight_decay;
    g.lr_scale = 1.0;
    return g;
}

/* The usual split of a transformer's parameters (nanoGPT's
 * configure_optimizers): out[0] holds the tensors of 2 or more dims
 * (weights, embeddings) with `weight_decay`, out[1] the others (biases,
 * LayerNorm) with none, each in the order of `params`. Both point into
 * `scratch` (n entries, the caller's; the names stay those of `params`).
 * out[0].struct_size is the caller's, set before the call (CX_STRUCT_SIZE
 * or cx_param_group_of()): both groups are written at that size, that far
 * apart, each with its struct_size set to it (core.h).
 * @return 2, or -1 with cx_last_error set on a NULL list, negative n or an
 * out[0].struct_size below the first version's. */
CX_API int cx_param_groups_by_ndim(const cx_named_tensor *params, int n, double weight_decay,
                                   cx_named_tensor *scratch, cx_param_group out[2]);

/* Optimizers over parameter groups: the parameters of every group, group
 * after group (cx_optim_params and cx_optim_state list them in this
 * order), each updated with its group's weight decay and learning rate;
 * `opts.weight_decay` is not used (each group has its own).
 * @return the optimizer, or NULL with cx_last_error set as for the plain
 * constructors, and for a group with a negative weight_decay, an lr_scale
 * that is not positive, or a tensor listed twice (in one group or two).
 * The library steps through `groups` by groups[0].struct_size (sizeof as
 * the caller's headers have it), so every group must carry that same
 * struct_size: a group whose struct_size differs, or is below the first
 * version's, is refused. */
CX_API cx_optimizer *cx_optim_sgd_groups(const cx_param_group *groups, int ngroups, cx_sgd_opts opts);
CX_API cx_optimizer *cx_optim_adam_groups(const cx_param_group *groups, int ngroups, cx_adam_opts opts);
CX_API cx_optimizer *cx_optim_adamw_groups(const cx_param_group *groups, int ngroups, cx_adam_opts opts);
/* @return the number of parameter groups (1 for the plain constructors). */
CX_API int cx_optim_num_groups(const cx_optimizer *opt);

/* Records one update of every parameter that has a gradient (in no-grad
 * mode). Parameters without one are skipped, as in PyTorch.
 * @return CX_OK, or the error of a poisoned gradient/update (CX_ERR_SHAPE). */
CX_API cx_status cx_optim_step(cx_optimizer *opt);
/* Sets every parameter's gradient to none (PyTorch's set_to_none=True). */
CX_API void cx_optim_zero_grad(cx_optimizer *opt);

/* The base learning rate (a group's is this times its lr_scale). */
CX_API void cx_optim_set_lr(cx_optimizer *opt, double lr);
CX_API double cx_optim_get_lr(const cx_optimizer *opt);
/* Steps taken (the host's copy of the "step" state). */
CX_API int64_t cx_optim_step_count(const cx_optimizer *opt);
/* After restoring state from a checkpoint. */
CX_API void cx_optim_set_step_count(cx_optimizer *opt, int64_t steps);
CX_API const char *cx_optim_name(const cx_optimizer *opt);   /* "SGD", "Adam", "AdamW" */

/* The state tensors, named "<param>.<state>" ("fc1.weight.exp_avg",
 * "fc1.weight.momentum_buffer", "fc1.weight.step"), in parameter order.
 * One allocation: release with free(). NULL when out of memory. */
CX_API cx_named_tensor *cx_optim_state(const cx_optimizer *opt, int *n);
/* The parameters it updates (names as given). Release with free(). */
CX_API cx_named_tensor *cx_optim_params(const cx_optimizer *opt, int *n);

/* ---- gradient clipping ----------------------------------------------------- */

/* Scales the gradients of `params` so their total 2-norm is at most
 * max_norm (coefficient max_norm / (norm + 1e-6), capped at 1, as
 * torch.nn.utils.clip_grad_norm_). Computed on the device: nothing is read
 * back. Tensors without a gradient are skipped.
 * @return the total norm before clipping, a lazy 0-d tensor (owned by the
 * caller/step), or a poisoned tensor on max_norm <= 0. */
CX_API cx_tensor *cx_clip_grad_norm(cx_tensor *const *params, int n, double max_norm);
/* The same over an optimizer's parameters. */
CX_API cx_tensor *cx_optim_clip_grad_norm(cx_optimizer *opt, double max_norm);

/* ---- learning-rate schedules ------------------------------------------------- */

typedef enum {
    CX_LR_CONSTANT = 0,
    CX_LR_STEP,      /* base * gamma^floor(t / step_size)          (StepLR) */
    CX_LR_COSINE,    /* min + (base - min)(1 + cos(pi t / total)) / 2 (CosineAnnealingLR,
                        which keeps following the cosine past total) */
} cx_lr_kind;

/* A pure function of the step: no state to save. An optional linear
 * warm-up (LinearLR from warmup_start_factor to 1 over warmup_steps) runs
 * first; the main schedule then starts at t = 0 (as SequentialLR). */
typedef struct {
    size_t struct_size;           /* set by cx_lr_schedule_default_opts (core.h) */
    cx_lr_kind kind;
    double base_lr;
    int64_t step_size;            /* CX_LR_STEP */
    double gamma;                 /* CX_LR_STEP */
    int64_t total_steps;          /* CX_LR_COSINE: T_max */
    double min_lr;                /* CX_LR_COSINE: eta_min */
    int64_t warmup_steps;         /* 0: none */
    double warmup_start_factor;
} cx_lr_schedule;

/* Constant 0.01, step_size 1, gamma 0.1, total_steps 1, min_lr 0, no warm-up
 * (start factor 1/3 as LinearLR's default). */
static inline cx_lr_schedule cx_lr_schedule_default_opts(void)
{
    cx_lr_schedule o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.kind = CX_LR_CONSTANT;
    o.base_lr = 0.01;
    o.step_size = 1;
    o.gamma = 0.1;
    o.total_steps = 1;
    o.min_lr = 0.0;
    o.warmup_steps = 0;
    o.warmup_start_factor = 1.0 / 3.0;
    return o;
}
/* The learning rate for step t (0-based), or NaN with cx_last_error set for
 * a NULL schedule or a struct_size below the first version's. */
CX_API double cx_lr_at(const cx_lr_schedule *s, int64_t t);

#ifdef __cplusplus
}
#endif
#endif
