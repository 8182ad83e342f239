/* cx_ckpt_save / cx_ckpt_load: writing a rank's file, the two-phase commit
 * over the ranks, and loading any committed checkpoint into any wrapping. */
#include "ckpt_internal.h"

#include <fcntl.h>
#include <unistd.h>

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* FSDP lives in parallel/fsdp and may be absent from a build (it lands
 * separately): weak references let checkpoint/ link either way, and an FSDP
 * save/load reports a clear error instead of failing to link. */
#pragma weak cx_fsdp_shard_metadata
#pragma weak cx_fsdp_parameters
#pragma weak cx_fsdp_module

cx_ckpt_opts cx_ckpt_default_opts(void)
{
    return (cx_ckpt_opts){ .compress_level = 0, .with_optimizer = true, .verify = true };
}

cx_ckpt_model cx_ckpt_model_single(cx_module *m) { return (cx_ckpt_model){ CX_CKPT_SINGLE, m, NULL }; }
cx_ckpt_model cx_ckpt_model_ddp(cx_module *m) { return (cx_ckpt_model){ CX_CKPT_DDP, m, NULL }; }
cx_ckpt_model cx_ckpt_model_fsdp(cx_fsdp *f, bool zero3)
{
    return (cx_ckpt_model){ zero3 ? CX_CKPT_FSDP_ZERO3 : CX_CKPT_FSDP_ZERO2, NULL, f };
}

/* ---- views ------------------------------------------------------------------ */

void ckpt_view_release(ckpt_view *v)
{
    if (!v) return;
    ckpt_units_free(v->units, v->nunits);
    free(v->flat);
    memset(v, 0, sizeof *v);
}

cx_status ckpt_view_of(cx_ckpt_model m, ckpt_view *v)
{
    memset(v, 0, sizeof *v);
    v->strategy = m.strategy;
    if (m.strategy == CX_CKPT_SINGLE || m.strategy == CX_CKPT_DDP) {
        if (!m.module) {
            cx_set_last_error("checkpoint: no module given");
            return CX_ERR_ARG;
        }
        v->module = m.module;
        return CX_OK;
    }
    if (m.strategy != CX_CKPT_FSDP_ZERO2 && m.strategy != CX_CKPT_FSDP_ZERO3) {
        cx_set_last_error("checkpoint: unknown strategy %d", (int)m.strategy);
        return CX_ERR_ARG;
    }
    if (!m.fsdp) {
        cx_set_last_error("checkpoint: no FSDP wrapper given");
        return CX_ERR_ARG;
    }
    if (!cx_fsdp_shard_metadata || !cx_fsdp_parameters || !cx_fsdp_module) {
        cx_set_last_error("checkpoint: this build of cxla has no FSDP");
        return CX_ERR_STATE;
    }
    v->sharded = true;
    v->module = cx_fsdp_module(m.fsdp);
    int nu = 0, nflat = 0;
    const cx_fsdp_unit_info *info = cx_fsdp_shard_metadata(m.fsdp, &nu);
    cx_named_tensor *flat = cx_fsdp_parameters(m.fsdp, &nflat);
    v->units = calloc((size_t)(nu ? nu : 1), sizeof *v->units);
    v->flat = calloc((size_t)(nu ? nu : 1), sizeof *v->flat);
    if (!flat || !v->units || !v->flat) goto oom;
    v->nunits = nu;
    for (int i = 0; i < nu; i++) {
        ckpt_unit *u = &v->units[i];
        const cx_fsdp_unit_info *x = &info[i];
        u->path = strdup(x->path ? x->path : "");
        u->flat_name = strdup(x->flat_name ? x->flat_name : "flat_param");
        u->params = calloc((size_t)(x->nparams ? x->nparams : 1), sizeof *u->params);
        if (!u->path || !u->flat_name || !u->params) goto oom;
        u->nparams = x->nparams;
        for (int p = 0; p < x->nparams; p++) {
            ckpt_pinfo *pi = &u->params[p];
            pi->name = strdup(x->params[p].name);
            if (!pi->name) goto oom;
            pi->ndim = x->params[p].ndim;
            memcpy(pi->shape, x->params[p].shape, sizeof pi->shape);
            pi->numel = x->params[p].numel;
            pi->offset = x->params[p].offset;
        }
        u->flat_numel = x->flat_numel;
        u->padded_numel = x->padded_numel;
        u->shard_numel = x->shard_numel;
        u->padding = x->padding;
        u->world = x->world_size;
        u->rank = x->rank;
        u->shard_offset = x->shard_offset;
        /* the shard named after the unit, else the unit's position */
        for (int k = 0; k < nflat && !v->flat[i]; k++)
            if (flat[k].name && !strcmp(flat[k].name, u->flat_name)) v->flat[i] = flat[k].tensor;
        if (!v->flat[i] && i < nflat) v->flat[i] = flat[i].tensor;
        if (!v->flat[i] || cx_numel(v->flat[i]) != u->shard_numel) {
            free(flat);
            cx_set_last_error("checkpoint: FSDP unit %s has no local shard of %lld elements", u->flat_name,
                              (long long)u->shard_numel);
            ckpt_view_release(v);
            return CX_ERR_STATE;
        }
    }
    free(flat);
    return CX_OK;
oom:
    free(flat);
    ckpt_view_release(v);
    cx_set_last_error("checkpoint: out of memory describing the FSDP shards");
    return CX_ERR_OOM;
}

