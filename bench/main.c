/* cxla-bench SUBCOMMAND: reproducible benchmarks, one JSON object per line,
 * each figure with a reference measured in the same run. */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv, bench_cfg cfg);
    const char *summary;   /* how it is run, then what each figure compares */
    int rounds;            /* default --rounds (0: 5) */
    double min_time;       /* default --min-time (0: 2 s) */
} subcommand;

static const subcommand g_subcommands[] = {
    { "core", bench_core,
      "Run directly.\n"
      "fused_elementwise_gbps: relu(a*b+c) over 64 MiB operands through the core vs the same loop in C on as many threads\n"
      "matmul_gflops: a 2048^2 matmul through the core vs cblas_sgemm with as many threads\n"
      "cache_hit_overhead_us: trace, key and lookup of a 100-node step vs a fixed 50 us (a target, not measured)\n"
      "ir_debug_cache_hit_us: the same step with XLA_IR_DEBUG=1 (each node records its call site) vs off", 0, 0 },
    { "train", bench_train,
      "Run directly.\n"
      "train_*_images_per_s: training steps of the cnn (batch 64, 256) and a 4096-wide mlp (batch 256),\n"
      "at 1 and 2 threads, vs the GEMM-bound limit: model FLOPs over the cblas_sgemm rate measured in the same round\n"
      "resnet50_fake_images_per_s: resnet50 training steps at 224x224, batch 32, 2 threads (fake ImageNet-shaped\n"
      "batches, SGD momentum) vs the GEMM-bound limit of its convolutions and fc (at most 3 rounds of one step;\n"
      "--resnet-only runs only this figure)\n"
      "imagefolder_loader_w0_images_per_s: decode + augment + upload rate of the image-folder loader (224x224 training\n"
      "crops of 500x375 photo-like JPEGs, batch 32) on its one thread; _w1_vs_w0, _w2_vs_w0: with 1 and 2 workers\n"
      "vs that; _w2_fast_vs_whole: 2 workers with jpeg_fast (partial and DCT-scaled JPEG decoding) vs without\n"
      "imagefolder_loader_images_per_s: the loader's rate with 2 workers vs resnet18 training steps at 224x224,\n"
      "batch 32, 2 threads (fake batches; at most 3 rounds; --loader-only runs only the loader figures)", 0, 0 },
    { "gpt", bench_gpt,
      "Run directly.\n"
      "gpt_tokens_per_s: training steps of the gpt program's default model (4 layers, n_embd 256, block 128,\n"
      "batch 16; AdamW, clip) vs the GEMM-bound limit: matmul flops per token over the cblas_sgemm rate\n"
      "gpt_attention_share: the fused attention's share of a step (forward + backward of every layer)\n"
      "vs the plain attention's share of the same step built with it\n"
      "gpt_peak_bytes: peak device memory of a step vs the model state (parameters, gradients, Adam moments)", 0, 0 },
    { "precision", bench_precision,
      "Run directly. The machine line names the bf16 path (cx_bf16_path, CX_CPU_ISA caps it).\n"
      "bf16_gemm_gflops: a 2048^3 bf16 matmul through the core vs the faster, in each round, of oneDNN's bf16\n"
      "matmul and OpenBLAS's sgemm on the same values, with as many threads\n"
      "bf16_matmul_vs_f32: the gpt default model's three linear shapes as bf16 matmuls through the core vs the same\n"
      "in f32 (target: >= 1.5 with AVX512_BF16, >= 1.0 without)\n"
      "cnn_conv_bf16_vs_f32: the seed cnn's two convs (batch 64) forward and backward in bf16 vs f32\n"
      "gpt_attention_bf16_vs_f32: the gpt default's causal attention forward and backward in bf16 vs f32\n"
      "gpt_bf16_tokens_per_s: gpt training steps (the gpt bench's model and batch) with --precision bf16-mixed\n"
      "(autocast around the forward, f32 weights) vs the same steps in f32, in the same rounds\n"
      "cnn_bf16_images_per_s: the same for the seed cnn, batch 64\n"
      "gpt_bf16_peak_bytes (with gpt_bf16_tokens_per_s): peak device memory of a bf16-mixed gpt step vs an f32 one\n"
      "(each measured alone, after the compile cache and arena of the other were released; rounds 1)\n"
      "--figure NAME runs one figure", 0, 0 },
    { "ckpt", bench_ckpt,
      "Run directly; files go to $CX_BENCH_DIR (default /tmp).\n"
      "ckpt_save_gbps: saving a 640 MiB model vs a raw sequential write (with fsync) of as many bytes\n"
      "ckpt_load_gbps: loading it with cold pages vs a raw cold sequential read\n"
      "ckpt_consolidate_peak_bytes: consolidate_ckpts' peak RSS on 4 shards vs the largest tensor\n"
      "(not a timing: one consolidation per round)\n"
      "11 rounds by default: a cold read's rate moves by a third from round to round on a virtual disk",
      11, 0 },
    { "cache", bench_cache,
      "Run directly; each unit is a fresh process.\n"
      "cache_warm_start_s: spawn to first training step done with a warm persistent compile cache vs an empty one\n"
      "cache_load_vs_compile_s: the warm runs' cache load time vs the cold runs' compile time", 0, 0 },
    { "comm", bench_comm,
      "Run under xla-launch --nproc N (N >= 2).\n"
      "allreduce_busbw_gbps_{1,16,64}MiB: all-reduce bus bandwidth through the library (shared memory inside a\n"
      "node; CX_SHM_COLLECTIVES=0: MPI) vs MPI_Allreduce\n"
      "reducescatter_busbw_gbps_*, allgather_busbw_gbps_*: the same vs MPI_Reduce_scatter_block, MPI_Allgather", 0, 0 },
    { "ddp", bench_ddp,
      "Run directly, not under xla-launch: it starts its own 2 ranks (four xla-launch runs per round).\n"
      "ddp_images_per_s: cnn batch 64 per rank on 2 ranks x 1 thread vs 1 rank x 2 threads\n"
      "ddp_shm_images_per_s: the cnn's 2-rank run with shared-memory collectives vs CX_SHM_COLLECTIVES=0 (MPI)\n"
      "ddp_desync_check_ms: the time a cnn step waits for the desync check vs the step's time (target: <= 0.01)\n"
      "The communication figures, on an mlp 784-2048-2048-10 (23 MB of gradients; means over steps and ranks):\n"
      "ddp_exposed_comm_ms: all-reduce time a step waits for vs its all-reduce time\n"
      "ddp_shm_exposed_comm_ms, ddp_shm_allreduce_ms: the same with shared-memory collectives vs MPI\n"
      "--min-time defaults to 6 s here: a step's wait for its all-reduce moves with the scheduling of two ranks and\n"
      "their progress threads on two cores, and 2 s per side left the communication figures ±30 % from run to run", 0, 6 },
    { "spmd", bench_spmd,
      "Run under xla-launch --nproc N (N even; the README's figures: N = 4).\n"
      "spmd_seed_images_per_s: the seed's mnist_xla.py run (cnn, its SPMD shardings, global batch 256) vs DDP on the\n"
      "same ranks (batch 256 / N per rank)\n"
      "spmd_fsdpv2_step_s: FSDPv2 (every parameter's first dimension over the fsdp axis, the batch too) on an mlp\n"
      "784-2048-2048-10 vs DDP on the same mlp and ranks, global batch 256\n"
      "tp_state_bytes_per_rank: the gpt program's model (4 layers, n_embd 256) with Megatron tensor parallelism over 2\n"
      "ranks (mesh (N/2, 2): the batch over data, the blocks over model): bytes of parameters + AdamW state per rank vs\n"
      "one process's (not a timing: rounds 1)\n"
      "spmd_tp_step_s: that run's step vs DDP on the same ranks, global batch --gpt-batch-size (16)", 0, 0 },
    { "fsdp", bench_fsdp,
      "Run under xla-launch --nproc N (the README's figures: N = 4). A 120M-parameter mlp with AdamW.\n"
      "zero3_peak_bytes_per_rank, zero2_peak_bytes_per_rank: the worst rank's peak vs DDP's; one pass in a fixed\n"
      "order (the intermediate arena only grows, so an earlier larger run would count in a later one's peak): rounds 1\n"
      "zero3_largest_model_vs_limit: parameter + gradient + AdamW bytes of the largest 24-layer mlp that trains with\n"
      "ZeRO-3 (deferred init, a unit per Linear) within --limit-mb per rank vs that limit (binary search over widths,\n"
      "each a real build and 3 steps from an empty cache; the worst rank's peak): rounds 1\n"
      "zero3_deferred_construction_peak_bytes: that model's peak while built and wrapped vs 1/N of its parameters\n"
      "plus its largest unit (the bound: <= 1)\n"
      "zero3_step_s: ZeRO-3 step time vs DDP's\n"
      "fsdpv2_peak_bytes_per_rank: FSDPv2 (gpt --parallel fsdpv2: each block wrapped, parameters and the global batch\n"
      "of 8 over the fsdp axis) on a GPT of 4 layers, n_embd 256, block 32 (3.2M parameters, AdamW): the worst rank's\n"
      "peak over building, warm-up and 2 steps from an empty cache vs DDP's on the same model and global batch\n"
      "(target <= 0.35 on 4 ranks)\n"
      "fsdpv2_step_s: that FSDPv2 step vs DDP's, both built once, alternated in every round (target <= 1.3)", 0, 0 },
};
#define N_SUBCOMMANDS ((int)(sizeof g_subcommands / sizeof *g_subcommands))

