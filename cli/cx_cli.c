#include "cx_cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Flag names compare with '_' and '-' as the same character. */
static bool name_eq(const char *a, const char *b, size_t blen)
{
    size_t i = 0;
    for (; i < blen && a[i]; i++) {
        char x = a[i] == '_' ? '-' : a[i], y = b[i] == '_' ? '-' : b[i];
        if (x != y) return false;
    }
    return i == blen && !a[i];
}

void cli_error(const cli_spec *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", s->prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see %s --help)\n", s->prog);
    va_end(ap);
}

static bool has_range(const cli_flag *f) { return f->min != 0 || f->max != 0; }
static bool in_range(const cli_flag *f, double x) { return !has_range(f) || (x >= f->min && x <= f->max); }
/* Integers compare as integers: as doubles, 2^62 + 1 would pass a bound of 2^62. */
static bool int_in_range(const cli_flag *f, long long i)
{
    if (!has_range(f)) return true;
    if (f->min >= 0x1p63 || f->max < -0x1p63) return false;
    if (f->min > -0x1p63 && i < (long long)ceil(f->min)) return false;
    if (f->max < 0x1p63 && i > (long long)floor(f->max)) return false;
    return true;
}

/* "expected an integer in [1, 100], got '0'"; with no upper bound "expected a number >= 0". */
static void range_error(const cli_spec *s, const cli_flag *f, const char *v)
{
    bool integer = f->kind != CLI_DOUBLE;
    const char *what = integer ? "an integer" : "a number";
    if (isinf(f->max))
        cli_error(s, integer ? "--%s: expected %s >= %.0f, got '%s'" : "--%s: expected %s >= %g, got '%s'", f->name,
                  what, f->min, v);
    else
        cli_error(s, integer ? "--%s: expected %s in [%.0f, %.0f], got '%s'" : "--%s: expected %s in [%g, %g], got '%s'",
                  f->name, what, f->min, f->max, v);
}

static bool set_number(const cli_spec *s, const cli_flag *f, const char *v)
{
    char *end;
    errno = 0;
    if (f->kind != CLI_DOUBLE) {
        long long i = strtoll(v, &end, 10);
        if (errno || end == v || *end) { cli_error(s, "--%s: expected an integer, got '%s'", f->name, v); return false; }
        if (!int_in_range(f, i)) { range_error(s, f, v); return false; }
        if (f->kind == CLI_INT) {
            if (i < -2147483647LL - 1 || i > 2147483647LL) { cli_error(s, "--%s: %s is out of range", f->name, v); return false; }
            *(int *)f->dest = (int)i;
        } else {
            *(int64_t *)f->dest = (int64_t)i;
        }
        return true;
    }
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x)) { cli_error(s, "--%s: expected a number, got '%s'", f->name, v); return false; }
    if (!in_range(f, x)) { range_error(s, f, v); return false; }
    *(double *)f->dest = x;
    return true;
}

static bool set_value(const cli_spec *s, const cli_flag *f, const char *v)
{
    switch (f->kind) {
    case CLI_STRING:
        if (!*v) { cli_error(s, "--%s needs a non-empty value", f->name); return false; }
        *(const char **)f->dest = v;
        return true;
    case CLI_CHOICE:
        for (int i = 0; f->choices[i]; i++)
            if (!strcmp(v, f->choices[i])) { *(const char **)f->dest = f->choices[i]; return true; }
        cli_error(s, "--%s: unknown value '%s'", f->name, v);
        return false;
    case CLI_STRINGS: {
        if (!*v) { cli_error(s, "--%s needs a non-empty value", f->name); return false; }
        cli_strings *l = f->dest;
        const char **grown = realloc(l->v, sizeof *grown * ((size_t)l->n + 1));
        if (!grown) { cli_error(s, "--%s: out of memory", f->name); return false; }
        l->v = grown;
        l->v[l->n++] = v;
        return true;
    }
    default:
        return set_number(s, f, v);
    }
}

