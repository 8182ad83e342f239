/* The library's environment variables, in one table: each one's type,
 * default, range and documentation, read by the typed getters below and
 * checked by cx_settings_check (include/cxla/logging.h). The README's table
 * of variables is printed from it (cx_settings_markdown), and xla-launch
 * checks the same table before it starts any rank. */
#ifndef CX_UTIL_SETTINGS_H
#define CX_UTIL_SETTINGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { CX_SET_BOOL, CX_SET_INT, CX_SET_DOUBLE, CX_SET_BYTES, CX_SET_STRING, CX_SET_ENUM } cx_setting_type;

typedef struct {
    const char *name;
    cx_setting_type type;
    const char *def;      /* the default as a user would write it (parsed by the same code); NULL: none */
    double min, max;      /* INT, DOUBLE, BYTES */
    const char *choices;  /* ENUM: "a|b|c"; the getter returns the index */
    bool numbered;        /* ENUM: 0, 1, ... also name the choices in order */
    bool (*valid)(const char *text);  /* STRING with a syntax of its own, else NULL */
    const char *want;     /* STRING: what is expected, else "any text" */
    const char *doc;      /* one line for the README */
} cx_setting;

typedef struct {
    bool b;
    int64_t i;     /* INT, BYTES */
    double d;
    int e;         /* ENUM: index into choices */
    const char *s; /* STRING: the environment's text or the default; NULL when neither */
} cx_setting_value;

/* Reads `name` (which must be in the table: a programmer error aborts)
 * without logging. @return 0 when unset or empty, 1 when set and valid,
 * -1 when set but bad: then err[errn] holds "bad NAME 'VALUE': want ...".
 * *out holds the value, or the default when unset or bad. */
int cx_setting_read(const char *name, cx_setting_value *out, char *err, size_t errn);

/* The typed getters: the value, or the default when unset or bad. A bad
 * value is reported once per process (one error line, module "settings").
 * The type must match the table's (BYTES reads as an int). */
bool cx_setting_bool(const char *name);
int64_t cx_setting_int(const char *name);
double cx_setting_double(const char *name);
int cx_setting_enum(const char *name);
const char *cx_setting_str(const char *name);

/* @return whether `name` is set to a non-empty value (valid or not). */
bool cx_setting_is_set(const char *name);

/* @return the table, its length in *n. */
const cx_setting *cx_settings_table(int *n);

/* Writes the README's table of variables (markdown, one row each). */
void cx_settings_markdown(FILE *f);

/* Forgets which bad values were reported (tests). */
void cx_settings_reset_reports(void);

#endif
