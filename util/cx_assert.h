/* CX_ASSERT: the always-on check for programmer bugs inside the library (a
 * violated internal invariant, never a user error: those are cx_status
 * returns or poisoned tensors). Every layer may include this folder. */
#ifndef CX_UTIL_ASSERT_H
#define CX_UTIL_ASSERT_H

#include <stdio.h>
#include <stdlib.h>

#define CX_ASSERT(cond)                                                              \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "cxla: internal assertion failed at %s:%d: %s\n",       \
                    __FILE__, __LINE__, #cond);                                      \
            abort();                                                                 \
        }                                                                            \
    } while (0)

#endif