static const cli_flag *find(const cli_spec *s, const char *name, size_t len)
{
    for (int i = 0; i < s->nflags; i++)
        if (name_eq(s->flags[i].name, name, len)) return &s->flags[i];
    return NULL;
}

/* The spelling and value that last set an entry of the table. */
typedef struct {
    const char *name;    /* as typed: the entry's own name or a synonym's */
    const char *value;   /* NULL: a switch */
    bool preset;         /* a synonym with its value built in */
} cli_seen;

/* Two spellings of one flag (--data mnist --fake_data) that disagree are an
 * error rather than the last one silently winning; the same spelling twice
 * still overrides, as a repeated flag always has. @return false after the line. */
static bool same_or_first(const cli_spec *s, cli_seen *seen, const cli_flag *typed, const char *value)
{
    const char *v = typed->preset ? typed->preset : value;
    bool agree = seen->value && v ? !strcmp(seen->value, v) : seen->value == v;
    if (seen->name && strcmp(seen->name, typed->name) && !agree) {
        /* a preset is named bare, as it is typed (--fake_data) */
        bool bare = !seen->value || seen->preset;
        cli_error(s, "--%s%s%s and --%s%s%s set one flag to different values: give one", seen->name, bare ? "" : " ",
                  bare ? "" : seen->value, typed->name, typed->preset || !v ? "" : " ", typed->preset || !v ? "" : v);
        return false;
    }
    seen->name = typed->name;
    seen->value = v;
    seen->preset = typed->preset != NULL;
    return true;
}

static cli_result parse_args(const cli_spec *s, int argc, char **argv, int *first_positional, cli_seen *seen)
{
    int i = 1;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--")) { i++; break; }
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) { cli_help(s, stdout); return CLI_HELP; }
        if (arg[0] != '-' || !arg[1]) {
            if (s->positionals) break;
            cli_error(s, "unexpected argument '%s'", arg);
            return CLI_ERROR;
        }
        const char *eq = strchr(arg, '=');
        int len = eq ? (int)(eq - arg) : (int)strlen(arg);
        /* a single dash (-np, -n) is not a spelling of any flag */
        const cli_flag *typed = arg[1] == '-' ? find(s, arg + 2, (size_t)len - 2) : NULL;
        if (!typed) { cli_error(s, "unknown flag %.*s", len, arg); return CLI_ERROR; }
        /* the entry that holds the value */
        const cli_flag *target = typed->synonym_of ? find(s, typed->synonym_of, strlen(typed->synonym_of)) : typed;
        if (!target || target->synonym_of) {
            cli_error(s, "--%s: synonym of --%s, which is not a flag of the table", typed->name, typed->synonym_of);
            return CLI_ERROR;
        }
        /* errors name the entry as the help lists it: a synonym by its own name */
        cli_flag named = *target;
        named.name = typed->name;
        const cli_flag *f = &named;
        if (f->given) *f->given = true;
        cli_seen *last = &seen[target - s->flags];
        if (f->kind == CLI_BOOL || typed->preset) {
            if (eq) { cli_error(s, "--%s takes no value", f->name); return CLI_ERROR; }
            if (!same_or_first(s, last, typed, NULL)) return CLI_ERROR;
            if (typed->preset) {
                if (!set_value(s, f, typed->preset)) return CLI_ERROR;
            } else if (f->dest) {
                *(bool *)f->dest = true;
            }
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) { cli_error(s, "--%s needs a value", f->name); return CLI_ERROR; }
        if (!same_or_first(s, last, typed, v)) return CLI_ERROR;
        if (!set_value(s, f, v)) return CLI_ERROR;
    }
    if (first_positional) *first_positional = i;
    return CLI_OK;
}

cli_result cli_parse(const cli_spec *s, int argc, char **argv, int *first_positional)
{
    cli_seen *seen = calloc(s->nflags > 0 ? (size_t)s->nflags : 1, sizeof *seen);
    if (!seen) { cli_error(s, "out of memory parsing the flags"); return CLI_ERROR; }
    cli_result r = parse_args(s, argc, argv, first_positional, seen);
    free(seen);
    return r;
}

