/* The table of the library's environment variables and the one parser of
 * their values (cx_settings.h), so that a bad value reads the same wherever
 * it is found: in a rank, in xla-launch, in cx_settings_check. */
#include "cx_settings.h"

#include "cx_assert.h"
#include "cx_log.h"

#include <cxla/logging.h>

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define BIG 9e15 /* "no upper bound" for the integer types: below 2^53, so exact as a double */

static const cx_setting g_table[] = {
    { "CX_NUM_THREADS", CX_SET_INT, "0", 0, 65536, NULL, false, NULL, NULL,
      "compute threads per process; 0: the cores, shared among the ranks on a host" },
    { "CX_MEMORY_LIMIT", CX_SET_BYTES, "0", 0, BIG, NULL, false, NULL, NULL,
      "cap on device memory, e.g. `2G`; exceeding it is an error naming the allocation; 0: none" },
    { "CX_BUFFER_CACHE_BYTES", CX_SET_BYTES, "2GiB", 0, BIG, NULL, false, NULL, NULL,
      "freed buffers kept for reuse, at most this many bytes" },
    { "CX_CPU_ISA", CX_SET_ENUM, "auto", 0, 0, "auto|amx|avx512_bf16|avx512|avx2|baseline", false, NULL, NULL,
      "the highest instruction set the kernels use (detected at run time with `auto`; `amx` hands bf16 matmuls to "
      "oneDNN's AMX kernels, see `CX_BF16_GEMM`); below `avx512_bf16`, "
      "bf16 matmuls widen their blocks to f32 as they pack them for an f32 micro-kernel (`avx512`, `avx2`; "
      "for the f32 libraries at `baseline`), as on a CPU without bf16 instructions; below the CPU's level it caps "
      "oneDNN too (OpenBLAS reads `OPENBLAS_CORETYPE`, e.g. `Haswell`, when it loads; `cxla-bench` sets it)" },
    { "CX_BF16_GEMM", CX_SET_ENUM, "auto", 0, 0, "auto|cxla|onednn", false, NULL, NULL,
      "which library runs bf16 matmuls: `auto` oneDNN's matmul at the `amx` level (its AMX tile kernels) and "
      "cxla's own kernels below; `onednn` oneDNN's wherever the level has bf16 instructions; `cxla` cxla's "
      "everywhere" },
    { "CX_DESYNC_CHECK", CX_SET_BOOL, "1", 0, 0, NULL, false, NULL, NULL,
      "the check that the ranks run the same collectives, before each graph's first one (about 5 µs per step)" },
    { "CX_COLLECTIVE_TIMEOUT", CX_SET_DOUBLE, "300", 0, BIG, NULL, false, NULL, NULL,
      "seconds a rank may wait inside one collective before `xla-launch` ends the job, and a shared-memory "
      "collective gives up; 0: no limit" },
    { "CX_SHM_COLLECTIVES", CX_SET_ENUM, "1", 0, 0, "0|1|all", false, NULL, NULL,
      "collectives among the ranks of one node go through a shared-memory segment: all-reduces and "
      "reduce-scatters with `1`, also all-gathers and broadcasts with `all` (for hosts where Open MPI cannot "
      "copy between processes directly), none with `0`" },
    /* measured on a 2-vCPU Zen 4 VM, 16 MiB all-reduces: 1 MiB chunks moved 7.1-7.7 GB/s against 6.8-7.6
     * with 256 KiB ones (vCPUs in one core complex), 2.9 against 2.3 (in two); 4 MiB ones lost again */
    { "CX_SHM_CHUNK_KIB", CX_SET_INT, "1024", 4, 65536, NULL, false, NULL, NULL,
      "the shared-memory path's chunk, in KiB" },
    { "CX_SHM_STREAM_MIB", CX_SET_DOUBLE, "32", 0, 1e6, NULL, false, NULL, NULL,
      "the message size (MiB) from which shared-memory results bypass the caches" },
    { "CX_SHM_SLOT_WRITES", CX_SET_ENUM, "auto", 0, 0, "auto|cached|streamed", false, NULL, NULL,
      "how every message is written into the shared segment; `auto`: messages of 512 KiB and up are written "
      "both ways in turn, timed, and the faster kept (docs/architecture.md)" },
    { "CX_SHM_HEAP_MIB", CX_SET_INT, "4096", 0, 1073741824, NULL, false, NULL, NULL,
      "address space (MiB) of each rank's shared heap, from which all-reduce outputs and the intermediate "
      "arena are taken so the node's other ranks write results into them in place; 0: no heaps" },
    { "CX_SHM_HIERARCHICAL", CX_SET_BOOL, "0", 0, 0, NULL, false, NULL, NULL,
      "all-reduces over several nodes go node by node: shared memory inside each node, MPI between one leader "
      "per node, shared memory again (off by default: on the test cluster, where TCP between hosts runs at "
      "0.4 GB/s and 4 ranks share 2 cores, it measured 0.2–0.7× of a flat `MPI_Allreduce`)" },
    { "CX_SHM_NODE_RANKS", CX_SET_INT, "0", 0, 1048576, NULL, false, NULL, NULL,
      "takes every N consecutive ranks for one node: runs the hierarchical all-reduce on one machine (tests); "
      "0: MPI's own idea of a node" },
    { "CX_STATUS_DIR", CX_SET_STRING, NULL, 0, 0, NULL, false, NULL, "a directory",
      "set by `xla-launch`: where each rank keeps the status page its collective watchdog reads" },
    { "CX_CACHE_DIR", CX_SET_STRING, NULL, 0, 0, NULL, false, NULL, "a directory", "persistent compile cache" },
    { "CX_CACHE_READONLY", CX_SET_BOOL, "0", 0, 0, NULL, false, NULL, NULL,
      "the persistent compile cache is only read" },
    { "XLA_FLAGS", CX_SET_STRING, NULL, 0, 0, NULL, false, NULL, NULL,
      "compile options, part of every compile cache key; `--xla_dump_to=DIR` also writes every compilation to DIR "
      "(as `CX_DUMP_DIR`)" },
    { "CX_COMPILE_OPTIONS", CX_SET_STRING, NULL, 0, 0, NULL, false, NULL, NULL,
      "compile options, part of every compile cache key" },
    { "PT_XLA_DEBUG_LEVEL", CX_SET_INT, "0", 0, 1000, NULL, false, NULL, NULL,
      "PyTorch/XLA's debug analysis: compilations with call sites (1), also executions (2)" },
    { "PT_XLA_DEBUG_FILE", CX_SET_STRING, NULL, 0, 0, NULL, false, NULL, "a file",
      "the debug analysis goes to this file (`.<rank>` appended with several ranks) instead of stderr" },
    { "CX_DEBUG_ALL_RANKS", CX_SET_BOOL, "0", 0, 0, NULL, false, NULL, NULL,
      "every rank prints the debug analysis, not only local rank 0" },
    { "XLA_SAVE_TENSORS_FILE", CX_SET_STRING, NULL, 0, 0, NULL, false, NULL, "a file",
      "the IR of every executed graph is appended to this file" },
    { "XLA_SAVE_TENSORS_FMT", CX_SET_ENUM, "text", 0, 0, "text|dot|hlo", false, NULL, NULL,
      "the format of `XLA_SAVE_TENSORS_FILE`; `hlo`: the lowered program (fusion groups, kernels, collectives, "
      "memory plan), which `cx_ir_text` then returns too" },
    { "XLA_IR_DEBUG", CX_SET_BOOL, "0", 0, 0, NULL, false, NULL, NULL,
      "each IR node records the user's line that made it (the first frame outside libcxla), shown in IR dumps, "
      "the debug analysis and desync messages" },
    { "XLA_HLO_DEBUG", CX_SET_BOOL, "0", 0, 0, NULL, false, NULL, NULL,
      "with `XLA_IR_DEBUG`: the compiled-program dumps name the user's line of every op" },
    { "CX_DUMP_DIR", CX_SET_STRING, NULL, 0, 0, NULL, false, NULL, "a directory",
      "every compilation writes its captured, partitioned and lowered program here, per rank (as "
      "`XLA_FLAGS=--xla_dump_to=DIR`)" },
    { "XLA_SAVE_HLO_FILE", CX_SET_STRING, NULL, 0, 0, NULL, false, NULL, "a file",
      "a graph whose compile or run fails is written here (`.<rank>` appended with several ranks), and the error "
      "names the file" },
    { "XLA_METRICS_FILE", CX_SET_STRING, NULL, 0, 0, NULL, false, NULL, "a file, `STDOUT` or `STDERR`",
      "the metrics report at every step end is appended here" },
    /* enums, not bools: PyTorch/XLA reads them as 0/1, so `yes` is refused rather than guessed */
    { "XLA_USE_BF16", CX_SET_ENUM, "0", 0, 0, "0|1", false, NULL, NULL,
      "tensors made as f32 are held and computed as bf16 (`cx_dtype_of` says bf16; checkpoints save f32); read at the first tensor made" },
    { "XLA_DOWNCAST_BF16", CX_SET_ENUM, "0", 0, 0, "0|1", false, NULL, NULL,
      "as `XLA_USE_BF16` (PyTorch/XLA's f64 becomes f32 there; cxla has no f64)" },
    { "XLA_USE_EAGER_DEBUG_MODE", CX_SET_BOOL, "0", 0, 0, NULL, false, NULL, NULL,
      "every op runs when it is recorded (eager mode)" },
    { "CX_PROFILE_PORT", CX_SET_INT, "0", 0, 65535, NULL, false, NULL, NULL,
      "profile server on 127.0.0.1, this port plus the local rank, for `xla-profile`; 0: none" },
    { "CX_LOG_LEVEL", CX_SET_ENUM, "info", 0, 0, "error|warning|info|debug", true, NULL, NULL,
      "the most verbose diagnostics shown (include/cxla/logging.h)" },
    { "CX_LOG_MODULES", CX_SET_STRING, NULL, 0, 0, NULL, false, cx_log_modules_valid,
      "module=level,... with levels error, warning, info, debug or 0-3",
      "a level of its own for each named module, e.g. `shm=debug,settings=error`" },
};
#define NSETTINGS ((int)(sizeof g_table / sizeof g_table[0]))

