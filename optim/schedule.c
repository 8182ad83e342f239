/* Learning-rate schedules: pure functions of the step. */
#include "cx_struct.h"

#include <cxla/optim.h>

#include <math.h>

double cx_lr_at(const cx_lr_schedule *given, int64_t t)
{
    cx_lr_schedule own = cx_lr_schedule_default_opts();
    const cx_lr_schedule *s = &own;
    if (!given) { cx_set_last_error("cx_lr_at: schedule is NULL"); return NAN; }
    if (!CX_TAKE_STRUCT("cx_lr_at", cx_lr_schedule, own, given, warmup_start_factor)) return NAN;
    if (t < 0) t = 0;
    if (t < s->warmup_steps) {
        double f = s->warmup_start_factor + (1.0 - s->warmup_start_factor) * (double)t / (double)s->warmup_steps;
        return s->base_lr * f;
    }
    t -= s->warmup_steps;
    switch (s->kind) {
    case CX_LR_STEP:
        return s->base_lr * pow(s->gamma, (double)(t / (s->step_size > 0 ? s->step_size : 1)));
    case CX_LR_COSINE: {
        /* Past total_steps the cosine goes on (back up), as CosineAnnealingLR. */
        double total = (double)(s->total_steps > 0 ? s->total_steps : 1);
        return s->min_lr + (s->base_lr - s->min_lr) * (1.0 + cos(M_PI * (double)t / total)) / 2.0;
    }
    case CX_LR_CONSTANT:
    default:
        return s->base_lr;
    }
}
