/* This thread's last error: every failure's one-line message. */
#include "base.h"

#include <stdarg.h>
#include <string.h>

static _Thread_local char t_last_error[1024];

const char *cx_last_error(void) { return t_last_error; }
void cx_clear_error(void) { t_last_error[0] = 0; }

void cx_set_last_error(const char *fmt, ...)
{
    /* Callers prefix the previous message ("%s: more", cx_last_error()):
     * formatting straight into the buffer would read it while writing it. */
    char tmp[sizeof t_last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(t_last_error, tmp, strlen(tmp) + 1);
}

const char *cx_status_str(cx_status s)
{
    switch (s) {
    case CX_OK: return "CX_OK";
    case CX_ERR_SHAPE: return "CX_ERR_SHAPE";
    case CX_ERR_ARG: return "CX_ERR_ARG";
    case CX_ERR_OOM: return "CX_ERR_OOM";
    case CX_ERR_IO: return "CX_ERR_IO";
    case CX_ERR_COMM: return "CX_ERR_COMM";
    case CX_ERR_STATE: return "CX_ERR_STATE";
    }
    return "CX_ERR_UNKNOWN";
}
