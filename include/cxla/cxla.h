/* cxla: PyTorch/XLA's training stack in C. The umbrella header. Which
 * thread may call what, and who frees what: core.h's "threads and
 * ownership" section, then each header's own paragraph (docs/api.md). */
#ifndef CXLA_CXLA_H
#define CXLA_CXLA_H

#include <cxla/core.h>
#include <cxla/comm.h>
#include <cxla/nn.h>
#include <cxla/gpt.h>
#include <cxla/optim.h>
#include <cxla/data.h>
#include <cxla/parallel.h>
#include <cxla/checkpoint.h>
#include <cxla/metrics.h>
#include <cxla/debug.h>
#include <cxla/profiler.h>
#include <cxla/cache.h>
#include <cxla/fsdp.h>
#include <cxla/spmd.h>
#include <cxla/logging.h>

#endif
