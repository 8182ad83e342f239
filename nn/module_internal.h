/* The module object, shared by module.c (building, slots, forward, ties)
 * and module_walk.c (full names, lists, signature). Only these two include
 * it; layers go through the public calls. Not installed. */
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

/* The module holding the last component of the full name `key` under m
 * ("a.b.weight": the module "a.b", *leaf = "weight"). @return NULL when no
 * such module exists. */
cx_module *cx_mod_owner(const cx_module *m, const char *key, const char **leaf);
/* The parameter (*param = true) or buffer named `key` under m, NULL if none. */
cx_mod_entry *cx_mod_lookup(const cx_module *m, const char *key, bool *param);

#endif
