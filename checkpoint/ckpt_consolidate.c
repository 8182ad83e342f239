/* consolidate_ckpts' engine: stitch a checkpoint into one full file, or
 * rewrite it for another world size. Both stream through a buffer of at
 * most CKPT_STREAM_ELEMS elements (never a whole tensor, never the model),
 * validate every input file first, and leave nothing behind on failure. */
#include "ckpt_internal.h"

#include "cx_struct.h"

#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cx_ckpt_count_files(const char *prefix, const char *suffix)
{
    if (!prefix) {
        cx_set_last_error("cx_ckpt_count_files: prefix is NULL");
        return -1;
    }
    char pattern[8300];
    ckpt_glob_pattern(pattern, sizeof pattern, prefix, suffix);
    glob_t gl;
    int rc = glob(pattern, 0, NULL, &gl);
    int n = rc == 0 ? (int)gl.gl_pathc : 0;
    if (rc == 0) globfree(&gl);
    return n;
}

/* An output file being written from a source, through one streaming
 * buffer sized for the largest entry, capped. */
typedef struct {
    ckpt_src *s;
    void *buf;
    int64_t elems;      /* capacity in elements of 8 bytes */
    int level;
    const char *path;
} writer;

static cx_status writer_init(writer *w, ckpt_src *s, int level)
{
    int64_t largest = 1;
    for (int i = 0; i < s->nentries; i++)
        if (s->entries[i].numel > largest) largest = s->entries[i].numel;
    *w = (writer){ .s = s, .level = level };
    w->elems = largest < CKPT_STREAM_ELEMS ? largest : CKPT_STREAM_ELEMS;
    w->buf = malloc((size_t)w->elems * 8);
    if (!w->buf) {
        cx_set_last_error("checkpoint %s: out of memory for a %lld-element stream buffer", s->prefix,
                          (long long)w->elems);
        return CX_ERR_OOM;
    }
    return CX_OK;
}

/* A dataset being streamed out, hashed as it is written. */
typedef struct {
    hid_t d;
    cx_dtype dt;
    const int64_t *shape;
    int ndim;
    const char *name;
    ckpt_hasher h;
} out_dataset;

