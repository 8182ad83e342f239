/* The persistent compile cache (xr.initialize_cache): executables survive
 * the process, one zstd-compressed file per graph key.
 *
 * File name: <dir>/<32 hex>.cxe, the hex being the graph key mixed with the
 * library's build identity (its GNU build-id: any code change gives a new
 * one), so a rebuilt library never even opens an old entry. The graph key
 * itself already covers the version string, the build type and the compile
 * options (cx_set_compile_options, $XLA_FLAGS, $CX_COMPILE_OPTIONS).
 *
 * Layout: a fixed header (magic, format version, struct-layout fingerprint,
 * key, build identity, payload size, payload checksum), then one zstd
 * frame (with zstd's own checksum) holding the serialized executable.
 * Writes go to a unique temporary file in the same directory and are
 * renamed over the entry: readers see either nothing or a whole file, and
 * ranks writing the same key at once simply replace identical bytes.
 *
 * Loading never trusts the file: sizes are bounded before allocating, the
 * checksums must match, and every slot, register, view, input/output index
 * and count of the executable is range-checked, and the element ranges a
 * fused/reduce program loads are checked against their buffers, before the
 * executor may see it. Any failure is a miss counted as
 * PersistentCacheDeserializeFailure, and the file is removed (unless the
 * cache is read-only). */
#define _GNU_SOURCE
#include "obs/obs_internal.h"

#include <cxla/cache.h>
#include <cxla/metrics.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "cx_hash.h"

#define CXE_MAGIC "CXEXEC01"
#define CXE_FORMAT 4   /* 2: kernels carry how their epilogue runs (epi); 3: named attributes
                        * (nattrs, coll_op), XXH3 checksums; 4: the shared key */
#define CXE_MAX_FILE ((int64_t)1 << 30)
#define CXE_MAX_COUNT (1 << 24)

typedef struct {
    char magic[8];
    uint32_t format;
    uint32_t layout;
    uint64_t key_hi, key_lo;
    uint64_t build_id;
    uint64_t payload_bytes;
    uint64_t checksum;
} cxe_header;

static char *g_dir;
static bool g_readonly;
static bool g_compiled_any;
static uint64_t g_build_id;
static pthread_mutex_t g_dc_mu = PTHREAD_MUTEX_INITIALIZER;

/* the in-memory layout of what is written raw: a different compiler or
 * struct change must not reinterpret old bytes */
static uint32_t layout_fingerprint(void)
{
    uint64_t v[] = { sizeof(cx_slot), sizeof(cx_kernel), sizeof(cx_pinstr), sizeof(cx_view), sizeof(cx_kin),
                     sizeof(cx_program), CX_MAX_DIMS, CX_BLK, OP_COUNT, K_COPY, P_MASK,
                     offsetof(cx_kernel, prog), offsetof(cx_kernel, in), offsetof(cx_kernel, wait_at),
                     offsetof(cx_kernel, attrs), CX_MAX_ATTRS };
    return (uint32_t)cx_hash64(v, sizeof v);
}

/* ---- build identity ---------------------------------------------------------------- */

typedef struct { uintptr_t addr; uint64_t id; bool found; } build_id_ctx;

static int find_build_id(struct dl_phdr_info *info, size_t size, void *p)
{
    (void)size;
    build_id_ctx *c = p;
    bool mine = false;
    for (int i = 0; i < info->dlpi_phnum && !mine; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && c->addr >= lo && c->addr < lo + ph->p_memsz) mine = true;
    }
    if (!mine) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE) continue;
        const char *n = (const char *)(info->dlpi_addr + ph->p_vaddr), *end = n + ph->p_memsz;
        while (n + sizeof(ElfW(Nhdr)) <= end) {
            const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)n;
            const char *name = n + sizeof *nh;
            const char *desc = name + ((nh->n_namesz + 3) & ~3u);
            if (desc + nh->n_descsz > end) break;
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && !memcmp(name, "GNU", 4)) {
                c->id = cx_hash64(desc, nh->n_descsz);
                c->found = true;
                return 1;
            }
            n = desc + ((nh->n_descsz + 3) & ~3u);
        }
    }
    return 1;
}

