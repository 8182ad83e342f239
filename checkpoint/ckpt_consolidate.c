/* consolidate_ckpts' engine: stitch a checkpoint into one full file, or
 * rewrite it for another world size. Both stream through a buffer of at
 * most CKPT_STREAM_ELEMS elements (never a whole tensor, never the model),
 * validate every input file first, and leave nothing behind on failure. */
#include "ckpt_internal.h"

#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

hid_t ckpt_file_create(const char *path);
int ckpt_write_root_attrs(hid_t f, const char *strategy, int world, int rank, int train_world, int64_t step,
                          int64_t epoch, int64_t pos, uint64_t rng_seed, uint64_t rng_offset, const char *optimizer,
                          int64_t opt_steps, int level);

cx_ckpt_consolidate_opts cx_ckpt_consolidate_default_opts(void)
{
    return (cx_ckpt_consolidate_opts){ .suffix = NULL, .with_optimizer = false, .compress_level = 0,
                                       .shard_size_multiple = 1 };
}

int cx_ckpt_count_files(const char *prefix, const char *suffix)
{
    if (!prefix) {
        cx_set_last_error("cx_ckpt_count_files: prefix is NULL");
        return -1;
    }
    char pattern[8300];
    size_t o = 0;
    for (const char *p = prefix; *p && o + 2 < 8000; p++) {
        if (strchr("*?[]\\", *p)) pattern[o++] = '\\';
        pattern[o++] = *p;
    }
    snprintf(pattern + o, sizeof pattern - o, "%s", suffix ? suffix : CX_CKPT_DEFAULT_SUFFIX);
    glob_t gl;
    int rc = glob(pattern, 0, NULL, &gl);
    int n = rc == 0 ? (int)gl.gl_pathc : 0;
    if (rc == 0) globfree(&gl);
    return n;
}

/* A streaming buffer sized for the largest entry, capped. */
typedef struct {
    void *buf;
    int64_t elems;    /* capacity in elements of 8 bytes */
} stream_buf;

static cx_status stream_alloc(stream_buf *b, const ckpt_src *s)
{
    int64_t largest = 1;
    for (int i = 0; i < s->nentries; i++)
        if (s->entries[i].numel > largest) largest = s->entries[i].numel;
    b->elems = largest < CKPT_STREAM_ELEMS ? largest : CKPT_STREAM_ELEMS;
    b->buf = malloc((size_t)b->elems * 8);
    if (!b->buf) {
        cx_set_last_error("checkpoint %s: out of memory for a %lld-element stream buffer", s->prefix,
                          (long long)b->elems);
        return CX_ERR_OOM;
    }
    return CX_OK;
}

