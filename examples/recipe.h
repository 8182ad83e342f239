/* The seed's ImageNet recipe flags in the reference trainer (issue 28):
 * PyTorch/XLA's test_train_mp_imagenet(_fsdp).py as written.
 *
 *   --num_warmup_epochs E --lr_scheduler_divide_every_n_epochs K
 *   --lr_scheduler_divisor D     WarmupAndExponentialDecayScheduler
 *   --test_set_batch_size N --eval_interval N --drop_last
 *   --use_nested_fsdp            FSDP units = the model's blocks
 *   --use_gradient_checkpointing rematerialize the model's blocks
 *   --log-file F.jsonl, train plot   the learning curve
 *
 * The model's "blocks" come from a table of module type names per model
 * (recipe_block_types): the residual blocks of a ResNet, every Linear and
 * Conv2d of the small MNIST models. */
#ifndef CX_EXAMPLES_RECIPE_H
#define CX_EXAMPLES_RECIPE_H

#include <cxla/cxla.h>

#include <stdio.h>

/* The recipe's flags, as train's table fills them. */
typedef struct {
    double warmup_epochs;         /* --num_warmup_epochs (fractions allowed) */
    int divide_every;             /* --lr_scheduler_divide_every_n_epochs */
    int divisor;                  /* --lr_scheduler_divisor */
    bool schedule_given[3];       /* any of the three turns the schedule on */
    int64_t test_batch_size;      /* 0: --batch-size */
    int eval_interval;            /* epochs between evaluations (and after the last) */
    bool drop_last;
    bool use_nested_fsdp, use_gradient_checkpointing;
    bool parallel_given;          /* --parallel was on the command line */
    const char *log_file;         /* NULL: no learning-curve log */
} recipe_flags;

/* Defaults: the seed's (warm-up 0.9 epochs, / 5 every 20 epochs; off
 * until one of the three is given), evaluation every epoch. */
recipe_flags recipe_default_flags(void);

/* The flags that go together or not (one line on rank 0 each, naming the
 * flags): --use_nested_fsdp with a --parallel other than fsdp (without
 * one it sets *parallel to "fsdp"), with --nested or
 * --auto-wrap-min-params; --use_gradient_checkpointing with --grad-ckpt;
 * either for a model without a block table entry.
 * @return 0, or 2 (the usage exit code). */
int recipe_check(recipe_flags *r, const char *model, const char **parallel, bool nested, int64_t auto_wrap_min_params,
                 bool grad_ckpt);

/* The module type names of the model's blocks. @return the names and *n,
 * or NULL for a model the table does not know. */
const char *const *recipe_block_types(const char *model, int *n);

/* cx_checkpoint_module on every module of the tree whose type is listed
 * (not looking inside one found). @return how many, or -1 with
 * cx_last_error set. */
int recipe_checkpoint_blocks(cx_module *m, const char *const *types, int n);

/* "blocks of cnn (Linear, Conv2d): 4 FSDP units, 4 checkpointed" with
 * --use_nested_fsdp or --use_gradient_checkpointing (fsdp: the wrapper,
 * NULL without). */
void recipe_print_blocks(const recipe_flags *r, const char *model, const cx_fsdp *fsdp, int checkpointed);

/* WarmupAndExponentialDecayScheduler (torch_xla's test/schedulers.py), its
 * state included: not a pure function of the step (it skips updates
 * smaller than 1e-6), so not a cx_lr_schedule. */
typedef struct {
    bool on;
    double lr;                    /* the peak, --lr */
    double warmup_epochs;
    int divide_every, divisor;
    int64_t steps_per_epoch;      /* the steps an epoch runs */
    int64_t at;                   /* the step `current` is for, -1: none yet */
    int64_t count;                /* the scheduler's step count */
    double previous, current;     /* the last rate that changed the optimizer's; the optimizer's */
} recipe_schedule;

recipe_schedule recipe_schedule_of(const recipe_flags *r, double lr, int64_t steps_per_epoch);
/* The learning rate of optimizer step `step` (0-based, counted over the
 * whole run): the peak when the schedule is off. Steps are cheap forward
 * (one scheduler step each); an earlier step (a resume) replays from 0. */
double recipe_lr_at(recipe_schedule *s, int64_t step);

/* The learning-curve log, opened by rank 0 (every rank calls it: they
 * agree on failure). A run resumed at step resumed_step (-1: a fresh run)
 * first cuts the log to the lines of steps <= resumed_step (atomically:
 * a resume from an older checkpoint would otherwise log its steps twice),
 * then appends. Non-finite numbers are written as null. @return the file
 * on rank 0, NULL elsewhere, without --log-file, or with *failed set on
 * every rank (rank 0's line on stderr). */
FILE *recipe_log_open(const recipe_flags *r, int64_t resumed_step, bool *failed);
void recipe_log_step(FILE *f, int64_t step, int epoch, double loss, double lr, double images_per_s);
void recipe_log_eval(FILE *f, int64_t step, int epoch, double accuracy, int64_t images);

/* `train plot --log-file F.jsonl --out F.png|F.svg`: argv[0] is "plot".
 * @return the exit code (0, 1 gnuplot failed, 2 bad flag, 3 bad log file). */
int recipe_plot_main(int argc, char **argv);

#endif
