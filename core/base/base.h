/* The core's base layer: what every other folder of core/ may use. Nothing
 * here knows of nodes, tensors, executables or the compiler: dtypes and
 * shapes, the last error, the thread's recording context, a spin lock. The
 * op set, buffers, the comm backend registry, the worker pool, the counter
 * RNG and the observer hooks have headers of their own beside this one. */
#ifndef CX_BASE_H
#define CX_BASE_H

#include <cxla/core.h>
#include <cxla/comm.h>
#include <cxla/metrics.h>

#include <assert.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cx_assert.h"
#include "cx_bf16.h"
#include "cx_time.h"

/* ---- dtypes and shapes (dtype.c) ---- */

int64_t cx_shape_numel(const int64_t *shape, int ndim);
/* Formats a shape as "(2, 3)" into buf. @return buf. */
const char *cx_shape_str(char *buf, size_t cap, const int64_t *shape, int ndim);
/* Converts n values between dtypes (a copy when equal). */
void cx_convert_values(void *out, cx_dtype odt, const void *in, cx_dtype idt, int64_t n);
/* The dtype a tensor created as `dt` is held in: bf16 for f32 under
 * XLA_USE_BF16=1 or XLA_DOWNCAST_BF16=1 (seed 000: torch.float is bf16 on
 * the device; cxla has no f64 for the two to differ on), else dt. */
cx_dtype cx_held_dtype(cx_dtype dt);

/* ---- what this thread records into (record.c) ---- */

#define CX_AUTOCAST_MAX_DEPTH 16
#define CX_RECORD_MAX_STEPS 16 /* ir/tensor.c's step nesting */

typedef struct {
    int step_depth;          /* open steps: new handles belong to the innermost */
    int no_grad;             /* open no_grad regions */
    int remat_depth;         /* open remat regions ... */
    uint64_t remat_region;   /* ... and the tag their nodes carry */
    const char *site_file;   /* the user's line that syncs (cx_sync_at & co.), or NULL */
    int site_line;
    int autocast_depth;      /* open autocast regions, innermost last ... */
    uint8_t autocast_dtype[CX_AUTOCAST_MAX_DEPTH]; /* ... each one's dtype (CX_F32: turned off) */
    /* autocast_depth when each open step began: a region a step opened must close in it */
    int autocast_at_step[CX_RECORD_MAX_STEPS + 1];
} cx_record_ctx;

cx_record_ctx *cx_record(void);
/* The tag of the open rematerialization region, 0 outside one. */
uint64_t cx_remat_region(void);
/* Step depth d (1-based) began: regions opened from here on belong to it. */
void cx_autocast_step_began(int d);
/* The innermost step is ending: an autocast region it opened and left open
 * is closed and reported. @return CX_OK or CX_ERR_STATE (last error set). */
cx_status cx_autocast_step_check(void);

/* ---- a tiny lock for the core's shared lists (uncontended almost always) ---- */

typedef atomic_flag cx_spinlock;
#define CX_SPINLOCK_INIT ATOMIC_FLAG_INIT
static inline void cx_spin_lock(cx_spinlock *l) { while (atomic_flag_test_and_set_explicit(l, memory_order_acquire)) {} }
static inline void cx_spin_unlock(cx_spinlock *l) { atomic_flag_clear_explicit(l, memory_order_release); }

#endif
