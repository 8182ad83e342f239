/* Growable arrays: one doubling policy for every list the library builds
 * (graph nodes, kernels, slots, closures, checkpoint entries, ...). */
#ifndef CX_UTIL_VEC_H
#define CX_UTIL_VEC_H

#include <stdbool.h>
#include <stddef.h>

/* Makes room for `need` elements of `elem_size` bytes in *items (capacity
 * *cap, doubled from 16 as needed). @return true on success; false when out
 * of memory or the size overflows, leaving *items and *cap unchanged. */
bool cx_grow(void **items, int *cap, int need, size_t elem_size);

/* CX_GROW(arr, cap, need): cx_grow for a typed pointer `arr`. */
#define CX_GROW(arr, cap, need) cx_grow((void **)&(arr), &(cap), (need), sizeof *(arr))

#endif