static cx_status out_begin(writer *w, out_dataset *o, hid_t parent, const char *name, cx_dtype dt,
                           const int64_t *shape, int ndim)
{
    *o = (out_dataset){ .dt = dt, .shape = shape, .ndim = ndim, .name = name };
    o->d = ckpt_dataset_create(parent, name, dt, shape, ndim, w->level);
    if (o->d < 0) {
        cx_set_last_error("%s: cannot create %s: %s", w->path, name, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    if (ckpt_hasher_begin(&o->h, CX_CKPT_FORMAT_VERSION) == 0) return CX_OK;
    H5Dclose(o->d);
    return CX_ERR_OOM;
}

/* Elements [a, b) of entry e (NULL: zeros) become elements [at, at + b - a)
 * of the output. */
static cx_status out_piece(writer *w, out_dataset *o, const ckpt_entry *e, int64_t a, int64_t b, int64_t at)
{
    size_t bytes = (size_t)(b - a) * cx_dtype_size(o->dt);
    cx_status st = CX_OK;
    if (e) st = ckpt_src_read(w->s, e, a, b, w->buf);
    else memset(w->buf, 0, bytes);
    if (st != CX_OK) return st;
    ckpt_hasher_update(&o->h, w->buf, bytes);
    if (ckpt_dataset_write_range(o->d, o->dt, o->shape, o->ndim, at, at + (b - a), w->buf) < 0) {
        cx_set_last_error("%s: cannot write %s: %s", w->path, o->name, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    return CX_OK;
}

/* Closes the output, with its attributes when it was written whole (st). */
static cx_status out_end(writer *w, out_dataset *o, const char *kind, cx_status st)
{
    if (st == CX_OK && ckpt_dataset_attrs(o->d, o->dt, kind, ckpt_hasher_end(&o->h)) < 0) {
        cx_set_last_error("%s: cannot write attributes of %s: %s", w->path, o->name, ckpt_h5_msg());
        st = CX_ERR_IO;
    } else if (st != CX_OK) {
        ckpt_hasher_drop(&o->h);
    }
    H5Dclose(o->d);
    return st;
}

/* Copies entry e into a new dataset of its full shape. */
static cx_status copy_entry(writer *w, const ckpt_entry *e, hid_t parent, const char *name, const char *kind)
{
    out_dataset o;
    cx_status st = out_begin(w, &o, parent, name, e->dtype, e->shape, e->ndim);
    if (st != CX_OK) return st;
    for (int64_t a = 0; a < e->numel && st == CX_OK; a += w->elems)
        st = out_piece(w, &o, e, a, a + w->elems < e->numel ? a + w->elems : e->numel, a);
    return out_end(w, &o, kind, st);
}

static cx_status write_optimizer_copy(writer *w, hid_t fid)
{
    hid_t og = ckpt_group_at(fid, "optimizer", w->path, "/optimizer");
    if (og < 0) return CX_ERR_IO;
    cx_status st = CX_OK;
    for (int i = 0; i < w->s->nentries && st == CX_OK; i++) {
        const ckpt_entry *e = &w->s->entries[i];
        if (!e->state) continue;
        char what[1200];
        snprintf(what, sizeof what, "/optimizer/%s", e->key);
        hid_t g = ckpt_group_at(og, e->key, w->path, what);
        if (g < 0) {
            st = CX_ERR_IO;
            break;
        }
        st = copy_entry(w, e, g, e->state, "state");
        H5Gclose(g);
    }
    H5Gclose(og);
    return st;
}

/* The ranks that trained the source: its record, or for a file without
 * one its file count (a DDP save is one file, written by rank 0 for all). */
static int64_t trained_world(const ckpt_src *s)
{
    return s->root.train_world_size > 0 ? s->root.train_world_size : s->world;
}

/* The samples the whole run took in the epoch: each rank's sampler counted
 * its own share (an SPMD run's one sampler counted the global batches). */
static int64_t global_sampler_position(const ckpt_src *s)
{
    return s->spmd ? s->root.sampler_position : s->root.sampler_position * trained_world(s);
}

cx_status cx_ckpt_consolidate(const char *prefix, const char *out_path, cx_ckpt_consolidate_opts opts)
{
    cx_ckpt_consolidate_opts own_opts = cx_ckpt_consolidate_default_opts();
    if (!CX_TAKE_STRUCT("cx_ckpt_consolidate", cx_ckpt_consolidate_opts, own_opts, &opts, shard_size_multiple)) return CX_ERR_ARG;
    opts = own_opts;
    if (!prefix || !out_path) {
        cx_set_last_error("cx_ckpt_consolidate: NULL prefix or output path");
        return CX_ERR_ARG;
    }
    cx_status st = ckpt_zstd_check_level("cx_ckpt_consolidate", opts.compress_level);
    if (st != CX_OK) return st;
    ckpt_src s;
    st = ckpt_src_open(&s, prefix, opts.suffix, NULL, true, 0);
    if (st != CX_OK) return st;
    writer w;
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out_path, (long)getpid());
    /* one file for the whole run: its sampler position counts every
     * rank's samples (cx_ckpt_load_full shares them out again) */
    ckpt_root root = s.root;
    root.world_size = 1;
    root.rank = 0;
    root.train_world_size = trained_world(&s);
    root.sampler_position = global_sampler_position(&s);
    root.consolidated_from_world_size = s.world;
    root.resharded_from_world_size = 0;
    hid_t fid = -1, mg = -1;
    if ((st = writer_init(&w, &s, opts.compress_level)) == CX_OK) {
        w.path = tmp;
        st = ckpt_file_begin(tmp, &root, opts.compress_level, &fid, &mg);
    }
    for (int i = 0; i < s.nentries && st == CX_OK; i++) {
        const ckpt_entry *e = &s.entries[i];
        if (!e->state) st = copy_entry(&w, e, mg, e->key, e->is_param ? "param" : "buffer");
    }
    if (mg >= 0) H5Gclose(mg);
    if (st == CX_OK && opts.with_optimizer) st = write_optimizer_copy(&w, fid);
    if (fid >= 0 && st != CX_OK) {
        ckpt_h5_discard_close(fid);
    } else if (fid >= 0 && H5Fclose(fid) < 0) {
        cx_set_last_error("%s: cannot close: %s", tmp, ckpt_h5_msg());
        ckpt_h5_discard_close(fid);
        st = CX_ERR_IO;
    }
    if (st == CX_OK) st = ckpt_publish(tmp, out_path, NULL, NULL);
    else unlink(tmp);
    free(w.buf);
    ckpt_src_close(&s);
    return st;
}

/* ---- resharding ------------------------------------------------------------------------ */

/* Writes one flat shard dataset (the layout of `u`, rank u->rank): the
 * pieces of each parameter's full tensor `state` (NULL: the parameter)
 * that fall in the shard, zeros elsewhere (padding). */
static cx_status write_flat(writer *w, const ckpt_unit *u, const char *state, hid_t parent, const char *name)
{
    int64_t shape[1] = { u->shard_numel };
    out_dataset o;
    cx_status st = out_begin(w, &o, parent, name, CX_F32, shape, 1);
    if (st != CX_OK) return st;
    int64_t s0 = u->shard_offset, s1 = u->shard_offset + u->shard_numel;
    int64_t cap = w->elems * 2;   /* the buffer holds 8-byte elements */
    int p = 0;
    for (int64_t pos = s0; pos < s1 && st == CX_OK;) {
        while (p < u->nparams && u->params[p].offset + u->params[p].numel <= pos) p++;
        bool inside = p < u->nparams && u->params[p].offset <= pos;
        int64_t end = inside ? u->params[p].offset + u->params[p].numel : p < u->nparams ? u->params[p].offset : s1;
        if (end > s1) end = s1;
        if (end > pos + cap) end = pos + cap;
        if (!inside) {   /* a gap or the padding */
            st = out_piece(w, &o, NULL, 0, end - pos, pos - s0);
        } else {
            const ckpt_entry *e = ckpt_src_find(w->s, u->params[p].name, state);
            if (e) {
                st = out_piece(w, &o, e, pos - u->params[p].offset, end - u->params[p].offset, pos - s0);
            } else {
                char what[1200];
                ckpt_label(what, sizeof what, u->params[p].name, state);
                cx_set_last_error("checkpoint %s has no %s", w->s->prefix, what);
                st = CX_ERR_SHAPE;
            }
        }
        pos = end;
    }
    return out_end(w, &o, state ? "state" : "flat_param", st);
}

/* The units of an unsharded source: one root unit over its parameters. */
static cx_status root_unit(ckpt_src *s, ckpt_unit **out, int *n)
{
    ckpt_unit *u = calloc(1, sizeof *u);
    int np = 0;
    for (int i = 0; i < s->nentries; i++)
        if (!s->entries[i].state && s->entries[i].is_param) np++;
    if (!u || !(u->params = calloc((size_t)(np ? np : 1), sizeof *u->params)) || !(u->path = strdup("")) ||
        !(u->flat_name = strdup("flat_param"))) {
        ckpt_units_free(u, u ? 1 : 0);
        cx_set_last_error("checkpoint %s: out of memory", s->prefix);
        return CX_ERR_OOM;
    }
    int64_t off = 0;
    for (int i = 0; i < s->nentries; i++) {
        ckpt_entry *e = &s->entries[i];
        if (e->state || !e->is_param) continue;
        if (e->dtype != CX_F32) {
            ckpt_units_free(u, 1);
            cx_set_last_error("checkpoint %s: parameter %s is %s; FSDP shards hold f32 only", s->prefix, e->key,
                              cx_dtype_name(e->dtype));
            return CX_ERR_SHAPE;
        }
        ckpt_pinfo *pi = &u->params[u->nparams];
        if (!(pi->name = strdup(e->key))) {
            ckpt_units_free(u, 1);
            cx_set_last_error("checkpoint %s: out of memory", s->prefix);
            return CX_ERR_OOM;
        }
        u->nparams++;
        pi->ndim = e->ndim;
        memcpy(pi->shape, e->shape, sizeof pi->shape);
        pi->numel = e->numel;
        pi->offset = off;
        off += e->numel;
    }
    u->flat_numel = off;
    *out = u;
    *n = 1;
    return CX_OK;
}

/* Each unit's optimizer states, as flat shards (0-d ones copied): a unit's
 * states are those of its first parameter. */
static cx_status write_unit_states(writer *w, hid_t fid, const ckpt_unit *u, int nu)
{
    hid_t og = ckpt_group_at(fid, "optimizer", w->path, "/optimizer");
    if (og < 0) return CX_ERR_IO;
    cx_status st = CX_OK;
    for (int i = 0; i < nu && st == CX_OK; i++) {
        if (u[i].nparams == 0) continue;
        char what[1200];
        snprintf(what, sizeof what, "/optimizer/%s", u[i].flat_name);
        hid_t g = ckpt_group_at(og, u[i].flat_name, w->path, what);
        if (g < 0) {
            st = CX_ERR_IO;
            break;
        }
        for (int k = 0; k < w->s->nentries && st == CX_OK; k++) {
            const ckpt_entry *e = &w->s->entries[k];
            if (!e->state || strcmp(e->key, u[i].params[0].name)) continue;
            if (e->ndim == 0) st = copy_entry(w, e, g, e->state, "state");
            else st = write_flat(w, &u[i], e->state, g, e->state);
        }
        H5Gclose(g);
    }
    H5Gclose(og);
    return st;
}

static cx_status write_reshard_file(writer *w, const ckpt_unit *u, int nu, int rank, int world, bool with_optimizer)
{
    ckpt_src *s = w->s;
    ckpt_root root = s->root;
    if (!s->sharded) ckpt_strlcpy(root.strategy, sizeof root.strategy, "fsdp-zero3");
    root.world_size = world;
    root.rank = rank;
    root.train_world_size = world;
    /* the sampler position counts each rank's samples: rescale it to the new
     * world (the global position is what a resumed run must continue from) */
    root.sampler_position = global_sampler_position(s) / world;
    root.consolidated_from_world_size = 0;
    root.resharded_from_world_size = s->world;
    hid_t fid, mg;
    cx_status st = ckpt_file_begin(w->path, &root, w->level, &fid, &mg);
    if (st != CX_OK) return st;
    for (int i = 0; i < nu && st == CX_OK; i++) st = write_flat(w, &u[i], NULL, mg, u[i].flat_name);
    for (int i = 0; i < s->nentries && st == CX_OK; i++) {
        const ckpt_entry *e = &s->entries[i];
        if (!e->state && !e->is_param) st = copy_entry(w, e, mg, e->key, "buffer");
    }
    H5Gclose(mg);
    bool any_state = false;
    for (int i = 0; i < s->nentries && !any_state; i++) any_state = s->entries[i].state != NULL;
    if (st == CX_OK && with_optimizer && any_state) st = write_unit_states(w, fid, u, nu);
    if (st == CX_OK) st = ckpt_units_write(fid, u, nu);
    if (st != CX_OK) {
        ckpt_h5_discard_close(fid);
    } else if (H5Fclose(fid) < 0) {
        cx_set_last_error("%s: cannot close: %s", w->path, ckpt_h5_msg());
        ckpt_h5_discard_close(fid);
        st = CX_ERR_IO;
    }
    return st;
}

/* Writes and publishes the file of each rank of the new world (sizes and
 * hashes per rank), removing all of them if any fails. */
static cx_status write_reshard_files(writer *w, const ckpt_unit *src_units, int nu, const char *out_prefix,
                                     int world, cx_ckpt_consolidate_opts opts, int64_t *sizes, uint64_t *hashes)
{
    cx_status st = CX_OK;
    char final[4300], tmp[4400];
    for (int r = 0; r < world && st == CX_OK; r++) {
        ckpt_unit *u = NULL;
        ckpt_file_name(final, sizeof final, out_prefix, r, world);
        snprintf(tmp, sizeof tmp, "%s.tmp-%ld", final, (long)getpid());
        w->path = tmp;
        st = ckpt_units_relayout(src_units, nu, world, r, opts.shard_size_multiple, &u);
        if (st == CX_OK) st = write_reshard_file(w, u, nu, r, world, opts.with_optimizer);
        ckpt_units_free(u, nu);
        if (st == CX_OK) st = ckpt_publish(tmp, final, &hashes[r], &sizes[r]);
        else unlink(tmp);
    }
    for (int r = 0; r < world && st != CX_OK; r++) {   /* no partial output */
        ckpt_file_name(final, sizeof final, out_prefix, r, world);
        unlink(final);
    }
    return st;
}

cx_status cx_ckpt_reshard(const char *prefix, const char *out_prefix, int world, cx_ckpt_consolidate_opts opts)
{
    cx_ckpt_consolidate_opts own_opts = cx_ckpt_consolidate_default_opts();
    if (!CX_TAKE_STRUCT("cx_ckpt_reshard", cx_ckpt_consolidate_opts, own_opts, &opts, shard_size_multiple)) return CX_ERR_ARG;
    opts = own_opts;
    if (!prefix || !out_prefix || world < 1 || world > 1 << 16) {
        cx_set_last_error("cx_ckpt_reshard: need a prefix, an output prefix and a world size in [1, 65536]");
        return CX_ERR_ARG;
    }
    if (!strcmp(prefix, out_prefix)) {
        cx_set_last_error("cx_ckpt_reshard: the output prefix must differ from the input prefix %s", prefix);
        return CX_ERR_ARG;
    }
    cx_status st = ckpt_zstd_check_level("cx_ckpt_reshard", opts.compress_level);
    if (st != CX_OK) return st;
    ckpt_src s;
    st = ckpt_src_open(&s, prefix, opts.suffix, NULL, true, 0);
    if (st != CX_OK) return st;
    ckpt_unit *units = s.units;
    int nu = s.nunits;
    int64_t *sizes = calloc((size_t)world, sizeof *sizes);
    uint64_t *hashes = calloc((size_t)world, sizeof *hashes);
    writer w = { 0 };
    if (!sizes || !hashes) {
        cx_set_last_error("cx_ckpt_reshard: out of memory");
        st = CX_ERR_OOM;
    }
    if (st == CX_OK && !s.sharded) st = root_unit(&s, &units, &nu);
    if (st == CX_OK) st = writer_init(&w, &s, opts.compress_level);
    /* the output is uncommitted until its marker is written */
    if (st == CX_OK) st = ckpt_uncommit(out_prefix);
    if (st == CX_OK) st = write_reshard_files(&w, units, nu, out_prefix, world, opts, sizes, hashes);
    const char *strategy = s.sharded ? s.root.strategy : "fsdp-zero3";
    if (st == CX_OK && (st = ckpt_commit(out_prefix, world, strategy, s.root.step, sizes, hashes)) != CX_OK)
        for (int r = 0; r < world; r++) {
            char final[4300];
            ckpt_file_name(final, sizeof final, out_prefix, r, world);
            unlink(final);
        }
    if (!s.sharded && units) ckpt_units_free(units, nu);
    free(sizes);
    free(hashes);
    free(w.buf);
    ckpt_src_close(&s);
    return st;
}
