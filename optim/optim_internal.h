/* Shared by optim/ sources only (the optimizers and clipping; the schedules
 * need only the public header): the common optimizer object, a scope that
 * releases temporaries recorded outside a step, and the checked assign.
 * Not installed. */
#ifndef CX_OPTIM_INTERNAL_H
#define CX_OPTIM_INTERNAL_H

#include "cx_assert.h"
#include "cx_struct.h"

#include <cxla/core.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cxla/optim.h>

#define CX_OPTIM_MAX_STATE 4

typedef struct {
    char *name;
    cx_tensor *p;
    cx_tensor *state[CX_OPTIM_MAX_STATE];   /* by the kind's state slots */
    int64_t steps;                          /* updates this parameter got */
    cx_tensor *decay_mask;                  /* borrowed; NULL: decay every element */
} cx_oparam;

/* A parameter group: its own weight decay and learning-rate scale, over
 * the contiguous parameters ps[first .. first + n). */
typedef struct {
    double weight_decay, lr_scale;
    int first, n;
} cx_ogroup;

struct cx_optimizer;

typedef struct {
    const char *name;
    int nstate;
    const char *state_names[CX_OPTIM_MAX_STATE];
    /* Records the update of one parameter of group g; `hp` are the group's
     * runtime scalars for this step. */
    cx_status (*update)(struct cx_optimizer *o, const cx_ogroup *g, cx_oparam *p, cx_tensor *const *hp);
    /* Makes group g's runtime scalars of this step into hp[] (at most
     * CX_OPTIM_MAX_HP). @return their count. */
    int (*hyper)(struct cx_optimizer *o, const cx_ogroup *g, cx_tensor **hp);
} cx_optim_kind;

#define CX_OPTIM_MAX_HP 16

struct cx_optimizer {
    const cx_optim_kind *kind;
    int n;
    cx_oparam *ps;
    int ngroups;
    cx_ogroup *groups;
    double lr;          /* the base rate; group g's is lr * lr_scale */
    int64_t steps;
    union {
        cx_sgd_opts sgd;
        cx_adam_opts adam;
    } o;
    bool decoupled;   /* AdamW */
};

/* Builds the common object over the groups' parameters, in group order:
 * checks them (persistent, float, each tensor once in all groups) and the
 * groups' options, copies names, makes zero state tensors for the kind's
 * state slots whose `want[i]` is true. NULL on failure (error set). */
cx_optimizer *cx_optim_new(const cx_optim_kind *kind, const cx_param_group *groups, int ngroups, double lr,
                           const bool *want);

/* Temporaries of one update: inside a step they belong to it; outside, the
 * handles are released when the scope ends. */
#define CX_TEMPS_MAX 48
typedef struct {
    cx_tensor *t[CX_TEMPS_MAX];
    int n;
} cx_temps;

static inline cx_tensor *cx_tmp(cx_temps *s, cx_tensor *t)
{
    CX_ASSERT(s->n < CX_TEMPS_MAX);
    s->t[s->n++] = t;
    return t;
}

static inline void cx_temps_end(cx_temps *s)
{
    for (int i = 0; i < s->n; i++) cx_drop(s->t[i]);
    s->n = 0;
}

/* Records `dst = value` and reports a poisoned value. */
cx_status cx_optim_assign(cx_tensor *dst, cx_tensor *value, const char *what);

#endif
