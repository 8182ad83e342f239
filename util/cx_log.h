/* The library's logger (the public side is include/cxla/logging.h): every
 * diagnostic the library prints goes through cx_logf, so one filter
 * (CX_LOG_LEVEL, CX_LOG_MODULES) and one handler govern them all. */
#ifndef CX_UTIL_LOG_H
#define CX_UTIL_LOG_H

#include <cxla/logging.h>

#include <stdbool.h>

/* Formats one diagnostic of `module` and hands it to the handler (or
 * writes "cxla: [level: ]message\n" to stderr in one write) when the
 * filters let `level` through. Never fails: a message longer than 1 KiB
 * is truncated. */
void cx_logf(cx_log_level level, const char *module, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* @return whether a diagnostic of `level` from `module` would be shown,
 * for callers whose message is costly to build. */
bool cx_log_enabled(cx_log_level level, const char *module);

/* Reads CX_LOG_LEVEL and CX_LOG_MODULES again (they are otherwise read
 * once, at the first diagnostic) and reports a bad value of either. */
void cx_log_reload(void);

/* @return whether `text` is a valid CX_LOG_MODULES list. */
bool cx_log_modules_valid(const char *text);

#endif