static uint64_t build_identity(void)
{
    build_id_ctx c = { (uintptr_t)&build_identity, 0, false };
    dl_iterate_phdr(find_build_id, &c);
    if (c.found) return c.id;
    /* no build-id note (unusual linker flags): the library file's size and
     * modification time stand in for it */
    Dl_info di;
    struct stat st;
    uint64_t v[2] = { 0, 0 };
    if (dladdr((void *)&build_identity, &di) && di.dli_fname && stat(di.dli_fname, &st) == 0) {
        v[0] = (uint64_t)st.st_size;
        v[1] = (uint64_t)st.st_mtime;
    }
    return cx_hash64(v, sizeof v);
}

/* ---- init ------------------------------------------------------------------------------------- */


cx_status cx_cache_init(const char *path, bool readonly)
{
    if (!path || !*path) { cx_set_last_error("cache_init: no path"); return CX_ERR_ARG; }
    cx_obs_get();
    pthread_mutex_lock(&g_dc_mu);
    cx_status st = CX_OK;
    if (g_dir) {
        if (strcmp(g_dir, path) != 0 || g_readonly != readonly) {
            cx_set_last_error("cache_init: the persistent cache is already initialized at %s", g_dir);
            st = CX_ERR_STATE;
        }
        pthread_mutex_unlock(&g_dc_mu);
        return st;
    }
    if (g_compiled_any) {
        pthread_mutex_unlock(&g_dc_mu);
        cx_set_last_error("cache_init: must be called before any computation (a graph was already compiled)");
        return CX_ERR_STATE;
    }
    if (!readonly) st = cx_obs_mkdir("cache_init", path);
    if (st == CX_OK) {
        g_dir = strdup(path);
        if (!g_dir) { cx_set_last_error("cache_init: out of memory"); st = CX_ERR_OOM; }
    }
    if (st == CX_OK) {
        g_readonly = readonly;
        g_build_id = build_identity();
        cx_obs_set(OBS_DISK_CACHE, true);
    }
    pthread_mutex_unlock(&g_dc_mu);
    return st;
}

const char *cx_cache_dir(void) { return g_dir; }

static void entry_path(char *buf, size_t cap, uint64_t hi, uint64_t lo)
{
    uint64_t v[3] = { hi, lo, g_build_id };
    cx_key128 k = cx_hash128(v, sizeof v);
    snprintf(buf, cap, "%s/%016llx%016llx.cxe", g_dir, (unsigned long long)k.hi, (unsigned long long)k.lo);
}

/* ---- serialization ------------------------------------------------------------------------------ */

/* the serialized executable: raw bytes in a growable buffer */
typedef cx_sbuf wbuf;

static void w_put(wbuf *w, const void *src, size_t n)
{
    if (n) cx_sb_append(w, src, n);
}

static void w_i64(wbuf *w, int64_t v) { w_put(w, &v, sizeof v); }

static void serialize(wbuf *w, const cx_executable *e)
{
    int64_t hdr[] = { e->n_inputs, e->n_rts, e->n_outputs, e->nslots, e->nkernels, e->num_nodes, e->num_work_kernels,
                      e->num_aliased, e->arena_bytes, e->intermediate_bytes, (int64_t)e->shared_hi,
                      (int64_t)e->shared_lo };
    for (size_t i = 0; i < sizeof hdr / sizeof *hdr; i++) w_i64(w, hdr[i]);
    w_put(w, e->out_dtypes, (size_t)e->n_outputs);
    w_put(w, e->out_bytes, sizeof(int64_t) * (size_t)e->n_outputs);
    w_put(w, e->out_alias, sizeof(int) * (size_t)e->n_outputs);
    w_put(w, e->out_slot, sizeof(int) * (size_t)e->n_outputs);
    w_put(w, e->slots, sizeof(cx_slot) * (size_t)e->nslots);
    for (int k = 0; k < e->nkernels; k++) {
        cx_kernel kk = e->kernels[k];
        kk.prog.ins = NULL;   /* pointers never reach the file */
        kk.prog.views = NULL;
        w_put(w, &kk, sizeof kk);
        w_put(w, e->kernels[k].prog.ins, sizeof(cx_pinstr) * (size_t)e->kernels[k].prog.n);
        w_put(w, e->kernels[k].prog.views, sizeof(cx_view) * (size_t)e->kernels[k].prog.nviews);
    }
}

