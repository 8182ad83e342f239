/* train --data imagefolder: ROOT/train and ROOT/val as torchvision's
 * ImageFolder with the ImageNet transforms. A bad image is skipped rather
 * than ending a long run: the library names each one once. */
#include "train_data.h"

#include <stdio.h>
#include <string.h>

cx_status train_data_imagefolder(const char *root, bool train, int image_size, uint64_t seed, cx_dataset **out)
{
    char dir[4096];
    if (!root) {
        cx_set_last_error("--data imagefolder needs --data-dir ROOT (ROOT/train/<class>/*.jpg and ROOT/val/<class>/...)");
        return CX_ERR_ARG;
    }
    snprintf(dir, sizeof dir, "%s/%s", root, train ? "train" : "val");
    cx_imagefolder_opts o = cx_imagefolder_default_opts();
    o.root = dir;
    o.train = train;
    o.image_size = image_size ? image_size : TRAIN_IMAGEFOLDER_SIZE;
    o.seed = seed;
    o.on_error = CX_IMAGE_ERRORS_SKIP;
    return cx_imagefolder_open(o, out);
}

void train_data_report(const char *split, const cx_dataset *ds)
{
    int64_t n = cx_imagefolder_skipped(ds);
    if (n > 0) fprintf(stderr, "train: %lld bad image file(s) skipped in the %s set\n", (long long)n, split);
}
