/* The settings table (util/cx_settings.c): every default parses, each type
 * reads its values, a bad value is one line naming the variable, the value
 * and what is expected, said once, and the default is used. */
#include "cx_log.h"
#include "cx_settings.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static char g_lines[8][512];
static int g_n;

static void keep(cx_log_level level, const char *module, const char *message, void *user)
{
    (void)user;
    cr_assert_eq(level, CX_LOG_ERROR);
    cr_assert_str_eq(module, "settings");
    if (g_n < 8) snprintf(g_lines[g_n], sizeof g_lines[g_n], "%s", message);
    g_n++;
}

static void init(void)
{
    int n;
    const cx_setting *t = cx_settings_table(&n);
    for (int i = 0; i < n; i++) unsetenv(t[i].name);
    cx_log_set_handler(keep, NULL);
}

TestSuite(settings, .init = init);

Test(settings, defaults_parse_and_nothing_set_is_valid)
{
    int n;
    const cx_setting *t = cx_settings_table(&n);
    cr_assert_geq(n, 20);
    for (int i = 0; i < n; i++) {
        cx_setting_value v;
        cr_assert_eq(cx_setting_read(t[i].name, &v, NULL, 0), 0, "%s", t[i].name);
        cr_assert(t[i].doc && *t[i].doc, "%s has no doc line", t[i].name);
    }
    cr_assert(cx_settings_check(NULL, 0));
    cr_assert_eq(cx_setting_double("CX_COLLECTIVE_TIMEOUT"), 300);
    cr_assert_eq(cx_setting_int("CX_SHM_CHUNK_KIB"), 1024);
    cr_assert_eq(cx_setting_int("CX_BUFFER_CACHE_BYTES"), (int64_t)2 << 30);
    cr_assert(cx_setting_bool("CX_DESYNC_CHECK"));
    cr_assert_null(cx_setting_str("CX_CACHE_DIR"));
    cr_assert_eq(g_n, 0);
}

Test(settings, values_of_each_type)
{
    setenv("CX_DESYNC_CHECK", "off", 1);
    cr_assert(!cx_setting_bool("CX_DESYNC_CHECK"));
    setenv("CX_DESYNC_CHECK", "True", 1);
    cr_assert(cx_setting_bool("CX_DESYNC_CHECK"));
    setenv("CX_SHM_CHUNK_KIB", "4", 1);
    cr_assert_eq(cx_setting_int("CX_SHM_CHUNK_KIB"), 4);
    setenv("CX_COLLECTIVE_TIMEOUT", "2.5", 1);
    cr_assert_eq(cx_setting_double("CX_COLLECTIVE_TIMEOUT"), 2.5);
    setenv("CX_MEMORY_LIMIT", "2G", 1);
    cr_assert_eq(cx_setting_int("CX_MEMORY_LIMIT"), 2000000000);
    setenv("CX_MEMORY_LIMIT", "512 MiB", 1);
    cr_assert_eq(cx_setting_int("CX_MEMORY_LIMIT"), 512 << 20);
    setenv("CX_MEMORY_LIMIT", "180MB", 1);
    cr_assert_eq(cx_setting_int("CX_MEMORY_LIMIT"), 180000000);
    setenv("CX_SHM_SLOT_WRITES", "streamed", 1);
    cr_assert_eq(cx_setting_enum("CX_SHM_SLOT_WRITES"), 2);
    setenv("CX_LOG_LEVEL", "1", 1);
    cr_assert_eq(cx_setting_enum("CX_LOG_LEVEL"), 1, "a numbered enum");
    setenv("CX_SHM_COLLECTIVES", "all", 1);
    cr_assert_eq(cx_setting_enum("CX_SHM_COLLECTIVES"), 2);
    setenv("CX_CACHE_DIR", "/tmp/c", 1);
    cr_assert_str_eq(cx_setting_str("CX_CACHE_DIR"), "/tmp/c");
    setenv("CX_CACHE_DIR", "", 1);
    cr_assert_null(cx_setting_str("CX_CACHE_DIR"), "empty is unset");
    cr_assert(!cx_setting_is_set("CX_CACHE_DIR"));
    cr_assert(cx_settings_check(NULL, 0));
    cr_assert_eq(g_n, 0);
}

