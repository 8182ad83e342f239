/* Shared by the test_obs_*.c tests: a small cnn built from nn layers (the
 * tests link only the library) and a loader-driven training run. */
#ifndef TEST_OBS_CNN_H
#define TEST_OBS_CNN_H

#include <cxla/cxla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((unused)) static cx_module *obs_cnn(void)
{
    cx_conv2d_opts k3 = cx_conv2d_default_opts();
    cx_module *mods[] = {
        cx_nn_conv2d(1, 8, 3, k3), cx_nn_relu(), cx_nn_conv2d(8, 16, 3, k3), cx_nn_relu(),
        cx_nn_max_pool2d(2, 2, 0), cx_nn_flatten(1, -1), cx_nn_linear(16 * 12 * 12, 32, true), cx_nn_relu(),
        cx_nn_linear(32, 10, true), cx_nn_log_softmax(1),
    };
    return cx_nn_sequential(mods, (int)(sizeof mods / sizeof *mods));
}

typedef struct {
    int steps;
    double losses[32];
} obs_run;

/* `steps` SGD steps over fake data with the loader marking the steps; the
 * losses are read after each step (kept, read at the next iteration). */
__attribute__((unused)) static cx_status obs_train(int steps, obs_run *out)
{
    cx_manual_seed(7);
    cx_module *m = obs_cnn();
    if (!m) return CX_ERR_STATE;
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_sgd_opts so = cx_sgd_default_opts();
    so.lr = 0.05;
    so.momentum = 0.5;
    cx_optimizer *opt = cx_optim_sgd(ps, n, so);
    free(ps);
    cx_fake_data_opts fo = cx_fake_data_default_opts();
    fo.size = 8 * steps;
    cx_dataset *ds = NULL;
    if (!opt || cx_fake_data(fo, &ds) != CX_OK) return CX_ERR_STATE;
    cx_sampler_opts sopt = cx_sampler_default_opts();
    sopt.shuffle = false;
    cx_sampler *s = cx_sampler_new(cx_dataset_size(ds), sopt);
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = 8;
    cx_loader *l = cx_loader_new(ds, s, lo);
    if (!l) return CX_ERR_STATE;
    cx_batch b;
    cx_tensor *prev = NULL;
    out->steps = 0;
    cx_status st = CX_OK;
    while (out->steps < steps && cx_loader_next(l, &b) == CX_LOADER_BATCH) {
        if (prev) { out->losses[out->steps - 1] = cx_item(prev); cx_free(prev); prev = NULL; }
        cx_optim_zero_grad(opt);
        cx_tensor *loss = cx_nll_loss(cx_module_forward(m, cx_batch_field(&b, CX_FIELD_IMAGES)), cx_batch_field(&b, CX_FIELD_LABELS), CX_REDUCE_MEAN, -100);
        if ((st = cx_backward(loss)) != CX_OK || (st = cx_optim_step(opt)) != CX_OK) break;
        prev = cx_persist(loss);
        out->steps++;
    }
    if (st == CX_OK) st = cx_loader_end_step(l);
    if (prev) { out->losses[out->steps - 1] = cx_item(prev); cx_free(prev); }
    cx_loader_free(l);
    cx_sampler_free(s);
    cx_dataset_free(ds);
    cx_optim_free(opt);
    cx_module_free(m);
    return st;
}

/* Runs fn in a fresh child process (the caller must not have used the
 * library yet: its threads do not survive fork) and copies `bytes` of
 * result back. @return the child's exit status (0: ok). */
__attribute__((unused)) static int obs_in_child(void (*fn)(void *res, void *arg), void *arg, void *res, size_t bytes)
{
    int fd[2];
    if (pipe(fd) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        close(fd[0]);
        memset(res, 0, bytes);
        fn(res, arg);
        ssize_t w = write(fd[1], res, bytes);
        _exit(w == (ssize_t)bytes ? 0 : 3);
    }
    close(fd[1]);
    size_t got = 0;
    while (got < bytes) {
        ssize_t k = read(fd[0], (char *)res + got, bytes - got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fd[0]);
    int ws = 0;
    waitpid(pid, &ws, 0);
    if (got != bytes) return -2;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -3;
}

__attribute__((unused)) static char *obs_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

__attribute__((unused)) static int obs_count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

#endif
