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
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

/* "AMD EPYC" from /proc/cpuinfo's first model name, and its widest vector
 * extension among those the kernels dispatch on. */
static void cpu_model(char *name, size_t n, const char **isa)
{
    snprintf(name, n, "unknown CPU");
    *isa = "without AVX2";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[4096];
    bool got_name = false, got_flags = false;
    while ((!got_name || !got_flags) && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *v = colon + 1 + (colon[1] == ' ');
        v[strcspn(v, "\n")] = 0;
        if (!got_name && !strncmp(line, "model name", 10)) {
            snprintf(name, n, "%s", v);
            got_name = true;
        } else if (!got_flags && !strncmp(line, "flags", 5)) {
            got_flags = true;
            if (strstr(v, " avx512_bf16")) *isa = "AVX-512 with BF16";
            else if (strstr(v, " avx512f")) *isa = "AVX-512";
            else if (strstr(v, " avx2")) *isa = "AVX2";
        }
    }
    fclose(f);
}

static bool g_said_start;

static void describe(const char *when)
{
    /* one line per job: ranks other than 0 stay quiet */
    if (!bench_is_rank0()) return;
    char name[256];
    const char *isa;
    cpu_model(name, sizeof name, &isa);
    /* under a launcher the other ranks share the CPUs, and the round trip
     * would time their scheduling, not where the CPUs are */
    bool launched = bench_in_launched_rank();
    double rtt = launched ? -1 : core_round_trip_ns();
    if (rtt > 0)
        fprintf(stderr, "cxla-bench: %s: %s, %s, %ld CPUs, bf16 path %s; cache-line round trip between two CPUs %.0f ns\n",
                when, name, isa, sysconf(_SC_NPROCESSORS_ONLN), cx_bf16_path(), rtt);
    else
        fprintf(stderr, "cxla-bench: %s: %s, %s, %ld CPUs, bf16 path %s%s\n", when, name, isa,
                sysconf(_SC_NPROCESSORS_ONLN), cx_bf16_path(), launched ? " (no round trip: the ranks share the CPUs)" : "");
}

void bench_machine_start(void)
{
    g_said_start = true;
    describe("start");
}

void bench_machine_end(void)
{
    if (g_said_start) describe("end");
}
