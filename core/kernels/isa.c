/* Which instructions the kernels may use, found at run time (the same build
 * runs on AVX2-only and AVX512_BF16 machines), and capped by CX_CPU_ISA so
 * a machine with bf16 instructions can still run, and test, the fallback.
 *
 * The cap holds oneDNN's f32 gemm to the same level: the fallback is
 * meant to run, and be timed, as on a CPU without the instructions, and
 * its f32 reference with it. OpenBLAS picks its kernels when it loads,
 * before any of this runs; OPENBLAS_CORETYPE caps it (cxla-bench sets it). */
#include "kernels.h"
#include "cx_log.h"
#include "cx_settings.h"

#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdatomic.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <errno.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* XCR0 says whether the OS saves the vector state: cpuid alone does not. */
static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

/* AMX-TILE and AMX-BF16 (cpuid 7.0 edx bits 24 and 22) with their state
 * in XCR0 (bits 17, 18). Using them also takes the kernel's permission
 * (cx_amx_permitted), asked only when they are about to be used. */
static bool amx_present(uint64_t xcr0)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return false;
    return (xcr0 & (3ull << 17)) == 3ull << 17;
}

/* Linux hands out AMX's 8 KB of tile state only to a process that asks
 * (arch/x86/include/uapi/asm/prctl.h). Asking changes the process: the
 * kernel then refuses signal stacks too small for the state
 * (sigaltstack), so a process that never runs an AMX kernel is not made
 * to ask. */
#define CX_ARCH_REQ_XCOMP_PERM 0x1023
#define CX_XFEATURE_XTILEDATA 18

bool cx_amx_permitted(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_acquire);
    if (v >= 0) return v;
    v = syscall(SYS_arch_prctl, CX_ARCH_REQ_XCOMP_PERM, CX_XFEATURE_XTILEDATA) == 0;
    if (!v)
        cx_logf(CX_LOG_WARNING, "kernels", "the kernel refused AMX's tile state (arch_prctl: %s): bf16 matmuls "
                "stay on avx512_bf16", strerror(errno));
    atomic_store_explicit(&cached, v, memory_order_release);
    return v;
}

static cx_isa detect(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return CX_ISA_BASELINE;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6 || !(c & bit_FMA) || !(c & bit_AVX)) return CX_ISA_BASELINE;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & bit_AVX2)) return CX_ISA_BASELINE;
    /* opmask, upper zmm halves and zmm16-31 saved */
    bool zmm = (xcr0 & 0xe0) == 0xe0;
    if (!zmm || !(b & bit_AVX512F) || !(b & bit_AVX512BW) || !(b & bit_AVX512VL) || !(b & bit_AVX512DQ))
        return CX_ISA_AVX2;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return CX_ISA_AVX512;
    return amx_present(xcr0) ? CX_ISA_AMX : CX_ISA_AVX512_BF16;
}
#else
static cx_isa detect(void) { return CX_ISA_BASELINE; }
bool cx_amx_permitted(void) { return false; }
#endif

static const char *const g_names[] = { "baseline", "avx2", "avx512", "avx512_bf16", "amx" };

const char *cx_isa_name(cx_isa isa)
{
    return isa >= CX_ISA_BASELINE && isa <= CX_ISA_AMX ? g_names[isa] : "?";
}

cx_isa cx_isa_detected(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) { v = (int)detect(); atomic_store_explicit(&cached, v, memory_order_relaxed); }
    return (cx_isa)v;
}

/* CX_CPU_ISA's values in the table's order: auto, then the levels from the
 * top down. */
static cx_isa forced_level(int e)
{
    static const cx_isa levels[] = { CX_ISA_AMX, CX_ISA_AMX, CX_ISA_AVX512_BF16, CX_ISA_AVX512, CX_ISA_AVX2,
                                     CX_ISA_BASELINE };
    return e >= 0 && e < (int)(sizeof levels / sizeof *levels) ? levels[e] : CX_ISA_AMX;
}

/* Once, before oneDNN's first kernel (dnnl_set_max_cpu_isa works only
 * then): an application that ran oneDNN itself first keeps it uncapped,
 * and is told. */
static void cap_dnnl(void)
{
    static const dnnl_cpu_isa_t to_dnnl[] = { dnnl_cpu_isa_sse41, dnnl_cpu_isa_avx2, dnnl_cpu_isa_avx512_core,
                                              dnnl_cpu_isa_avx512_core_bf16 };
    cx_isa cap = forced_level(cx_setting_enum("CX_CPU_ISA"));
    if (cap >= CX_ISA_AMX || cap >= cx_isa_detected()) return;
    if (dnnl_set_max_cpu_isa(to_dnnl[cap]) != dnnl_success)
        cx_logf(CX_LOG_WARNING, "kernels", "CX_CPU_ISA=%s: oneDNN had already started, so its kernels are not capped",
                cx_isa_name(cap));
}

cx_isa cx_isa_active(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_acquire);
    if (v >= 0) return (cx_isa)v;
    cx_isa have = cx_isa_detected();
    int e = cx_setting_enum("CX_CPU_ISA");
    cx_isa want = forced_level(e);
    if (e > 0 && want > have)
        cx_logf(CX_LOG_WARNING, "kernels", "CX_CPU_ISA=%s: this CPU has only %s; using %s", cx_isa_name(want),
                cx_isa_name(have), cx_isa_name(have));
    v = (int)(want < have ? want : have);
    static pthread_once_t dnnl_once = PTHREAD_ONCE_INIT;
    pthread_once(&dnnl_once, cap_dnnl);
    atomic_store_explicit(&cached, v, memory_order_release);
    return (cx_isa)v;
}