static atomic_bool g_reported[NSETTINGS];

static const cx_setting *find(const char *name)
{
    for (int i = 0; i < NSETTINGS; i++)
        if (!strcmp(g_table[i].name, name)) return &g_table[i];
    return NULL;
}

/* ---- parsers: each one takes the whole text or fails -------------------------- */

static bool parse_bool(const char *s, bool *b)
{
    static const char *const yes[] = { "1", "true", "on", "yes" }, *const no[] = { "0", "false", "off", "no" };
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) return *b = true, true;
        if (!strcasecmp(s, no[i])) return *b = false, true;
    }
    return false;
}

static bool parse_number(const char *s, double *d)
{
    char *end;
    errno = 0;
    *d = strtod(s, &end);
    return end != s && !*end && errno == 0 && isfinite(*d);
}

static bool parse_int(const cx_setting *st, const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno || v < st->min || v > st->max) return false;
    *out = v;
    return true;
}

/* k, M, G count in powers of 1000, KiB, MiB, GiB of 1024 (as df and free do) */
static bool parse_bytes(const cx_setting *st, const char *s, int64_t *out)
{
    static const struct { const char *suffix; double mult; } units[] = {
        { "", 1 }, { "b", 1 }, { "k", 1e3 }, { "kb", 1e3 }, { "m", 1e6 }, { "mb", 1e6 }, { "g", 1e9 },
        { "gb", 1e9 }, { "t", 1e12 }, { "tb", 1e12 }, { "kib", 1024.0 }, { "mib", 1048576.0 },
        { "gib", 1073741824.0 }, { "tib", 1099511627776.0 },
    };
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0) return false;
    while (*end == ' ') end++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].suffix)) continue;
        double bytes = v * units[i].mult;
        if (bytes < st->min || bytes > st->max) return false;
        *out = (int64_t)bytes;
        return true;
    }
    return false;
}

