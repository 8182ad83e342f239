/* cx_ckpt_load: plans the whole load against the model (every key, shape
 * and file checked before anything is modified), then reads each tensor
 * into place, re-slicing a sharded source for any target layout. */
#include "ckpt_internal.h"

#include <cxla/metrics.h>

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cx_assert.h"
#include "cx_time.h"

/* One tensor of the model or optimizer to fill. */
typedef struct {
    const char *state;     /* NULL: parameters */
    cx_tensor *t;
    int unit;              /* target unit (sharded), else -1 */
    const ckpt_entry *e;   /* unsharded: the source entry */
    const cx_mesh *mesh;   /* an SPMD-sharded target: its sharding (NULL: the whole tensor) */
    cx_spec_entry spec[CX_MAX_DIMS];
    int nspec;
} load_item;

typedef struct {
    ckpt_src *s;
    const ckpt_view *v;
    load_item *items;
    int nitems;
    const cx_named_tensor *params;   /* the optimizer's, whose shardings their states take */
    int nparams;
} load_plan;

static cx_status oom(const ckpt_src *s)
{
    cx_set_last_error("checkpoint %s: out of memory while loading", s->prefix);
    return CX_ERR_OOM;
}

static bool entry_fits(const ckpt_entry *e, int ndim, const int64_t *shape)
{
    if (!e || e->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (e->shape[i] != shape[i]) return false;
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
    char a[160], b[160], what[1200];
    shape_str(b, sizeof b, ndim, shape);
    ckpt_label(what, sizeof what, key, state);
    if (!e && state) {
        cx_set_last_error("checkpoint %s has no optimizer state %s", s->prefix, what);
    } else if (!e) {
        cx_set_last_error("checkpoint %s has no %s (the model has it, shape %s)", s->prefix, key, b);
    } else {
        shape_str(a, sizeof a, e->ndim, e->shape);
        cx_set_last_error("checkpoint %s: %s has shape %s, the model expects %s", s->prefix, what, a, b);
    }
    return CX_ERR_SHAPE;
}

/* The model's i-th tensor name over both views (the state dict, or the
 * buffers then every unit's parameters when sharded). @return NULL past the end. */
static const char *model_key(const ckpt_view *v, const cx_named_tensor *sd, int n, int i)
{
    if (i < n) return sd[i].name;
    i -= n;
    for (int u = 0; v->sharded && u < v->nunits; u++) {
        if (i < v->units[u].nparams) return v->units[u].params[i].name;
        i -= v->units[u].nparams;
    }
    return NULL;
}

/* "transformer.*" when every model tensor of the checkpoint shares its
 * first name part, else its first two names. */
static void describe_src_keys(const ckpt_src *s, char *out, size_t cap, int *count)
{
    const char *first = NULL, *second = NULL;
    size_t head = 0;
    bool shared = true;
    *count = 0;
    for (int i = 0; i < s->nentries; i++) {
        const char *k = s->entries[i].key;
        if (s->entries[i].state) continue;
        if (!first) { first = k; head = strcspn(k, "."); }
        else if (!second) second = k;
        shared = shared && k[head] == '.' && !strncmp(k, first, head + 1);
        (*count)++;
    }
    if (first && shared) snprintf(out, cap, "%.*s.*", (int)head, first);
    else snprintf(out, cap, "%s%s%s%s", first ? first : "", second ? ", " : "", second ? second : "", *count > 2 ? ", ..." : "");
}

/* A checkpoint of another model misses the first tensor the model asks
 * for, which says nothing about why: name what it holds instead. */
static cx_status check_same_model(const ckpt_src *s, const ckpt_view *v, const cx_named_tensor *sd, int n)
{
    int nmodel = 0, nsrc;
    for (const char *k; (k = model_key(v, sd, n, nmodel)); nmodel++)
        if (ckpt_src_find(s, k, NULL)) return CX_OK;
    char found[600];
    describe_src_keys(s, found, sizeof found, &nsrc);
    if (nmodel == 0 || nsrc == 0) return CX_OK;
    const char *a = model_key(v, sd, n, 0), *b = model_key(v, sd, n, 1);
    cx_set_last_error("checkpoint %s holds another model: its %d tensors are %s, the model's %d are %s%s%s%s", s->prefix,
                      nsrc, found, nmodel, a, b ? ", " : "", b ? b : "", nmodel > 2 ? ", ..." : "");
    return CX_ERR_SHAPE;
}

/* Every tensor of the model's list (state dict, or the buffers when
 * sharded) must be in the checkpoint with its shape. */
static cx_status plan_model(load_plan *p, const cx_named_tensor *sd, int n)
{
    for (int i = 0; i < n; i++) {
        const ckpt_entry *e = ckpt_src_find(p->s, sd[i].name, NULL);
        if (!entry_fits(e, cx_ndim(sd[i].tensor), cx_shape(sd[i].tensor)))
            return shape_error(p->s, sd[i].name, NULL, e, cx_ndim(sd[i].tensor), cx_shape(sd[i].tensor));
        load_item *it = &p->items[p->nitems++];
        *it = (load_item){ .t = sd[i].tensor, .unit = -1, .e = e };
        it->nspec = cx_get_sharding(sd[i].tensor, &it->mesh, it->spec, CX_MAX_DIMS);
    }
    return CX_OK;
}

/* Every parameter of every FSDP unit must be in the checkpoint (f32, its
 * shape), and the checkpoint must have no other parameter. */
static cx_status plan_flat_params(load_plan *p)
{
    const ckpt_view *v = p->v;
    int nparams = 0, src_params = 0;
    for (int u = 0; u < v->nunits; u++) {
        for (int k = 0; k < v->units[u].nparams; k++) {
            const ckpt_pinfo *pi = &v->units[u].params[k];
            const ckpt_entry *e = ckpt_src_find(p->s, pi->name, NULL);
            if (!entry_fits(e, pi->ndim, pi->shape) || e->dtype != CX_F32)
                return shape_error(p->s, pi->name, NULL, e, pi->ndim, pi->shape);
        }
        nparams += v->units[u].nparams;
        p->items[p->nitems++] = (load_item){ .t = v->flat[u], .unit = u };
    }
    for (int i = 0; i < p->s->nentries; i++)
        if (!p->s->entries[i].state && p->s->entries[i].is_param) src_params++;
    if (src_params != nparams) {
        cx_set_last_error("checkpoint %s has %d parameters, the model %d", p->s->prefix, src_params, nparams);
        return CX_ERR_SHAPE;
    }
    return CX_OK;
}

/* The checkpoint has no model tensor the model lacks (parameters of a
 * sharded target are counted by plan_flat_params). */
static cx_status check_extra_keys(const ckpt_src *s, const ckpt_view *v, const cx_named_tensor *sd, int n)
{
    for (int i = 0; i < s->nentries; i++) {
        const ckpt_entry *e = &s->entries[i];
        if (e->state || (v->sharded && e->is_param)) continue;
        bool known = false;
        for (int k = 0; k < n && !known; k++) known = !strcmp(sd[k].name, e->key);
        if (!known) {
            cx_set_last_error("checkpoint %s: unexpected key %s (not in the model)", s->prefix, e->key);
            return CX_ERR_SHAPE;
        }
    }
    return CX_OK;
}

/* A state of an unsharded target: the entry of its parameter and name.
 * Under SPMD it takes its parameter's sharding (the same shape), else
 * keeps its own (a 0-d step). */
static cx_status plan_full_state(load_plan *p, const char *pname, const char *sname, cx_tensor *t)
{
    const ckpt_entry *e = ckpt_src_find(p->s, pname, sname);
    if (!entry_fits(e, cx_ndim(t), cx_shape(t))) return shape_error(p->s, pname, sname, e, cx_ndim(t), cx_shape(t));
    cx_tensor *like = t;
    for (int k = 0; k < p->nparams; k++)
        if (!strcmp(p->params[k].name, pname) && entry_fits(e, cx_ndim(p->params[k].tensor), cx_shape(p->params[k].tensor)))
            like = p->params[k].tensor;
    load_item *it = &p->items[p->nitems++];
    *it = (load_item){ .state = sname, .t = t, .unit = -1, .e = e };
    it->nspec = cx_get_sharding(like, &it->mesh, it->spec, CX_MAX_DIMS);
    return CX_OK;
}

/* A state of a sharded target: a 0-d value taken from the unit's first
 * parameter, or one slice per parameter of the unit. */
static cx_status plan_unit_state(load_plan *p, const char *pname, const char *sname, cx_tensor *t)
{
    const ckpt_view *v = p->v;
    int u = -1;
    for (int k = 0; k < v->nunits && u < 0; k++)
        if (!strcmp(v->units[k].flat_name, pname)) u = k;
    if (u < 0) {
        cx_set_last_error("checkpoint: optimizer state %s.%s belongs to no FSDP unit", pname, sname);
        return CX_ERR_ARG;
    }
    const ckpt_unit *un = &v->units[u];
    if (cx_ndim(t) == 0) {
        const char *first = un->nparams ? un->params[0].name : un->flat_name;
        const ckpt_entry *e = un->nparams ? ckpt_src_find(p->s, first, sname) : NULL;
        if (!e || e->ndim != 0) return shape_error(p->s, first, sname, e, 0, NULL);
        p->items[p->nitems++] = (load_item){ .state = sname, .t = t, .unit = -1, .e = e };
        return CX_OK;
    }
    for (int k = 0; k < un->nparams; k++) {
        const ckpt_pinfo *pi = &un->params[k];
        const ckpt_entry *e = ckpt_src_find(p->s, pi->name, sname);
        if (!entry_fits(e, pi->ndim, pi->shape) || e->dtype != CX_F32)
            return shape_error(p->s, pi->name, sname, e, pi->ndim, pi->shape);
    }
    p->items[p->nitems++] = (load_item){ .state = sname, .t = t, .unit = u };
    return CX_OK;
}

static cx_status plan_state(load_plan *p, const cx_named_tensor *state, int ns)
{
    for (int i = 0; i < ns; i++) {
        char pname[1024];
        const char *sname;
        cx_tensor *t = state[i].tensor;
        if (ckpt_split_state(state[i].name, pname, sizeof pname, &sname) < 0) {
            cx_set_last_error("checkpoint: optimizer state name '%s' is not <param>.<state>", state[i].name);
            return CX_ERR_ARG;
        }
        cx_status st = p->v->sharded ? plan_unit_state(p, pname, sname, t) : plan_full_state(p, pname, sname, t);
        if (st != CX_OK) return st;
    }
    return CX_OK;
}

/* This rank's boxes of an SPMD-sharded target item (allocated). @return
 * how many, or -1 (error set). */
static int target_boxes(const load_item *it, cx_shard_box **out)
{
    const ckpt_entry *e = it->e;
    int me = cx_global_ordinal();
    int n = cx_shard_boxes(it->mesh, it->spec, it->nspec, e->shape, e->ndim, me, NULL, 0);
    *out = n > 0 ? calloc((size_t)n, sizeof **out) : NULL;
    if (n > 0 && !*out) cx_set_last_error("checkpoint: out of memory for %d shard boxes", n);
    if (!*out) return -1;
    return cx_shard_boxes(it->mesh, it->spec, it->nspec, e->shape, e->ndim, me, *out, n);
}

/* Marks the files holding a piece of what item `it` reads: all of its
 * entry's pieces, or (a sharded target) those its boxes hit. */
static cx_status mark_needed(const load_item *it, bool *need)
{
    const ckpt_entry *e = it->e;
    if (!it->mesh) {
        for (int k = 0; k < e->npieces; k++) need[e->pieces[k].file] = true;
        return CX_OK;
    }
    cx_shard_box *b = NULL;
    int nb = target_boxes(it, &b);
    if (nb < 0) return CX_ERR_OOM;
    for (int k = 0; k < e->npieces; k++)
        for (int i = 0; i < nb && !need[e->pieces[k].file]; i++)
            need[e->pieces[k].file] = ckpt_piece_hits(&e->pieces[k], e->ndim, b[i].start, b[i].count);
    free(b);
    return CX_OK;
}

/* An SPMD checkpoint: the files this rank reads from, whole (a file's
 * checksum covers it all; a hyperslab of a dataset has none of its own). */
static cx_status verify_needed(const load_plan *p)
{
    ckpt_src *s = p->s;
    bool *need = calloc((size_t)s->nfiles, sizeof *need);
    if (!need) return oom(s);
    cx_status st = CX_OK;
    for (int i = 0; i < p->nitems && st == CX_OK; i++) {
        if (p->items[i].unit >= 0) {   /* an FSDP target: pieces of every parameter */
            for (int r = 0; r < s->nfiles; r++) need[r] = true;
            continue;
        }
        st = mark_needed(&p->items[i], need);
    }
    for (int r = 0; r < s->nfiles && st == CX_OK; r++)
        if (need[r]) st = ckpt_src_verify(s, r);
    free(need);
    return st;
}

/* Every file this rank reads verifies before anything is modified. */
static cx_status verify_files(const load_plan *p)
{
    ckpt_src *s = p->s;
    const ckpt_view *v = p->v;
    bool shard_targets = false;
    for (int i = 0; i < p->nitems; i++) shard_targets = shard_targets || p->items[i].mesh;
    if (s->spmd) return verify_needed(p);
    if (!s->sharded && !v->sharded && !shard_targets) {
        /* whole tensors only: each one is checked against its own checksum
         * as it is read (a second pass over the file would double the I/O);
         * HDF5 checksums the metadata itself */
        s->per_dataset = true;
        return CX_OK;
    }
    /* with our own layout only our file is read; otherwise pieces may come
     * from any file */
    bool same_layout = s->sharded && v->sharded && s->world == cx_world_size() && s->home == cx_global_ordinal() &&
                       s->nunits == v->nunits;
    for (int u = 0; same_layout && u < v->nunits; u++)
        same_layout = v->units[u].shard_numel == s->units[u].shard_numel &&
                      v->units[u].flat_numel == s->units[u].flat_numel;
    cx_status st = CX_OK;
    for (int r = 0; r < s->nfiles && st == CX_OK; r++)
        if (!same_layout || r == s->home) st = ckpt_src_verify(s, r);
    return st;
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
        CX_ASSERT(e);   /* the plan checked every parameter and state */
        cx_status st = ckpt_src_read(s, e, lo - pi->offset, hi - pi->offset, buf + (lo - s0));
        if (st != CX_OK) return st;
    }
    return CX_OK;
}

