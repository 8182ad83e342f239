/* cxla's diagnostics and settings: the one logger every part of the library
 * writes through, and the check of its environment variables.
 *
 * By default a diagnostic is one line on stderr: "cxla: MESSAGE" for an
 * error, "cxla: warning: ", "cxla: notice: " or "cxla: debug: " before the
 * message for the other levels. Which lines are shown:
 *   CX_LOG_LEVEL=error|warning|info|debug (or 0-3 in that order; default
 *       info): the most verbose level shown. Errors are always shown.
 *   CX_LOG_MODULES=module=level,...  a level of its own for each named
 *       module (above or below CX_LOG_LEVEL), e.g. "shm=debug,settings=0".
 * Both are read at the first diagnostic. A bad value of either is itself
 * reported in one error line and the default used.
 *
 * Every environment variable of the library (the README's table) is read
 * through one table: a set variable whose value does not parse or lies out
 * of range is reported once per process, in one error line naming the
 * variable, the value and what is expected ("bad CX_COLLECTIVE_TIMEOUT 'x':
 * want ..."), and the default is used. xla-launch prints the same line and
 * does not start the job; a program may do the same with cx_settings_check.
 */
#ifndef CXLA_LOGGING_H
#define CXLA_LOGGING_H

#include <cxla/export.h>

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CX_LOG_ERROR = 0, CX_LOG_WARNING = 1, CX_LOG_INFO = 2, CX_LOG_DEBUG = 3 } cx_log_level;

/* Receives one diagnostic that passed the filters: its level, the module
 * that wrote it ("shm", "runtime", "settings", ...), the message without
 * the "cxla: " and level prefix or a newline (both borrowed for the call
 * only: copy them to keep them), and the user pointer given
 * to cx_log_set_handler. Calls are serialized (the library logs from its
 * progress and loader threads too), so a handler needs no lock of its own;
 * it must not call cx_log_set_handler. A diagnostic the handler's own
 * library calls cause goes to stderr. */
typedef void (*cx_log_handler)(cx_log_level level, const char *module, const char *message, void *user);

/* Sends the library's diagnostics to fn (with user) from now on instead of
 * stderr; fn == NULL restores the stderr lines. Thread-safe: returns after
 * any call of the previous handler has returned. No error cases. */
CX_API void cx_log_set_handler(cx_log_handler fn, void *user);

/* Checks every library environment variable that is set (non-empty).
 * @return true when all parse; false with the first bad one's line
 * ("bad NAME 'VALUE': want ...", no prefix or newline) written into
 * msg[cap] (truncated to fit; msg may be NULL when cap is 0). Logs
 * nothing: the caller decides whether a bad value stops it. */
CX_API bool cx_settings_check(char *msg, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
