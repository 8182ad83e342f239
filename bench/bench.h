/* Shared machinery of the cxla-bench subcommands.
 *
 * Every figure compares a measured side with a reference measured in the
 * same run. A run is `rounds` rounds; in each round every side is timed for
 * at least `min_time` seconds (its unit of work repeated as needed). A round
 * is cut into slices of about BENCH_SLICE_S per side, and the sides take
 * turns slice by slice, in forward order in one slice and reverse order in
 * the next (A B, B A, ...), so that drift (a neighbour's load, the host
 * moving a virtual CPU, the disk) hits both alike even when it comes and
 * goes within a round. A figure's JSON line carries the medians over rounds
 * of the value and the reference, the median of the per-round ratios, and
 * their min and max. */
#ifndef CX_BENCH_H
#define CX_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "cx_cli.h"
#include <cxla/spmd.h>
#include <cxla/gpt.h>

#define BENCH_MAX_ROUNDS 100
#define BENCH_MAX_SIDES 8
/* Seconds per side per slice of a round. (In whole 2 s turns, five of the
 * nine 2-rank comm figures of three runs in a row moved more than +-10 %
 * from their median on a 2-vCPU AMD EPYC VM whose host moves the vCPUs;
 * in slices, two did.) */
#define BENCH_SLICE_S 0.25
#define BENCH_MAX_SLICES 16

typedef struct {
    int rounds;
    double min_time;   /* seconds per side per round; 0: one unit */
    /* Multi-rank sides must repeat their unit the same number of times on
     * every rank: given this rank's "enough", returns the decision all ranks
     * follow. NULL: single process. */
    bool (*agree)(bool enough);
} bench_cfg;

/* One side of a comparison. */
typedef struct {
    /* One unit of work; returns the seconds to count (the timed part, so
     * untimed set-up such as dropping the page cache stays out), or a
     * negative number after printing why it failed. */
    double (*unit)(void *ctx);
    /* Instead of `unit`, for a side that times itself over a whole round
     * (ddp: one multi-rank launch per round): returns seconds per unit. */
    double (*whole_round)(void *ctx, const bench_cfg *cfg);
    void *ctx;
} bench_side;

/* Per-round value and reference of one figure. */
typedef struct {
    int n;
    double value[BENCH_MAX_ROUNDS], ref[BENCH_MAX_ROUNDS];
} bench_series;

double bench_now(void);
/* Median of n doubles (sorts in place). */
double bench_median(double *v, int n);

/* Repeats `unit` until the seconds it reports add up to at least
 * cfg->min_time; returns seconds per unit, negative if a unit failed. */
double bench_repeat(const bench_cfg *cfg, double (*unit)(void *), void *ctx);
/* Round `round` of n <= BENCH_MAX_SIDES sides, in slices (alternating
 * order); sec[i] = seconds per unit of sides[i] over the round. A round
 * with a whole_round side, or with min_time 0, is one slice. false if a
 * side failed (it said why) or n is too large. */
bool bench_round(const bench_cfg *cfg, int round, const bench_side *sides, int n, double *sec);

void bench_add(bench_series *s, double value, double ref);
/* Which way a figure improves: a rate's ratio up, a time's or a size's down
 * (a reader of one JSON line cannot tell from the unit alone: the largest
 * model that fits is a size that should grow). */
typedef enum { BENCH_HIGHER, BENCH_LOWER } bench_better;
/* Prints {"bench", "value", "unit", "ref", "ratio", "better", "rounds",
 * "ratio_min", "ratio_max"}: value and ref are medians over rounds, ratio
 * the median of the per-round value/ref, better "higher" or "lower". A
 * number that is not finite prints as null. */
void bench_emit(const char *name, const char *unit, bench_better better, const bench_series *s);

/* Writes the --rounds and --min-time flags (pointing into *cfg) to out[0..1]; returns 2. */
int bench_common_flags(bench_cfg *cfg, cli_flag *out);
/* Parses a subcommand's flags: --rounds and --min-time (defaults: the
 * global flags' values, already in *cfg) and the subcommand's own `extra`.
 * @return -1 to go on, else the exit code (0 after --help, 2 on an error). */
