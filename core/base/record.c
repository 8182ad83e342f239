/* What this thread is recording into: its open steps, no_grad, autocast
 * and rematerialization regions. One thread-local context, so a loader thread
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

/* ---- autocast: a stack of dtypes, so an inner region can turn it off
 * (torch.autocast(enabled=False)) and the outer one resumes ---- */

cx_status cx_autocast_begin(cx_dtype dtype)
{
    if (dtype != CX_BF16 && dtype != CX_F32) {
        cx_set_last_error("cx_autocast_begin: dtype %s is not supported: bf16 turns autocast on, f32 turns it off",
                          cx_dtype_name(dtype));
        return CX_ERR_ARG;
    }
    if (t_rec.autocast_depth >= CX_AUTOCAST_MAX_DEPTH) {
        cx_set_last_error("cx_autocast_begin: autocast regions nested deeper than %d", CX_AUTOCAST_MAX_DEPTH);
        return CX_ERR_STATE;
    }
    t_rec.autocast_dtype[t_rec.autocast_depth++] = (uint8_t)dtype;
    return CX_OK;
}

cx_status cx_autocast_end(void)
{
    if (t_rec.autocast_depth == 0) {
        cx_set_last_error("cx_autocast_end: no autocast region is open");
        return CX_ERR_STATE;
    }
    t_rec.autocast_depth--;
    /* a region that was open when a step began, closed inside it: what
     * opens after it in that step is that step's to close */
    for (int d = 1; d <= t_rec.step_depth && d <= CX_RECORD_MAX_STEPS; d++)
        if (t_rec.autocast_at_step[d] > t_rec.autocast_depth) t_rec.autocast_at_step[d] = t_rec.autocast_depth;
    return CX_OK;
}

cx_dtype cx_autocast_dtype(void)
{
    return t_rec.autocast_depth > 0 ? (cx_dtype)t_rec.autocast_dtype[t_rec.autocast_depth - 1] : CX_F32;
}

void cx_autocast_step_began(int d)
{
    if (d >= 1 && d <= CX_RECORD_MAX_STEPS) t_rec.autocast_at_step[d] = t_rec.autocast_depth;
}

cx_status cx_autocast_step_check(void)
{
    int d = t_rec.step_depth;
    if (d < 1 || d > CX_RECORD_MAX_STEPS || t_rec.autocast_depth <= t_rec.autocast_at_step[d]) return CX_OK;
    int open = t_rec.autocast_depth - t_rec.autocast_at_step[d];
    /* their dtypes, innermost first */
    char dtypes[CX_AUTOCAST_MAX_DEPTH * 6] = "";
    for (int i = t_rec.autocast_depth - 1, at = 0; i >= t_rec.autocast_at_step[d] && at < (int)sizeof dtypes; i--)
        at += snprintf(dtypes + at, sizeof dtypes - (size_t)at, "%s%s", at ? ", " : "",
                       cx_dtype_name((cx_dtype)t_rec.autocast_dtype[i]));
    cx_set_last_error("cx_step_end: %d autocast region%s (%s) opened in this step %s still open; call "
                      "cx_autocast_end before the step ends", open, open > 1 ? "s" : "", dtypes,
                      open > 1 ? "are" : "is");
    t_rec.autocast_depth = t_rec.autocast_at_step[d];
    return CX_ERR_STATE;
}