static const char *metavar(const cli_flag *f)
{
    if (f->metavar) return f->metavar;
    switch (f->kind) {
    case CLI_INT: case CLI_I64: return "N";
    case CLI_DOUBLE: return "X";
    case CLI_STRING: case CLI_STRINGS: return "VALUE";
    default: return "";
    }
}

static void print_default(const cli_flag *f, FILE *out)
{
    switch (f->kind) {
    case CLI_BOOL: return;
    case CLI_STRINGS: fprintf(out, " (repeatable)"); return;
    case CLI_INT: {
        int v = *(const int *)f->dest;
        if (int_in_range(f, v)) fprintf(out, " (default %d)", v);
        return;
    }
    case CLI_I64: {
        int64_t v = *(const int64_t *)f->dest;
        if (int_in_range(f, (long long)v)) fprintf(out, " (default %lld)", (long long)v);
        return;
    }
    case CLI_DOUBLE: {
        double v = *(const double *)f->dest;
        if (in_range(f, v)) fprintf(out, " (default %g)", v);
        return;
    }
    case CLI_STRING: case CLI_CHOICE: {
        const char *v = *(const char *const *)f->dest;
        if (v) fprintf(out, " (default %s)", v);
        return;
    }
    }
}

/* "--num_epochs N    synonym of --epochs"; a preset: "--fake_data   synonym of --data fake". */
static void help_synonym(const cli_spec *s, const cli_flag *f, FILE *out)
{
    const cli_flag *t = find(s, f->synonym_of, strlen(f->synonym_of));
    char left[96];
    bool value = t && !f->preset && t->kind != CLI_BOOL;
    snprintf(left, sizeof left, "--%s%s%s", f->name, value ? " " : "", value ? metavar(t) : "");
    if (strlen(left) > 32) fprintf(out, "  %s\n  %-32s ", left, "");
    else fprintf(out, "  %-32s ", left);
    fprintf(out, "synonym of --%s%s%s", f->synonym_of, f->preset ? " " : "", f->preset ? f->preset : "");
    if (f->help) fprintf(out, ": %s", f->help);
    fputc('\n', out);
}

void cli_help(const cli_spec *s, FILE *out)
{
    fprintf(out, "usage: %s %s\n", s->prog, s->args ? s->args : "[flags]");
    if (s->summary) fprintf(out, "%s\n", s->summary);
    fprintf(out, "\nflags (--a-b and --a_b are the same flag):\n");
    for (int i = 0; i < s->nflags; i++) {
        const cli_flag *f = &s->flags[i];
        char left[96];
        if (f->synonym_of) {
            help_synonym(s, f, out);
            continue;
        }
        if (f->kind == CLI_CHOICE) {
            int n = snprintf(left, sizeof left, "--%s {", f->name);
            for (int c = 0; f->choices[c] && n < (int)sizeof left; c++)
                n += snprintf(left + n, sizeof left - (size_t)n, "%s%s", c ? "," : "", f->choices[c]);
            if (n < (int)sizeof left) snprintf(left + n, sizeof left - (size_t)n, "}");
        } else {
            snprintf(left, sizeof left, "--%s%s%s", f->name, f->kind == CLI_BOOL ? "" : " ", metavar(f));
        }
        /* a long left column gets a line of its own */
        if (strlen(left) > 32) fprintf(out, "  %s\n  %-32s ", left, "");
        else fprintf(out, "  %-32s ", left);
        for (const char *h = f->help ? f->help : ""; *h; h++) {
            fputc(*h, out);
            if (*h == '\n') fprintf(out, "  %-32s ", "");
        }
        print_default(f, out);
        fputc('\n', out);
    }
    fprintf(out, "  %-32s this text\n", "--help");
    if (s->epilog) fprintf(out, "\n%s\n", s->epilog);
}
