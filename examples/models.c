/* The reference trainer's models (see models.h). */
#include "models.h"

#include <stdlib.h>

/* ---- cnn ------------------------------------------------------------------ */

typedef struct {
    int conv1, conv2, fc1, fc2;   /* child slots */
} cnn;

static cx_tensor *cnn_forward(cx_module *m, cx_tensor *x)   // x (N, 1, 28, 28)
{
    const cnn *c = cx_module_impl(m);
    x = cx_relu(cx_module_forward(cx_module_child(m, c->conv1), x));     // (N, 32, 26, 26)
    x = cx_relu(cx_module_forward(cx_module_child(m, c->conv2), x));     // (N, 64, 24, 24)
    x = cx_max_pool2d(x, 2, 2, 2, 2, 0, 0);                               // (N, 64, 12, 12)
    x = cx_flatten(x, 1, -1);                                             // (N, 9216)
    x = cx_relu(cx_module_forward(cx_module_child(m, c->fc1), x));       // (N, 128)
    x = cx_module_forward(cx_module_child(m, c->fc2), x);                // (N, 10)
    return cx_log_softmax(x, 1);
}

static const cx_module_type cnn_type = { CX_STRUCT_SIZE(cx_module_type), .name = "MnistCnn", .forward = cnn_forward, .free = free };

cx_module *model_cnn(void)
{
    cnn *c = malloc(sizeof *c);
    if (!c) return NULL;
    cx_module *m = cx_module_new(&cnn_type, c);
    if (!m) return NULL;
    cx_conv2d_opts k3 = cx_conv2d_default_opts();
    c->conv1 = cx_module_add_child(m, "conv1", cx_nn_conv2d(1, 32, 3, k3));
    c->conv2 = cx_module_add_child(m, "conv2", cx_nn_conv2d(32, 64, 3, k3));
    c->fc1 = cx_module_add_child(m, "fc1", cx_nn_linear(9216, 128, true));
    c->fc2 = cx_module_add_child(m, "fc2", cx_nn_linear(128, 10, true));
    if (c->conv1 < 0 || c->conv2 < 0 || c->fc1 < 0 || c->fc2 < 0) { cx_module_free(m); return NULL; }
    return m;
}

/* ---- lenet ------------------------------------------------------------------ */

typedef struct {
    int conv1, bn1, conv2, bn2, fc1, fc2;
} lenet;

static cx_tensor *lenet_forward(cx_module *m, cx_tensor *x)   // x (N, 1, 28, 28)
{
    const lenet *l = cx_module_impl(m);
    x = cx_module_forward(cx_module_child(m, l->conv1), x);              // (N, 10, 24, 24)
    x = cx_relu(cx_max_pool2d(x, 2, 2, 2, 2, 0, 0));                      // (N, 10, 12, 12)
    x = cx_module_forward(cx_module_child(m, l->bn1), x);
    x = cx_module_forward(cx_module_child(m, l->conv2), x);              // (N, 20, 8, 8)
    x = cx_relu(cx_max_pool2d(x, 2, 2, 2, 2, 0, 0));                      // (N, 20, 4, 4)
    x = cx_module_forward(cx_module_child(m, l->bn2), x);
    x = cx_flatten(x, 1, -1);                                             // (N, 320)
    x = cx_relu(cx_module_forward(cx_module_child(m, l->fc1), x));       // (N, 50)
    x = cx_module_forward(cx_module_child(m, l->fc2), x);                // (N, 10)
    return cx_log_softmax(x, 1);
}

static const cx_module_type lenet_type = { CX_STRUCT_SIZE(cx_module_type), .name = "MnistLenet", .forward = lenet_forward, .free = free };

cx_module *model_lenet(void)
{
    lenet *l = malloc(sizeof *l);
    if (!l) return NULL;
    cx_module *m = cx_module_new(&lenet_type, l);
    if (!m) return NULL;
    cx_conv2d_opts k5 = cx_conv2d_default_opts();
    cx_batch_norm_opts bn = cx_batch_norm_default_opts();
    l->conv1 = cx_module_add_child(m, "conv1", cx_nn_conv2d(1, 10, 5, k5));
    l->bn1 = cx_module_add_child(m, "bn1", cx_nn_batch_norm2d(10, bn));
    l->conv2 = cx_module_add_child(m, "conv2", cx_nn_conv2d(10, 20, 5, k5));
    l->bn2 = cx_module_add_child(m, "bn2", cx_nn_batch_norm2d(20, bn));
    l->fc1 = cx_module_add_child(m, "fc1", cx_nn_linear(320, 50, true));
    l->fc2 = cx_module_add_child(m, "fc2", cx_nn_linear(50, 10, true));
    if (l->conv1 < 0 || l->bn1 < 0 || l->conv2 < 0 || l->bn2 < 0 || l->fc1 < 0 || l->fc2 < 0) {
        cx_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- mlp ------------------------------------------------------------------------ */

cx_module *model_mlp(int64_t in_features, int64_t width, int depth, int64_t classes)
{
    cx_module *seq = cx_nn_sequential(NULL, 0);
    if (!seq) return NULL;
    bool ok = cx_nn_sequential_append(seq, cx_nn_flatten(1, -1)) >= 0;
    int64_t in = in_features;
    for (int i = 0; ok && i < depth; i++) {
        ok = cx_nn_sequential_append(seq, cx_nn_linear(in, width, true)) >= 0 &&
             cx_nn_sequential_append(seq, cx_nn_relu()) >= 0;
        in = width;
    }
    ok = ok && cx_nn_sequential_append(seq, cx_nn_linear(in, classes, true)) >= 0 &&
         cx_nn_sequential_append(seq, cx_nn_log_softmax(1)) >= 0;
    if (!ok) { cx_module_free(seq); return NULL; }
    return seq;
}
