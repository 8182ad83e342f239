#include "precision.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void say(const char *prog, const char *what)
{
    if (cx_global_ordinal() == 0) fprintf(stderr, "%s: %s\n", prog, what);
}

int precision_setup(const char *prog, const char *value, bool given, precision *out)
{
    char line[512];
    /* the names, Lightning's spellings of them too ("32-true", "bf16-true"),
     * in any case and with _ for - as the flags' names take it */
    static const struct { const char *name; precision p; } names[] = {
        { "f32", PRECISION_F32 }, { "32", PRECISION_F32 }, { "32-true", PRECISION_F32 }, { "fp32", PRECISION_F32 },
        { "bf16-mixed", PRECISION_BF16_MIXED }, { "bf16", PRECISION_BF16 }, { "bf16-true", PRECISION_BF16 },
    };
    char norm[32];
    snprintf(norm, sizeof norm, "%s", value);
    for (char *c = norm; *c; c++) *c = *c == '_' ? '-' : (char)tolower((unsigned char)*c);
    int p = -1;
    const bool whole = strlen(value) < sizeof norm;   /* a longer value names none of them */
    for (size_t i = 0; whole && i < sizeof names / sizeof *names; i++)
        if (!strcmp(norm, names[i].name)) p = (int)names[i].p;
    if (p < 0) {
        bool f16 = !strcmp(norm, "fp16") || !strcmp(norm, "16") || !strcmp(norm, "16-mixed") ||
                   !strcmp(norm, "fp16-mixed") || !strcmp(norm, "16-true");
        snprintf(line, sizeof line, "--precision %s: %s; use f32, bf16-mixed or bf16", value,
                 f16 ? "cxla has no float16 (its CPU kernels compute in f32 and bf16)" : "unknown precision");
        say(prog, line);
        return -1;
    }
    /* the environment's XLA_USE_BF16 / XLA_DOWNCAST_BF16 hold f32 as bf16 for the
     * whole process: they must agree with the flag, not silently win over it */
    char bad[512];
    if (!cx_settings_check(bad, sizeof bad) && (strstr(bad, "bad XLA_USE_BF16 ") || strstr(bad, "bad XLA_DOWNCAST_BF16 "))) {
        say(prog, bad); /* the library would log it and run in f32: not what was asked */
        return -1;
    }
    const char *env = getenv("XLA_USE_BF16"), *down = getenv("XLA_DOWNCAST_BF16");
    bool held = (env && !strcmp(env, "1")) || (down && !strcmp(down, "1"));
    if (held && p != PRECISION_BF16) {
        snprintf(line, sizeof line, "--precision %s%s, but %s=1 holds every f32 tensor as bf16; unset it, or use "
                 "--precision bf16", value, given ? "" : " (the default)",
                 env && !strcmp(env, "1") ? "XLA_USE_BF16" : "XLA_DOWNCAST_BF16");
        say(prog, line);
        return -1;
    }
    if (p == PRECISION_BF16 && env && !strcmp(env, "0")) {
        snprintf(line, sizeof line, "--precision %s holds every f32 tensor as bf16 (XLA_USE_BF16=1), but the "
                 "environment sets XLA_USE_BF16=0; unset it, or use another --precision", value);
        say(prog, line);
        return -1;
    }
    if (p == PRECISION_BF16 && setenv("XLA_USE_BF16", "1", 1) != 0) {
        say(prog, "--precision bf16: cannot set XLA_USE_BF16");
        return -1;
    }
    *out = (precision)p;
    return 0;
}
