/* The tensors of a full or FSDP checkpoint as full, PyTorch-shaped
 * entries: the home file's datasets, with a sharded file's flat parameters
 * and states listed per parameter of their unit. An SPMD checkpoint is
 * listed by its sibling ckpt_spmd_src.c; both fill the entry table of
 * ckpt_table.c and neither calls the other (ckpt_source.c picks one). */
#include "ckpt_internal.h"

#include <stdlib.h>
#include <string.h>

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
            ckpt_entry_spec x = { pi->name, NULL, h5, true, pi->ndim, pi->shape, CX_F32, i, p, false };
            st = ckpt_src_add_entry(s, &x);
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
        ckpt_entry_spec x = { model.names[k], NULL, h5, is_param, nd, shape, dt, -1, -1, true };
        st = ckpt_src_add_entry(s, &x);
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
            ckpt_entry_spec x = { group, states.names[k], h5, false, nd, shape, dt, -1, -1, true };
            st = ckpt_src_add_entry(s, &x);
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
            ckpt_entry_spec x = { pi->name, states.names[k], h5, false, pi->ndim, pi->shape, dt, unit, p, false };
            if (nd == 0) {
                x.ndim = 0;
                x.replicated = true;
            }
            st = ckpt_src_add_entry(s, &x);
        }
    }
    ckpt_name_list_free(&states);
    return st;
}

cx_status ckpt_src_list(ckpt_src *s)
{
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
