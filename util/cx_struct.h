/* Structs a caller fills and the library reads carry their own size in a
 * leading `struct_size` (docs/api.md, "Growing structs"): a program built
 * against older headers passes a shorter struct, and the library must read
 * only what it holds, taking its defaults for the fields added since. */
#ifndef CX_STRUCT_H
#define CX_STRUCT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* The size of T up to and including `field`: the first version's size when
 * `field` was its last member, which stays the same as members are added. */
#define CX_SIZE_THROUGH(T, field) (offsetof(T, field) + sizeof(((T *)0)->field))

/* Copies the caller's `given` bytes of `src` over `dst` (`full` bytes,
 * holding the defaults); bytes past `full` are members this library does
 * not know and are ignored. @return false, with a message in err, when
 * given is below `min` (0: the caller never set it). */
static inline bool cx_struct_take(void *dst, size_t full, const void *src, size_t given, size_t min, const char *type,
                                  char *err, size_t errn)
{
    if (given < min) {
        snprintf(err, errn, "%s.struct_size is %zu, below its first version's %zu: initialize it with its "
                 "default function or CX_STRUCT_SIZE(%s)", type, given, min, type);
        return false;
    }
    memcpy(dst, src, given < full ? given : full);
    return true;
}

/* The other direction, for a struct the library fills in the caller's
 * memory: `dst`'s own struct_size (the caller's headers) says how many
 * bytes it holds, and only that many of the library's `full` bytes at
 * `src` are written; a caller with newer headers keeps its bytes past
 * `full`. dst->struct_size stays the caller's. @return false, with a
 * message in err and nothing written, when it is below `min`. */
static inline bool cx_struct_give(void *dst, const void *src, size_t full, size_t min, const char *type, char *err,
                                  size_t errn)
{
    size_t given;
    memcpy(&given, dst, sizeof given);
    if (given < min) {
        snprintf(err, errn, "%s.struct_size is %zu, below its first version's %zu: initialize it with its "
                 "default function or CX_STRUCT_SIZE(%s)", type, given, min, type);
        return false;
    }
    size_t n = given < full ? given : full;
    memcpy((char *)dst + sizeof given, (const char *)src + sizeof given, n - sizeof given);
    return true;
}

/* cx_struct_take with the failure reported the way every library entry
 * point reports one: "who: <message>" through report, which is
 * cx_set_last_error (util/ cannot name it; the layers above pass it in
 * CX_TAKE_STRUCT). */
static inline bool cx_struct_take_or_report(void *dst, size_t full, const void *src, size_t given, size_t min,
                                            const char *type, const char *who,
                                            void (*report)(const char *fmt, ...))
{
    char err[256];
    if (cx_struct_take(dst, full, src, given, min, type, err, sizeof err)) return true;
    report("%s: %s", who, err);
    return false;
}

/* Takes the caller's *src (a T whose first version ended at first_last)
 * over dst, which holds the library's defaults. @return false with the
 * error set as "who: ..." when its struct_size is too small. */
#define CX_TAKE_STRUCT(who, T, dst, src, first_last)                                                               \
    cx_struct_take_or_report(&(dst), sizeof(dst), (src), (src)->struct_size, CX_SIZE_THROUGH(T, first_last), #T, (who), \
                             cx_set_last_error)

#endif
