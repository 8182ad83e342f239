/* cx_ckpt_save: each writing rank's file (model, optimizer state, shard
 * metadata), then the commit over the ranks (ckpt_commit.c). */
#include "ckpt_internal.h"
#include <cxla/spmd.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* How one rank's file is being written. */
typedef struct {
    int level;            /* compression */
    const char *path;     /* the temporary file, for messages */
    bool spmd;            /* each rank writes its own shards (ckpt_spmd_save.c) */
    int64_t written;      /* SPMD: datasets written */
} save_ctx;

static cx_status write_tensor(hid_t parent, const char *name, cx_tensor *t, const char *kind, save_ctx *c)
{
    if (c->spmd) return ckpt_spmd_write_tensor(parent, name, t, kind, c->level, c->path, &c->written);
    int level = c->level;
    const char *path = c->path;
    char spec[256];
    if (strcmp(cx_sharding_spec(t, spec, sizeof spec), "replicated")) {
        /* reading it would gather over every rank while only this one writes:
         * refuse instead of hanging (single and DDP models switch to the
         * SPMD layout by themselves; an FSDP wrapper holds no such tensor) */
        cx_set_last_error("%s: %s is SPMD-sharded %s; save the model with cx_ckpt_model_spmd", path, name, spec);
        return CX_ERR_ARG;
    }
    cx_dtype dt = ckpt_saved_dtype(t);
    int64_t n = cx_numel(t);
    size_t bytes = (size_t)n * cx_dtype_size(dt);
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        cx_set_last_error("%s: out of memory for %s (%zu bytes)", path, name, bytes);
        return CX_ERR_OOM;
    }
    cx_status st = cx_to_host(t, buf, dt);
    if (st != CX_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cx_last_error());
        cx_set_last_error("%s: cannot read %s from the device: %s", path, name, msg);
        free(buf);
        return st;
    }
    hid_t d = ckpt_dataset_create(parent, name, dt, cx_shape(t), cx_ndim(t), level);
    if (d < 0 || ckpt_dataset_write_all(d, dt, buf, n) < 0 ||
        ckpt_dataset_attrs(d, dt, kind, ckpt_hash_bytes(buf, bytes)) < 0) {
        cx_set_last_error("%s: cannot write %s: %s", path, name, ckpt_h5_msg());
        st = CX_ERR_IO;
    }
    if (d >= 0) H5Dclose(d);
    free(buf);
    return st;
}

static cx_status write_optimizer(hid_t fid, cx_optimizer *opt, save_ctx *c)
{
    const char *path = c->path;
    hid_t og = ckpt_group_at(fid, "optimizer", path, "/optimizer");
    if (og < 0) return CX_ERR_IO;
    int ns = 0;
    cx_named_tensor *state = cx_optim_state(opt, &ns);
    cx_status st = state ? CX_OK : CX_ERR_OOM;
    if (!state) cx_set_last_error("%s: out of memory listing the optimizer state", path);
    for (int i = 0; i < ns && st == CX_OK; i++) {
        char param[1024], what[1200];
        const char *sname;
        if (ckpt_split_state(state[i].name, param, sizeof param, &sname) < 0) {
            cx_set_last_error("%s: optimizer state name '%s' is not <param>.<state>", path, state[i].name);
            st = CX_ERR_ARG;
            break;
        }
        snprintf(what, sizeof what, "/optimizer/%s", param);
        hid_t g = ckpt_group_at(og, param, path, what);
        if (g < 0) {
            st = CX_ERR_IO;
            break;
        }
        st = write_tensor(g, sname, state[i].tensor, "state", c);
        H5Gclose(g);
    }
    free(state);
    H5Gclose(og);
    return st;
}

/* The unsharded state dict, each tensor marked parameter or buffer. */
static cx_status write_state_dict(hid_t mg, cx_module *m, save_ctx *c)
{
    const char *path = c->path;
    int n = 0, np = 0;
    cx_named_tensor *sd = cx_module_state_dict(m, &n);
    cx_named_tensor *ps = cx_module_parameters(m, &np);
    cx_status st = CX_OK;
    if (!sd || !ps) {
        cx_set_last_error("%s: out of memory listing the state dict", path);
        st = CX_ERR_OOM;
    }
    for (int i = 0; i < n && st == CX_OK; i++) {
        bool is_param = false;
        for (int k = 0; k < np && !is_param; k++) is_param = ps[k].tensor == sd[i].tensor;
        st = write_tensor(mg, sd[i].name, sd[i].tensor, is_param ? "param" : "buffer", c);
    }
    free(sd);
    free(ps);
    return st;
}

