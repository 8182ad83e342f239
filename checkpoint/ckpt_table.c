/* The entry table of an open checkpoint: adding, finding and freeing the
 * entries that the two listers build (ckpt_entries.c for full and FSDP
 * checkpoints, ckpt_spmd_src.c for SPMD ones) and that every reader looks
 * up. It is the bottom of the read side: it calls no other checkpoint
 * file, so the listers, the opener (ckpt_source.c) and the readers above
 * it (ckpt_spmd_read.c, ckpt_read.c, ckpt_box.c) each depend only
 * downward. */
#include "ckpt_internal.h"

#include <stdlib.h>
#include <string.h>

#include "cx_vec.h"

void ckpt_entry_free(ckpt_entry *e)
{
    free(e->key);
    free(e->state);
    free(e->h5path);
    for (int i = 0; i < e->npieces; i++) {
        free(e->pieces[i].h5path);
        free(e->pieces[i].boxes);
    }
    free(e->pieces);
}

cx_status ckpt_src_add_entry(ckpt_src *s, const ckpt_entry_spec *x)
{
    if (!CX_GROW(s->entries, s->entries_cap, s->nentries + 1)) goto oom;
    ckpt_entry *e = &s->entries[s->nentries];
    memset(e, 0, sizeof *e);
    e->key = strdup(x->key);
    e->state = x->state ? strdup(x->state) : NULL;
    e->h5path = strdup(x->h5path);
    if (!e->key || (x->state && !e->state) || !e->h5path) {
        ckpt_entry_free(e);
        goto oom;
    }
    e->is_param = x->is_param;
    e->ndim = x->ndim;
    e->numel = 1;
    for (int i = 0; i < x->ndim; i++) {
        e->shape[i] = x->shape[i];
        e->numel *= x->shape[i];
    }
    e->dtype = x->dtype;
    e->unit = x->unit;
    e->pidx = x->pidx;
    e->replicated = x->replicated;
    s->nentries++;
    return CX_OK;
oom:
    cx_set_last_error("checkpoint %s: out of memory listing tensors", s->prefix);
    return CX_ERR_OOM;
}

const ckpt_entry *ckpt_src_find(const ckpt_src *s, const char *key, const char *state)
{
    for (int i = 0; i < s->nentries; i++) {
        const ckpt_entry *e = &s->entries[i];
        if (strcmp(e->key, key)) continue;
        if ((state == NULL) != (e->state == NULL)) continue;
        if (state && strcmp(state, e->state)) continue;
        return e;
    }
    return NULL;
}
