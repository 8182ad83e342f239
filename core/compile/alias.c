/* Pass 5, output aliasing: an output that replaces a persistent input
 * (cx_assign: a parameter, an optimizer state) may be written straight over
 * that input's buffer, so an optimizer step does not double memory. */
#include "passes.h"

/* An output may take its donor input's buffer only if every read of that
 * input happens before the output is written, or in the very kernel that
 * writes it with the identical element order. */
static bool alias_safe(const cx_executable *e, int out_slot, int in_slot)
{
    int writer = cx_exec_first_writer(e, out_slot);
    if (writer < 0) return false;
    /* an asynchronous collective reads its input until it is waited for:
     * one started before the writer and waited for after it still reads */
    for (int k = 0; k < writer; k++) {
        const cx_kernel *kn = &e->kernels[k];
        if (kn->kind == K_COLL && kn->wait_at > writer && cx_kernel_reads(kn, in_slot)) return false;
    }
    for (int k = writer; k < e->nkernels; k++) {
        const cx_kernel *kn = &e->kernels[k];
        if (!cx_kernel_reads(kn, in_slot)) continue;
        if (k > writer) return false;
        /* the writer itself: an elementwise kernel reading the input in its
         * own element order, or an all-reduce / broadcast in place */
        bool identity_only = kn->kind == K_FUSED && !kn->has_epilogue;
        for (int i = 0; identity_only && i < kn->prog.n; i++) {
            const cx_pinstr *in = &kn->prog.ins[i];
            if (in->kind == P_LOAD && in->slot == in_slot &&
                !cx_view_is_identity(&kn->prog.views[in->view], kn->shape, kn->ndim))
                identity_only = false;
        }
        for (int i = 0; i < kn->nin; i++) if (kn->in[i].slot == in_slot) identity_only = false;
        if (kn->scratch_slot == in_slot) identity_only = false;
        bool coll_in_place = kn->kind == K_COLL && kn->nin == 1 && kn->in[0].slot == in_slot &&
                             (kn->coll_op == OP_ALL_REDUCE || kn->coll_op == OP_BROADCAST);
        if (!identity_only && !coll_in_place) return false;
    }
    return true;
}

static int input_slot(const cx_executable *e, int ordinal)
{
    for (int s = 0; s < e->nslots; s++) if (e->slots[s].kind == SLOT_INPUT && e->slots[s].index == ordinal) return s;
    return -1;
}

bool cx_pass_alias_outputs(cx_executable *e, const int *out_alias)
{
    e->num_aliased = 0;
    for (int o = 0; o < e->n_outputs; o++) {
        if (out_alias[o] < 0) continue;
        e->num_aliased++;
        int in_slot = input_slot(e, out_alias[o]), os = e->out_slot[o];
        if (in_slot < 0 || alias_safe(e, os, in_slot)) continue;
        /* compute into a fresh arena slot, then copy over the input at the end */
        int tmp = cx_exec_add_slot(e, SLOT_ARENA, -1, e->slots[os].bytes);
        if (tmp < 0) return false;
        cx_exec_rename_slot(e, os, tmp);
        cx_kernel *cp = cx_exec_add_kernel(e);
        if (!cp) return false;
        cp->kind = K_COPY;
        cp->out_slot = os;
        cp->out_numel = e->slots[os].bytes;
        cp->nin = 1;
        cp->in[0].slot = tmp;
    }
    return true;
}