typedef struct {
    const unsigned char *p;
    size_t n, at;
    bool bad;
} rbuf;

static bool r_get(rbuf *r, void *dst, size_t n)
{
    if (r->bad || n > r->n - r->at) { r->bad = true; return false; }
    if (n) memcpy(dst, r->p + r->at, n);
    r->at += n;
    return true;
}

static void *r_array(rbuf *r, int64_t count, size_t es)
{
    if (r->bad || count < 0 || count > CXE_MAX_COUNT || (size_t)count * es > r->n - r->at) { r->bad = true; return NULL; }
    void *p = malloc((size_t)count * es + 1);
    if (!p) { r->bad = true; return NULL; }
    r_get(r, p, (size_t)count * es);
    return p;
}

static bool dtype_ok(int dt) { return dt >= 0 && dt < CX_DTYPE_COUNT; }

/* elements of `slot` viewed as `dt` */
static int64_t slot_elems(const cx_executable *e, int slot, int dt)
{
    size_t es = cx_dtype_size((cx_dtype)dt);
    return es ? e->slots[slot].bytes / (int64_t)es : 0;
}

/* every address view `v` can produce over iteration shape (shape, nd) lies
 * in [0, limit) */
static bool view_in_bounds(const cx_view *v, const int64_t *shape, int nd, int64_t limit)
{
    /* checked arithmetic: the values come from the file */
    int64_t lo = v->offset, hi = v->offset;
    for (int d = 0; d < nd; d++) {
        int64_t a = 0, b = shape[d];
        if (v->masked) {
            if (v->lo[d] > a) a = v->lo[d];
            if (v->hi[d] < b) b = v->hi[d];
        }
        if (b <= a) return true;   /* every lane is masked out: nothing is read */
        int64_t s = v->strides[d], x, y;
        if (__builtin_mul_overflow(a, s, &x) || __builtin_mul_overflow(b - 1, s, &y)) return false;
        if (s > 0) { if (__builtin_add_overflow(lo, x, &lo) || __builtin_add_overflow(hi, y, &hi)) return false; }
        else if (__builtin_add_overflow(lo, y, &lo) || __builtin_add_overflow(hi, x, &hi)) return false;
    }
    return lo >= 0 && hi < limit;
}

/* count elements of dtype dt fit in `bytes` (no overflow) */
static bool fits(int64_t count, int dt, int64_t bytes)
{
    int64_t need;
    return count >= 0 && !__builtin_mul_overflow(count, (int64_t)cx_dtype_size((cx_dtype)dt), &need) && need <= bytes;
}

