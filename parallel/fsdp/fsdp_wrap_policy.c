/* What FSDP (fsdp.c) and FSDPv2 (fsdp_spmd.c) share when they walk a
 * module tree for their auto-wrap policies: a name in a list, and a
 * submodule's full path. */
#include "fsdp_wrap_policy.h"

#include <stdlib.h>
#include <string.h>

bool cx_fsdp_listed(const char *s, const char *const *list, int n)
{
    for (int i = 0; i < n; i++) if (list[i] && !strcmp(list[i], s)) return true;
    return false;
}

char *cx_fsdp_join_path(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 2);
    if (!p) return NULL;
    if (la) { memcpy(p, a, la); p[la] = '.'; memcpy(p + la + 1, b, lb + 1); }
    else memcpy(p, b, lb + 1);
    return p;
}
