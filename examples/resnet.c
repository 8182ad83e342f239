/* torchvision's ResNets (see resnet.h). The layout follows
 * torchvision/models/resnet.py of 0.14: children and their order give the
 * same state-dict keys. */
#include "resnet.h"

#include <math.h>
#include <stdlib.h>

/* ---- init ------------------------------------------------------------------ */

/* Replaces parameter `name` of m with a fresh cx_init_* tensor (deferred
 * when the build is; the constructor's own draw is dropped). @return false
 * with cx_last_error set. */
static bool reinit(cx_module *m, const char *name, cx_tensor *t)
{
    int slot = cx_module_param_slot(m, name);
    if (slot < 0 || !t || cx_tensor_error(t)) {
        cx_set_last_error("resnet: cannot initialize %s.%s: %s", cx_module_type_name(m), name,
                          t && cx_tensor_error(t) ? cx_tensor_error(t) : "no such parameter");
        cx_free(t);
        return false;
    }
    cx_module_set_param(m, slot, cx_requires_grad(t, true));
    return true;
}

/* Conv2d without bias, weight ~ N(0, 2 / fan_out), fan_out = out * k * k:
 * torchvision's kaiming_normal_(mode="fan_out", nonlinearity="relu"). */
static cx_module *conv(int64_t in, int64_t out, int k, int stride, int pad)
{
    cx_conv2d_opts o = cx_conv2d_default_opts();
    o.stride = stride;
    o.padding = pad;
    o.bias = false;
    cx_module *c = cx_nn_conv2d(in, out, k, o);
    int64_t shape[4] = { out, in, k, k };
    if (c && !reinit(c, "weight", cx_init_normal(shape, 4, 0.0, sqrt(2.0 / (double)(out * k * k))))) {
        cx_module_free(c);
        return NULL;
    }
    return c;
}

