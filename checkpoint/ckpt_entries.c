/* The tensors of a checkpoint as full, PyTorch-shaped entries: the home
 * file's datasets, with a sharded file's flat parameters and states listed
 * per parameter of their unit. */
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

typedef struct {
    const char *key, *state, *h5path;
    bool is_param;
    int ndim;
    const int64_t *shape;
    cx_dtype dtype;
    int unit, pidx;
    bool replicated;
} entry_spec;

static cx_status add_entry(ckpt_src *s, entry_spec x)
{
    if (!CX_GROW(s->entries, s->entries_cap, s->nentries + 1)) goto oom;
    ckpt_entry *e = &s->entries[s->nentries];
    memset(e, 0, sizeof *e);
    e->key = strdup(x.key);
    e->state = x.state ? strdup(x.state) : NULL;
    e->h5path = strdup(x.h5path);
    if (!e->key || (x.state && !e->state) || !e->h5path) {
        ckpt_entry_free(e);
        goto oom;
    }
    e->is_param = x.is_param;
    e->ndim = x.ndim;
    e->numel = 1;
    for (int i = 0; i < x.ndim; i++) {
        e->shape[i] = x.shape[i];
        e->numel *= x.shape[i];
    }
    e->dtype = x.dtype;
    e->unit = x.unit;
    e->pidx = x.pidx;
    e->replicated = x.replicated;
    s->nentries++;
    return CX_OK;
oom:
    cx_set_last_error("checkpoint %s: out of memory listing tensors", s->prefix);
    return CX_ERR_OOM;
}

/* Rank, shape, dtype (and optionally the "kind" attribute) of a tensor
 * dataset. @return CX_OK, or CX_ERR_IO naming the dataset. */
static cx_status probe_dataset(hid_t fid, const char *fpath, const char *h5, int *nd, int64_t *shape, cx_dtype *dt,
                               char *kind, size_t kind_cap)
{
    hid_t d = H5Dopen2(fid, h5, H5P_DEFAULT);
    int64_t numel;
    bool ok = d >= 0 && ckpt_dataset_shape(d, nd, shape, &numel) == 0 && ckpt_dataset_dtype(d, dt) == 0;
    if (d >= 0 && kind) ckpt_attr_read_str(d, "kind", kind, kind_cap);
    if (d >= 0) H5Dclose(d);
    if (!ok) {
        cx_set_last_error("%s: %s is not a readable tensor dataset", fpath, h5);
        return CX_ERR_IO;
    }
    return CX_OK;
}

/* /model: the parameters of the shard metadata (sharded), then every
 * dataset that is not a flat parameter (only the buffers when sharded). */
static cx_status list_model(ckpt_src *s, hid_t fid, const char *fpath)
{
    cx_status st = CX_OK;
    for (int i = 0; s->sharded && i < s->nunits && st == CX_OK; i++) {
        char h5[1200];
        snprintf(h5, sizeof h5, "/model/%s", s->units[i].flat_name);
        for (int p = 0; p < s->units[i].nparams && st == CX_OK; p++) {
            const ckpt_pinfo *pi = &s->units[i].params[p];
            st = add_entry(s, (entry_spec){ pi->name, NULL, h5, true, pi->ndim, pi->shape, CX_F32, i, p, false });
        }
    }
    ckpt_name_list model;
    if (st == CX_OK && ckpt_list_group(fid, "/model", &model) < 0) {
        cx_set_last_error("%s: cannot list /model: %s", fpath, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    for (int k = 0; k < model.n && st == CX_OK; k++) {
        char h5[1200], kind[32] = "param";
        snprintf(h5, sizeof h5, "/model/%s", model.names[k]);
        int nd = 0;
        int64_t shape[CX_MAX_DIMS];
        cx_dtype dt = CX_F32;
        if ((st = probe_dataset(fid, fpath, h5, &nd, shape, &dt, kind, sizeof kind)) != CX_OK) break;
        if (!strcmp(kind, "flat_param")) continue;      /* listed per parameter above */
        if (s->sharded && strcmp(kind, "buffer")) continue;
        bool is_param = strcmp(kind, "buffer") != 0;
        st = add_entry(s, (entry_spec){ model.names[k], NULL, h5, is_param, nd, shape, dt, -1, -1, true });
    }
    ckpt_name_list_free(&model);
    return st;
}

/* The states of one /optimizer group. Sharded, the group is a flat
 * parameter: one entry per parameter of its unit, a slice (the parameter's
 * layout) or the replicated 0-d value. */
static cx_status list_states(ckpt_src *s, hid_t fid, const char *fpath, const char *group)
{
    char gpath[1200];
    snprintf(gpath, sizeof gpath, "/optimizer/%s", group);
    ckpt_name_list states;
    if (ckpt_list_group(fid, gpath, &states) < 0) {
        cx_set_last_error("%s: cannot list %s: %s", fpath, gpath, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    int unit = -1;
    for (int i = 0; s->sharded && i < s->nunits; i++)
        if (!strcmp(s->units[i].flat_name, group)) unit = i;
    cx_status st = CX_OK;
    for (int k = 0; k < states.n && st == CX_OK; k++) {
        char h5[2400];
        snprintf(h5, sizeof h5, "%s/%s", gpath, states.names[k]);
        int nd = 0;
        int64_t shape[CX_MAX_DIMS];
        cx_dtype dt = CX_F32;
        if ((st = probe_dataset(fid, fpath, h5, &nd, shape, &dt, NULL, 0)) != CX_OK) break;
        if (!s->sharded) {
            st = add_entry(s, (entry_spec){ group, states.names[k], h5, false, nd, shape, dt, -1, -1, true });
            continue;
        }
        if (unit < 0) {
            cx_set_last_error("%s: optimizer state %s belongs to no unit of the shard metadata", fpath, h5);
            st = CX_ERR_IO;
            break;
        }
        const ckpt_unit *u = &s->units[unit];
        for (int p = 0; p < u->nparams && st == CX_OK; p++) {
            const ckpt_pinfo *pi = &u->params[p];
            entry_spec x = { pi->name, states.names[k], h5, false, pi->ndim, pi->shape, dt, unit, p, false };
            if (nd == 0) {
                x.ndim = 0;
                x.replicated = true;
            }
            st = add_entry(s, x);
        }
    }
    ckpt_name_list_free(&states);
    return st;
}

cx_status ckpt_src_list(ckpt_src *s)
{
    if (s->spmd) return ckpt_spmd_list(s);
    hid_t fid = s->files[s->home].fid;
    const char *fpath = s->files[s->home].path;
    cx_status st = list_model(s, fid, fpath);
    if (st != CX_OK) return st;
    ckpt_name_list groups;
    if (ckpt_list_group(fid, "/optimizer", &groups) < 0) {
        cx_set_last_error("%s: cannot list /optimizer: %s", fpath, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    for (int g = 0; g < groups.n && st == CX_OK; g++) st = list_states(s, fid, fpath, groups.names[g]);
    ckpt_name_list_free(&groups);
    return st;
}
