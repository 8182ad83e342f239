#include "cx_vec.h"

#include <stdint.h>
#include <stdlib.h>

bool cx_grow(void **items, int *cap, int need, size_t elem_size)
{
    if (need <= *cap) return true;
    if (need < 0) return false;
    int c = *cap > 0 ? *cap : 16;
    while (c < need) {
        if (c > INT32_MAX / 2) { c = need; break; }
        c *= 2;
    }
    if ((size_t)c > SIZE_MAX / elem_size) return false;
    void *p = realloc(*items, (size_t)c * elem_size);
    if (!p) return false;
    *items = p;
    *cap = c;
    return true;
}