static bool prog_ok(const cx_executable *e, const cx_kernel *k, const cx_program *p)
{
    if (p->n < 0 || p->nviews < 0 || p->n > CXE_MAX_COUNT || p->nviews > CXE_MAX_COUNT) return false;
    if (p->n > 0 && (p->result < 0 || p->result >= p->n)) return false;
    for (int i = 0; i < p->n; i++) {
        const cx_pinstr *in = &p->ins[i];
        if (!dtype_ok(in->dtype)) return false;
        bool uses_view = false;
        switch ((cx_pkind)in->kind) {
        case P_LOAD:
            if (in->slot < 0 || in->slot >= e->nslots || !dtype_ok(in->src_dtype)) return false;
            uses_view = true;
            break;
        case P_CONST: break;
        case P_RT: if (in->slot < 0 || in->slot >= e->n_rts) return false; break;
        case P_IOTA: uses_view = true; break;
        case P_RNG:
            if (in->slot < 0 || in->slot >= e->n_rts || in->a < 0 || in->a >= e->n_rts) return false;
            uses_view = true;
            break;
        case P_UN: case P_CAST: if (in->a < 0 || in->a >= i) return false; break;
        case P_BIN:
            if (in->a < 0 || in->a >= i || in->b < 0 || in->b >= i || in->op >= OP_COUNT) return false;
            if (!dtype_ok(in->src_dtype)) return false;
            break;
        case P_WHERE:
            if (in->a < 0 || in->a >= i || in->b < 0 || in->b >= i || in->c < 0 || in->c >= i) return false;
            break;
        case P_MASK: if (in->a < 0 || in->a >= i) return false; uses_view = true; break;
        case P_RELU: if (in->a < 0 || in->a >= i) return false; break;
        case P_POSMASK: if (in->a < 0 || in->a >= i || in->b < 0 || in->b >= i) return false; break;
        default: return false;
        }
        if ((in->kind == P_UN) && in->op >= OP_COUNT) return false;
        if (uses_view && (in->view < 0 || in->view >= p->nviews)) return false;
        if (in->kind == P_LOAD && !view_in_bounds(&p->views[in->view], k->shape, k->ndim, slot_elems(e, in->slot, in->src_dtype)))
            return false;
    }
    return true;
}

/* A heavy kernel's input view (strides over the input's own shape, from an
 * offset) stays inside its buffer. */
static bool view_fits(const cx_kin *x, int64_t slot_bytes)
{
    if (x->view.offset < 0) return false;
    int64_t last = x->view.offset, span;
    for (int d = 0; d < x->ndim; d++) {
        if (x->shape[d] <= 0) return true;   /* no element is read */
        /* checked: the values come from the file (fuzz_cache found the sum
         * overflowing) */
        if (x->view.strides[d] < 0 || __builtin_mul_overflow(x->shape[d] - 1, x->view.strides[d], &span) ||
            __builtin_add_overflow(last, span, &last))
            return false;
    }
    int64_t end;
    if (__builtin_add_overflow(last, 1, &end)) return false;   /* fuzz_cache: a view ending at INT64_MAX */
    return x->numel == 0 || fits(end, x->dtype, slot_bytes);
}

/* Every attribute the executor reads (CX_ATTR) exists. */
static bool attrs_ok(const cx_kernel *k)
{
    if (k->nattrs < 0 || k->nattrs > CX_MAX_ATTRS) return false;
    switch (k->kind) {
    case K_CONV: return k->nattrs >= CX_AT_CONV_COUNT;
    case K_CONV_BI: case K_CONV_BW: return k->nattrs == CX_AT_CONV_BWD_COUNT;
    case K_MAXPOOL: case K_AVGPOOL: case K_MAXPOOL_BWD: return k->nattrs >= CX_AT_POOL_COUNT;
    case K_AVGPOOL_BWD: return k->nattrs == CX_AT_POOL_BWD_COUNT;
    case K_GATHER: case K_SCATTER_ADD: return k->nattrs >= 1;
    case K_CONCAT: return k->nattrs >= CX_AT_CONCAT_COUNT;
    case K_COLL: return k->nattrs >= CX_AT_COLL_COUNT;
    case K_PAD: return k->nin >= 1 && k->nattrs >= CX_AT_PAD_COUNT(k->in[0].ndim);
    case K_ATTENTION: return k->nin == 3 && k->nattrs >= CX_AT_ATTN_COUNT && k->in[0].ndim == 4 && k->in[1].ndim == 4;
    case K_ATTENTION_BWD: return k->nin == 5 && k->nattrs >= CX_AT_ATTN_COUNT && k->in[0].ndim == 4 && k->in[1].ndim == 4;
    case K_LAYER_NORM: case K_LAYER_NORM_BWD: return k->nin == 3 && k->in[0].ndim >= 1;
    default: return true;
    }
}

