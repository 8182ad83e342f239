/* Stateless element-wise layers: ReLU, GELU, SiLU, Tanh, Sigmoid, and the
 * (log-)softmax over a dim. */
#include "nn_internal.h"

static cx_tensor *relu_forward(cx_module *m, cx_tensor *x) { (void)m; return cx_relu(x); }
static cx_tensor *silu_forward(cx_module *m, cx_tensor *x) { (void)m; return cx_silu(x); }
static cx_tensor *tanh_forward(cx_module *m, cx_tensor *x) { (void)m; return cx_tanh(x); }
static cx_tensor *sigmoid_forward(cx_module *m, cx_tensor *x) { (void)m; return cx_sigmoid(x); }

static const cx_module_type relu_type = { CX_STRUCT_SIZE(cx_module_type), .name = "ReLU", .forward = relu_forward };
static const cx_module_type silu_type = { CX_STRUCT_SIZE(cx_module_type), .name = "SiLU", .forward = silu_forward };
static const cx_module_type tanh_type = { CX_STRUCT_SIZE(cx_module_type), .name = "Tanh", .forward = tanh_forward };
static const cx_module_type sigmoid_type = { CX_STRUCT_SIZE(cx_module_type), .name = "Sigmoid", .forward = sigmoid_forward };

cx_module *cx_nn_relu(void) { return cx_module_new(&relu_type, NULL); }
cx_module *cx_nn_silu(void) { return cx_module_new(&silu_type, NULL); }
cx_module *cx_nn_tanh(void) { return cx_module_new(&tanh_type, NULL); }
cx_module *cx_nn_sigmoid(void) { return cx_module_new(&sigmoid_type, NULL); }

/* The flag lives in the impl pointer's target: two static bools, no allocation. */
static const bool gelu_exact = false, gelu_tanh = true;

static cx_tensor *gelu_forward(cx_module *m, cx_tensor *x)
{
    return cx_gelu(x, *(const bool *)cx_module_impl(m));
}

static const cx_module_type gelu_type = { CX_STRUCT_SIZE(cx_module_type), .name = "GELU", .forward = gelu_forward };

cx_module *cx_nn_gelu(bool tanh_approx)
{
    return cx_module_new(&gelu_type, (void *)(tanh_approx ? &gelu_tanh : &gelu_exact));
}

typedef struct {
    int dim;
} softmax_dim;

static cx_tensor *log_softmax_forward(cx_module *m, cx_tensor *x)
{
    return cx_log_softmax(x, ((const softmax_dim *)cx_module_impl(m))->dim);
}

static const cx_module_type log_softmax_type = { CX_STRUCT_SIZE(cx_module_type), .name = "LogSoftmax", .forward = log_softmax_forward, .free = free };

cx_module *cx_nn_log_softmax(int dim)
{
    softmax_dim *d = malloc(sizeof *d);
    if (!d) { cx_set_last_error("cx_nn_log_softmax: out of memory"); return NULL; }
    d->dim = dim;
    return cx_module_new(&log_softmax_type, d);
}
