/* Includes WIDTH_FILE once per vector width, for loops written once per
 * width rather than cloned per CPU (conv_direct_bf16_width.h says why):
 * with WIDTH 16 and CX_TARGET_AVX512, 8 and CX_TARGET_AVX2 (x86 only), and
 * 4 with the baseline's instructions; each file names its functions with
 * the width as a suffix. CX_BY_WIDTH(name) is then the one the instruction
 * level allows (cx_isa_active(), so CX_CPU_ISA caps it). */
#ifndef WIDTH_FILE
#error "each_width.h: define WIDTH_FILE (the file to include per width) first"
#endif

/* For the file: AT_WIDTH(name) is name_WIDTH, WIDTH_INLINE a helper
 * inlined into that width's functions. */
#ifndef AT_WIDTH
#define WIDTH_CAT2(a, b) a##_##b
#define WIDTH_CAT(a, b) WIDTH_CAT2(a, b)
#define AT_WIDTH(name) WIDTH_CAT(name, WIDTH)
#define WIDTH_INLINE WIDTH_TARGET static inline __attribute__((always_inline))
#endif

#ifdef CX_HAVE_ISA_TARGETS
#define WIDTH 16
#define WIDTH_TARGET CX_TARGET_AVX512
#include WIDTH_FILE
#undef WIDTH
#undef WIDTH_TARGET
#define WIDTH 8
#define WIDTH_TARGET CX_TARGET_AVX2
#include WIDTH_FILE
#undef WIDTH
#undef WIDTH_TARGET
#endif
#define WIDTH 4
#define WIDTH_TARGET
#include WIDTH_FILE
#undef WIDTH
#undef WIDTH_TARGET
#undef WIDTH_FILE

#ifndef CX_BY_WIDTH
#ifdef CX_HAVE_ISA_TARGETS
#define CX_BY_WIDTH(name)                                                                                             \
    (cx_isa_active() >= CX_ISA_AVX512 ? name##_16 : cx_isa_active() >= CX_ISA_AVX2 ? name##_8 : name##_4)
#else
#define CX_BY_WIDTH(name) name##_4
#endif
#endif
