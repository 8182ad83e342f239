#include "cx_sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(cx_sbuf *b, size_t extra)
{
    if (b->oom) return false;
    if (b->s && b->n + extra < b->cap) return true;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->n + extra + 1) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) { b->oom = true; return false; }
    b->s = s;
    b->cap = cap;
    return true;
}

void cx_sb_printf(cx_sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) { b->oom = true; return; }
    if (!reserve(b, (size_t)k)) return;
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

void cx_sb_append(cx_sbuf *b, const char *s, size_t n)
{
    if (!reserve(b, n)) return;
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

char *cx_sb_finish(cx_sbuf *b)
{
    if (b->oom) { free(b->s); *b = (cx_sbuf){ 0 }; return NULL; }
    char *s = b->s ? b->s : strdup("");
    *b = (cx_sbuf){ 0 };
    return s;
}
