/* ckpt_compare A.h5 B.h5 TOL: every dataset under /model of two full
 * checkpoints agrees within |a - b| <= TOL * max(1, |b|) (relative, with an
 * absolute floor at 1 so that values near zero are not held to float noise).
 * Exit 0 when they agree, 1 (naming the worst entry) when not. */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { hid_t b; double tol, worst; char worst_name[340]; int n, bad; } cmp;

static float *read_all(hid_t f, const char *name, hsize_t *n)
{
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    if (d < 0) return NULL;
    hid_t sp = H5Dget_space(d);
    hssize_t cnt = H5Sget_simple_extent_npoints(sp);
    float *v = malloc(sizeof(float) * (size_t)(cnt > 0 ? cnt : 1));
    if (v && H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) { free(v); v = NULL; }
    *n = (hsize_t)cnt;
    H5Sclose(sp);
    H5Dclose(d);
    return v;
}

static herr_t visit(hid_t g, const char *name, const H5L_info_t *info, void *p)
{
    (void)info;
    cmp *c = p;
    char path[300];
    snprintf(path, sizeof path, "/model/%s", name);
    hsize_t na = 0, nb = 0;
    float *a = read_all(g, name, &na), *b = read_all(c->b, path, &nb);
    c->n++;
    if (!a || !b || na != nb) {
        fprintf(stderr, "ckpt_compare: %s: missing or of another size\n", path);
        c->bad++;
    } else {
        for (hsize_t i = 0; i < na; i++) {
            double d = fabs((double)a[i] - b[i]) / fmax(1.0, fabs((double)b[i]));
            if (d > c->worst) { c->worst = d; snprintf(c->worst_name, sizeof c->worst_name, "%s[%llu]", path, (unsigned long long)i); }
        }
    }
    free(a);
    free(b);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4) { fprintf(stderr, "usage: ckpt_compare A.h5 B.h5 TOL\n"); return 2; }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t fa = H5Fopen(argv[1], H5F_ACC_RDONLY, H5P_DEFAULT), fb = H5Fopen(argv[2], H5F_ACC_RDONLY, H5P_DEFAULT);
    if (fa < 0 || fb < 0) { fprintf(stderr, "ckpt_compare: cannot open %s\n", fa < 0 ? argv[1] : argv[2]); return 1; }
    hid_t ga = H5Gopen2(fa, "/model", H5P_DEFAULT), gb = H5Gopen2(fb, "/model", H5P_DEFAULT);
    if (ga < 0 || gb < 0) { fprintf(stderr, "ckpt_compare: no /model group\n"); return 1; }
    cmp c = { .b = fb, .tol = atof(argv[3]) };
    H5Literate(ga, H5_INDEX_NAME, H5_ITER_INC, NULL, visit, &c);
    H5Gclose(ga); H5Gclose(gb); H5Fclose(fa); H5Fclose(fb);
    printf("ckpt_compare: %d tensors, worst difference %.3g%s%s\n", c.n, c.worst, c.worst > 0 ? " at " : "", c.worst_name);
    return (c.bad || c.n == 0 || c.worst > c.tol) ? 1 : 0;
}