static bool exec_ok(const cx_executable *e)
{
    if (e->n_inputs < 0 || e->n_rts < 0 || e->n_outputs < 0 || e->nslots < 0 || e->nkernels < 0) return false;
    if (e->arena_bytes < 0 || e->intermediate_bytes < 0) return false;
    for (int o = 0; o < e->n_outputs; o++) {
        if (!dtype_ok(e->out_dtypes[o]) || e->out_bytes[o] < 0) return false;
        if (e->out_alias[o] < -1 || e->out_alias[o] >= e->n_inputs) return false;
        if (e->out_slot[o] < -1 || e->out_slot[o] >= e->nslots) return false;
    }
    for (int s = 0; s < e->nslots; s++) {
        const cx_slot *sl = &e->slots[s];
        if (sl->bytes < 0) return false;
        switch (sl->kind) {
        case SLOT_INPUT: if (sl->index < 0 || sl->index >= e->n_inputs) return false; break;
        case SLOT_OUTPUT:
            if (sl->index < 0 || sl->index >= e->n_outputs || sl->bytes > e->out_bytes[sl->index]) return false;
            break;
        case SLOT_ARENA: if (sl->offset < 0 || sl->offset > e->arena_bytes - sl->bytes) return false; break;
        default: return false;
        }
    }
    for (int ki = 0; ki < e->nkernels; ki++) {
        const cx_kernel *k = &e->kernels[ki];
        if ((int)k->kind < 0 || k->kind > K_COPY) return false;
        if (k->out_slot < 0 || k->out_slot >= e->nslots || !dtype_ok(k->out_dtype) || k->out_numel < 0) return false;
        if (k->ndim < 0 || k->ndim > CX_MAX_DIMS || k->nin < 0 || k->nin > CX_MAX_KERNEL_INPUTS) return false;
        if (k->scratch_slot < -1 || k->scratch_slot >= e->nslots || k->wait_at < -1 || k->wait_at > e->nkernels) return false;
        if (k->scratch_bytes < 0) return false;
        int64_t iter = 1;
        for (int d = 0; d < k->ndim; d++) {
            if (k->shape[d] < 0 || (k->shape[d] > 0 && iter > INT64_MAX / k->shape[d])) return false;
            iter *= k->shape[d];
        }
        /* the output store: fused kernels write out_numel elements, copies out_numel bytes */
        if (k->kind == K_COPY ? k->out_numel > e->slots[k->out_slot].bytes
                              : !fits(k->out_numel, k->out_dtype, e->slots[k->out_slot].bytes))
            return false;
        if (k->kind == K_FUSED && iter != k->out_numel) return false;
        for (int i = 0; i < k->nin; i++) {
            const cx_kin *x = &k->in[i];
            if (x->slot < 0 || x->slot >= e->nslots || !dtype_ok(x->dtype) || x->ndim < 0 || x->ndim > CX_MAX_DIMS) return false;
            if (!fits(x->numel, x->dtype, e->slots[x->slot].bytes)) return false;
            if (!view_fits(x, e->slots[x->slot].bytes)) return false;
        }
        if (k->kind == K_REDUCE && (k->nkeep < 0 || k->nkeep > k->ndim || k->prog.n == 0)) return false;
        if (k->kind == K_REDUCE && k->red_op != OP_REDUCE_SUM && k->red_op != OP_REDUCE_MAX && k->red_op != OP_ARGMAX) return false;
        if (k->kind == K_COLL && (k->coll_op < OP_ALL_REDUCE || k->coll_op > OP_BROADCAST || k->nin < 1)) return false;
        if (!attrs_ok(k)) return false;
        if ((k->kind == K_FUSED || k->has_epilogue) && k->prog.n == 0) return false;
        if (k->epi > EPI_POSMASK) return false;
        if (k->epi != EPI_PROG) {
            if (!k->has_epilogue || k->epi_load < 0 || k->epi_load >= k->prog.n || k->prog.ins[k->epi_load].kind != P_LOAD)
                return false;
            if (k->epi == EPI_POSMASK ? k->kind != K_CONV_BI && k->kind != K_MAXPOOL_BWD : k->kind != K_CONV) return false;
        }
        if (!prog_ok(e, k, &k->prog)) return false;
    }
    return true;
}