static bool parse_enum(const cx_setting *st, const char *s, int *out)
{
    size_t n = strlen(s);
    int idx = 0;
    for (const char *c = st->choices; *c; idx++) {
        size_t len = strcspn(c, "|");
        if (len == n && !strncasecmp(c, s, n)) return *out = idx, true;
        c += len + (c[len] == '|');
    }
    if (st->numbered && n == 1 && s[0] >= '0' && s[0] < '0' + idx) return *out = s[0] - '0', true;
    return false;
}

static bool parse_value(const cx_setting *st, const char *s, cx_setting_value *v)
{
    switch (st->type) {
    case CX_SET_BOOL: return parse_bool(s, &v->b);
    case CX_SET_INT: return parse_int(st, s, &v->i);
    case CX_SET_BYTES: return parse_bytes(st, s, &v->i);
    case CX_SET_ENUM: return parse_enum(st, s, &v->e);
    case CX_SET_STRING:
        v->s = s;
        return !st->valid || st->valid(s);
    case CX_SET_DOUBLE: {
        double d;
        if (!parse_number(s, &d) || d < st->min || d > st->max) return false;
        v->d = d;
        return true;
    }
    }
    return false;
}

/* ---- what a value may be, in words (the error lines and the README) ------------ */

static void describe_range(char *buf, size_t cap, const char *what, const cx_setting *st)
{
    if (st->max >= BIG) snprintf(buf, cap, "%s >= %.15g", what, st->min);
    else snprintf(buf, cap, "%s from %.15g to %.15g", what, st->min, st->max);
}

