/* The logger (cx_log.h, include/cxla/logging.h). Two locks: g_cfg_mu for
 * the filters, g_out_mu around the output, so a handler that makes the
 * library log again finds the filters free (its line then goes to stderr,
 * see t_in_handler) and lines from several threads never interleave. */
#include "cx_log.h"

#include "cx_settings.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define MAX_MODULES 32

typedef struct {
    char name[32];
    int level;
} module_level;

static pthread_mutex_t g_cfg_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool g_loaded;
static int g_level = CX_LOG_INFO;
static module_level g_mods[MAX_MODULES];
static int g_nmods;

static pthread_mutex_t g_out_mu = PTHREAD_MUTEX_INITIALIZER;
static cx_log_handler g_fn;
static void *g_user;
static _Thread_local bool t_in_handler;

static int parse_level(const char *s, size_t n)
{
    static const char *const names[] = { "error", "warning", "info", "debug" };
    for (int i = 0; i < 4; i++)
        if (strlen(names[i]) == n && !strncasecmp(s, names[i], n)) return i;
    if (n == 1 && s[0] >= '0' && s[0] <= '3') return s[0] - '0';
    return -1;
}

/* "module=level,...": the entries into mods (when not NULL). @return their
 * number, or -1 when the text is not such a list */
static int parse_modules(const char *s, module_level *mods)
{
    int n = 0;
    while (*s) {
        size_t len = strcspn(s, ",");
        const char *eq = memchr(s, '=', len);
        size_t name_len = eq ? (size_t)(eq - s) : 0;
        if (!eq || name_len == 0 || name_len >= sizeof mods->name || n >= MAX_MODULES) return -1;
        int level = parse_level(eq + 1, len - name_len - 1);
        if (level < 0) return -1;
        if (mods) {
            memcpy(mods[n].name, s, name_len);
            mods[n].name[name_len] = '\0';
            mods[n].level = level;
        }
        n++;
        s += len + (s[len] == ',');
    }
    return n;
}

bool cx_log_modules_valid(const char *text) { return parse_modules(text, NULL) >= 0; }

/* The filters from the environment; bad values are left in errs for the
 * caller to report once the lock is released (reporting takes it). */
static int load_locked(char errs[2][512])
{
    int nerr = 0;
    cx_setting_value v;
    if (cx_setting_read("CX_LOG_LEVEL", &v, errs[nerr], sizeof errs[nerr]) < 0) nerr++;
    g_level = v.e;
    g_nmods = 0;
    if (cx_setting_read("CX_LOG_MODULES", &v, errs[nerr], sizeof errs[nerr]) < 0) nerr++;
    else if (v.s) g_nmods = parse_modules(v.s, g_mods);
    return nerr;
}

static void write_stderr(cx_log_level level, const char *msg)
{
    static const char *const prefix[] = { "", "warning: ", "notice: ", "debug: " };
    char line[1200];
    int n = snprintf(line, sizeof line, "cxla: %s%s\n", prefix[level], msg);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    if (len && line[len - 1] != '\n') line[len - 1] = '\n';
    /* one write per line: ranks and threads share the terminal */
    for (size_t off = 0; off < len;) {
        ssize_t w = write(2, line + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        off += (size_t)w;
    }
}

static void deliver(cx_log_level level, const char *module, const char *msg)
{
    if (t_in_handler) {
        write_stderr(level, msg);
        return;
    }
    pthread_mutex_lock(&g_out_mu);
    if (g_fn) {
        t_in_handler = true;
        g_fn(level, module, msg, g_user);
        t_in_handler = false;
    } else {
        write_stderr(level, msg);
    }
    pthread_mutex_unlock(&g_out_mu);
}

static bool enabled_locked(cx_log_level level, const char *module)
{
    if (level == CX_LOG_ERROR) return true;
    for (int i = 0; module && i < g_nmods; i++)
        if (!strcmp(g_mods[i].name, module)) return (int)level <= g_mods[i].level;
    return (int)level <= g_level;
}

static void report(char errs[2][512], int nerr)
{
    char line[600];
    for (int i = 0; i < nerr; i++) {
        snprintf(line, sizeof line, "%s; the value is ignored", errs[i]);
        deliver(CX_LOG_ERROR, "settings", line);
    }
}

static void ensure_loaded(void)
{
    if (atomic_load_explicit(&g_loaded, memory_order_acquire)) return;
    char errs[2][512];
    int nerr = 0;
    pthread_mutex_lock(&g_cfg_mu);
    if (!atomic_load_explicit(&g_loaded, memory_order_relaxed)) {
        nerr = load_locked(errs);
        atomic_store_explicit(&g_loaded, true, memory_order_release);
    }
    pthread_mutex_unlock(&g_cfg_mu);
    report(errs, nerr);
}

void cx_log_reload(void)
{
    char errs[2][512];
    pthread_mutex_lock(&g_cfg_mu);
    int nerr = load_locked(errs);
    atomic_store_explicit(&g_loaded, true, memory_order_release);
    pthread_mutex_unlock(&g_cfg_mu);
    report(errs, nerr);
}

bool cx_log_enabled(cx_log_level level, const char *module)
{
    ensure_loaded();
    pthread_mutex_lock(&g_cfg_mu);
    bool on = enabled_locked(level, module);
    pthread_mutex_unlock(&g_cfg_mu);
    return on;
}

void cx_logf(cx_log_level level, const char *module, const char *fmt, ...)
{
    if ((unsigned)level > CX_LOG_DEBUG || !cx_log_enabled(level, module)) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    deliver(level, module, msg);
}

void cx_log_set_handler(cx_log_handler fn, void *user)
{
    pthread_mutex_lock(&g_out_mu);
    g_fn = fn;
    g_user = user;
    pthread_mutex_unlock(&g_out_mu);
}