/* A bool read from raw bytes may hold any byte: check it without loading
 * it as a bool (which would be undefined behaviour). */
static bool bool_ok(const bool *b)
{
    unsigned char v;
    memcpy(&v, b, 1);
    return v <= 1;
}

static bool kernel_bools_ok(const cx_kernel *k)
{
    if (!bool_ok(&k->has_epilogue)) return false;
    for (int i = 0; i < CX_MAX_KERNEL_INPUTS; i++)
        if (!bool_ok(&k->in[i].trans) || !bool_ok(&k->in[i].view.masked)) return false;
    for (int v = 0; v < k->prog.nviews; v++)
        if (!bool_ok(&k->prog.views[v].masked)) return false;
    return true;
}

static cx_executable *deserialize(const unsigned char *p, size_t n)
{
    rbuf r = { p, n, 0, false };
    cx_executable *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    int64_t h[12] = { 0 };
    r_get(&r, h, sizeof h);
    for (int i = 0; i < 8 && !r.bad; i++) if (h[i] < 0 || h[i] > CXE_MAX_COUNT) r.bad = true;
    if (!r.bad) {
        e->n_inputs = (int)h[0]; e->n_rts = (int)h[1]; e->n_outputs = (int)h[2]; e->nslots = (int)h[3];
        e->num_nodes = (int)h[5]; e->num_work_kernels = (int)h[6]; e->num_aliased = (int)h[7];
        e->arena_bytes = h[8]; e->intermediate_bytes = h[9];
        e->shared_hi = (uint64_t)h[10]; e->shared_lo = (uint64_t)h[11];
        e->out_dtypes = r_array(&r, h[2], 1);
        e->out_bytes = r_array(&r, h[2], sizeof(int64_t));
        e->out_alias = r_array(&r, h[2], sizeof(int));
        e->out_slot = r_array(&r, h[2], sizeof(int));
        e->slots = r_array(&r, h[3], sizeof(cx_slot));
        /* kernels are read one by one; nkernels counts the ones whose
         * programs are owned, so cx_executable_free stays correct on failure */
        /* each kernel takes at least its struct's bytes of the payload: a
         * count beyond that is a lie (found by fuzz_cache: 16M kernels
         * asked for 8.5 GB before the first one was read) */
        if ((uint64_t)h[4] > (r.n - r.at) / sizeof(cx_kernel)) r.bad = true;
        e->kernels = r.bad ? NULL : calloc((size_t)h[4] + 1, sizeof(cx_kernel));
        if (!e->kernels) r.bad = true;
        for (int64_t k = 0; k < h[4] && !r.bad; k++) {
            cx_kernel *kk = &e->kernels[k];
            if (!r_get(&r, kk, sizeof *kk)) break;
            int np = kk->prog.n, nv = kk->prog.nviews;
            kk->prog.ins = NULL;
            kk->prog.views = NULL;
            e->nkernels = (int)k + 1;
            kk->prog.ins = r_array(&r, np, sizeof(cx_pinstr));
            kk->prog.views = r_array(&r, nv, sizeof(cx_view));
            kk->prog.cap = np;
            kk->prog.vcap = nv;
            if (!r.bad && !kernel_bools_ok(kk)) r.bad = true;
        }
    }
    if (!r.bad && r.at != r.n) r.bad = true;   /* trailing bytes: not what we wrote */
    if (!r.bad && e->nkernels != (int)h[4]) r.bad = true;
    if (!r.bad && !exec_ok(e)) r.bad = true;
    if (r.bad) { cx_executable_free(e); return NULL; }
    e->max_prog = 1;
    for (int k = 0; k < e->nkernels; k++) if (e->kernels[k].prog.n > e->max_prog) e->max_prog = e->kernels[k].prog.n;
    return e;
}

/* ---- load / store ------------------------------------------------------------------------------------ */

