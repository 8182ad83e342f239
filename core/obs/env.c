/* The environment switches of debug.h (PT_XLA_DEBUG_LEVEL, XLA_SAVE_TENSORS_FILE,
 * XLA_METRICS_FILE, XLA_USE_EAGER_DEBUG_MODE, XLA_IR_DEBUG, the dump
 * directory, XLA_SAVE_HLO_FILE, CX_CACHE_DIR), read at the first op or
 * sync through the registry's env hook. */
#include "obs_internal.h"
#include "cx_fs.h"
#include "cx_log.h"
#include "cx_settings.h"

#include <cxla/cache.h>
#include <cxla/comm.h>
#include <cxla/debug.h>

#include <pthread.h>

cx_obs_config cx_obs_cfg;
static pthread_mutex_t g_cfg_mu = PTHREAD_MUTEX_INITIALIZER;

static char *env_dup(const char *name)
{
    const char *v = cx_setting_str(name);
    return v && *v ? strdup(v) : NULL;
}

/* XLA_FLAGS's --xla_dump_to=DIR (or --xla_dump_to DIR), the flag XLA's
 * users already pass; CX_DUMP_DIR otherwise. @return a malloc'd DIR or NULL. */
static char *dump_dir_of(const char **name)
{
    *name = "XLA_FLAGS=--xla_dump_to";
    const char *f = cx_setting_str("XLA_FLAGS");
    const char *at = f ? strstr(f, "--xla_dump_to") : NULL;
    if (at && (at[13] == '=' || at[13] == ' ')) {
        const char *v = at + 14;
        while (*v == ' ') v++;
        size_t n = strcspn(v, " \t");
        if (n > 0) return strndup(v, n);
    }
    *name = "CX_DUMP_DIR";
    return env_dup("CX_DUMP_DIR");
}

static void read_env_locked(void)
{
    cx_obs_config *c = &cx_obs_cfg;
    free(c->debug_file);
    free(c->dump_path);
    free(c->metrics_path);
    free(c->dump_dir);
    free(c->save_hlo_file);
    memset(c, 0, sizeof *c);
    c->debug_level = (int)cx_setting_int("PT_XLA_DEBUG_LEVEL");
    c->all_ranks = cx_setting_bool("CX_DEBUG_ALL_RANKS");
    c->debug_file = env_dup("PT_XLA_DEBUG_FILE");
    c->dump_path = env_dup("XLA_SAVE_TENSORS_FILE");
    c->dump_dot = cx_setting_enum("XLA_SAVE_TENSORS_FMT") == 1;   /* text|dot|hlo */
    c->dump_hlo = cx_setting_enum("XLA_SAVE_TENSORS_FMT") == 2;
    c->ir_debug = cx_setting_bool("XLA_IR_DEBUG");
    c->hlo_debug = c->ir_debug && cx_setting_bool("XLA_HLO_DEBUG");
    c->dump_dir = dump_dir_of(&c->dump_dir_name);
    c->save_hlo_file = env_dup("XLA_SAVE_HLO_FILE");
    c->metrics_path = env_dup("XLA_METRICS_FILE");
    cx_obs_set(OBS_DEBUG, c->debug_level > 0);
    cx_obs_set(OBS_DUMP, c->dump_path != NULL);
    cx_obs_set(OBS_METRICS_FILE, c->metrics_path != NULL);
    cx_obs_set(OBS_EAGER, cx_setting_bool("XLA_USE_EAGER_DEBUG_MODE"));
    cx_obs_set(OBS_PROFILE_SERVER, cx_setting_int("CX_PROFILE_PORT") > 0);
    cx_obs_set(OBS_IR_DEBUG, c->ir_debug);
    cx_obs_set(OBS_PROGRAM_DUMP, c->dump_dir != NULL);
    cx_obs_set(OBS_SAVE_FAILED, c->dump_dir != NULL || c->save_hlo_file != NULL);
}

static void read_env_once(void)
{
    pthread_mutex_lock(&g_cfg_mu);
    if (!(atomic_load(&cx_obs_flags) & OBS_UNINIT)) { pthread_mutex_unlock(&g_cfg_mu); return; }
    read_env_locked();
    cx_obs_set(OBS_UNINIT, false);
    pthread_mutex_unlock(&g_cfg_mu);
    /* outside the lock: cx_cache_init may report through cx_set_error */
    const char *dir = cx_setting_str("CX_CACHE_DIR");
    if (dir && *dir && !cx_cache_dir() && cx_cache_init(dir, cx_setting_bool("CX_CACHE_READONLY")) != CX_OK)
        cx_logf(CX_LOG_ERROR, "cache", "CX_CACHE_DIR=%s: %s", dir, cx_last_error());
}

__attribute__((constructor)) static void register_env(void) { cx_obs_hooks.env = read_env_once; }

void cx_debug_reload_env(void)
{
    pthread_mutex_lock(&g_cfg_mu);
    read_env_locked();
    cx_obs_set(OBS_UNINIT, false);
    pthread_mutex_unlock(&g_cfg_mu);
}

int cx_debug_level(void)
{
    cx_obs_get();
    return cx_obs_cfg.debug_level;
}

void cx_obs_rank_path(char *buf, size_t cap, const char *path)
{
    if (cx_world_size() > 1) snprintf(buf, cap, "%s.%d", path, cx_global_ordinal());
    else snprintf(buf, cap, "%s", path);
}

cx_status cx_obs_mkdir(const char *who, const char *path)
{
    char failed[256];
    int err = cx_mkdir_p(path, failed, sizeof failed);
    if (err == 0) return CX_OK;
    cx_set_last_error("%s: cannot create %s: %s", who, failed, strerror(err));
    return CX_ERR_IO;
}