int bench_default_rounds(const char *sub)
{
    for (int i = 0; i < N_SUBCOMMANDS; i++)
        if (!strcmp(sub, g_subcommands[i].name) && g_subcommands[i].rounds > 0) return g_subcommands[i].rounds;
    return 5;
}

const char *bench_summary(const char *sub)
{
    for (int i = 0; i < N_SUBCOMMANDS; i++)
        if (!strcmp(sub, g_subcommands[i].name)) return g_subcommands[i].summary;
    return NULL;
}

/* The subcommand list for the global help: the name, then the summary's
 * lines indented under it. */
static char *subcommand_list(void)
{
    size_t cap = 256;
    for (int i = 0; i < N_SUBCOMMANDS; i++) cap += strlen(g_subcommands[i].summary) * 2 + 64;
    char *out = malloc(cap);
    if (!out) return NULL;
    size_t n = (size_t)snprintf(out, cap, "subcommands (cxla-bench SUBCOMMAND --help: its own flags):");
    for (int i = 0; i < N_SUBCOMMANDS; i++) {
        const char *s = g_subcommands[i].summary;
        for (bool first = true; *s; first = false) {
            size_t len = strcspn(s, "\n");
            n += (size_t)snprintf(out + n, cap - n, "\n  %-8s %.*s", first ? g_subcommands[i].name : "", (int)len, s);
            s += len + (s[len] == '\n');
        }
    }
    return out;
}

