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
 * checksums must match, and the payload is read and checked by the
 * executable format's own reader (executable/serialize.c) before the
 * executor may see it. Any failure is a miss counted as
 * PersistentCacheDeserializeFailure, and the file is removed (unless the
 * cache is read-only). */
#define _GNU_SOURCE
#include "obs_internal.h"

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
#define CXE_FORMAT 5   /* 2: kernels carry how their epilogue runs (epi); 3: named attributes
                        * (nattrs, coll_op), XXH3 checksums; 4: the shared key; 5: outputs'
                        * shardings and collectives' replica groups (SPMD programs) */
#define CXE_MAX_FILE ((int64_t)1 << 30)

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
    if (memcmp(h.magic, CXE_MAGIC, 8) != 0 || h.format != CXE_FORMAT || h.layout != cx_exec_layout_fingerprint() ||
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
    e = cx_exec_deserialize(payload, dn);
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
    cx_sbuf w = { 0 };
    cx_exec_serialize(&w, e);
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
    cxe_header h = { .format = CXE_FORMAT, .layout = cx_exec_layout_fingerprint(), .key_hi = e->key_hi, .key_lo = e->key_lo,
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
    /* a partitioned program is one rank's: the key holds the rank, so each
     * rank stores and finds its own entry */
    if (g_dir && !g_readonly) store(e);
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
    cx_executable *e = cx_exec_deserialize(payload, n);
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
        cx_executable *y = cx_exec_deserialize(m, len);
        if (y) { accepted++; cx_executable_free(y); }
    }
    free(m);
    free(payload);
    return accepted;
}