static cx_executable *load_file(const char *path, uint64_t hi, uint64_t lo, bool *exists)
{
    *exists = false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    *exists = true;
    struct stat st;
    unsigned char *file = NULL, *payload = NULL;
    cx_executable *e = NULL;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(cxe_header) || st.st_size > CXE_MAX_FILE) goto out;
    file = malloc((size_t)st.st_size);
    if (!file) goto out;
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t k = read(fd, file + got, (size_t)st.st_size - got);
        if (k <= 0) { if (k < 0 && errno == EINTR) continue; goto out; }
        got += (size_t)k;
    }
    cxe_header h;
    memcpy(&h, file, sizeof h);
    if (memcmp(h.magic, CXE_MAGIC, 8) != 0 || h.format != CXE_FORMAT || h.layout != layout_fingerprint() ||
        h.key_hi != hi || h.key_lo != lo || h.build_id != g_build_id || h.payload_bytes > (uint64_t)CXE_MAX_FILE * 8)
        goto out;
    size_t zn = got - sizeof h;
    unsigned long long content = ZSTD_getFrameContentSize(file + sizeof h, zn);
    if (content != h.payload_bytes) goto out;
    payload = malloc((size_t)h.payload_bytes + 1);
    if (!payload) goto out;
    size_t dn = ZSTD_decompress(payload, (size_t)h.payload_bytes, file + sizeof h, zn);
    if (ZSTD_isError(dn) || dn != h.payload_bytes) goto out;
    if (cx_hash64(payload, dn) != h.checksum) goto out;
    e = deserialize(payload, dn);
out:
    close(fd);
    free(file);
    free(payload);
    return e;
}

static cx_executable *cache_load(uint64_t hi, uint64_t lo)
{
    if (!g_dir) return NULL;
    double t0 = cx_now();
    char path[4200];
    entry_path(path, sizeof path, hi, lo);
    bool exists;
    cx_executable *e = load_file(path, hi, lo, &exists);
    if (e) {
        e->key_hi = hi;
        e->key_lo = lo;
        cx_counter_add("PersistentCacheHit", 1);
        cx_metric_add("PersistentCacheLoadTime", cx_now() - t0);
        return e;
    }
    cx_counter_add("PersistentCacheMiss", 1);
    if (exists) {
        cx_counter_add("PersistentCacheDeserializeFailure", 1);
        if (!g_readonly) unlink(path);   /* a fresh compile will replace it */
    }
    return NULL;
}

static void store(const cx_executable *e)
{
    wbuf w = { 0 };
    serialize(&w, e);
    if (w.oom) { free(w.s); return; }
    size_t bound = ZSTD_compressBound(w.n);
    unsigned char *out = malloc(sizeof(cxe_header) + bound);
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    if (!out || !cc) { free(out); free(w.s); ZSTD_freeCCtx(cc); return; }
    ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, 3);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 1);
    size_t zn = ZSTD_compress2(cc, out + sizeof(cxe_header), bound, w.s, w.n);
    ZSTD_freeCCtx(cc);
    if (ZSTD_isError(zn)) { free(out); free(w.s); return; }
    cxe_header h = { .format = CXE_FORMAT, .layout = layout_fingerprint(), .key_hi = e->key_hi, .key_lo = e->key_lo,
                     .build_id = g_build_id, .payload_bytes = w.n,
                     .checksum = cx_hash64(w.s, w.n) };
    memcpy(h.magic, CXE_MAGIC, 8);
    memcpy(out, &h, sizeof h);
    free(w.s);

    char path[4200], tmp[4400];
    entry_path(path, sizeof path, e->key_hi, e->key_lo);
    /* unique per host, process and store: ranks on several hosts may share
     * the directory over a network file system */
    static _Atomic unsigned seq;
    char host[64] = "host";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "host");
    host[sizeof host - 1] = '\0';
    snprintf(tmp, sizeof tmp, "%s.tmp.%s.%d.%u", path, host, (int)getpid(), atomic_fetch_add(&seq, 1));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    bool ok = fd >= 0;
    size_t total = sizeof h + zn, put = 0;
    while (ok && put < total) {
        ssize_t k = write(fd, out + put, total - put);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) ok = false;
        else put += (size_t)k;
    }
    if (fd >= 0 && close(fd) != 0) ok = false;
    if (ok && rename(tmp, path) != 0) ok = false;
    if (!ok && fd >= 0) unlink(tmp);
    if (ok) cx_counter_add("PersistentCacheWrite", 1);
    free(out);
}