int bench_parse(const char *sub, int argc, char **argv, const cli_flag *extra, int nextra, bench_cfg *cfg);
/* bench_parse, then check(), which reads the parsed flags and returns -1
 * if they go together or prints its one line and returns 2; it runs
 * before the machine line, so a bad combination prints only its error. */
int bench_parse_checked(const char *sub, int argc, char **argv, const cli_flag *extra, int nextra, bench_cfg *cfg,
                        int (*check)(void));
/* What a subcommand compares and how it is run (main.c's table): the help
 * of `cxla-bench SUB --help` and of `cxla-bench --help` alike. */
const char *bench_summary(const char *sub);
/* The subcommand's --rounds when none is given (5 for most). */
int bench_default_rounds(const char *sub);

/* True inside a rank started by mpirun or xla-launch. */
bool bench_in_launched_rank(void);
/* True unless this is a launched rank other than rank 0 (read from the
 * environment, so it works before MPI is up). */
bool bench_is_rank0(void);
/* One line on stderr (rank 0's only): the CPU model, its widest vector
 * extension, the CPU count, the bf16 path, the levels of the f32
 * libraries' kernels, and, outside launched ranks, the cache-line
 * round trip between the first two CPUs now, which on a VM says where the
 * host has put them (bench_machine.c). bench_parse says it at the start of
 * a run, once the flags are good (so not for --help, a bad flag, cache's
 * children or ddp's workers); main says it again at the end of a run that
 * said it at the start and succeeded. */
void bench_machine_start(void);
void bench_machine_end(void);
/* With CX_CPU_ISA below this CPU's level (and OPENBLAS_CORETYPE unset),
 * runs the bench again, argv as given, with OPENBLAS_CORETYPE set to the
 * capped level's core: the library caps its own kernels and oneDNN, but
 * OpenBLAS chose its kernels when it loaded, and the f32 references must
 * be the capped CPU's. Returns only when it did not exec (said why if it
 * failed). */
void bench_cap_openblas(char **argv);

/* ---- shared pieces of work -------------------------------------------------------- */

struct cx_module;
/* The seed's MNIST cnn, as trained by `train --model cnn`. */
struct cx_module *bench_cnn(void);

/* Training steps (forward, backward, SGD with momentum: one graph per step)
 * on MNIST-shaped synthetic batches; the model may be wrapped in DDP. */
typedef struct bench_trainer bench_trainer;
/* Takes the model; runs the warm-up steps (the first compiles). NULL after
 * printing why. */
bench_trainer *bench_trainer_new(struct cx_module *m, int64_t batch, bool ddp);
/* The same under SPMD: every rank passes the global batch (N, 1, 28, 28),
 * split over input_mesh as spec[0..4) says (the model's parameters already
 * marked). */
struct cx_mesh;
bench_trainer *bench_trainer_new_spmd(struct cx_module *m, int64_t global_batch, struct cx_mesh *input_mesh,
                                      const cx_spec_entry *spec);
/* bench_side unit: one step. */
double bench_trainer_step(void *trainer);
/* bf16-mixed from now on (the forward under autocast), then the warm-up
 * steps again. @return false after printing why. */
bool bench_trainer_set_autocast(bench_trainer *t, bool on);
void bench_trainer_free(bench_trainer *t);

/* GPT training steps (the gpt program's default recipe: AdamW, clipping;
 * one graph per step) on synthetic tokens, in one process, under DDP (each
 * rank its own `batch` rows), or under SPMD on a (data, model) mesh (every
 * rank passes the global `batch`, split over data; with model > 1 the
 * blocks split over it, cx_gpt_tensor_parallel), or under FSDPv2 on a
 * (fsdp, model) mesh (the global `batch` split over fsdp, each block
 * wrapped, as gpt --parallel fsdpv2). Runs the warm-up steps.
 * NULL after printing why. */
