/* What this thread is recording into: its open steps, no_grad regions and
 * rematerialization region. One thread-local context, so a loader thread
 * recording uploads never inherits the training thread's modes. */
#include "base.h"

#include <stdatomic.h>

static _Thread_local cx_record_ctx t_rec;
/* remat tags are unique across threads: a clone interned under one tag is
 * never mistaken for another region's */
static atomic_uint_fast64_t g_remat_tags;

cx_record_ctx *cx_record(void) { return &t_rec; }

void cx_no_grad_begin(void) { t_rec.no_grad++; }
void cx_no_grad_end(void) { if (t_rec.no_grad > 0) t_rec.no_grad--; }
bool cx_grad_enabled(void) { return t_rec.no_grad == 0; }

void cx_remat_begin(void)
{
    if (t_rec.remat_depth++ == 0) t_rec.remat_region = atomic_fetch_add(&g_remat_tags, 1) + 1;
}

void cx_remat_end(void)
{
    if (t_rec.remat_depth > 0 && --t_rec.remat_depth == 0) t_rec.remat_region = 0;
}

uint64_t cx_remat_region(void) { return t_rec.remat_depth > 0 ? t_rec.remat_region : 0; }