static void describe(const cx_setting *st, char *buf, size_t cap)
{
    switch (st->type) {
    case CX_SET_BOOL: snprintf(buf, cap, "1/0, true/false, on/off or yes/no"); break;
    case CX_SET_INT: describe_range(buf, cap, "an integer", st); break;
    case CX_SET_DOUBLE: describe_range(buf, cap, "a number", st); break;
    case CX_SET_BYTES: snprintf(buf, cap, "a size such as 2G or 512MiB (k, M, G: 1000s; KiB, MiB, GiB: 1024s)"); break;
    case CX_SET_STRING: snprintf(buf, cap, "%s", st->want ? st->want : "any text"); break;
    case CX_SET_ENUM: {
        size_t at = (size_t)snprintf(buf, cap, "one of ");
        int n = 0;
        for (const char *c = st->choices; *c && at < cap; n++) {
            size_t len = strcspn(c, "|");
            at += (size_t)snprintf(buf + at, cap - at, "%s%.*s", c == st->choices ? "" : ", ", (int)len, c);
            c += len + (c[len] == '|');
        }
        if (st->numbered && at < cap) snprintf(buf + at, cap - at, " or 0-%d", n - 1);
        break;
    }
    }
}

/* ---- reading ------------------------------------------------------------------- */

static int read_setting(const cx_setting *st, cx_setting_value *out, char *err, size_t errn)
{
    memset(out, 0, sizeof *out);
    if (st->def) {
        bool def_ok = parse_value(st, st->def, out);
        CX_ASSERT(def_ok);
    }
    const char *text = getenv(st->name);
    if (!text || !*text) return 0;
    cx_setting_value v = *out;
    if (parse_value(st, text, &v)) {
        *out = v;
        return 1;
    }
    char want[256];
    describe(st, want, sizeof want);
    if (errn) {
        snprintf(err, errn, "bad %s '%.80s': want %s%s%s%s", st->name, text, want, st->def ? " (default " : "",
                 st->def ? st->def : "", st->def ? ")" : "");
    }
    return -1;
}

int cx_setting_read(const char *name, cx_setting_value *out, char *err, size_t errn)
{
    const cx_setting *st = find(name);
    CX_ASSERT(st != NULL);
    return read_setting(st, out, err, errn);
}

static cx_setting_value get(const char *name, cx_setting_type type)
{
    const cx_setting *st = find(name);
    CX_ASSERT(st != NULL);
    CX_ASSERT(st->type == type || (type == CX_SET_INT && st->type == CX_SET_BYTES));
    cx_setting_value v;
    char err[512];
    if (read_setting(st, &v, err, sizeof err) < 0 && !atomic_exchange(&g_reported[st - g_table], true))
        cx_logf(CX_LOG_ERROR, "settings", "%s; the value is ignored", err);
    return v;
}

bool cx_setting_bool(const char *name) { return get(name, CX_SET_BOOL).b; }
int64_t cx_setting_int(const char *name) { return get(name, CX_SET_INT).i; }
double cx_setting_double(const char *name) { return get(name, CX_SET_DOUBLE).d; }
int cx_setting_enum(const char *name) { return get(name, CX_SET_ENUM).e; }
const char *cx_setting_str(const char *name) { return get(name, CX_SET_STRING).s; }

bool cx_setting_is_set(const char *name)
{
    CX_ASSERT(find(name) != NULL);
    const char *v = getenv(name);
    return v && *v;
}

bool cx_settings_check(char *msg, size_t cap)
{
    for (int i = 0; i < NSETTINGS; i++) {
        cx_setting_value v;
        if (read_setting(&g_table[i], &v, msg, cap) < 0) return false;
    }
    return true;
}

const cx_setting *cx_settings_table(int *n)
{
    *n = NSETTINGS;
    return g_table;
}

void cx_settings_reset_reports(void)
{
    for (int i = 0; i < NSETTINGS; i++) atomic_store(&g_reported[i], false);
}

void cx_settings_markdown(FILE *f)
{
    fprintf(f, "| variable | value | default | effect |\n|---|---|---|---|\n");
    for (int i = 0; i < NSETTINGS; i++) {
        const cx_setting *st = &g_table[i];
        char want[256];
        describe(st, want, sizeof want);
        fprintf(f, "| `%s` | %s | %s%s%s | %s |\n", st->name, want, st->def ? "`" : "", st->def ? st->def : "",
                st->def ? "`" : "", st->doc);
    }
}
