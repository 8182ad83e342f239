/* The commit marker <prefix>.commit: its text format, and the questions
 * answered from markers alone (is a prefix committed, which is the latest). */
#include "ckpt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ckpt_fsync_dir(const char *path)
{
    char dir[4096];
    ckpt_dir_of(path, dir, sizeof dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

cx_status ckpt_marker_write(const char *prefix, const ckpt_marker *m)
{
    char path[4096], tmp[4200];
    ckpt_marker_name(path, sizeof path, prefix);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        cx_set_last_error("checkpoint: cannot write %s: %s", tmp, strerror(errno));
        return CX_ERR_IO;
    }
    fprintf(f, "%s %d\nprefix %s\nworld_size %d\nstrategy %s\nstep %lld\nfiles %d\n", CKPT_MARKER_MAGIC, m->version,
            ckpt_base_name(prefix), m->world, m->strategy, (long long)m->step, m->nfiles);
    for (int i = 0; i < m->nfiles; i++)
        fprintf(f, "file %s %lld %016llx\n", m->files[i].name, (long long)m->files[i].size,
                (unsigned long long)m->files[i].hash);
    fprintf(f, "end\n");
    bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        cx_set_last_error("checkpoint: cannot commit %s: %s", path, strerror(errno));
        unlink(tmp);
        return CX_ERR_IO;
    }
    ckpt_fsync_dir(path);
    return CX_OK;
}

void ckpt_marker_release(ckpt_marker *m)
{
    if (!m) return;
    free(m->files);
    m->files = NULL;
    m->nfiles = 0;
}

cx_status ckpt_marker_read(const char *prefix, ckpt_marker *m)
{
    char path[4096];
    ckpt_marker_name(path, sizeof path, prefix);
    memset(m, 0, sizeof *m);
    FILE *f = fopen(path, "r");
    if (!f) {
        cx_set_last_error("checkpoint %s is not committed: no commit marker %s", prefix, path);
        return CX_ERR_IO;
    }
    char line[1024], word[64], str[600];
    long long ll;
    int nfiles = -1, got = 0;
    bool ended = false, bad = false;
    while (!bad && fgets(line, sizeof line, f)) {
        if (!strchr(line, '\n')) { bad = true; break; }
        if (got == 0) {
            if (sscanf(line, "%63s %d", word, &m->version) != 2 || strcmp(word, CKPT_MARKER_MAGIC)) bad = true;
            got = 1;
            continue;
        }
        if (sscanf(line, "%63s", word) != 1) { bad = true; break; }
        if (!strcmp(word, "world_size")) { if (sscanf(line, "%*s %d", &m->world) != 1) bad = true; }
        else if (!strcmp(word, "strategy")) { if (sscanf(line, "%*s %31s", m->strategy) != 1) bad = true; }
        else if (!strcmp(word, "step")) { if (sscanf(line, "%*s %lld", &ll) != 1) bad = true; else m->step = ll; }
        else if (!strcmp(word, "prefix")) { /* informational */ }
        else if (!strcmp(word, "files")) {
            if (sscanf(line, "%*s %d", &nfiles) != 1 || nfiles < 1 || nfiles > 1 << 20 || m->files) { bad = true; break; }
            m->files = calloc((size_t)nfiles, sizeof *m->files);
            if (!m->files) { bad = true; break; }
        } else if (!strcmp(word, "file")) {
            unsigned long long h;
            if (!m->files || m->nfiles >= nfiles || sscanf(line, "%*s %511s %lld %llx", str, &ll, &h) != 3) { bad = true; break; }
            ckpt_marker_file *mf = &m->files[m->nfiles++];
            ckpt_strlcpy(mf->name, sizeof mf->name, str);
            mf->size = ll;
            mf->hash = h;
        } else if (!strcmp(word, "end")) { ended = true; break; }
        else bad = true;
    }
    fclose(f);
    bool known = m->version >= CKPT_OLDEST_VERSION && m->version <= CX_CKPT_FORMAT_VERSION;
    if (bad || !ended || !known || m->nfiles != nfiles || m->world < 1) {
        cx_set_last_error("checkpoint %s: commit marker %s is malformed or of an unsupported version", prefix, path);
        ckpt_marker_release(m);
        return CX_ERR_IO;
    }
    return CX_OK;
}

bool cx_ckpt_is_committed(const char *prefix)
{
    ckpt_marker m;
    if (!prefix || ckpt_marker_read(prefix, &m) != CX_OK) return false;
    char dir[4096], path[5000];
    ckpt_dir_of(prefix, dir, sizeof dir);
    bool ok = true;
    for (int i = 0; i < m.nfiles && ok; i++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, m.files[i].name);
        ok = stat(path, &st) == 0 && st.st_size == m.files[i].size;
    }
    ckpt_marker_release(&m);
    return ok;
}

cx_status cx_ckpt_latest(const char *dir, char *out, size_t cap)
{
    if (!dir || !out || cap == 0) {
        cx_set_last_error("cx_ckpt_latest: NULL argument");
        return CX_ERR_ARG;
    }
    DIR *d = opendir(dir);
    if (!d) {
        cx_set_last_error("no committed checkpoint in %s: %s", dir, strerror(errno));
        return CX_ERR_IO;
    }
    char best[4200] = "";
    int64_t best_step = -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len <= 7 || strcmp(de->d_name + len - 7, ".commit")) continue;
        char prefix[4200];
        snprintf(prefix, sizeof prefix, "%s/%.*s", dir, (int)(len - 7), de->d_name);
        ckpt_marker m;
        if (ckpt_marker_read(prefix, &m) != CX_OK) continue;
        int64_t step = m.step;
        ckpt_marker_release(&m);
        if (!cx_ckpt_is_committed(prefix)) continue;
        if (step > best_step || (step == best_step && strcmp(prefix, best) > 0)) {
            best_step = step;
            snprintf(best, sizeof best, "%s", prefix);
        }
    }
    closedir(d);
    cx_clear_error();
    if (best_step < 0) {
        cx_set_last_error("no committed checkpoint in %s", dir);
        return CX_ERR_IO;
    }
    if (strlen(best) >= cap) {
        cx_set_last_error("cx_ckpt_latest: prefix %s does not fit in %zu bytes", best, cap);
        return CX_ERR_ARG;
    }
    snprintf(out, cap, "%s", best);
    return CX_OK;
}
