/* resnet_logits: loads a consolidated ResNet checkpoint (train's
 * *_consolidated.h5, or consolidate_ckpts' output) and writes the logits of
 * a fixed input in evaluation mode, for examples/resnet_torch_check.py to
 * compare with torchvision's on the same weights and input.
 *
 * The input (B, C, N, N) is x[i] = (u * 2 - 1) with u = the top 24 bits of
 * SplitMix64's output for state i * gamma, over 2^24, in float32; the
 * script makes the same values with numpy. The logits (B, classes) go to
 * --out as raw little-endian float32.
 *
 * Exit codes: 0 success, 1 runtime error, 2 bad flag, 3 checkpoint missing
 * or not this model's. */
#include <cxla/cxla.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cx_cli.h"
#include "resnet.h"

enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2, EXIT_CKPT = 3 };

typedef struct {
    const char *model, *ckpt, *out;
    int in_channels, num_classes, image_size, batch;
} config;

static const char *const k_models[] = { "resnet18", "resnet50", NULL };

static cli_result parse_flags(config *c, int argc, char **argv)
{
    *c = (config){ .model = "resnet50", .in_channels = 3, .num_classes = 1000, .image_size = 64, .batch = 2 };
    const cli_flag flags[] = {
        { .name = "model", .kind = CLI_CHOICE, .dest = &c->model, .choices = k_models, .help = "model" },
        { .name = "ckpt", .kind = CLI_STRING, .dest = &c->ckpt, .metavar = "FILE.h5", .help = "consolidated checkpoint" },
        { .name = "out", .kind = CLI_STRING, .dest = &c->out, .metavar = "FILE", .help = "logits, raw float32" },
        { .name = "in-channels", .kind = CLI_INT, .dest = &c->in_channels, .min = 1, .max = 4096, .help = "input channels" },
        { .name = "num-classes", .kind = CLI_INT, .dest = &c->num_classes, .min = 1, .max = 1000000, .help = "classes" },
        { .name = "image-size", .kind = CLI_INT, .dest = &c->image_size, .min = 8, .max = 4096, .help = "N x N input" },
        { .name = "batch", .kind = CLI_INT, .dest = &c->batch, .min = 1, .max = 1024, .help = "images" },
    };
    const cli_spec spec = { .prog = "resnet_logits", .summary = "Logits of a consolidated ResNet checkpoint on a fixed input.",
                            .flags = flags, .nflags = (int)(sizeof flags / sizeof *flags) };
    cli_result r = cli_parse(&spec, argc, argv, NULL);
    if (r == CLI_OK && (!c->ckpt || !c->out)) {
        fprintf(stderr, "resnet_logits: --ckpt and --out are required\n");
        return CLI_ERROR;
    }
    return r;
}

/* The fixed input, as resnet_torch_check.py's make_input. */
static float *make_input(int64_t n)
{
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; x && i < n; i++) {
        uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        x[i] = (float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
    }
    return x;
}

/* Forward of the fixed input in evaluation mode into out (batch * classes). */
static cx_status logits_of(cx_module *m, const config *c, float *out)
{
    int64_t shape[4] = { c->batch, c->in_channels, c->image_size, c->image_size };
    float *hx = make_input(shape[0] * shape[1] * shape[2] * shape[3]);
    if (!hx) { cx_set_last_error("out of memory for the input"); return CX_ERR_OOM; }
    cx_module_train(m, false);
    cx_no_grad_begin();
    cx_step_begin();
    cx_tensor *y = cx_keep(cx_module_forward(m, cx_from_host(hx, shape, 4, CX_F32)));   // (B, classes)
    cx_status st = cx_step_end();
    cx_no_grad_end();
    if (st == CX_OK) st = cx_to_host(y, out, CX_F32);
    cx_free(y);
    free(hx);
    return st;
}

static bool write_all(const char *path, const float *v, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(v, sizeof *v, n, f) == n;
    return fclose(f) == 0 && ok;
}

int main(int argc, char **argv)
{
    config c;
    cli_result parsed = parse_flags(&c, argc, argv);
    if (parsed != CLI_OK) return parsed == CLI_HELP ? 0 : EXIT_USAGE;
    bool r50 = !strcmp(c.model, "resnet50");
    cx_module *m = r50 ? model_resnet50(c.in_channels, c.num_classes, false)
                       : model_resnet18(c.in_channels, c.num_classes, false);
    if (!m) {
        fprintf(stderr, "resnet_logits: cannot build %s: %s\n", c.model, cx_last_error());
        return EXIT_RUNTIME;
    }
    if (cx_ckpt_load_full(c.ckpt, cx_ckpt_model_single(m), NULL, NULL) != CX_OK) {
        fprintf(stderr, "resnet_logits: %s: %s\n", c.ckpt, cx_last_error());
        cx_module_free(m);
        return EXIT_CKPT;
    }
    size_t n = (size_t)c.batch * (size_t)c.num_classes;
    float *out = malloc(n * sizeof *out);
    cx_status st = out ? logits_of(m, &c, out) : CX_ERR_OOM;
    int rc = 0;
    if (st != CX_OK) {
        fprintf(stderr, "resnet_logits: forward: %s\n", out ? cx_last_error() : "out of memory");
        rc = EXIT_RUNTIME;
    } else if (!write_all(c.out, out, n)) {
        fprintf(stderr, "resnet_logits: cannot write %s\n", c.out);
        rc = EXIT_RUNTIME;
    }
    free(out);
    cx_module_free(m);
    return rc;
}
