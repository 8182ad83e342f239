/* --precision for train and gpt: the names Lightning and Accelerate use. */
#ifndef CX_EXAMPLES_PRECISION_H
#define CX_EXAMPLES_PRECISION_H

#include <cxla/cxla.h>

typedef enum {
    PRECISION_F32,
    PRECISION_BF16_MIXED,   /* autocast around the forward, f32 master weights */
    PRECISION_BF16,         /* XLA_USE_BF16: every f32 tensor held as bf16 */
} precision;

#define PRECISION_HELP "f32, bf16-mixed (autocast: matmul, conv and\nattention in bf16, f32 weights) or bf16\n(XLA_USE_BF16: every f32 tensor held as bf16)"

/* Reads --precision (given: on the command line, else value is the
 * default) and sets it up; call before the first tensor is made (bf16
 * sets XLA_USE_BF16=1). @return 0, or -1 after one line on stderr (rank 0
 * only) naming what is wrong. */
int precision_setup(const char *prog, const char *value, bool given, precision *out);

/* What the run banner adds after its parallel mode: nothing for f32, so
 * the default run's line is as it was. */
static inline const char *precision_banner(precision p)
{
    return p == PRECISION_BF16_MIXED ? ", precision bf16-mixed" : p == PRECISION_BF16 ? ", precision bf16" : "";
}

/* The --precision value that selects p. */
static inline const char *precision_name(precision p)
{
    return p == PRECISION_BF16_MIXED ? "bf16-mixed" : p == PRECISION_BF16 ? "bf16" : "f32";
}

/* The forward's autocast region under bf16-mixed; nothing otherwise. */
static inline void precision_forward_begin(precision p) { if (p == PRECISION_BF16_MIXED) cx_autocast_begin(CX_BF16); }
static inline void precision_forward_end(precision p) { if (p == PRECISION_BF16_MIXED) cx_autocast_end(); }

#endif
