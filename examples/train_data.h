/* train's image-folder data (examples/train_data.c). */
#ifndef CX_EXAMPLES_TRAIN_DATA_H
#define CX_EXAMPLES_TRAIN_DATA_H

#include <cxla/cxla.h>

#define TRAIN_IMAGEFOLDER_SIZE 224   /* --image-size 0 */

/* ROOT/train (the training transform) or ROOT/val (eval's) of the seed's
 * ImageNet layout as an image folder of image_size crops (0: 224), bad
 * files skipped (each named once on stderr, counted at the end) or, with
 * stop_on_bad, failing the batch that reads one (the error names it).
 * @return the cx_imagefolder_open status, its message in cx_last_error. */
cx_status train_data_imagefolder(const char *root, bool train, int image_size, uint64_t seed, bool stop_on_bad,
                                 cx_dataset **out);

/* Compares the class directories of the two splits (names and order).
 * @return 0, or -1 with one line on rank 0 naming the first class that
 * differs. */
int train_data_check_classes(const char *root, const cx_dataset *train, const cx_dataset *val);

/* Prints "train: N bad image file(s) skipped in the SPLIT set" for a split
 * that skipped any: on rank 0 the sum over the ranks (every rank must call
 * it: a collective), or with per_rank every rank its own ("on this rank").
 * Nothing for a data set that is not an image folder. */
void train_data_report(const char *split, const cx_dataset *ds, bool per_rank);

#endif
