/* Learning curves from a program's --log-file (one JSON object a line, each
 * with a "step"), drawn with gnuplot: gpt plot and train plot. */
#ifndef CX_EXAMPLES_LEARNING_CURVE_H
#define CX_EXAMPLES_LEARNING_CURVE_H

#include <stdbool.h>
#include <stddef.h>

/* One curve: the values of `key` against their line's "step". */
typedef struct {
    const char *key;        /* "loss", "val_loss", "test_accuracy" */
    const char *title;      /* in the legend */
    bool points;            /* sparse values (evaluations): lines with points */
    bool right_axis;        /* on the right-hand y axis */
} lc_series;

typedef struct {
    const char *prog;       /* messages start with it: "gpt plot" */
    const char *log_file;   /* F.jsonl */
    const char *out;        /* F.png or F.svg: the terminal follows the name */
    const char *ylabel;
    const char *y2label;    /* the right-hand axis, NULL: none */
    const lc_series *series;
    int nseries;            /* at most LC_MAX_SERIES */
} lc_plot_spec;

#define LC_MAX_SERIES 8

/* Draws the curves that have points into p->out (a notice line for each
 * series without one; null and non-finite values are not points) and
 * prints "wrote OUT".
 * @return 0, or the exit code with its one line on stderr: 2 for an --out
 * that is neither .png nor .svg or whose directory cannot be written, 3
 * for a log file unreadable, holding no line with a step or no finite
 * value, 1 when gnuplot cannot be started (the line says how to install
 * it) or fails (the line is gnuplot's last message). */
int lc_plot(const lc_plot_spec *p);

/* x formatted with fmt into buf, or "null" for a non-finite x (JSON has no
 * NaN or Infinity): the writers of the log files both programs plot.
 * @return buf or the literal. */
const char *lc_json_num(char *buf, size_t cap, const char *fmt, double x);

#endif
