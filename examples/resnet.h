/* torchvision 0.14's ResNet-18 and ResNet-50 for the reference trainer,
 * built from public cxla modules, with torchvision's state-dict names and
 * init (so a consolidated checkpoint loads strictly into
 * torchvision.models.resnet50()). Module type names: "ResNet",
 * "BasicBlock", "Bottleneck" (FSDP and gradient checkpointing pick the
 * blocks by them). */
#ifndef CX_EXAMPLES_RESNET_H
#define CX_EXAMPLES_RESNET_H

#include <cxla/cxla.h>

/* conv1 7x7/2, bn1, relu, maxpool 3/2, layer1..layer4 of BasicBlocks
 * [2, 2, 2, 2], avgpool (1, 1), flatten, fc 512 -> num_classes. The forward
 * takes x (N, in_channels, H, W) and returns logits (N, num_classes).
 * zero_init_residual: each block's last BN starts with weight 0.
 * @return the model, or NULL with cx_last_error set (bad sizes, out of
 * memory). */
cx_module *model_resnet18(int in_channels, int num_classes, bool zero_init_residual);
/* The same with Bottlenecks [3, 4, 6, 3] (stride in the 3x3, as
 * torchvision), fc 2048 -> num_classes. */
cx_module *model_resnet50(int in_channels, int num_classes, bool zero_init_residual);

#endif