int main(int argc, char **argv)
{
    bench_cap_openblas(argv);
    /* rounds 0, min_time -1: the subcommand's defaults */
    bench_cfg cfg = { .rounds = 0, .min_time = -1 };
    cli_flag flags[2];
    int nflags = bench_common_flags(&cfg, flags);
    char *list = subcommand_list();
    cli_spec spec = {
        .prog = "cxla-bench",
        .args = "[--rounds N] [--min-time SECONDS] SUBCOMMAND [flags]",
        .summary = "One JSON line per figure: {bench, value, unit, ref, ratio, better, rounds, ratio_min, ratio_max}.\n"
                   "Each figure compares a measured side with a reference measured in the same run. Every round\n"
                   "times each side for at least --min-time seconds, the sides taking turns in slices of about\n"
                   "0.25 s in alternating order (A B, then B A, ...); value and ref are medians over rounds,\n"
                   "ratio the median of the per-round value/ref, and ratio_min, ratio_max its range; better is\n"
                   "\"higher\" or \"lower\": which way the ratio improves (a rate, or a time or a size). --rounds\n"
                   "and --min-time go before or after SUBCOMMAND.\n"
                   "Under xla-launch the lines carry its \"[rank 0] \" prefix (sed 's/^\\[rank 0\\] //').",
        .epilog = list,
        .flags = flags,
        .nflags = nflags,
        .positionals = true,
    };
    int first = argc;
    cli_result r = cli_parse(&spec, argc, argv, &first);
    int rc = r == CLI_HELP ? 0 : 2;
    if (r == CLI_OK && first >= argc) {
        fprintf(stderr, "cxla-bench: no subcommand given (see cxla-bench --help)\n");
    } else if (r == CLI_OK) {
        const subcommand *sub = NULL;
        for (int i = 0; i < N_SUBCOMMANDS; i++)
            if (!strcmp(argv[first], g_subcommands[i].name)) sub = &g_subcommands[i];
        if (!sub) fprintf(stderr, "cxla-bench: unknown subcommand '%s' (see cxla-bench --help)\n", argv[first]);
        else {
            free(list);
            if (cfg.min_time < 0) cfg.min_time = sub->min_time > 0 ? sub->min_time : 2.0;
            rc = sub->run(argc - first, argv + first, cfg);
            if (rc == 0) bench_machine_end();
            return rc;
        }
    }
    free(list);
    return rc;
}
