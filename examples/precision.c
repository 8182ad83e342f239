#include "precision.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void say(const char *prog, const char *what)
{
    if (cx_global_ordinal() == 0) fprintf(stderr, "%s: %s\n", prog, what);
}

int precision_setup(const char *prog, const char *value, precision *out)
{
    char line[512];
    static const char *const names[] = { "f32", "bf16-mixed", "bf16" };
    int p = -1;
    for (int i = 0; i < 3; i++) if (!strcmp(value, names[i])) p = i;
    if (p < 0) {
        bool f16 = !strcmp(value, "fp16") || !strcmp(value, "16") || !strcmp(value, "16-mixed") || !strcmp(value, "fp16-mixed");
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
                 "--precision bf16", value, p == PRECISION_F32 ? " (the default)" : "",
                 env && !strcmp(env, "1") ? "XLA_USE_BF16" : "XLA_DOWNCAST_BF16");
        say(prog, line);
        return -1;
    }
    if (p == PRECISION_BF16 && env && !strcmp(env, "0")) {
        say(prog, "--precision bf16 holds every f32 tensor as bf16 (XLA_USE_BF16=1), but the environment sets "
                  "XLA_USE_BF16=0; unset it, or use another --precision");
        return -1;
    }
    if (p == PRECISION_BF16 && setenv("XLA_USE_BF16", "1", 1) != 0) {
        say(prog, "--precision bf16: cannot set XLA_USE_BF16");
        return -1;
    }
    *out = (precision)p;
    return 0;
}
