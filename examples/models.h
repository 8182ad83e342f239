/* The reference trainer's models, built from public cxla modules. Their
 * forwards record ops inside the caller's step. */
#ifndef CX_EXAMPLES_MODELS_H
#define CX_EXAMPLES_MODELS_H

#include <cxla/cxla.h>

/* conv1 1->32 k3, ReLU, conv2 32->64 k3, ReLU, max_pool 2, flatten,
 * fc1 9216->128, ReLU, fc2 128->10, log_softmax. x (N, 1, 28, 28). */
cx_module *model_cnn(void);
/* PyTorch/XLA's test_train_mp_mnist net: conv1 1->10 k5, bn1, conv2 10->20 k5,
 * bn2, fc1 320->50, fc2 50->10; relu(max_pool2d(conv(x), 2)) then bn. */
cx_module *model_lenet(void);
/* flatten, `depth` x (Linear(., width), ReLU), Linear(width, classes),
 * log_softmax. x (N, C, H, W) with C*H*W = in_features. */
cx_module *model_mlp(int64_t in_features, int64_t width, int depth, int64_t classes);

#endif
