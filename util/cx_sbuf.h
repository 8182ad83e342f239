/* A growable string for reports, dumps and messages. Start from
 * (cx_sbuf){0}; an allocation failure sets `oom` and later appends do
 * nothing, so callers check once at the end. */
#ifndef CX_UTIL_SBUF_H
#define CX_UTIL_SBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} cx_sbuf;

/* Appends printf-style. */
void cx_sb_printf(cx_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends `n` bytes of `s`. */
void cx_sb_append(cx_sbuf *b, const char *s, size_t n);
/* @return the string (the caller frees it; "" when nothing was appended),
 * or NULL after an allocation failure (the buffer is freed either way). */
char *cx_sb_finish(cx_sbuf *b);

#endif
