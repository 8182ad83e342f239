/* Includes WIDTH_FILE once per vector width, for loops written once per
 * width rather than cloned per CPU (conv_direct_bf16_width.h says why):
 * with WIDTH 16 and CX_TARGET_AVX512, 8 and CX_TARGET_AVX2 (x86 only), and
 * 4 with the baseline's instructions; each file names its functions with
 * the width as a suffix. CX_BY_WIDTH(name) is then the one the instruction
 * level allows (cx_isa_active(), so CX_CPU_ISA caps it). */
#ifndef WIDTH_FILE
#error "each_width.h: define WIDTH_FILE (the file to include per width) first"
#endif

#ifdef CX_HAVE_ISA_TARGETS
#define WIDTH 16
#define WIDTH_TARGET CX_TARGET_AVX512
#include WIDTH_FILE
#define WIDTH 8
#define WIDTH_TARGET CX_TARGET_AVX2
#include WIDTH_FILE
#endif
#define WIDTH 4
#define WIDTH_TARGET
#include WIDTH_FILE
#undef WIDTH_FILE

#ifndef CX_BY_WIDTH
#ifdef CX_HAVE_ISA_TARGETS
#define CX_BY_WIDTH(name)                                                                                             \
    (cx_isa_active() >= CX_ISA_AVX512 ? name##_16 : cx_isa_active() >= CX_ISA_AVX2 ? name##_8 : name##_4)
#else
#define CX_BY_WIDTH(name) name##_4
#endif
#endif
