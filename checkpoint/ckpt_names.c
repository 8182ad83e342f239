/* How a checkpoint's files and tensors are named: rank files, the marker,
 * glob patterns of a prefix, "param.state" keys. */
#include "ckpt_internal.h"

#include <string.h>

void ckpt_file_name(char *out, size_t cap, const char *prefix, int r, int w)
{
    snprintf(out, cap, "%s_rank-%d-of-%d.h5", prefix, r, w);
}

void ckpt_marker_name(char *out, size_t cap, const char *prefix) { snprintf(out, cap, "%s.commit", prefix); }

void ckpt_glob_pattern(char *out, size_t cap, const char *prefix, const char *suffix)
{
    if (!suffix) suffix = CX_CKPT_DEFAULT_SUFFIX;
    size_t o = 0, tail = strlen(suffix);
    /* a prefix may hold glob metacharacters: they must match themselves */
    for (; *prefix && o + 2 + tail < cap; prefix++) {
        if (strchr("*?[]\\", *prefix)) out[o++] = '\\';
        out[o++] = *prefix;
    }
    snprintf(out + o, cap - o, "%s", suffix);
}

void ckpt_dir_of(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == path) snprintf(out, cap, "/");
    else snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

const char *ckpt_base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

void ckpt_strlcpy(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

int ckpt_split_state(const char *full, char *param, size_t cap, const char **state)
{
    const char *dot = strrchr(full, '.');
    if (!dot || dot == full || !dot[1] || (size_t)(dot - full) >= cap) return -1;
    memcpy(param, full, (size_t)(dot - full));
    param[dot - full] = '\0';
    *state = dot + 1;
    return 0;
}

void ckpt_label(char *out, size_t cap, const char *key, const char *state)
{
    snprintf(out, cap, "%s%s%s", key, state ? "." : "", state ? state : "");
}
