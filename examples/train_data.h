/* train's image-folder data (examples/train_data.c). */
#ifndef CX_EXAMPLES_TRAIN_DATA_H
#define CX_EXAMPLES_TRAIN_DATA_H

#include <cxla/cxla.h>

#define TRAIN_IMAGEFOLDER_SIZE 224   /* --image-size 0 */

/* ROOT/train (the training transform) or ROOT/val (eval's) of the seed's
 * ImageNet layout as an image folder of image_size crops (0: 224), bad
 * files skipped (each named once on stderr, counted at the end).
 * @return the cx_imagefolder_open status, its message in cx_last_error. */
cx_status train_data_imagefolder(const char *root, bool train, int image_size, uint64_t seed, cx_dataset **out);

/* Prints "train: N bad image files skipped" for a split that skipped any. */
void train_data_report(const char *split, const cx_dataset *ds);

#endif