/* Waits for an assignment to land, naming the tensor if it failed. */
static cx_status finish_assign(cx_tensor *t, cx_status st, const char *what)
{
    if (st == CX_OK) st = cx_sync_tensors(&t, 1);
    if (st != CX_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cx_last_error());
        cx_set_last_error("checkpoint: cannot load %s: %s", what, msg);
    }
    return st;
}

static cx_status assign_host(cx_tensor *t, const void *buf, cx_dtype dt, const char *what)
{
    cx_tensor *v = cx_from_host(buf, cx_shape(t), cx_ndim(t), dt);
    cx_tensor *c = dt == cx_dtype_of(t) ? v : cx_cast(v, cx_dtype_of(t));
    cx_status st = cx_assign(t, c);
    if (c != v) cx_free(c);
    cx_free(v);
    return finish_assign(t, st, what);
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

/* Straight from the file into the device buffer: one copy. */
static cx_status assign_read(cx_tensor *t, ckpt_src *s, const ckpt_entry *e, const char *what)
{
    read_ctx r = { s, e };
    cx_tensor *v = cx_from_fill(cx_shape(t), cx_ndim(t), cx_dtype_of(t), fill_from_file, &r);
    cx_status st = cx_tensor_error(v) ? CX_ERR_IO : cx_assign(t, v);
    cx_free(v);
    return finish_assign(t, st, what);
}

/* An SPMD-sharded target: this rank's shard, box by box from only the
 * parts of the source its boxes cover, set as the tensor's value with its
 * sharding (no data moves between ranks). */
static cx_status load_shard(ckpt_src *s, const load_item *it, const char *what)
{
    const ckpt_entry *e = it->e;
    int64_t local[CX_MAX_DIMS], n = 1;
    cx_shard_box *b = NULL;
    int nb = target_boxes(it, &b);
    if (nb < 0) return CX_ERR_OOM;
    cx_status st = cx_shard_local_shape(it->mesh, it->spec, it->nspec, e->shape, e->ndim, local);
    for (int d = 0; d < e->ndim; d++) n *= local[d];
    void *buf = st == CX_OK ? calloc((size_t)(n ? n : 1), cx_dtype_size(e->dtype)) : NULL;
    if (st == CX_OK && !buf) st = oom(s);
    for (int k = 0; k < nb && st == CX_OK; k++)
        st = ckpt_src_read_box(s, e, b[k].start, b[k].count, buf, local, b[k].local_start);
    free(b);
    if (st != CX_OK) {
        free(buf);
        return st;
    }
    cx_tensor *v = cx_from_local_shard(buf, e->shape, e->ndim, e->dtype, it->mesh, it->spec, it->nspec);
    free(buf);
    cx_tensor *c = e->dtype == cx_dtype_of(it->t) ? v : cx_cast(v, cx_dtype_of(it->t));
    st = cx_assign(it->t, c);
    if (c != v) cx_free(c);
    cx_free(v);
    return finish_assign(it->t, st, what);
}

static cx_status load_item_now(ckpt_src *s, const ckpt_view *v, const load_item *it)
{
    char what[1200];
    if (it->unit >= 0) {
        const ckpt_unit *u = &v->units[it->unit];
        float *buf = malloc(sizeof(float) * (size_t)(u->shard_numel ? u->shard_numel : 1));
        if (!buf) return oom(s);
        ckpt_label(what, sizeof what, u->flat_name, it->state);
        cx_status st = fill_shard(s, u, it->state, buf);
        if (st == CX_OK) st = assign_host(it->t, buf, CX_F32, what);
        free(buf);
        return st;
    }
    const ckpt_entry *e = it->e;
    ckpt_label(what, sizeof what, e->key, it->state);
    if (it->mesh) return load_shard(s, it, what);
    if (e->dtype == cx_dtype_of(it->t)) return assign_read(it->t, s, e, what);
    size_t bytes = (size_t)e->numel * cx_dtype_size(e->dtype);
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf) return oom(s);
    cx_status st = ckpt_src_read(s, e, 0, e->numel, buf);
    if (st == CX_OK) st = assign_host(it->t, buf, e->dtype, what);
    free(buf);
    return st;
}