/* ---- writing one rank's file ---------------------------------------------------- */

static cx_status write_tensor(hid_t parent, const char *name, cx_tensor *t, const char *kind, int level,
                              const char *path)
{
    cx_dtype dt = cx_dtype_of(t);
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

static hid_t open_or_create_group(hid_t parent, const char *name)
{
    if (H5Lexists(parent, name, H5P_DEFAULT) > 0) return H5Gopen2(parent, name, H5P_DEFAULT);
    return ckpt_group_create(parent, name);
}

/* File creation with creation-order tracking at the root and the 1.8 object
 * format (checksummed metadata), which h5py and h5dump read. */
hid_t ckpt_file_create(const char *path);
hid_t ckpt_file_create(const char *path)
{
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE), fapl = H5Pcreate(H5P_FILE_ACCESS), f = -1;
    if (fcpl >= 0 && fapl >= 0 &&
        H5Pset_link_creation_order(fcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED) >= 0 &&
        H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) >= 0)
        f = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, fapl);
    if (fcpl >= 0) H5Pclose(fcpl);
    if (fapl >= 0) H5Pclose(fapl);
    return f;
}

int ckpt_write_root_attrs(hid_t f, const char *strategy, int world, int rank, int train_world, int64_t step,
                          int64_t epoch, int64_t pos, uint64_t rng_seed, uint64_t rng_offset, const char *optimizer,
                          int64_t opt_steps, int level);
int ckpt_write_root_attrs(hid_t f, const char *strategy, int world, int rank, int train_world, int64_t step,
                          int64_t epoch, int64_t pos, uint64_t rng_seed, uint64_t rng_offset, const char *optimizer,
                          int64_t opt_steps, int level)
{
    char comp[32];
    if (level > 0) snprintf(comp, sizeof comp, "zstd-%d", level);
    else snprintf(comp, sizeof comp, "none");
    bool ok = ckpt_attr_write_str(f, "format", CKPT_FORMAT_NAME) == 0 &&
              ckpt_attr_write_i64(f, "format_version", CX_CKPT_FORMAT_VERSION) == 0 &&
              ckpt_attr_write_str(f, "library_version", CX_VERSION_STRING) == 0 &&
              ckpt_attr_write_str(f, "strategy", strategy) == 0 && ckpt_attr_write_i64(f, "world_size", world) == 0 &&
              ckpt_attr_write_i64(f, "rank", rank) == 0 && ckpt_attr_write_i64(f, "train_world_size", train_world) == 0 &&
              ckpt_attr_write_i64(f, "step", step) == 0 && ckpt_attr_write_i64(f, "epoch", epoch) == 0 &&
              ckpt_attr_write_i64(f, "sampler_epoch", epoch) == 0 &&
              ckpt_attr_write_i64(f, "sampler_position", pos) == 0 && ckpt_attr_write_u64(f, "rng_seed", rng_seed) == 0 &&
              ckpt_attr_write_u64(f, "rng_offset", rng_offset) == 0 &&
              ckpt_attr_write_str(f, "optimizer", optimizer) == 0 &&
              ckpt_attr_write_i64(f, "optimizer_steps", opt_steps) == 0 && ckpt_attr_write_str(f, "compression", comp) == 0;
    return ok ? 0 : -1;
}

