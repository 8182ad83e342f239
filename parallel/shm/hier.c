/* The hierarchical all-reduce (hier.h). */
#include "hier.h"

#include "cx_settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cx_hier {
    MPI_Comm node;       /* this node's ranks of c */
    MPI_Comm leaders;    /* local rank 0 of every node; MPI_COMM_NULL elsewhere */
    cx_shm *shm;         /* over node */
    int node_rank;
};

cx_hier *cx_hier_open(MPI_Comm c, char *err, size_t errn)
{
    err[0] = 0;
    int rank, size, node_size = 0, all_one = 0;
    MPI_Comm_rank(c, &rank);
    MPI_Comm_size(c, &size);
    /* opt-in: on the 2-host test cluster (4 ranks on 2 cores, TCP over
     * veth at 0.4 GB/s) it measured 0.2-0.7x of a flat MPI_Allreduce */
    int on = cx_shm_wanted() && cx_setting_bool("CX_SHM_HIERARCHICAL");
    MPI_Bcast(&on, 1, MPI_INT, 0, c);
    if (!on) return NULL;
    MPI_Comm node;
    if (cx_shm_split_node(c, &node) != MPI_SUCCESS) return NULL;
    MPI_Comm_size(node, &node_size);
    int one = node_size == size;
    MPI_Allreduce(&one, &all_one, 1, MPI_INT, MPI_MIN, c);
    cx_hier *h = all_one ? NULL : calloc(1, sizeof *h);
    int ok = h != NULL, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, c);
    if (!all_ok) {   /* one node, or out of memory somewhere: flat */
        if (!all_one) snprintf(err, errn, "hierarchical all-reduce off: out of memory");
        free(h);
        MPI_Comm_free(&node);
        return NULL;
    }
    h->node = node;
    MPI_Comm_rank(node, &h->node_rank);
    MPI_Comm_split(c, h->node_rank == 0 ? 0 : MPI_UNDEFINED, rank, &h->leaders);
    if (h->leaders != MPI_COMM_NULL) MPI_Comm_set_errhandler(h->leaders, MPI_ERRORS_RETURN);
    /* a node of one rank has nothing to share: its shm stays NULL */
    char why[256] = "";
    h->shm = node_size > 1 ? cx_shm_open(node, why, sizeof why) : NULL;
    int mine = node_size == 1 || h->shm != NULL;
    MPI_Allreduce(&mine, &ok, 1, MPI_INT, MPI_MIN, c);
    if (!ok) {
        snprintf(err, errn, "hierarchical all-reduce off: %s", why[0] ? why : "a node could not map its segment");
        cx_hier_close(h);
        return NULL;
    }
    return h;
}

void cx_hier_close(cx_hier *h)
{
    if (!h) return;
    cx_shm_close(h->shm);
    if (h->leaders != MPI_COMM_NULL) MPI_Comm_free(&h->leaders);
    MPI_Comm_free(&h->node);
    free(h);
}

bool cx_hier_takes(cx_dtype dt) { return dt != CX_BF16 && cx_shm_reduces(dt); }

cx_status cx_hier_all_reduce(cx_hier *h, void *out, const void *in, int64_t count, cx_dtype dt, cx_reduce_op red,
                             double scale, MPI_Op mpi_op, MPI_Datatype mpi_dt, char *err, size_t errn)
{
    size_t es = cx_dtype_size(dt);
    /* 1. the node's sum, on every rank of the node (the leader needs it;
     * the others' copies are overwritten by the broadcast) */
    if (h->shm) {
        if (cx_shm_all_reduce(h->shm, out, in, count, dt, red, 1.0, err, errn) != CX_OK) return CX_ERR_COMM;
    } else if (out != in) {
        memcpy(out, in, es * (size_t)count);
    }
    /* 2. between nodes, in pieces MPI's int count can hold */
    if (h->leaders != MPI_COMM_NULL) {
        const int64_t piece = (int64_t)1 << 30;
        for (int64_t off = 0; off < count; off += piece) {
            int n = (int)(count - off < piece ? count - off : piece);
            int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)out + es * (size_t)off, n, mpi_dt, mpi_op, h->leaders);
            if (rc != MPI_SUCCESS) {
                char msg[MPI_MAX_ERROR_STRING];
                int len = 0;
                MPI_Error_string(rc, msg, &len);
                snprintf(err, errn, "hierarchical all-reduce between nodes: %.200s", msg);
                return CX_ERR_COMM;
            }
        }
    }
    /* 3. the leader's result to the node, then the scale (after the whole
     * sum, as the flat paths apply it) */
    if (h->shm && cx_shm_broadcast(h->shm, out, count * (int64_t)es, 0, err, errn) != CX_OK) return CX_ERR_COMM;
    if (scale != 1.0) cx_shm_copy_out(out, out, count, dt, scale, false);
    return CX_OK;
}