/* This rank's flat shards, the (replicated) buffers and the shard metadata. */
static cx_status write_shards(hid_t fid, hid_t mg, const ckpt_view *v, save_ctx *c)
{
    const char *path = c->path;
    cx_status st = CX_OK;
    for (int i = 0; i < v->nunits && st == CX_OK; i++)
        st = write_tensor(mg, v->units[i].flat_name, v->flat[i], "flat_param", c);
    int nb = 0;
    cx_named_tensor *bs = cx_module_buffers(v->module, &nb);
    if (st == CX_OK && !bs) {
        cx_set_last_error("%s: out of memory listing the buffers", path);
        st = CX_ERR_OOM;
    }
    for (int i = 0; i < nb && st == CX_OK; i++) st = write_tensor(mg, bs[i].name, bs[i].tensor, "buffer", c);
    free(bs);
    if (st == CX_OK) st = ckpt_units_write(fid, v->units, v->nunits);
    return st;
}

static cx_status write_rank_file(const char *tmp, const ckpt_view *v, cx_optimizer *opt, const cx_ckpt_extra *ex,
                                 cx_ckpt_opts opts, int rank, int nfiles)
{
    cx_rng_state rng = cx_get_rng_state();
    ckpt_root root = { .world_size = nfiles, .rank = rank, .train_world_size = cx_world_size(), .step = ex->step,
                       .epoch = ex->epoch, .sampler_position = ex->sampler_position, .rng_seed = rng.seed,
                       .rng_offset = rng.offset, .optimizer_steps = opt ? cx_optim_step_count(opt) : 0 };
    ckpt_strlcpy(root.strategy, sizeof root.strategy, cx_ckpt_strategy_name(v->strategy));
    ckpt_strlcpy(root.optimizer, sizeof root.optimizer, opt ? cx_optim_name(opt) : "");
    ckpt_strlcpy(root.program_meta, sizeof root.program_meta, opts.meta ? opts.meta : "");   /* length checked */
    hid_t fid, mg;
    cx_status st = ckpt_file_begin(tmp, &root, opts.compress_level, &fid, &mg);
    if (st != CX_OK) return st;
    save_ctx c = { .level = opts.compress_level, .path = tmp, .spmd = v->spmd, .written = 0 };
    st = v->sharded ? write_shards(fid, mg, v, &c) : write_state_dict(mg, v->module, &c);
    H5Gclose(mg);
    if (st == CX_OK && opt && opts.with_optimizer) st = write_optimizer(fid, opt, &c);
    if (st == CX_OK && v->spmd) st = ckpt_spmd_write_meta(fid, tmp, rank, nfiles, c.written);
    if (st != CX_OK) {
        ckpt_h5_discard_close(fid);
        return st;
    }
    if (H5Fclose(fid) < 0) {
        cx_set_last_error("%s: cannot close: %s", tmp, ckpt_h5_msg());
        ckpt_h5_discard_close(fid);
        st = CX_ERR_IO;
    }
    return st;
}

static cx_status check_save_args(const char *prefix, cx_ckpt_opts opts)
{
    if (!prefix || !*prefix || strlen(prefix) > 4000) {
        cx_set_last_error("cx_ckpt_save: bad prefix");
        return CX_ERR_ARG;
    }
    /* refused, not cut: a truncated string would read back as other metadata */
    if (opts.meta && strlen(opts.meta) >= CX_CKPT_META_MAX) {
        cx_set_last_error("cx_ckpt_save: opts.meta has %zu bytes, more than CX_CKPT_META_MAX - 1 (%d)",
                          strlen(opts.meta), CX_CKPT_META_MAX - 1);
        return CX_ERR_ARG;
    }
    cx_status st = ckpt_zstd_check_level("cx_ckpt_save", opts.compress_level);
    if (st == CX_OK && ckpt_h5_init() < 0) st = CX_ERR_IO;
    return st;
}

/* Rank 0 writes the marker from every rank's report, then all agree. */
static cx_status commit_save(const char *prefix, const ckpt_view *v, int nfiles, int64_t step,
                             const ckpt_report *all)
{
    cx_status st = CX_OK;
    if (cx_global_ordinal() == 0) {
        ckpt_hook("before-marker");
        int64_t *sizes = calloc((size_t)nfiles, sizeof *sizes);
        uint64_t *hashes = calloc((size_t)nfiles, sizeof *hashes);
        if (!sizes || !hashes) {
            cx_set_last_error("%s.commit: out of memory", prefix);
            st = CX_ERR_OOM;
        }
        for (int r = 0; r < nfiles && st == CX_OK; r++) {
            sizes[r] = all[r].size;
            hashes[r] = all[r].hash;
        }
        if (st == CX_OK) st = ckpt_commit(prefix, nfiles, cx_ckpt_strategy_name(v->strategy), step, sizes, hashes);
        free(sizes);
        free(hashes);
        if (st == CX_OK) ckpt_hook("committed");
    }
    ckpt_report rep;
    memset(&rep, 0, sizeof rep);
    return ckpt_agree("cx_ckpt_commit", st, &rep, NULL);
}