static cx_status write_optimizer(hid_t fid, cx_optimizer *opt, int level, const char *path)
{
    hid_t og = ckpt_group_create(fid, "optimizer");
    if (og < 0) {
        cx_set_last_error("%s: cannot create /optimizer: %s", path, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    int ns = 0;
    cx_named_tensor *state = cx_optim_state(opt, &ns);
    cx_status st = state ? CX_OK : CX_ERR_OOM;
    if (!state) cx_set_last_error("%s: out of memory listing the optimizer state", path);
    for (int i = 0; i < ns && st == CX_OK; i++) {
        char param[1024];
        const char *sname;
        if (ckpt_split_state(state[i].name, param, sizeof param, &sname) < 0) {
            cx_set_last_error("%s: optimizer state name '%s' is not <param>.<state>", path, state[i].name);
            st = CX_ERR_ARG;
            break;
        }
        hid_t g = open_or_create_group(og, param);
        if (g < 0) {
            cx_set_last_error("%s: cannot create /optimizer/%s: %s", path, param, ckpt_h5_msg());
            st = CX_ERR_IO;
            break;
        }
        st = write_tensor(g, sname, state[i].tensor, "state", level, path);
        H5Gclose(g);
    }
    free(state);
    H5Gclose(og);
    return st;
}

static cx_status write_rank_file(const char *tmp, const ckpt_view *v, cx_optimizer *opt, const cx_ckpt_extra *ex,
                                 cx_ckpt_opts opts, int rank, int nfiles)
{
    hid_t fid = ckpt_file_create(tmp);
    if (fid < 0) {
        cx_set_last_error("%s: cannot create: %s", tmp, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    cx_rng_state rng = cx_get_rng_state();
    cx_status st = CX_OK;
    if (ckpt_write_root_attrs(fid, cx_ckpt_strategy_name(v->strategy), nfiles, rank, cx_world_size(), ex->step,
                              ex->epoch, ex->sampler_position, rng.seed, rng.offset, opt ? cx_optim_name(opt) : "",
                              opt ? cx_optim_step_count(opt) : 0, opts.compress_level) < 0) {
        cx_set_last_error("%s: cannot write attributes: %s", tmp, ckpt_h5_msg());
        st = CX_ERR_IO;
    }
    hid_t mg = st == CX_OK ? ckpt_group_create(fid, "model") : -1;
    if (st == CX_OK && mg < 0) {
        cx_set_last_error("%s: cannot create /model: %s", tmp, ckpt_h5_msg());
        st = CX_ERR_IO;
    }
    if (st == CX_OK && !v->sharded) {
        int n = 0, np = 0;
        cx_named_tensor *sd = cx_module_state_dict(v->module, &n);
        cx_named_tensor *ps = cx_module_parameters(v->module, &np);
        if (!sd || !ps) {
            cx_set_last_error("%s: out of memory listing the state dict", tmp);
            st = CX_ERR_OOM;
        }
        for (int i = 0; i < n && st == CX_OK; i++) {
            bool is_param = false;
            for (int k = 0; k < np && !is_param; k++) is_param = ps[k].tensor == sd[i].tensor;
            st = write_tensor(mg, sd[i].name, sd[i].tensor, is_param ? "param" : "buffer", opts.compress_level, tmp);
        }
        free(sd);
        free(ps);
    } else if (st == CX_OK) {
        for (int i = 0; i < v->nunits && st == CX_OK; i++)
            st = write_tensor(mg, v->units[i].flat_name, v->flat[i], "flat_param", opts.compress_level, tmp);
        int nb = 0;
        cx_named_tensor *bs = cx_module_buffers(v->module, &nb);
        if (st == CX_OK && !bs) {
            cx_set_last_error("%s: out of memory listing the buffers", tmp);
            st = CX_ERR_OOM;
        }
        for (int i = 0; i < nb && st == CX_OK; i++)
            st = write_tensor(mg, bs[i].name, bs[i].tensor, "buffer", opts.compress_level, tmp);
        free(bs);
        if (st == CX_OK) st = ckpt_units_write(fid, v->units, v->nunits);
    }
    if (mg >= 0) H5Gclose(mg);
    if (st == CX_OK && opt && opts.with_optimizer) st = write_optimizer(fid, opt, opts.compress_level, tmp);
    if (H5Fclose(fid) < 0 && st == CX_OK) {
        cx_set_last_error("%s: cannot close: %s", tmp, ckpt_h5_msg());
        st = CX_ERR_IO;
    }
    return st;
}

/* ---- the commit protocol ------------------------------------------------------------- */

typedef struct {
    int32_t status;
    int32_t rank;
    int64_t size;
    uint64_t hash;
    char msg[480];
} rank_report;

/* Every rank learns every rank's outcome; a failure anywhere is returned
 * everywhere with the failing rank's message. */
static cx_status agree(const char *tag, cx_status mine, rank_report *rep, rank_report **all_out)
{
    rep->status = (int32_t)mine;
    rep->rank = cx_global_ordinal();
    if (mine != CX_OK) snprintf(rep->msg, sizeof rep->msg, "%s", cx_last_error());
    void *all = NULL;
    cx_status st = cx_rendezvous(tag, rep, sizeof *rep, &all, NULL);
    if (st != CX_OK) return st;
    rank_report *r = all;
    int world = cx_world_size();
    for (int i = 0; i < world; i++)
        if (r[i].status != CX_OK) {
            if (world > 1) cx_set_last_error("rank %d: %s", (int)r[i].rank, r[i].msg);
            else cx_set_last_error("%s", r[i].msg);
            st = (cx_status)r[i].status;
            break;
        }
    if (all_out && st == CX_OK) *all_out = r;
    else free(r);
    return st;
}

/* Removes files of this prefix left by an earlier save with another world
 * size, so the checkpoint's file set is exactly what the marker lists. */
static void remove_stale(const char *prefix, int nfiles)
{
    char pattern[8300], want[4200];
    size_t o = 0;
    for (const char *p = prefix; *p && o + 2 < sizeof pattern - 32; p++) {
        if (strchr("*?[]\\", *p)) pattern[o++] = '\\';
        pattern[o++] = *p;
    }
    snprintf(pattern + o, sizeof pattern - o, "%s", CX_CKPT_DEFAULT_SUFFIX);
    glob_t gl;
    if (glob(pattern, 0, NULL, &gl) != 0) return;
    for (size_t i = 0; i < gl.gl_pathc; i++) {
        bool keep = false;
        for (int r = 0; r < nfiles && !keep; r++) {
            ckpt_file_name(want, sizeof want, prefix, r, nfiles);
            keep = !strcmp(want, gl.gl_pathv[i]);
        }
        if (!keep) unlink(gl.gl_pathv[i]);
    }
    globfree(&gl);
}

static void hook(const char *phase)
{
    if (ckpt_test_hook) ckpt_test_hook(phase);
}

cx_status ckpt_save_view(const char *prefix, const ckpt_view *v, cx_optimizer *opt, const cx_ckpt_extra *extra,
                         cx_ckpt_opts opts)
{
    cx_status st = CX_OK;
    int rank = cx_global_ordinal(), world = cx_world_size();
    int nfiles = v->sharded ? world : 1;
    bool writes = v->sharded || rank == 0;
    cx_ckpt_extra ex = { opt ? cx_optim_step_count(opt) : 0, 0, 0 };
    if (extra) ex = *extra;
    char final[4200], tmp[4300], marker[4200];
    ckpt_file_name(final, sizeof final, prefix, v->sharded ? rank : 0, nfiles);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", final, (long)getpid());
    ckpt_marker_name(marker, sizeof marker, prefix);
    if (!prefix || !*prefix || strlen(prefix) > 4000) {
        cx_set_last_error("cx_ckpt_save: bad prefix");
        st = CX_ERR_ARG;
    } else if (opts.compress_level < 0 || opts.compress_level > 22) {
        cx_set_last_error("cx_ckpt_save: compression level %d outside 0..22", opts.compress_level);
        st = CX_ERR_ARG;
    } else if (ckpt_h5_init() < 0) {
        st = CX_ERR_IO;
    }
    /* un-commit an older checkpoint of this prefix before any of its files is
     * replaced (each rank before its own rename; ENOENT is the usual case) */
    if (st == CX_OK && unlink(marker) != 0 && errno != ENOENT) {
        cx_set_last_error("%s: cannot remove the old commit marker: %s", marker, strerror(errno));
        st = CX_ERR_IO;
    }
    if (st == CX_OK && rank == 0) remove_stale(prefix, nfiles);
    rank_report rep;
    memset(&rep, 0, sizeof rep);
    if (st == CX_OK && writes) {
        st = write_rank_file(tmp, v, opt, &ex, opts, v->sharded ? rank : 0, nfiles);
        if (st == CX_OK) hook("file-written");
        if (st == CX_OK) st = ckpt_hash_file(tmp, true, &rep.hash, &rep.size);
        if (st == CX_OK && rename(tmp, final) != 0) {
            cx_set_last_error("%s: cannot rename into place: %s", final, strerror(errno));
            st = CX_ERR_IO;
        }
        if (st == CX_OK && ckpt_fsync_dir(final) != 0) {
            cx_set_last_error("%s: cannot fsync its directory: %s", final, strerror(errno));
            st = CX_ERR_IO;
        }
        if (st != CX_OK) unlink(tmp);
        else hook("renamed");
    }
    rank_report *all = NULL;
    cx_status agreed = agree("cx_ckpt_save", st, &rep, &all);
    if (agreed != CX_OK) {
        if (writes && st == CX_OK) unlink(final);   /* uncommitted: do not leave it around */
        return agreed;
    }
    cx_status mst = CX_OK;
    if (rank == 0) {
        hook("before-marker");
        ckpt_marker m = { .version = CX_CKPT_FORMAT_VERSION, .world = nfiles, .step = ex.step, .nfiles = nfiles };
        snprintf(m.strategy, sizeof m.strategy, "%s", cx_ckpt_strategy_name(v->strategy));
        m.files = calloc((size_t)nfiles, sizeof *m.files);
        if (!m.files) {
            cx_set_last_error("%s: out of memory", marker);
            mst = CX_ERR_OOM;
        }
        for (int r = 0; r < nfiles && mst == CX_OK; r++) {
            char name[4200];
            ckpt_file_name(name, sizeof name, prefix, r, nfiles);
            const char *b = strrchr(name, '/');
            ckpt_strlcpy(m.files[r].name, sizeof m.files[r].name, b ? b + 1 : name);
            m.files[r].size = all[r].size;
            m.files[r].hash = all[r].hash;
        }
        if (mst == CX_OK) mst = ckpt_marker_write(prefix, &m);
        free(m.files);
        if (mst == CX_OK) hook("committed");
    }
    free(all);
    rank_report rep2;
    memset(&rep2, 0, sizeof rep2);
    return agree("cx_ckpt_commit", mst, &rep2, NULL);
}

cx_status cx_ckpt_save_opts(const char *prefix, cx_ckpt_model model, cx_optimizer *opt, const cx_ckpt_extra *extra,
                            cx_ckpt_opts opts)
{
    ckpt_view v;
    cx_status st = ckpt_view_of(model, &v);
    /* every rank takes part in the agreement even when its own view failed */
    if (st != CX_OK) {
        rank_report rep;
        memset(&rep, 0, sizeof rep);
        cx_status a = agree("cx_ckpt_save", st, &rep, NULL);
        return a != CX_OK ? a : st;
    }
    st = ckpt_save_view(prefix, &v, opt, extra, opts);
    ckpt_view_release(&v);
    return st;
}

cx_status cx_ckpt_save(const char *prefix, cx_ckpt_model model, cx_optimizer *opt, const cx_ckpt_extra *extra)
{
    return cx_ckpt_save_opts(prefix, model, opt, extra, cx_ckpt_default_opts());
}

/* ---- loading ----------------------------------------------------------------------------- */

static bool same_shape(const ckpt_entry *e, const cx_tensor *t)
{
    if (e->ndim != cx_ndim(t)) return false;
    for (int i = 0; i < e->ndim; i++)
        if (e->shape[i] != cx_dim(t, i)) return false;
    return true;
}

static void shape_str(char *out, size_t cap, int ndim, const int64_t *shape)
{
    size_t o = (size_t)snprintf(out, cap, "(");
    for (int i = 0; i < ndim && o < cap; i++) o += (size_t)snprintf(out + o, cap - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < cap) snprintf(out + o, cap - o, ")");
}

static cx_status shape_error(const ckpt_src *s, const char *key, const char *state, const ckpt_entry *e,
                             int ndim, const int64_t *shape)
{
    char a[160], b[160];
    shape_str(b, sizeof b, ndim, shape);
    if (!e) {
        cx_set_last_error("checkpoint %s has no %s%s%s (the model has it, shape %s)", s->prefix, state ? "optimizer state " : "",
                          key, state ? "." : "", b);
        if (state) cx_set_last_error("checkpoint %s has no optimizer state %s.%s", s->prefix, key, state);
        return CX_ERR_SHAPE;
    }
    shape_str(a, sizeof a, e->ndim, e->shape);
    cx_set_last_error("checkpoint %s: %s%s%s has shape %s, the model expects %s", s->prefix, key, state ? "." : "",
                      state ? state : "", a, b);
    return CX_ERR_SHAPE;
}

/* Fills a shard buffer (unit u of the target layout) from the source's full
 * tensors `key`/`state`, piece by piece. */
static cx_status fill_shard(ckpt_src *s, const ckpt_unit *u, const char *state, float *buf)
{
    memset(buf, 0, sizeof(float) * (size_t)u->shard_numel);
    int64_t s0 = u->shard_offset, s1 = u->shard_offset + u->shard_numel;
    for (int p = 0; p < u->nparams; p++) {
        const ckpt_pinfo *pi = &u->params[p];
        int64_t lo = pi->offset > s0 ? pi->offset : s0, hi = pi->offset + pi->numel < s1 ? pi->offset + pi->numel : s1;
        if (lo >= hi) continue;
        const ckpt_entry *e = ckpt_src_find(s, pi->name, state);
        cx_status st = ckpt_src_read(s, e, lo - pi->offset, hi - pi->offset, buf + (lo - s0));
        if (st != CX_OK) return st;
    }
    return CX_OK;
}

static cx_status assign_host(cx_tensor *t, const void *buf, cx_dtype dt, const char *what)
{
    cx_tensor *v = cx_from_host(buf, cx_shape(t), cx_ndim(t), dt);
    cx_tensor *c = dt == cx_dtype_of(t) ? v : cx_cast(v, cx_dtype_of(t));
    cx_status st = cx_assign(t, c);
    if (c != v) cx_free(c);
    cx_free(v);
    if (st == CX_OK) st = cx_sync_tensors(&t, 1);
    if (st != CX_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cx_last_error());
        cx_set_last_error("checkpoint: cannot load %s: %s", what, msg);
    }
    return st;
}

typedef struct {
    ckpt_src *s;
    const ckpt_entry *e;
} read_ctx;

static cx_status fill_from_file(void *p, void *dst, size_t bytes)
{
    read_ctx *r = p;
    (void)bytes;
    return ckpt_src_read(r->s, r->e, 0, r->e->numel, dst);
}

static cx_status assign_read(cx_tensor *t, ckpt_src *s, const ckpt_entry *e, const char *what)
{
    read_ctx r = { s, e };
    cx_tensor *v = cx_from_fill(cx_shape(t), cx_ndim(t), cx_dtype_of(t), fill_from_file, &r);
    cx_status st = cx_tensor_error(v) ? CX_ERR_IO : cx_assign(t, v);
    cx_free(v);
    if (st == CX_OK) st = cx_sync_tensors(&t, 1);
    if (st != CX_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cx_last_error());
        cx_set_last_error("checkpoint: cannot load %s: %s", what, msg);
    }
    return st;
}

typedef struct {
    const char *state;     /* NULL: parameters */
    cx_tensor *t;
    int unit;              /* target unit (sharded) */
    const ckpt_entry *e;   /* unsharded: the source entry */
} load_item;

/* Plans (and checks) everything, then reads and assigns. */
static cx_status load_into(ckpt_src *s, const ckpt_view *v, cx_optimizer *opt, cx_ckpt_opts opts)
{
    cx_status st = CX_OK;
    int n = 0, nb = 0, ns = 0;
    cx_named_tensor *sd = NULL, *state = NULL;
    load_item *items = NULL;
    int nitems = 0;
    char (*pnames)[1024] = NULL;
    bool with_opt = opt && opts.with_optimizer;
    sd = v->sharded ? cx_module_buffers(v->module, &nb) : cx_module_state_dict(v->module, &n);
    if (v->sharded) n = nb;
    state = with_opt ? cx_optim_state(opt, &ns) : NULL;
    if (!sd || (with_opt && !state)) goto oom;
    int cap = n + ns + v->nunits + 1;
    items = calloc((size_t)cap, sizeof *items);
    pnames = calloc((size_t)(ns ? ns : 1), sizeof *pnames);
    if (!items || !pnames) goto oom;

    /* model: every key must exist with the same shape, and nothing extra */
    int model_entries = 0;
    for (int i = 0; i < s->nentries; i++)
        if (!s->entries[i].state && (!v->sharded || !s->entries[i].is_param)) model_entries++;
    for (int i = 0; i < n && st == CX_OK; i++) {
        const ckpt_entry *e = ckpt_src_find(s, sd[i].name, NULL);
        if (!e || !same_shape(e, sd[i].tensor)) {
            st = shape_error(s, sd[i].name, NULL, e, cx_ndim(sd[i].tensor), cx_shape(sd[i].tensor));
            break;
        }
        items[nitems++] = (load_item){ NULL, sd[i].tensor, -1, e };
    }
    if (st == CX_OK && v->sharded) {
        for (int u = 0; u < v->nunits && st == CX_OK; u++) {
            for (int p = 0; p < v->units[u].nparams && st == CX_OK; p++) {
                const ckpt_pinfo *pi = &v->units[u].params[p];
                const ckpt_entry *e = ckpt_src_find(s, pi->name, NULL);
                bool ok = e && e->ndim == pi->ndim && e->dtype == CX_F32;
                for (int d = 0; ok && d < pi->ndim; d++) ok = e->shape[d] == pi->shape[d];
                if (!ok) st = shape_error(s, pi->name, NULL, e, pi->ndim, pi->shape);
            }
            items[nitems++] = (load_item){ NULL, v->flat[u], u, NULL };
        }
        int nparams = 0;
        for (int u = 0; u < v->nunits; u++) nparams += v->units[u].nparams;
        int src_params = 0;
        for (int i = 0; i < s->nentries; i++)
            if (!s->entries[i].state && s->entries[i].is_param) src_params++;
        if (st == CX_OK && src_params != nparams) {
            cx_set_last_error("checkpoint %s has %d parameters, the model %d", s->prefix, src_params, nparams);
            st = CX_ERR_SHAPE;
        }
    }
    if (st == CX_OK && model_entries != n) {
        for (int i = 0; i < s->nentries; i++) {
            const ckpt_entry *e = &s->entries[i];
            if (e->state || (v->sharded && e->is_param)) continue;
            bool known = false;
            for (int k = 0; k < n && !known; k++) known = !strcmp(sd[k].name, e->key);
            if (!known) {
                cx_set_last_error("checkpoint %s: unexpected key %s (not in the model)", s->prefix, e->key);
                break;
            }
        }
        st = CX_ERR_SHAPE;
    }
    /* optimizer state */
    for (int i = 0; i < ns && st == CX_OK; i++) {
        const char *sname;
        if (ckpt_split_state(state[i].name, pnames[i], sizeof pnames[i], &sname) < 0) {
            cx_set_last_error("checkpoint: optimizer state name '%s' is not <param>.<state>", state[i].name);
            st = CX_ERR_ARG;
            break;
        }
        if (!v->sharded) {
            const ckpt_entry *e = ckpt_src_find(s, pnames[i], sname);
            if (!e || !same_shape(e, state[i].tensor)) {
                st = shape_error(s, pnames[i], sname, e, cx_ndim(state[i].tensor), cx_shape(state[i].tensor));
                break;
            }
            items[nitems++] = (load_item){ sname, state[i].tensor, -1, e };
            continue;
        }
        int u = -1;
        for (int k = 0; k < v->nunits && u < 0; k++)
            if (!strcmp(v->units[k].flat_name, pnames[i])) u = k;
        if (u < 0) {
            cx_set_last_error("checkpoint: optimizer state %s belongs to no FSDP unit", state[i].name);
            st = CX_ERR_ARG;
            break;
        }
        const ckpt_unit *un = &v->units[u];
        if (cx_ndim(state[i].tensor) == 0) {
            const ckpt_entry *e = un->nparams ? ckpt_src_find(s, un->params[0].name, sname) : NULL;
            if (!e || e->ndim != 0) {
                st = shape_error(s, un->nparams ? un->params[0].name : un->flat_name, sname, e, 0, NULL);
                break;
            }
            items[nitems++] = (load_item){ sname, state[i].tensor, -1, e };
            continue;
        }
        for (int p = 0; p < un->nparams && st == CX_OK; p++) {
            const ckpt_entry *e = ckpt_src_find(s, un->params[p].name, sname);
            bool ok = e && e->ndim == un->params[p].ndim && e->dtype == CX_F32;
            for (int d = 0; ok && d < e->ndim; d++) ok = e->shape[d] == un->params[p].shape[d];
            if (!ok) st = shape_error(s, un->params[p].name, sname, e, un->params[p].ndim, un->params[p].shape);
        }
        items[nitems++] = (load_item){ sname, state[i].tensor, u, NULL };
    }
    if (st != CX_OK) goto out;

    /* every file this rank reads verifies before anything is modified */
    bool same_layout = s->sharded && v->sharded && s->world == cx_world_size() && s->home == cx_global_ordinal() &&
                       s->nunits == v->nunits;
    for (int u = 0; same_layout && u < v->nunits; u++)
        same_layout = v->units[u].shard_numel == s->units[u].shard_numel &&
                      v->units[u].flat_numel == s->units[u].flat_numel;
    /* with our own layout only our file is read; otherwise pieces may come
     * from any file */
    if (!s->sharded && !v->sharded) {
        /* whole tensors only: each one is checked against its own checksum
         * as it is read (a second pass over the file would double the I/O);
         * HDF5 checksums the metadata itself */
        s->per_dataset = true;
    } else {
        for (int r = 0; r < s->nfiles && st == CX_OK; r++)
            if (!same_layout || r == s->home) st = ckpt_src_verify(s, r);
    }
    for (int i = 0; i < nitems && st == CX_OK; i++) {
        load_item *it = &items[i];
        if (it->unit >= 0) {
            const ckpt_unit *u = &v->units[it->unit];
            float *buf = malloc(sizeof(float) * (size_t)(u->shard_numel ? u->shard_numel : 1));
            if (!buf) goto oom;
            st = fill_shard(s, u, it->state, buf);
            char what[1200];
            snprintf(what, sizeof what, "%s%s%s", u->flat_name, it->state ? "." : "", it->state ? it->state : "");
            if (st == CX_OK) st = assign_host(it->t, buf, CX_F32, what);
            free(buf);
            continue;
        }
        const ckpt_entry *e = it->e;
        char what[1200];
        snprintf(what, sizeof what, "%s%s%s", e->key, it->state ? "." : "", it->state ? it->state : "");
        if (e->dtype == cx_dtype_of(it->t)) {
            /* straight from the file into the device buffer: one copy */
            st = assign_read(it->t, s, e, what);
            continue;
        }
        size_t bytes = (size_t)e->numel * cx_dtype_size(e->dtype);
        void *buf = malloc(bytes ? bytes : 1);
        if (!buf) goto oom;
        st = ckpt_src_read(s, e, 0, e->numel, buf);
        if (st == CX_OK) st = assign_host(it->t, buf, e->dtype, what);
        free(buf);
    }
    goto out;
oom:
    cx_set_last_error("checkpoint %s: out of memory while loading", s->prefix);
    st = CX_ERR_OOM;
out:
    free(items);
    free(pnames);
    free(sd);
    free(state);
    return st;
}

cx_status ckpt_load_view(const char *prefix, const char *single_file, const ckpt_view *v, cx_optimizer *opt,
                         cx_ckpt_extra *extra, cx_ckpt_opts opts)
{
    ckpt_src s;
    int rank = cx_global_ordinal();
    cx_status st = ckpt_src_open(&s, prefix, NULL, single_file, false, v->sharded ? rank : 0);
    if (st != CX_OK) return st;
    /* ask the kernel to stream the files in: tensors are then read from
     * the page cache while the disk keeps going */
    for (int r = 0; r < s.nfiles; r++) {
        int fd = open(s.files[r].path, O_RDONLY);
        if (fd < 0) continue;
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
        close(fd);
    }
    if (!opts.verify)
        for (int r = 0; r < s.nfiles; r++) s.files[r].verified = true;
    if (opt && opts.with_optimizer) {
        bool any = false;
        for (int i = 0; i < s.nentries && !any; i++) any = s.entries[i].state != NULL;
        if (!any) {
            cx_set_last_error("checkpoint %s has no optimizer state (load without an optimizer, or consolidate "
                              "with --with-optimizer)",
                              s.prefix);
            ckpt_src_close(&s);
            return CX_ERR_SHAPE;
        }
    }
    st = load_into(&s, v, opt, opts);
    if (st == CX_OK) {
        cx_set_rng_state((cx_rng_state){ s.rng_seed, s.rng_offset });
        if (opt && opts.with_optimizer) cx_optim_set_step_count(opt, s.optimizer_steps);
        if (extra) *extra = (cx_ckpt_extra){ s.step, s.epoch, s.sampler_position };
    }
    ckpt_src_close(&s);
    return st;
}

cx_status cx_ckpt_load_opts(const char *prefix, cx_ckpt_model model, cx_optimizer *opt, cx_ckpt_extra *extra,
                            cx_ckpt_opts opts)
{
    ckpt_view v;
    cx_status st = ckpt_view_of(model, &v);
    if (st == CX_OK && !prefix) {
        cx_set_last_error("cx_ckpt_load: prefix is NULL");
        st = CX_ERR_ARG;
    }
    if (st == CX_OK) st = ckpt_load_view(prefix, NULL, &v, opt, extra, opts);
    ckpt_view_release(&v);
    rank_report rep;
    memset(&rep, 0, sizeof rep);
    return agree("cx_ckpt_load", st, &rep, NULL);
}

cx_status cx_ckpt_load(const char *prefix, cx_ckpt_model model, cx_optimizer *opt, cx_ckpt_extra *extra)
{
    return cx_ckpt_load_opts(prefix, model, opt, extra, cx_ckpt_default_opts());
}

cx_status cx_ckpt_load_full(const char *path, cx_ckpt_model model, cx_optimizer *opt, cx_ckpt_extra *extra)
{
    if (!path) {
        cx_set_last_error("cx_ckpt_load_full: path is NULL");
        return CX_ERR_ARG;
    }
    ckpt_view v;
    cx_status st = ckpt_view_of(model, &v);
    if (st != CX_OK) return st;
    cx_ckpt_opts o = cx_ckpt_default_opts();
    o.with_optimizer = opt != NULL;
    st = ckpt_load_view(NULL, path, &v, opt, extra, o);
    ckpt_view_release(&v);
    return st;
}

/* ---- finding the latest ---------------------------------------------------------------- */

cx_status cx_ckpt_latest(const char *dir, char *out, size_t cap)
{
    if (!dir || !out || cap == 0) {
        cx_set_last_error("cx_ckpt_latest: NULL argument");
        return CX_ERR_ARG;
    }
    DIR *d = opendir(dir);
    if (!d) {
        cx_set_last_error("no committed checkpoint in %s: %s", dir, strerror(errno));
        return CX_ERR_IO;
    }
    char best[4200] = "";
    int64_t best_step = -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len <= 7 || strcmp(de->d_name + len - 7, ".commit")) continue;
        char prefix[4200];
        snprintf(prefix, sizeof prefix, "%s/%.*s", dir, (int)(len - 7), de->d_name);
        ckpt_marker m;
        if (ckpt_marker_read(prefix, &m) != CX_OK) continue;
        int64_t step = m.step;
        ckpt_marker_release(&m);
        if (!cx_ckpt_is_committed(prefix)) continue;
        if (step > best_step || (step == best_step && strcmp(prefix, best) > 0)) {
            best_step = step;
            snprintf(best, sizeof best, "%s", prefix);
        }
    }
    closedir(d);
    cx_clear_error();
    if (best_step < 0) {
        cx_set_last_error("no committed checkpoint in %s", dir);
        return CX_ERR_IO;
    }
    if (strlen(best) >= cap) {
        cx_set_last_error("cx_ckpt_latest: prefix %s does not fit in %zu bytes", best, cap);
        return CX_ERR_ARG;
    }
    snprintf(out, cap, "%s", best);
    return CX_OK;
}
