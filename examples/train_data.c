/* train --data imagefolder: ROOT/train and ROOT/val as torchvision's
 * ImageFolder with the ImageNet transforms. By default a bad image is
 * skipped rather than ending a long run (the library names each one once);
 * --bad-images stop fails the batch that reads it. */
#include "train_data.h"

#include <stdio.h>
#include <string.h>

cx_status train_data_imagefolder(const char *root, bool train, int image_size, uint64_t seed, bool stop_on_bad,
                                 cx_dataset **out)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", root, train ? "train" : "val");
    cx_imagefolder_opts o = cx_imagefolder_default_opts();
    o.root = dir;
    o.train = train;
    o.image_size = image_size ? image_size : TRAIN_IMAGEFOLDER_SIZE;
    o.seed = seed;
    o.on_error = stop_on_bad ? CX_IMAGE_ERRORS_STOP : CX_IMAGE_ERRORS_SKIP;
    return cx_imagefolder_open(o, out);
}

/* The same classes in the same order, or the labels the model learns
 * from train/ mean other classes in val/ and the accuracy means nothing. */
int train_data_check_classes(const char *root, const cx_dataset *train, const cx_dataset *val)
{
    int nt = cx_imagefolder_num_classes(train), nv = cx_imagefolder_num_classes(val);
    for (int i = 0; i < nt || i < nv; i++) {
        const char *t = i < nt ? cx_imagefolder_class_name(train, i) : NULL;
        const char *v = i < nv ? cx_imagefolder_class_name(val, i) : NULL;
        if (t && v && !strcmp(t, v)) continue;
        if (cx_global_ordinal() != 0) return -1;
        if (t && v)
            fprintf(stderr, "train: --data-dir %s: class %d is %s in train/ but %s in val/ (the two splits need the "
                    "same class directories)\n", root, i, t, v);
        else
            fprintf(stderr, "train: --data-dir %s: class %s is in %s/ only (train/ has %d classes, val/ %d; the two "
                    "splits need the same class directories)\n", root, t ? t : v, t ? "train" : "val", nt, nv);
        return -1;
    }
    return 0;
}

static void sum_reduce(const double *all, int world, int n, double *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = 0;
        for (int r = 0; r < world; r++) out[i] += all[r * n + i];
    }
}

void train_data_report(const char *split, const cx_dataset *ds, bool per_rank)
{
    if (!cx_imagefolder_num_classes(ds)) return;   /* not an image folder, on every rank */
    double n = (double)cx_imagefolder_skipped(ds), total = n;
    if (!per_rank && cx_mesh_reduce("bad_images", &n, 1, sum_reduce, &total) != CX_OK) {
        if (cx_global_ordinal() == 0) fprintf(stderr, "train: counting the bad images: %s\n", cx_last_error());
        return;
    }
    if (total > 0 && (per_rank || cx_global_ordinal() == 0))
        fprintf(stderr, "train: %lld bad image file(s) skipped in the %s set%s\n", (long long)total, split,
                per_rank && cx_world_size() > 1 ? " on this rank" : "");
}