/* BatchNorm2d with weight `gamma` (1, or 0 for a zero-initialized residual). */
static cx_module *bn(int64_t c, double gamma)
{
    cx_module *m = cx_nn_batch_norm2d(c, cx_batch_norm_default_opts());
    if (m && gamma != 1.0 && !reinit(m, "weight", cx_init_constant(&c, 1, gamma, CX_F32))) {
        cx_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- blocks ----------------------------------------------------------------- */

/* Child slots of a block; -1 for a missing downsample. Both block kinds use
 * it (BasicBlock leaves conv3/bn3 at -1). */
typedef struct {
    int conv1, bn1, conv2, bn2, conv3, bn3, downsample;
} block;

static cx_tensor *fwd(cx_module *m, int slot, cx_tensor *x) { return cx_module_forward(cx_module_child(m, slot), x); }

static cx_tensor *block_forward(cx_module *m, cx_tensor *x)   // x (N, C, H, W)
{
    const block *b = cx_module_impl(m);
    cx_tensor *h = cx_relu(fwd(m, b->bn1, fwd(m, b->conv1, x)));
    h = fwd(m, b->bn2, fwd(m, b->conv2, h));
    if (b->conv3 >= 0) h = fwd(m, b->bn3, fwd(m, b->conv3, cx_relu(h)));   // Bottleneck: (N, 4 * planes, H', W')
    cx_tensor *identity = b->downsample >= 0 ? fwd(m, b->downsample, x) : x;
    return cx_relu(cx_add(h, identity));
}

static const cx_module_type basic_type = { CX_STRUCT_SIZE(cx_module_type), .name = "BasicBlock",
                                           .forward = block_forward, .free = free };
static const cx_module_type bottleneck_type = { CX_STRUCT_SIZE(cx_module_type), .name = "Bottleneck",
                                                .forward = block_forward, .free = free };

/* downsample = Sequential(conv 1x1 stride s, bn): children "0", "1". */
static int add_downsample(cx_module *m, int64_t in, int64_t out, int stride)
{
    cx_module *l[2] = { conv(in, out, 1, stride, 0), bn(out, 1.0) };
    return cx_module_add_child(m, "downsample", cx_nn_sequential(l, 2));
}

/* Adds children in torchvision's order; `relu` sits between the BNs and the
 * downsample as torchvision registers it (it has no state). */
static cx_module *new_block(bool bottleneck, int64_t in, int64_t planes, int stride, bool zero_init)
{
    block *b = malloc(sizeof *b);
    if (!b) { cx_set_last_error("resnet: out of memory"); return NULL; }
    *b = (block){ -1, -1, -1, -1, -1, -1, -1 };
    cx_module *m = cx_module_new(bottleneck ? &bottleneck_type : &basic_type, b);
    if (!m) return NULL;
    int64_t out = bottleneck ? 4 * planes : planes;
    double last_gamma = zero_init ? 0.0 : 1.0;
    bool ok;
    if (bottleneck) {
        b->conv1 = cx_module_add_child(m, "conv1", conv(in, planes, 1, 1, 0));
        b->bn1 = cx_module_add_child(m, "bn1", bn(planes, 1.0));
        b->conv2 = cx_module_add_child(m, "conv2", conv(planes, planes, 3, stride, 1));
        b->bn2 = cx_module_add_child(m, "bn2", bn(planes, 1.0));
        b->conv3 = cx_module_add_child(m, "conv3", conv(planes, out, 1, 1, 0));
        b->bn3 = cx_module_add_child(m, "bn3", bn(out, last_gamma));
        ok = b->conv3 >= 0 && b->bn3 >= 0;
    } else {
        b->conv1 = cx_module_add_child(m, "conv1", conv(in, planes, 3, stride, 1));
        b->bn1 = cx_module_add_child(m, "bn1", bn(planes, 1.0));
        b->conv2 = cx_module_add_child(m, "conv2", conv(planes, planes, 3, 1, 1));
        b->bn2 = cx_module_add_child(m, "bn2", bn(planes, last_gamma));
        ok = true;
    }
    ok = ok && b->conv1 >= 0 && b->bn1 >= 0 && b->conv2 >= 0 && b->bn2 >= 0 &&
         cx_module_add_child(m, "relu", cx_nn_relu()) >= 0;
    if (ok && (stride != 1 || in != out)) ok = (b->downsample = add_downsample(m, in, out, stride)) >= 0;
    if (!ok) { cx_module_free(m); return NULL; }
    return m;
}

/* ---- the network -------------------------------------------------------------- */

typedef struct {
    int conv1, bn1, maxpool, layer[4], avgpool, fc;
} resnet;

static cx_tensor *resnet_forward(cx_module *m, cx_tensor *x)   // x (N, C, H, W)
{
    const resnet *r = cx_module_impl(m);
    x = cx_relu(fwd(m, r->bn1, fwd(m, r->conv1, x)));          // (N, 64, H/2, W/2)
    x = fwd(m, r->maxpool, x);                                  // (N, 64, H/4, W/4)
    for (int i = 0; i < 4; i++) x = fwd(m, r->layer[i], x);     // (N, 512 * e, H/32, W/32)
    x = cx_flatten(fwd(m, r->avgpool, x), 1, -1);               // (N, 512 * e)
    return fwd(m, r->fc, x);                                    // (N, classes) logits
}

static const cx_module_type resnet_type = { CX_STRUCT_SIZE(cx_module_type), .name = "ResNet",
                                            .forward = resnet_forward, .free = free };

/* layerN: Sequential of `n` blocks, the first with `stride` (and the
 * downsample when the shape changes). *in becomes the layer's output width. */
static cx_module *make_layer(bool bottleneck, int64_t *in, int64_t planes, int n, int stride, bool zero_init)
{
    cx_module *seq = cx_nn_sequential(NULL, 0);
    for (int i = 0; seq && i < n; i++) {
        if (cx_nn_sequential_append(seq, new_block(bottleneck, *in, planes, i == 0 ? stride : 1, zero_init)) < 0) {
            cx_module_free(seq);
            return NULL;
        }
        *in = bottleneck ? 4 * planes : planes;
    }
    return seq;
}

/* The stem and head around four layers of `blocks[i]` blocks. */
static cx_module *make_resnet(bool bottleneck, const int blocks[4], int in_channels, int num_classes, bool zero_init)
{
    if (in_channels <= 0 || num_classes <= 0) {
        cx_set_last_error("resnet: bad sizes: %d input channels, %d classes (want positive)", in_channels, num_classes);
        return NULL;
    }
    resnet *r = malloc(sizeof *r);
    if (!r) { cx_set_last_error("resnet: out of memory"); return NULL; }
    cx_module *m = cx_module_new(&resnet_type, r);
    if (!m) return NULL;
    r->conv1 = cx_module_add_child(m, "conv1", conv(in_channels, 64, 7, 2, 3));
    r->bn1 = cx_module_add_child(m, "bn1", bn(64, 1.0));
    bool ok = r->conv1 >= 0 && r->bn1 >= 0 && cx_module_add_child(m, "relu", cx_nn_relu()) >= 0 &&
              (r->maxpool = cx_module_add_child(m, "maxpool", cx_nn_max_pool2d(3, 2, 1))) >= 0;
    int64_t in = 64;
    static const char *const names[4] = { "layer1", "layer2", "layer3", "layer4" };
    for (int i = 0; ok && i < 4; i++) {
        cx_module *layer = make_layer(bottleneck, &in, 64 << i, blocks[i], i == 0 ? 1 : 2, zero_init);
        ok = (r->layer[i] = cx_module_add_child(m, names[i], layer)) >= 0;
    }
    /* fc keeps nn.Linear's own init, as torchvision does */
    ok = ok && (r->avgpool = cx_module_add_child(m, "avgpool", cx_nn_adaptive_avg_pool2d(1, 1))) >= 0 &&
         (r->fc = cx_module_add_child(m, "fc", cx_nn_linear(in, num_classes, true))) >= 0;
    if (!ok) { cx_module_free(m); return NULL; }
    return m;
}

cx_module *model_resnet18(int in_channels, int num_classes, bool zero_init_residual)
{
    static const int blocks[4] = { 2, 2, 2, 2 };
    return make_resnet(false, blocks, in_channels, num_classes, zero_init_residual);
}

cx_module *model_resnet50(int in_channels, int num_classes, bool zero_init_residual)
{
    static const int blocks[4] = { 3, 4, 6, 3 };
    return make_resnet(true, blocks, in_channels, num_classes, zero_init_residual);
}
