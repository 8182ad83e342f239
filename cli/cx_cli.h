/* Command-line flags for the project's programs (train, gpt,
 * consolidate_ckpts, xla-launch, cxla-bench): one parser, one help format,
 * one error format. A program lists its flags in a table whose `dest`
 * pointers hold the defaults; cli_parse overwrites those it is given.
 *
 * Spellings: --batch-size and --batch_size are the same flag; a value
 * follows as --flag=V or --flag V; a bool flag takes no value. Any other
 * argument starting with '-' is taken for a (mistyped) flag, not a
 * positional: "-np 4" is an error, "--" lets a positional start with '-'.
 *
 * Synonyms: another program's spelling of a flag (train takes the seed's
 * --num_epochs for --epochs, --fake_data for --data fake) is a table entry
 * of its own with `synonym_of` naming the flag it stands for; with a
 * `preset` it takes no value and means --<synonym_of> <preset>. The help
 * lists it as "synonym of --epochs"; its errors name it by its own name. */
#ifndef CX_CLI_H
#define CX_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    CLI_BOOL,     /* bool *: set to true when given; dest NULL: accepted and ignored
                   * (a spelling other programs' command lines pass) */
    CLI_INT,      /* int * */
    CLI_I64,      /* int64_t * */
    CLI_DOUBLE,   /* double * */
    CLI_STRING,   /* const char **: points into argv */
    CLI_CHOICE,   /* const char **: one of `choices` (the table's string) */
    CLI_STRINGS,  /* cli_strings *: repeatable, each value appended; free(.v) after use */
} cli_kind;

/* The values of a CLI_STRINGS flag in the order given (pointers into argv). */
typedef struct {
    const char **v;
    int n;
} cli_strings;

typedef struct {
    const char *name;              /* without the dashes, '-' between words (another program's
                                    * flag may keep its '_': the help shows the name as written) */
    cli_kind kind;
    void *dest;
    const char *metavar;           /* shown in the help ("N", "DIR"); NULL: from the kind */
    const char *help;              /* one line (more lines: embedded '\n') */
    double min, max;               /* numeric kinds: accepted range (min == max == 0: any; max
                                    * INFINITY: no upper bound). The help shows a default only
                                    * inside it, so an out-of-range default means "not given". */
    const char *const *choices;    /* CLI_CHOICE: NULL-terminated list */
    bool *given;                   /* optional: set when the flag appears */
    /* A synonym: the name of the entry it stands for (kind, dest, given and
     * range are that entry's; this one's are not used). */
    const char *synonym_of;
    const char *preset;            /* synonym only: takes no value, gives this one */
} cli_flag;

typedef struct {
    const char *prog;              /* name in messages: "train" */
    const char *args;              /* after the name in the usage line: "[flags]" */
    const char *summary;           /* printed under the usage line, may be NULL */
    const char *epilog;            /* printed after the flags (exit codes), may be NULL */
    const cli_flag *flags;
    int nflags;
    /* false: any non-flag argument is an error. true: parsing stops at the
     * first one (xla-launch PROGRAM ARGS..., cxla-bench SUBCOMMAND). */
    bool positionals;
} cli_spec;

typedef enum {
    CLI_OK = 0,      /* parsed; *first_positional = index of the first non-flag argument, or argc */
    CLI_HELP,        /* --help / -h: the help went to stdout; the program exits 0 */
    CLI_ERROR,       /* one line "prog: ... (see prog --help)" went to stderr; the program exits 2 */
} cli_result;

/* Parses argv[1..argc). "--" ends the flags. A flag repeated under one
 * spelling takes its last value; two spellings of one flag (a synonym and
 * its target) with different values are an error naming both.
 * @return a cli_result (CLI_ERROR also when out of memory). */
cli_result cli_parse(const cli_spec *spec, int argc, char **argv, int *first_positional);

/* One line "prog: <message> (see prog --help)" on stderr, for the checks a
 * program makes after cli_parse (a required flag, two that exclude each
 * other); the program then exits 2 as for a parse error. */
void cli_error(const cli_spec *spec, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints the usage line, the summary, one line per flag with its default
 * (the value `dest` holds now), and the epilog. */
void cli_help(const cli_spec *spec, FILE *f);

#endif