/* Copies entry e into a new dataset of its full shape. */
static cx_status copy_entry(ckpt_src *s, const ckpt_entry *e, hid_t parent, const char *name, const char *kind,
                            int level, stream_buf *b, const char *out)
{
    hid_t d = ckpt_dataset_create(parent, name, e->dtype, e->shape, e->ndim, level);
    if (d < 0) {
        cx_set_last_error("%s: cannot create %s: %s", out, name, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    ckpt_hash h;
    ckpt_hash_init(&h);
    size_t es = cx_dtype_size(e->dtype);
    cx_status st = CX_OK;
    for (int64_t a = 0; a < e->numel && st == CX_OK; a += b->elems) {
        int64_t z = a + b->elems < e->numel ? a + b->elems : e->numel;
        st = ckpt_src_read(s, e, a, z, b->buf);
        if (st != CX_OK) break;
        ckpt_hash_update(&h, b->buf, (size_t)(z - a) * es);
        if (ckpt_dataset_write_range(d, e->dtype, e->shape, e->ndim, a, z, b->buf) < 0) {
            cx_set_last_error("%s: cannot write %s: %s", out, name, ckpt_h5_msg());
            st = CX_ERR_IO;
        }
    }
    if (st == CX_OK && ckpt_dataset_attrs(d, e->dtype, kind, ckpt_hash_final(&h)) < 0) {
        cx_set_last_error("%s: cannot write attributes of %s: %s", out, name, ckpt_h5_msg());
        st = CX_ERR_IO;
    }
    H5Dclose(d);
    return st;
}

static hid_t group_at(hid_t parent, const char *name)
{
    if (H5Lexists(parent, name, H5P_DEFAULT) > 0) return H5Gopen2(parent, name, H5P_DEFAULT);
    return ckpt_group_create(parent, name);
}

/* fsync + rename + fsync dir; removes tmp on failure. */
static cx_status publish(const char *tmp, const char *final, uint64_t *hash, int64_t *size)
{
    uint64_t h;
    int64_t sz;
    cx_status st = ckpt_hash_file(tmp, true, &h, &sz);
    if (st == CX_OK && rename(tmp, final) != 0) {
        cx_set_last_error("%s: cannot rename into place: %s", final, strerror(errno));
        st = CX_ERR_IO;
    }
    if (st != CX_OK) {
        unlink(tmp);
        return st;
    }
    ckpt_fsync_dir(final);
    if (hash) *hash = h;
    if (size) *size = sz;
    return CX_OK;
}

cx_status cx_ckpt_consolidate(const char *prefix, const char *out_path, cx_ckpt_consolidate_opts opts)
{
    if (!prefix || !out_path) {
        cx_set_last_error("cx_ckpt_consolidate: NULL prefix or output path");
        return CX_ERR_ARG;
    }
    if (opts.compress_level < 0 || opts.compress_level > 22) {
        cx_set_last_error("cx_ckpt_consolidate: compression level %d outside 0..22", opts.compress_level);
        return CX_ERR_ARG;
    }
    ckpt_src s;
    cx_status st = ckpt_src_open(&s, prefix, opts.suffix, NULL, true, 0);
    if (st != CX_OK) return st;
    stream_buf b = { 0 };
    if ((st = stream_alloc(&b, &s)) != CX_OK) {
        ckpt_src_close(&s);
        return st;
    }
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out_path, (long)getpid());
    hid_t fid = ckpt_file_create(tmp);
    if (fid < 0) {
        cx_set_last_error("%s: cannot create: %s", tmp, ckpt_h5_msg());
        st = CX_ERR_IO;
        goto out;
    }
    /* the sampler position counts this rank's samples: one rank holds them all now */
    if (ckpt_write_root_attrs(fid, s.strategy, 1, 0, s.world, s.step, s.epoch, s.sampler_position * s.world, s.rng_seed,
                              s.rng_offset, s.optimizer, s.optimizer_steps, opts.compress_level) < 0 ||
        ckpt_attr_write_i64(fid, "consolidated_from_world_size", s.world) < 0) {
        cx_set_last_error("%s: cannot write attributes: %s", tmp, ckpt_h5_msg());
        st = CX_ERR_IO;
    }
    hid_t mg = st == CX_OK ? ckpt_group_create(fid, "model") : -1;
    if (st == CX_OK && mg < 0) {
        cx_set_last_error("%s: cannot create /model: %s", tmp, ckpt_h5_msg());
        st = CX_ERR_IO;
    }
    for (int i = 0; i < s.nentries && st == CX_OK; i++) {
        const ckpt_entry *e = &s.entries[i];
        if (e->state) continue;
        st = copy_entry(&s, e, mg, e->key, e->is_param ? "param" : "buffer", opts.compress_level, &b, tmp);
    }
    if (mg >= 0) H5Gclose(mg);
    if (st == CX_OK && opts.with_optimizer) {
        hid_t og = ckpt_group_create(fid, "optimizer");
        if (og < 0) {
            cx_set_last_error("%s: cannot create /optimizer: %s", tmp, ckpt_h5_msg());
            st = CX_ERR_IO;
        }
        for (int i = 0; i < s.nentries && st == CX_OK; i++) {
            const ckpt_entry *e = &s.entries[i];
            if (!e->state) continue;
            hid_t g = group_at(og, e->key);
            if (g < 0) {
                cx_set_last_error("%s: cannot create /optimizer/%s: %s", tmp, e->key, ckpt_h5_msg());
                st = CX_ERR_IO;
                break;
            }
            st = copy_entry(&s, e, g, e->state, "state", opts.compress_level, &b, tmp);
            H5Gclose(g);
        }
        if (og >= 0) H5Gclose(og);
    }
    if (fid >= 0 && H5Fclose(fid) < 0 && st == CX_OK) {
        cx_set_last_error("%s: cannot close: %s", tmp, ckpt_h5_msg());
        st = CX_ERR_IO;
    }
    if (st == CX_OK) st = publish(tmp, out_path, NULL, NULL);
    else unlink(tmp);
out:
    free(b.buf);
    ckpt_src_close(&s);
    return st;
}

/* ---- resharding ------------------------------------------------------------------------ */

/* Writes one flat shard dataset (the layout of `u`, rank u->rank): the
 * pieces of each parameter's full tensor `state` (NULL: the parameter)
 * that fall in the shard, zeros elsewhere (padding). */
static cx_status write_flat(ckpt_src *s, const ckpt_unit *u, const char *state, hid_t parent, const char *name,
                            int level, stream_buf *b, const char *out)
{
    int64_t shape[1] = { u->shard_numel };
    hid_t d = ckpt_dataset_create(parent, name, CX_F32, shape, 1, level);
    if (d < 0) {
        cx_set_last_error("%s: cannot create %s: %s", out, name, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    ckpt_hash h;
    ckpt_hash_init(&h);
    cx_status st = CX_OK;
    int64_t s0 = u->shard_offset, s1 = u->shard_offset + u->shard_numel;
    float *buf = b->buf;
    int64_t cap = b->elems * 2;   /* the buffer holds 8-byte elements */
    int p = 0;
    for (int64_t pos = s0; pos < s1 && st == CX_OK;) {
        while (p < u->nparams && u->params[p].offset + u->params[p].numel <= pos) p++;
        int64_t end;
        const ckpt_entry *e = NULL;
        if (p < u->nparams && u->params[p].offset <= pos) {
            end = u->params[p].offset + u->params[p].numel;
            e = ckpt_src_find(s, u->params[p].name, state);
            if (!e) {
                cx_set_last_error("checkpoint %s has no %s%s%s", s->prefix, u->params[p].name, state ? "." : "",
                                  state ? state : "");
                st = CX_ERR_SHAPE;
                break;
            }
        } else {
            end = p < u->nparams ? u->params[p].offset : s1;   /* a gap or the padding */
        }
        if (end > s1) end = s1;
        if (end > pos + cap) end = pos + cap;
        if (e) st = ckpt_src_read(s, e, pos - u->params[p].offset, end - u->params[p].offset, buf);
        else memset(buf, 0, sizeof(float) * (size_t)(end - pos));
        if (st != CX_OK) break;
        ckpt_hash_update(&h, buf, sizeof(float) * (size_t)(end - pos));
        if (ckpt_dataset_write_range(d, CX_F32, shape, 1, pos - s0, end - s0, buf) < 0) {
            cx_set_last_error("%s: cannot write %s: %s", out, name, ckpt_h5_msg());
            st = CX_ERR_IO;
        }
        pos = end;
    }
    if (st == CX_OK && ckpt_dataset_attrs(d, CX_F32, state ? "state" : "flat_param", ckpt_hash_final(&h)) < 0) {
        cx_set_last_error("%s: cannot write attributes of %s: %s", out, name, ckpt_h5_msg());
        st = CX_ERR_IO;
    }
    H5Dclose(d);
    return st;
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

static cx_status write_reshard_file(ckpt_src *s, const ckpt_unit *u, int nu, int rank, int world, const char *tmp,
                                    cx_ckpt_consolidate_opts opts, stream_buf *b)
{
    hid_t fid = ckpt_file_create(tmp);
    if (fid < 0) {
        cx_set_last_error("%s: cannot create: %s", tmp, ckpt_h5_msg());
        return CX_ERR_IO;
    }
    cx_status st = CX_OK;
    const char *strategy = s->sharded ? s->strategy : "fsdp-zero3";
    /* the sampler position counts each rank's samples: rescale it to the new
     * world (the global position is what a resumed run must continue from) */
    int64_t position = s->sampler_position * s->world / world;
    if (ckpt_write_root_attrs(fid, strategy, world, rank, world, s->step, s->epoch, position, s->rng_seed,
                              s->rng_offset, s->optimizer, s->optimizer_steps, opts.compress_level) < 0 ||
        ckpt_attr_write_i64(fid, "resharded_from_world_size", s->world) < 0) {
        cx_set_last_error("%s: cannot write attributes: %s", tmp, ckpt_h5_msg());
        st = CX_ERR_IO;
    }
    hid_t mg = st == CX_OK ? ckpt_group_create(fid, "model") : -1;
    if (st == CX_OK && mg < 0) {
        cx_set_last_error("%s: cannot create /model: %s", tmp, ckpt_h5_msg());
        st = CX_ERR_IO;
    }
    for (int i = 0; i < nu && st == CX_OK; i++) st = write_flat(s, &u[i], NULL, mg, u[i].flat_name, opts.compress_level, b, tmp);
    for (int i = 0; i < s->nentries && st == CX_OK; i++) {
        const ckpt_entry *e = &s->entries[i];
        if (!e->state && !e->is_param) st = copy_entry(s, e, mg, e->key, "buffer", opts.compress_level, b, tmp);
    }
    if (mg >= 0) H5Gclose(mg);
    bool any_state = false;
    for (int i = 0; i < s->nentries && !any_state; i++) any_state = s->entries[i].state != NULL;
    if (st == CX_OK && opts.with_optimizer && any_state) {
        hid_t og = ckpt_group_create(fid, "optimizer");
        if (og < 0) {
            cx_set_last_error("%s: cannot create /optimizer: %s", tmp, ckpt_h5_msg());
            st = CX_ERR_IO;
        }
        for (int i = 0; i < nu && st == CX_OK; i++) {
            if (u[i].nparams == 0) continue;
            hid_t g = ckpt_group_create(og, u[i].flat_name);
            if (g < 0) {
                cx_set_last_error("%s: cannot create /optimizer/%s: %s", tmp, u[i].flat_name, ckpt_h5_msg());
                st = CX_ERR_IO;
                break;
            }
            /* the unit's states are those of its first parameter */
            for (int k = 0; k < s->nentries && st == CX_OK; k++) {
                const ckpt_entry *e = &s->entries[k];
                if (!e->state || strcmp(e->key, u[i].params[0].name)) continue;
                if (e->ndim == 0) st = copy_entry(s, e, g, e->state, "state", opts.compress_level, b, tmp);
                else st = write_flat(s, &u[i], e->state, g, e->state, opts.compress_level, b, tmp);
            }
            H5Gclose(g);
        }
        if (og >= 0) H5Gclose(og);
    }
    if (st == CX_OK) st = ckpt_units_write(fid, u, nu);
    if (H5Fclose(fid) < 0 && st == CX_OK) {
        cx_set_last_error("%s: cannot close: %s", tmp, ckpt_h5_msg());
        st = CX_ERR_IO;
    }
    return st;
}

cx_status cx_ckpt_reshard(const char *prefix, const char *out_prefix, int world, cx_ckpt_consolidate_opts opts)
{
    if (!prefix || !out_prefix || world < 1 || world > 1 << 16) {
        cx_set_last_error("cx_ckpt_reshard: need a prefix, an output prefix and a world size in [1, 65536]");
        return CX_ERR_ARG;
    }
    if (!strcmp(prefix, out_prefix)) {
        cx_set_last_error("cx_ckpt_reshard: the output prefix must differ from the input prefix %s", prefix);
        return CX_ERR_ARG;
    }
    ckpt_src s;
    cx_status st = ckpt_src_open(&s, prefix, opts.suffix, NULL, true, 0);
    if (st != CX_OK) return st;
    ckpt_unit *src_units = NULL;
    int nu = 0;
    stream_buf b = { 0 };
    char (*tmps)[4400] = calloc((size_t)world, sizeof *tmps);
    char marker[4200];
    ckpt_marker m = { .version = CX_CKPT_FORMAT_VERSION, .world = world, .step = s.step, .nfiles = world };
    m.files = calloc((size_t)world, sizeof *m.files);
    if (!tmps || !m.files) {
        cx_set_last_error("cx_ckpt_reshard: out of memory");
        st = CX_ERR_OOM;
        goto out;
    }
    if (s.sharded) src_units = s.units;
    else if ((st = root_unit(&s, &src_units, &nu)) != CX_OK) goto out;
    if (s.sharded) nu = s.nunits;
    if ((st = stream_alloc(&b, &s)) != CX_OK) goto out;
    snprintf(m.strategy, sizeof m.strategy, "%s", s.sharded ? s.strategy : "fsdp-zero3");
    /* the output is uncommitted until its marker is written */
    ckpt_marker_name(marker, sizeof marker, out_prefix);
    if (unlink(marker) != 0 && errno != ENOENT) {
        cx_set_last_error("%s: cannot remove the old commit marker: %s", marker, strerror(errno));
        st = CX_ERR_IO;
        goto out;
    }
    for (int r = 0; r < world && st == CX_OK; r++) {
        ckpt_unit *u = NULL;
        char final[4300];
        ckpt_file_name(final, sizeof final, out_prefix, r, world);
        snprintf(tmps[r], sizeof tmps[r], "%s.tmp-%ld", final, (long)getpid());
        st = ckpt_units_relayout(src_units, nu, world, r, opts.shard_size_multiple, &u);
        if (st == CX_OK) st = write_reshard_file(&s, u, nu, r, world, tmps[r], opts, &b);
        ckpt_units_free(u, nu);
        if (st == CX_OK) st = ckpt_hash_file(tmps[r], true, &m.files[r].hash, &m.files[r].size);
        const char *bn = strrchr(final, '/');
        ckpt_strlcpy(m.files[r].name, sizeof m.files[r].name, bn ? bn + 1 : final);
    }
    for (int r = 0; r < world && st == CX_OK; r++) {
        char final[4300];
        ckpt_file_name(final, sizeof final, out_prefix, r, world);
        if (rename(tmps[r], final) != 0) {
            cx_set_last_error("%s: cannot rename into place: %s", final, strerror(errno));
            st = CX_ERR_IO;
        }
        if (st != CX_OK) /* undo the renamed ones: no partial output */
            for (int k = 0; k < r; k++) {
                ckpt_file_name(final, sizeof final, out_prefix, k, world);
                unlink(final);
            }
    }
    if (st == CX_OK) {
        ckpt_fsync_dir(marker);
        st = ckpt_marker_write(out_prefix, &m);
        if (st != CX_OK)
            for (int k = 0; k < world; k++) {
                char final[4300];
                ckpt_file_name(final, sizeof final, out_prefix, k, world);
                unlink(final);
            }
    }
out:
    if (st != CX_OK && tmps)
        for (int r = 0; r < world; r++)
            if (tmps[r][0]) unlink(tmps[r]);
    if (!s.sharded) ckpt_units_free(src_units, nu);
    free(tmps);
    free(m.files);
    free(b.buf);
    ckpt_src_close(&s);
    return st;
}