typedef struct bench_gpt_trainer bench_gpt_trainer;
typedef enum { BENCH_GPT_ONE, BENCH_GPT_DDP, BENCH_GPT_SPMD, BENCH_GPT_FSDPV2 } bench_gpt_par;
bench_gpt_trainer *bench_gpt_trainer_new(cx_gpt_config c, int64_t batch, bench_gpt_par par, const struct cx_mesh *mesh);
/* bench_side unit: one step. */
double bench_gpt_trainer_step(void *trainer);
/* bf16-mixed from now on, then the warm-up steps again. @return false after printing why. */
bool bench_gpt_trainer_set_autocast(bench_gpt_trainer *t, bool on);
/* Bytes of the parameters and optimizer state: this rank's shards (local)
 * or the whole tensors. */
int64_t bench_gpt_trainer_state_bytes(bench_gpt_trainer *t, bool local);
void bench_gpt_trainer_free(bench_gpt_trainer *t);

/* The image-folder loader at ImageNet's shapes (bench_loader.c): a folder
 * of BENCH_LOADER_IMAGES synthetic photo-like JPEGs (500x375, 4:2:0,
 * quality 90, one class), made in a temporary directory and read with the
 * training transform (random-resized 224x224 crops, flip, normalize) by a
 * loader of batch BENCH_LOADER_BATCH with num_workers workers. */
#define BENCH_LOADER_IMAGES 192
#define BENCH_LOADER_BATCH 32
/* Writes the folder into a new temporary directory, its path into dir (64
 * bytes). @return false after printing why. */
bool bench_loader_folder(char *dir);
/* Removes what bench_loader_folder made. */
void bench_loader_folder_remove(const char *dir);
typedef struct bench_loader bench_loader;
/* NULL after printing why. */
bench_loader *bench_loader_new(const char *dir, int num_workers, bool jpeg_fast);
/* bench_side unit: one epoch, every batch taken (decoded, augmented and
 * uploaded), from an empty pipeline; BENCH_LOADER_IMAGES images. */
double bench_loader_epoch(void *loader);
void bench_loader_free(bench_loader *l);
/* One figure over cfg's rounds: the loader's images/s with num_workers
 * (over dir, made by bench_loader_folder) vs `ref`, a side whose unit handles ref_images
 * images: a resnet18 training step of batch 32 (bench_trainer_step, 224x224)
 * makes it the imagefolder_loader_images_per_s. @return 0, or 1
 * after printing why. */
int bench_loader_figure(const bench_cfg *cfg, const char *dir, const char *name, int num_workers, bench_side ref,
                        double ref_images);
/* cxla-bench train's loader figures over dir (made by bench_loader_folder):
 * workers 1 and 2 vs 0, and jpeg_fast vs whole decodes with 2 workers.
 * @return 0, or 1 after printing why. */
int bench_train_loader(const bench_cfg *cfg, const char *dir);

/* cblas_sgemm at n x n x n with as many OpenBLAS threads as cxla uses. */
typedef struct bench_sgemm bench_sgemm;
bench_sgemm *bench_sgemm_new(int n);
/* bench_side unit: one sgemm. */
double bench_sgemm_run(void *sgemm);
double bench_sgemm_flop(const bench_sgemm *g);
/* Around a reference OpenBLAS call: its threads as many as cxla's, then
 * back to 1 with its worker threads stopped, so none spins into the next
 * side's time. */
void bench_openblas_begin(void);
void bench_openblas_end(void);
void bench_sgemm_free(bench_sgemm *g);

/* ---- subcommands ----------------------------------------------------------------- */

int bench_core(int argc, char **argv, bench_cfg cfg);
int bench_ckpt(int argc, char **argv, bench_cfg cfg);
int bench_train(int argc, char **argv, bench_cfg cfg);
int bench_spmd(int argc, char **argv, bench_cfg cfg);
int bench_comm(int argc, char **argv, bench_cfg cfg);
int bench_ddp(int argc, char **argv, bench_cfg cfg);
int bench_fsdp(int argc, char **argv, bench_cfg cfg);
int bench_cache(int argc, char **argv, bench_cfg cfg);
int bench_gpt(int argc, char **argv, bench_cfg cfg);
int bench_precision(int argc, char **argv, bench_cfg cfg);
/* precision's training rows (bench_precision_train.c) */
int bench_precision_gpt(const bench_cfg *cfg);
int bench_precision_cnn(const bench_cfg *cfg);

#endif
