/* Shared helpers for cxla-bench subcommands. */
#ifndef CX_BENCH_H
#define CX_BENCH_H

#include <stdint.h>

double bench_now(void);
/* Median of n doubles (sorts in place). */
double bench_median(double *v, int n);
/* Prints {"bench": NAME, "value": X, "unit": U, "ref": R, "ratio": X/R}. */
void bench_emit(const char *name, double value, const char *unit, double ref);

struct cx_module;
/* The seed's MNIST cnn, as trained by `train --model cnn`. */
struct cx_module *bench_cnn(void);

int bench_core(int argc, char **argv);
int bench_ckpt(int argc, char **argv);
int bench_train(int argc, char **argv);
int bench_comm(int argc, char **argv);
int bench_ddp(int argc, char **argv);
int bench_fsdp(int argc, char **argv);
int bench_cache(int argc, char **argv);

#endif
