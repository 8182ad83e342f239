/* The module object, shared by module.c (building, slots, lookups, forward,
 * ties) and module_walk.c (full names, lists, signature). Only these two
 * include it; layers go through the public calls. Not installed. The walk
 * reads these fields directly and calls module.c's public functions, while
 * module.c calls nothing of the walk's, so the two files never depend on
 * each other both ways. */
#ifndef CX_NN_MODULE_INTERNAL_H
#define CX_NN_MODULE_INTERNAL_H

#include "nn_internal.h"

/* One parameter or buffer value. A tied parameter is one cell named by
 * several slots (refs of them, in any modules): the slots always agree, a
 * replacement through any of them (FSDP's views) is seen by all, and the
 * tensor is freed with the last slot, whichever module goes first. */
typedef struct {
    cx_tensor *t;
    int refs;
} cx_param_cell;

typedef struct {
    char *name;
    cx_param_cell *c;
} cx_mod_entry;

typedef struct {
    char *name;
    cx_module *m;
} cx_mod_child;

struct cx_module {
    cx_module_type type;   /* the caller's, members past its struct_size zeroed */
    void *impl;
    bool training;
    cx_mod_entry *params;
    int nparams, cap_params;
    cx_mod_entry *buffers;
    int nbuffers, cap_buffers;
    cx_mod_child *children;
    int nchildren, cap_children;
    cx_module_hooks hooks[CX_MODULE_MAX_HOOKS];
    int nhooks;
};

#endif