static void cache_compiled(const cx_executable *e)
{
    g_compiled_any = true;
    if (g_dir && !g_readonly && !e->out_sharding) store(e);   /* a partitioned program is one rank's */
}

__attribute__((constructor)) static void register_disk_cache(void)
{
    cx_obs_hooks.cache_load = cache_load;
    cx_obs_hooks.compiled = cache_compiled;
}

/* ---- robustness check (tests) ----------------------------------------------------------------------- */

int cx_disk_cache_payload(const char *path, unsigned char **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *file = size > (long)sizeof(cxe_header) && size <= CXE_MAX_FILE ? malloc((size_t)size) : NULL;
    bool ok = file && fread(file, 1, (size_t)size, f) == (size_t)size;
    fclose(f);
    cxe_header h;
    if (ok) memcpy(&h, file, sizeof h);
    ok = ok && h.payload_bytes <= (uint64_t)CXE_MAX_FILE * 8;
    unsigned char *payload = ok ? malloc((size_t)h.payload_bytes + 1) : NULL;
    size_t dn = 0;
    if (payload) {
        dn = ZSTD_decompress(payload, (size_t)h.payload_bytes, file + sizeof h, (size_t)size - sizeof h);
        ok = !ZSTD_isError(dn) && dn == h.payload_bytes;
    }
    free(file);
    if (!payload || !ok) { free(payload); return -1; }
    *out = payload;
    *n = dn;
    return 0;
}

bool cx_disk_cache_payload_ok(const unsigned char *payload, size_t n)
{
    cx_executable *e = deserialize(payload, n);
    cx_executable_free(e);
    return e != NULL;
}

/* Feeds `iters` mutated copies of the payload of cache file `path` to the
 * validating loader (bypassing the checksums, which would reject them
 * first), to show that no file content can make it crash or accept
 * out-of-range indices. Mutations: random bytes, random 32/64-bit words set
 * to extreme values, truncation. @return the number of mutated payloads
 * the loader accepted (still valid executables), or -1 if the file cannot
 * be read. */
int cx_disk_cache_fuzz(const char *path, int iters, unsigned seed)
{
    unsigned char *payload;
    size_t n;
    if (cx_disk_cache_payload(path, &payload, &n) != 0) return -1;
    if (!cx_disk_cache_payload_ok(payload, n)) { free(payload); return -1; }   /* the unmutated payload must load */
    unsigned char *m = malloc(n + 1);
    if (!m) { free(payload); return -1; }
    int accepted = 0;
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int it = 0; it < iters; it++) {
        memcpy(m, payload, n);
        size_t len = n;
        int kind = it % 4;
        for (int k = 0; k < 1 + it % 3; k++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            size_t at = (size_t)(x % n);
            if (kind == 0) m[at] ^= (unsigned char)(1u << (x >> 60 & 7));
            else if (kind == 1 && at + 4 <= n) { int32_t v = (x >> 40 & 1) ? -1 - (int32_t)(x >> 50 & 7) : INT32_MAX - (int32_t)(x >> 50 & 7); memcpy(m + at - at % 4, &v, 4); }
            else if (kind == 2 && at + 8 <= n) { int64_t v = (x >> 40 & 1) ? INT64_MIN : (int64_t)(x >> 8); memcpy(m + at - at % 8, &v, 8); }
            else len = at;
        }
        cx_executable *y = deserialize(m, len);
        if (y) { accepted++; cx_executable_free(y); }
    }
    free(m);
    free(payload);
    return accepted;
}