/* A load in two halves: everything checked (prepare), then everything
 * read into place (apply). Between them the ranks of a collective load
 * agree, so that no rank modifies its model unless every rank's check
 * passed. */
typedef struct {
    ckpt_src s;
    bool open;
    load_plan p;
    cx_named_tensor *sd, *state, *params;
} load_job;

static void load_job_free(load_job *j)
{
    if (j->open) ckpt_src_close(&j->s);
    free(j->p.items);
    free(j->sd);
    free(j->state);
    free(j->params);
    memset(j, 0, sizeof *j);
}

/* Plans every tensor against the model and verifies the files it reads. */
static cx_status plan_all(load_job *j, const ckpt_view *v, cx_optimizer *opt, cx_ckpt_opts opts)
{
    ckpt_src *s = &j->s;
    int n = 0, ns = 0, np = 0;
    bool with_opt = opt && opts.with_optimizer;
    j->sd = v->sharded ? cx_module_buffers(v->module, &n) : cx_module_state_dict(v->module, &n);
    j->state = with_opt ? cx_optim_state(opt, &ns) : NULL;
    j->params = with_opt ? cx_optim_params(opt, &np) : NULL;
    load_plan *p = &j->p;
    *p = (load_plan){ .s = s, .v = v, .params = j->params, .nparams = np };
    if (j->sd && ((j->state && j->params) || !with_opt))
        p->items = calloc((size_t)(n + ns + v->nunits + 1), sizeof *p->items);
    cx_status st = p->items ? CX_OK : oom(s);
    if (st == CX_OK) st = check_same_model(s, v, j->sd, n);
    if (st == CX_OK) st = plan_model(p, j->sd, n);
    if (st == CX_OK && v->sharded) st = plan_flat_params(p);
    if (st == CX_OK) st = check_extra_keys(s, v, j->sd, n);
    if (st == CX_OK) st = plan_state(p, j->state, ns);
    if (st == CX_OK) st = verify_files(p);
    return st;
}