Test(settings, a_bad_value_is_one_line_and_the_default)
{
    static const struct { const char *name, *value, *line; } cases[] = {
        { "CX_COLLECTIVE_TIMEOUT", "abc", "bad CX_COLLECTIVE_TIMEOUT 'abc': want a number >= 0 (default 300)" },
        { "CX_COLLECTIVE_TIMEOUT", "-1", "bad CX_COLLECTIVE_TIMEOUT '-1': want a number >= 0 (default 300)" },
        { "CX_SHM_CHUNK_KIB", "2", "bad CX_SHM_CHUNK_KIB '2': want an integer from 4 to 65536 (default 1024)" },
        { "CX_SHM_CHUNK_KIB", "64x", "bad CX_SHM_CHUNK_KIB '64x': want an integer from 4 to 65536 (default 1024)" },
        { "CX_DESYNC_CHECK", "maybe", "bad CX_DESYNC_CHECK 'maybe': want 1/0, true/false, on/off or yes/no (default 1)" },
        { "XLA_SAVE_TENSORS_FMT", "svg", "bad XLA_SAVE_TENSORS_FMT 'svg': want one of text, dot, hlo (default text)" },
        { "CX_MEMORY_LIMIT", "2Q", "bad CX_MEMORY_LIMIT '2Q': want a size such as 2G or 512MiB (k, M, G: 1000s; "
                                   "KiB, MiB, GiB: 1024s) (default 0)" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv(cases[i].name, cases[i].value, 1);
        char msg[512];
        cr_assert(!cx_settings_check(msg, sizeof msg));
        cr_assert_str_eq(msg, cases[i].line);
        cx_setting_value v;
        cr_assert_eq(cx_setting_read(cases[i].name, &v, msg, sizeof msg), -1);
        cr_assert_str_eq(msg, cases[i].line);
        unsetenv(cases[i].name);
    }
    cr_assert_eq(g_n, 0, "reading and checking log nothing");
}

Test(settings, getters_report_a_bad_value_once)
{
    setenv("CX_SHM_CHUNK_KIB", "2", 1);
    cr_assert_eq(cx_setting_int("CX_SHM_CHUNK_KIB"), 1024, "the default");
    cr_assert_eq(cx_setting_int("CX_SHM_CHUNK_KIB"), 1024);
    cr_assert_eq(g_n, 1, "%d lines", g_n);
    cr_assert_str_eq(g_lines[0], "bad CX_SHM_CHUNK_KIB '2': want an integer from 4 to 65536 (default 1024); "
                                 "the value is ignored");
    setenv("CX_COLLECTIVE_TIMEOUT", "soon", 1);
    cr_assert_eq(cx_setting_double("CX_COLLECTIVE_TIMEOUT"), 300);
    cr_assert_eq(g_n, 2, "another variable has its own line");
    cx_settings_reset_reports();
    cr_assert_eq(cx_setting_int("CX_SHM_CHUNK_KIB"), 1024);
    cr_assert_eq(g_n, 3);
}

Test(settings, markdown_has_a_row_per_variable)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cx_settings_markdown(f);
    fclose(f);
    int n, rows = 0;
    const cx_setting *t = cx_settings_table(&n);
    for (char *p = buf; (p = strstr(p, "\n| `")); p++) rows++;
    cr_assert_eq(rows, n);
    for (int i = 0; i < n; i++) {
        char cell[80];
        snprintf(cell, sizeof cell, "| `%s` |", t[i].name);
        cr_assert_not_null(strstr(buf, cell), "%s", t[i].name);
    }
    free(buf);
}
