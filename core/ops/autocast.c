/* Autocast's casts (torch.autocast("cpu", torch.bfloat16)): the ops of the
 * bf16 list (matmul, conv2d, attention) call cx_autocast_low on their
 * operands and record themselves again on the bf16 casts; those of the f32
 * list (softmax, log-softmax, layer norm, losses, sum/mean, exp/log) call
 * cx_autocast_f32. The casts are ordinary OP_CAST nodes, so backward
 * casts each gradient back to its parameter's dtype, and what the bf16 ops
 * keep for backward is the bf16 value. */
#include "ops.h"

/* Replaces each float operand not of dtype `to` by its cast, the others by
 * an alias, so the caller drops all n alike. @return whether any was cast. */
static bool cast_operands(cx_tensor **ts, int n, cx_dtype from_any_but, cx_dtype to, bool only_from)
{
    bool need = false;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        if (ts[i]->node->op == OP_ERROR) return false; /* the op itself reports the poison */
        cx_dtype dt = (cx_dtype)ts[i]->node->dtype;
        if (!cx_dtype_is_float(dt) || dt == to) continue;
        if (only_from && dt != from_any_but) continue;
        need = true;
    }
    if (!need) return false;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        cx_dtype dt = (cx_dtype)ts[i]->node->dtype;
        bool cast = cx_dtype_is_float(dt) && dt != to && (!only_from || dt == from_any_but);
        ts[i] = cast ? cx_cast(ts[i], to) : cx_alias(ts[i]);
    }
    return true;
}

bool cx_autocast_low(cx_tensor **ts, int n)
{
    return cx_autocast_on() && cast_operands(ts, n, CX_F32, CX_BF16, false);
}

bool cx_autocast_f32(cx_tensor **ts, int n)
{
    return cx_autocast_on() && cast_operands(ts, n, CX_BF16, CX_F32, true);
}

void cx_autocast_drop(cx_tensor **ts, int n)
{
    for (int i = 0; i < n; i++) if (ts[i]) cx_drop(ts[i]);
}