/* Asks the kernel to stream the files in: tensors are then read from the
 * page cache while the disk keeps going. (Not for an SPMD checkpoint, of
 * which a rank reads only the parts its shards need.) */
static void read_ahead(const ckpt_src *s)
{
    for (int r = 0; r < s->nfiles && !s->spmd; r++) {
        int fd = open(s->files[r].path, O_RDONLY);
        if (fd < 0) continue;
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
        close(fd);
    }
}

static cx_status load_prepare(load_job *j, const char *prefix, const char *single_file, const ckpt_view *v,
                              cx_optimizer *opt, cx_ckpt_opts opts)
{
    ckpt_src *s = &j->s;
    cx_status st = ckpt_src_open(s, prefix, NULL, single_file, false, v->sharded ? cx_global_ordinal() : 0);
    if (st != CX_OK) return st;
    j->open = true;
    read_ahead(s);
    if (!opts.verify)
        for (int r = 0; r < s->nfiles; r++) s->files[r].verified = true;
    bool any_state = false;
    for (int i = 0; i < s->nentries && !any_state; i++) any_state = s->entries[i].state != NULL;
    /* an optimizer without state tensors (SGD without momentum) needs none */
    int wants = 0;
    if (opt && opts.with_optimizer) free(cx_optim_state(opt, &wants));
    if (wants > 0 && !any_state) {
        cx_set_last_error("checkpoint %s has no optimizer state (load without an optimizer, or consolidate "
                          "with --with-optimizer)",
                          s->prefix);
        return CX_ERR_SHAPE;
    }
    return plan_all(j, v, opt, opts);
}

