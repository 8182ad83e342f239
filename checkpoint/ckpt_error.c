/* The checkpoint module's error setter. */
#include "ckpt_internal.h"

#include <stdarg.h>

cx_status ckpt_fail(cx_status st, const char *fmt, ...)
{
    /* formatted apart first: cx_set_last_error writes the buffer that a
     * quoted cx_last_error() points into */
    char msg[9000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cx_set_last_error("%s", msg);
    return st;
}
