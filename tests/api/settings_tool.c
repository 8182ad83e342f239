/* The settings table from outside: `--markdown` prints the README's table
 * of variables (check_settings_doc.sh compares), `--get NAME` reads NAME
 * through the typed getter the library uses and prints its value, so a bad
 * value's line is the library's own (check_settings_line.sh). */
#include "cx_settings.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static int get(const char *name)
{
    int n;
    const cx_setting *t = cx_settings_table(&n);
    for (int i = 0; i < n; i++) {
        if (strcmp(t[i].name, name)) continue;
        switch (t[i].type) {
        case CX_SET_BOOL: printf("%d\n", cx_setting_bool(name)); break;
        case CX_SET_INT:
        case CX_SET_BYTES: printf("%" PRId64 "\n", cx_setting_int(name)); break;
        case CX_SET_DOUBLE: printf("%.15g\n", cx_setting_double(name)); break;
        case CX_SET_ENUM: printf("%d\n", cx_setting_enum(name)); break;
        case CX_SET_STRING: printf("%s\n", cx_setting_str(name) ? cx_setting_str(name) : "(unset)"); break;
        }
        return 0;
    }
    fprintf(stderr, "settings_tool: %s is not in the table\n", name);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--markdown")) {
        cx_settings_markdown(stdout);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "--get")) return get(argv[2]);
    fprintf(stderr, "usage: settings_tool --markdown | --get NAME\n");
    return 2;
}