static cx_status load_apply(load_job *j, cx_optimizer *opt, cx_ckpt_extra *extra, cx_ckpt_opts opts)
{
    ckpt_src *s = &j->s;
    cx_status st = CX_OK;
    for (int i = 0; i < j->p.nitems && st == CX_OK; i++) st = load_item_now(s, j->p.v, &j->p.items[i]);
    if (st == CX_OK) {
        cx_set_rng_state((cx_rng_state){ s->root.rng_seed, s->root.rng_offset });
        if (opt && opts.with_optimizer) cx_optim_set_step_count(opt, s->root.optimizer_steps);
        if (extra) *extra = (cx_ckpt_extra){ s->root.step, s->root.epoch, s->root.sampler_position };
    }
    return st;
}

cx_status cx_ckpt_load_opts(const char *prefix, cx_ckpt_model model, cx_optimizer *opt, cx_ckpt_extra *extra,
                            cx_ckpt_opts opts)
{
    cx_status st = ckpt_take_opts(&opts, "cx_ckpt_load");
    if (st != CX_OK) return st;
    ckpt_view v;
    st = ckpt_view_of(model, &v);
    if (st == CX_OK && !prefix) {
        cx_set_last_error("cx_ckpt_load: prefix is NULL");
        st = CX_ERR_ARG;
    }
    double t0 = cx_now();
    load_job j;
    memset(&j, 0, sizeof j);
    if (st == CX_OK) st = load_prepare(&j, prefix, NULL, &v, opt, opts);
    ckpt_report rep;
    memset(&rep, 0, sizeof rep);
    /* a failed check anywhere is the same error on every rank, before any
     * rank has modified anything */
    cx_status checked = ckpt_agree("cx_ckpt_load_check", st, &rep, NULL);
    if (checked == CX_OK) {
        st = load_apply(&j, opt, extra, opts);
        memset(&rep, 0, sizeof rep);
        checked = ckpt_agree("cx_ckpt_load", st, &rep, NULL);
    }
    load_job_free(&j);
    ckpt_view_release(&v);
    /* xla-launch's recovery figure splits a restart's time by this */
    if (checked == CX_OK) cx_metric_add("CheckpointLoadTime", cx_now() - t0);
    return checked;
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
    load_job j;
    memset(&j, 0, sizeof j);
    st = load_prepare(&j, NULL, path, &v, opt, o);
    if (st == CX_OK) st = load_apply(&j, opt, extra, o);
    /* the file's position counts the whole run's samples; each of this
     * run's samplers takes its share (an SPMD run's one sampler, all) */
    if (st == CX_OK && extra && !v.spmd && !cx_is_spmd()) extra->sampler_position /= cx_world_size();
    load_job_free(&j);
    ckpt_view_release(&v);
    return st;
}
