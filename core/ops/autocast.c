/* Autocast's casts (torch.autocast("cpu", torch.bfloat16)): the ops of the
 * bf16 list (matmul, conv2d, attention) call cx_autocast_low on their
 * operands and record themselves again on the bf16 casts; those of the f32
 * list (softmax, log-softmax, layer norm, losses, sum/mean, exp/log) call
 * cx_autocast_f32. The casts are ordinary OP_CAST nodes, so backward
 * casts each gradient back to its parameter's dtype. What a bf16 op keeps
 * for backward is what its node reads: the bf16 casts once the kernels take
 * bf16, their f32 conversions while contract.c computes bf16 in f32. */
#include "ops.h"

/* Whether operand t is one to cast to `to`: a float of another dtype, and
 * of dtype `from` unless from is CX_DTYPE_COUNT (any). */
static bool wants_cast(const cx_tensor *t, cx_dtype to, cx_dtype from)
{
    cx_dtype dt = (cx_dtype)t->node->dtype;
    return cx_dtype_is_float(dt) && dt != to && (from == CX_DTYPE_COUNT || dt == from);
}

/* A transposed operand (Linear's W^T) is cast before its permute: the cast
 * then reads its source in order, not across rows, and the op still sees
 * a permuted view, which the matmul reads as a transposed operand (and
 * whose gradient it writes in the source's layout), as it does in f32.
 * A permute recorded without grad of a source with it (a detached view)
 * keeps its cast while grad is recorded, so no gradient reaches the
 * source through it; under no_grad (evaluation) nothing records one, and
 * the eval step's W^T cast had read the weight across rows. */
static cx_tensor *cast_unpermuted(cx_tensor *t, cx_dtype to)
{
    const cx_node *n = t->node;
    if (n->op != OP_PERMUTE) return cx_cast(t, to);
    bool grad_differs = (n->flags & NF_REQUIRES_GRAD) != (n->inputs[0]->flags & NF_REQUIRES_GRAD);
    if (grad_differs && cx_grad_enabled()) return cx_cast(t, to);
    int perm[CX_MAX_DIMS];
    for (int i = 0; i < n->ndim; i++) perm[i] = (int)CX_ATTR(n, CX_AT_PERM(i));
    cx_tensor *base = cx_tensor_of(n->inputs[0]);
    cx_tensor *cast = cx_cast(base, to);
    cx_tensor *r = cx_permute(cast, perm);
    cx_drop(cast);
    cx_drop(base);
    return r;
}

/* Replaces each operand to cast by its cast, the others by an alias, so
 * the caller drops all n alike. @return whether any was cast. */
static bool cast_operands(cx_tensor **ts, int n, cx_dtype to, cx_dtype from)
{
    bool need = false;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        if (ts[i]->node->op == OP_ERROR) return false; /* the op itself reports the poison */
        need = need || wants_cast(ts[i], to, from);
    }
    if (!need) return false;
    for (int i = 0; i < n; i++)
        if (ts[i]) ts[i] = wants_cast(ts[i], to, from) ? cast_unpermuted(ts[i], to) : cx_alias(ts[i]);
    return true;
}

bool cx_autocast_cast_low(cx_tensor **ts, int n) { return cast_operands(ts, n, CX_BF16, CX_DTYPE_COUNT); }

bool cx_autocast_cast_f32(cx_tensor **ts, int n) { return cast_operands(ts, n, CX_F32, CX_BF16); }

void cx_autocast_drop(cx_tensor **ts, int n)
{
    for (int i = 0; i < n; i++) if (ts[i]) cx_drop(ts[i]);
}