static cx_status save_view(const char *prefix, const ckpt_view *v, cx_optimizer *opt, const cx_ckpt_extra *extra,
                           cx_ckpt_opts opts)
{
    int rank = cx_global_ordinal();
    bool per_rank = v->sharded || v->spmd;
    int nfiles = per_rank ? cx_world_size() : 1;
    bool writes = per_rank || rank == 0;
    cx_ckpt_extra ex = { opt ? cx_optim_step_count(opt) : 0, 0, 0 };
    if (extra) ex = *extra;
    cx_status st = check_save_args(prefix, opts);
    /* un-commit an older checkpoint of this prefix before any of its files is
     * replaced (each rank before its own rename) */
    if (st == CX_OK) st = ckpt_uncommit(prefix);
    if (st == CX_OK && rank == 0) ckpt_remove_stale(prefix, nfiles);
    char final[4200], tmp[4300];
    ckpt_report rep;
    memset(&rep, 0, sizeof rep);
    if (st == CX_OK && writes) {
        ckpt_file_name(final, sizeof final, prefix, per_rank ? rank : 0, nfiles);
        snprintf(tmp, sizeof tmp, "%s.tmp-%ld", final, (long)getpid());
        st = write_rank_file(tmp, v, opt, &ex, opts, per_rank ? rank : 0, nfiles);
        if (st == CX_OK) ckpt_hook("file-written");
        if (st == CX_OK) st = ckpt_publish(tmp, final, &rep.hash, &rep.size);
        else unlink(tmp);
        if (st == CX_OK) ckpt_hook("renamed");
    }
    ckpt_report *all = NULL;
    cx_status agreed = ckpt_agree("cx_ckpt_save", st, &rep, &all);
    if (agreed != CX_OK) {
        if (writes && st == CX_OK) unlink(final);   /* uncommitted: do not leave it around */
        return agreed;
    }
    st = commit_save(prefix, v, nfiles, ex.step, all);
    free(all);
    return st;
}

/* Under SPMD every rank first syncs the tensors the save reads (a pending
 * sharded value is one program over all ranks; then each tensor's sharding
 * is settled and its shard is local). A single or DDP model holding a
 * sharded tensor is saved in the SPMD layout: gathering it for rank 0's one
 * file would need every rank. */
static cx_status spmd_prepare(ckpt_view *v, cx_optimizer *opt, cx_ckpt_opts opts)
{
    if (v->sharded || (!v->spmd && !cx_is_spmd())) return CX_OK;
    int n = 0, ns = 0;
    cx_named_tensor *sd = cx_module_state_dict(v->module, &n);
    cx_named_tensor *state = opt && opts.with_optimizer ? cx_optim_state(opt, &ns) : NULL;
    cx_tensor **ts = calloc((size_t)(n + ns + 1), sizeof *ts);
    cx_status st = sd && ts && (state || !(opt && opts.with_optimizer)) ? CX_OK : CX_ERR_OOM;
    if (st != CX_OK) cx_set_last_error("cx_ckpt_save: out of memory listing the tensors");
    for (int i = 0; i < n && ts; i++) ts[i] = sd[i].tensor;
    for (int i = 0; i < ns && ts; i++) ts[n + i] = state[i].tensor;
    if (st == CX_OK) st = cx_sync_tensors(ts, n + ns);
    bool any = false;
    for (int i = 0; i < n + ns && st == CX_OK && !any; i++) {
        const cx_mesh *mesh;
        cx_spec_entry spec[CX_MAX_DIMS];
        any = cx_get_sharding(ts[i], &mesh, spec, CX_MAX_DIMS) > 0;
    }
    if (any) {
        v->spmd = true;
        v->strategy = CX_CKPT_SPMD;
    }
    free(ts);
    free(sd);
    free(state);
    return st;
}

cx_status cx_ckpt_save_opts(const char *prefix, cx_ckpt_model model, cx_optimizer *opt, const cx_ckpt_extra *extra,
                            cx_ckpt_opts opts)
{
    cx_status st = ckpt_take_opts(&opts, "cx_ckpt_save");
    if (st != CX_OK) return st;
    ckpt_view v;
    st = ckpt_view_of(model, &v);
    if (st == CX_OK) {
        st = spmd_prepare(&v, opt, opts);
        if (st != CX_OK) ckpt_view_release(&v);
    }
    /* every rank takes part in the agreement even when its own view failed */
    if (st != CX_OK) {
        ckpt_report rep;
        memset(&rep, 0, sizeof rep);
        cx_status a = ckpt_agree("cx_ckpt_save", st, &rep, NULL);
        return a != CX_OK ? a : st;
    }
    st = save_view(prefix, &v, opt, extra, opts);
    ckpt_view_release(&v);
    return st;
}

cx_status cx_ckpt_save(const char *prefix, cx_ckpt_model model, cx_optimizer *opt, const cx_ckpt_extra *extra)
{
    return cx_ckpt_save_opts(prefix, model, opt, extra, cx_ckpt_default_opts());
}
