/* Persistent compile-cache entries: the decompressed payload of a .cxe
 * file (the executable's slots, kernels, programs and views), fed to the
 * validating loader the cache uses before the executor may see an entry.
 * The file's header, zstd frame and checksum sit in front of this in a
 * real load; fuzzing behind them reaches the structure checks directly.
 * The seeds are payloads of real entries (the cnn's and the mlp's training
 * steps), taken with cx_disk_cache_payload. */
#include "fuzz_common.h"

#include <stdbool.h>
#include <stddef.h>

bool cx_disk_cache_payload_ok(const unsigned char *payload, size_t n);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    cx_disk_cache_payload_ok(data, n);
    return 0;
}
