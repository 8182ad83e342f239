/* This thread's last error: every failure's one-line message. */
#include "base.h"

#include <stdarg.h>

static _Thread_local char t_last_error[1024];

const char *cx_last_error(void) { return t_last_error; }
void cx_clear_error(void) { t_last_error[0] = 0; }

void cx_set_last_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_last_error, sizeof t_last_error, fmt, ap);
    va_end(ap);
}
