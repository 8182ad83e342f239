/* What machine a run's figures come from: the CPU model, its vector
 * extensions, and how far apart the first two CPUs are right now. On the
 * 2-vCPU VMs these figures are measured on, the host moves the vCPUs
 * between cores and core complexes from minute to minute (a cache-line
 * round trip of ~100 ns in one complex, ~450 ns across two), and several
 * figures move with it; printing it at the start and end of a run says
 * which placement a run had. */
#define _GNU_SOURCE
#include "bench.h"

#include <cxla/core.h>
#include <oneapi/dnnl/dnnl.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *openblas_get_corename(void);   /* OpenBLAS's, not in its cblas.h */

#define PING_ROUNDS 20000
#define PING_MAX_S 0.5   /* a busy partner CPU (another rank spinning) must not stall the run */

static _Alignas(64) atomic_int g_ping;
static _Alignas(64) atomic_bool g_stop;

static bool pin_to(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

/* Answers each ping; unpinned if pinning fails (then the figure is of
 * wherever it runs). */
static void *pong(void *arg)
{
    pin_to(*(const int *)arg);
    for (int i = 0; i < PING_ROUNDS; i++) {
        while (atomic_load_explicit(&g_ping, memory_order_acquire) != 2 * i + 1)
            if (atomic_load_explicit(&g_stop, memory_order_relaxed)) return NULL;
        atomic_store_explicit(&g_ping, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

/* Waits for the answer to ping i; false once PING_MAX_S has passed. */
static bool await_pong(int i, double t0)
{
    for (unsigned spins = 1; atomic_load_explicit(&g_ping, memory_order_acquire) != 2 * i + 2; spins++)
        if (spins % 1024 == 0 && bench_now() - t0 > PING_MAX_S) return false;
    return true;
}

/* Nanoseconds per cache-line round trip between the two lowest CPUs this
 * process may run on (the mean over at most PING_ROUNDS trips or
 * PING_MAX_S); negative when there are fewer than two CPUs or nothing could
 * be timed. The calling thread's affinity is restored. */
static double core_round_trip_ns(void)
{
    cpu_set_t old;
    if (pthread_getaffinity_np(pthread_self(), sizeof old, &old) != 0 || CPU_COUNT(&old) < 2) return -1;
    int cpus[2], n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &old)) cpus[n++] = c;
    atomic_store(&g_ping, 0);
    atomic_store(&g_stop, false);
    pthread_t t;
    double ns = -1;
    if (pin_to(cpus[0]) && pthread_create(&t, NULL, pong, &cpus[1]) == 0) {
        double t0 = bench_now();
        int done = 0;
        while (done < PING_ROUNDS) {
            atomic_store_explicit(&g_ping, 2 * done + 1, memory_order_release);
            if (!await_pong(done, t0)) break;
            done++;
        }
        double dt = bench_now() - t0;
        atomic_store(&g_stop, true);
        pthread_join(t, NULL);
        if (done >= 100) ns = dt / done * 1e9;
    }
    pthread_setaffinity_np(pthread_self(), sizeof old, &old);
    return ns;
}

/* The vector extensions the kernels dispatch on, lowest first, as the
 * machine line names them. */
enum { CPU_BASE, CPU_AVX2, CPU_AVX512, CPU_AVX512_BF16 };
static const char *const g_cpu_levels[] = { "without AVX2", "AVX2", "AVX-512", "AVX-512 with BF16" };

/* "AMD EPYC (family 26, model 2)" from /proc/cpuinfo's first CPU, and its
 * widest vector extension (CPU_*). The family and model tell apart CPUs a
 * virtual machine names alike (a Zen 4 and a Zen 5 "AMD EPYC"). */
static void cpu_model(char *name, size_t n, int *level)
{
    snprintf(name, n, "unknown CPU");
    *level = CPU_BASE;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[4096], family[32] = "", model[32] = "";
    bool got_name = false, got_flags = false;
    while ((!got_name || !got_flags) && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *v = colon + 1 + (colon[1] == ' ');
        v[strcspn(v, "\n")] = 0;
        if (!family[0] && !strncmp(line, "cpu family", 10)) {
            snprintf(family, sizeof family, "%.31s", v);
        } else if (!model[0] && !strncmp(line, "model\t", 6)) {
            snprintf(model, sizeof model, "%.31s", v);
        } else if (!got_name && !strncmp(line, "model name", 10)) {
            snprintf(name, n, "%s", v);
            got_name = true;
        } else if (!got_flags && !strncmp(line, "flags", 5)) {
            got_flags = true;
            *level = strstr(v, " avx512_bf16") ? CPU_AVX512_BF16
                     : strstr(v, " avx512f")   ? CPU_AVX512
                     : strstr(v, " avx2")      ? CPU_AVX2
                                               : CPU_BASE;
        }
    }
    fclose(f);
    size_t used = strlen(name);
    if (family[0] && model[0] && used < n) snprintf(name + used, n - used, " (family %s, model %s)", family, model);
}

/* The levels of CX_CPU_ISA below the top, and the OpenBLAS core of each. */
static const struct { const char *cap; int level; const char *openblas_core; } g_caps[] = {
    { "baseline", CPU_BASE, "Nehalem" },
    { "avx2", CPU_AVX2, "Haswell" },
    { "avx512", CPU_AVX512, "SkylakeX" },
};

void bench_cap_openblas(char **argv)
{
    const char *cap = getenv("CX_CPU_ISA");
    if (!cap || getenv("OPENBLAS_CORETYPE")) return;
    char name[256];
    int level;
    cpu_model(name, sizeof name, &level);
    for (int i = 0; i < (int)(sizeof g_caps / sizeof *g_caps); i++) {
        if (strcmp(cap, g_caps[i].cap) || level <= g_caps[i].level) continue;
        setenv("OPENBLAS_CORETYPE", g_caps[i].openblas_core, 1);
        execv("/proc/self/exe", argv);
        fprintf(stderr, "cxla-bench: CX_CPU_ISA=%s: cannot run again with OPENBLAS_CORETYPE=%s (%s); OpenBLAS keeps "
                "this CPU's kernels, so the f32 references are not a %s CPU's\n", cap, g_caps[i].openblas_core,
                strerror(errno), g_cpu_levels[g_caps[i].level]);
        unsetenv("OPENBLAS_CORETYPE");
        return;
    }
}

static const char *dnnl_isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

static bool g_said_start;

static void describe(const char *when)
{
    /* one line per job: ranks other than 0 stay quiet */
    if (!bench_is_rank0()) return;
    char name[256];
    int level;
    cpu_model(name, sizeof name, &level);
    const char *isa = g_cpu_levels[level];
    /* under a launcher the other ranks share the CPUs, and the round trip
     * would time their scheduling, not where the CPUs are */
    bool launched = bench_in_launched_rank();
    double rtt = launched ? -1 : core_round_trip_ns();
    /* the bf16 path first: asking it applies CX_CPU_ISA's cap to oneDNN,
     * which reading oneDNN's level would fix */
    const char *bf16 = cx_bf16_path();
    char libs[224];
    snprintf(libs, sizeof libs, "f32 libraries OpenBLAS %s%s, oneDNN %s; %s%s", openblas_get_corename(),
             getenv("OPENBLAS_CORETYPE") ? " (OPENBLAS_CORETYPE)" : "",
             dnnl_isa_name(dnnl_get_effective_cpu_isa()), CX_BENCH_MARCH[0] ? "a build for -march=" : "a build for any CPU",
             CX_BENCH_MARCH);
    if (rtt > 0)
        fprintf(stderr, "cxla-bench: %s: %s, %s, %ld CPUs, bf16 path %s, %s; cache-line round trip between two CPUs "
                "%.0f ns\n", when, name, isa, sysconf(_SC_NPROCESSORS_ONLN), bf16, libs, rtt);
    else
        fprintf(stderr, "cxla-bench: %s: %s, %s, %ld CPUs, bf16 path %s, %s%s\n", when, name, isa,
                sysconf(_SC_NPROCESSORS_ONLN), bf16, libs, launched ? " (no round trip: the ranks share the CPUs)" : "");
}

void bench_machine_start(void)
{
    g_said_start = true;
    describe("start");
    /* an environment's OPENBLAS_CORETYPE (not CX_CPU_ISA's cap) can hold
     * the f32 references below the CPU: a Zen 5 machine's Haswell setting
     * had made the cnn's bf16 figure 1.96x where OpenBLAS's own choice gave 1.37x */
    const char *core = getenv("OPENBLAS_CORETYPE");
    if (core && !getenv("CX_CPU_ISA") && bench_is_rank0())
        fprintf(stderr, "cxla-bench: OPENBLAS_CORETYPE=%s holds OpenBLAS to that core's kernels, which may be below "
                "this CPU's: the f32 references then are too (unset it to compare against OpenBLAS's own choice)\n", core);
}

void bench_machine_end(void)
{
    if (g_said_start) describe("end");
}
