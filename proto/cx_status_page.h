/* The collective status page: the one definition of its format, shared by
 * its writer (each rank, parallel/watch_page.c) and its reader (xla-launch's
 * watchdog and restart decisions, launch/watch.c). The two are separate
 * programs that never link each other, so the format is a protocol between
 * them; keeping it here, header-only and free of any cxla type, lets both
 * compile against the same sizes, offsets and formats instead of two
 * copies that can drift. proto/ is on the include path of the parallel
 * layer and of the launcher only, and is never installed: this is not
 * public API (tests/api/check_layers.sh checks who sees it).
 *
 * When the launcher sets CX_STATUS_DIR, each rank keeps DIR/rank-<r>.status,
 * a shared mapping of CX_STATUS_LINES fixed lines of CX_STATUS_LINE bytes,
 * each padded with spaces and ending in '\n':
 *   line 0        header: "cxla-status 1 rank R pid P seq S state in|idle since NS"
 *   lines 1..RING the last RING collectives, a ring by sequence number S
 *                 (line CX_STATUS_RING_LINE(S)):
 *                 "#S|all_reduce f32[1024]|group G|running|done|failed|start NS|end NS"
 *   line RING + 1 "progress steps N open NS first NS compile S hits H load S"
 * NS: CLOCK_MONOTONIC nanoseconds, comparable on one node. A format change
 * that an older reader would misread bumps CX_STATUS_VERSION. */
#ifndef CX_STATUS_PAGE_H
#define CX_STATUS_PAGE_H

#define CX_STATUS_STR_(x) #x
#define CX_STATUS_STR(x) CX_STATUS_STR_(x)

/* Where the pages are: the directory the launcher makes and names in this
 * variable, one file per rank. */
#define CX_STATUS_DIR_ENV "CX_STATUS_DIR"
#define CX_STATUS_FILE_PREFIX "rank-"
#define CX_STATUS_FILE_FMT CX_STATUS_FILE_PREFIX "%d.status"   /* printf and sscanf alike */

/* Geometry: lines are fixed so the reader can seek to one and the writer
 * rewrites one with plain stores, never moving the others. */
#define CX_STATUS_LINE 128
#define CX_STATUS_RING 64
#define CX_STATUS_HEADER_LINE 0
#define CX_STATUS_RING_LINE(seq) (1 + (int)(((seq) - 1) % CX_STATUS_RING))
#define CX_STATUS_PROGRESS_LINE (1 + CX_STATUS_RING)
#define CX_STATUS_LINES (2 + CX_STATUS_RING)
#define CX_STATUS_BYTES ((size_t)CX_STATUS_LINES * CX_STATUS_LINE)

/* The header line. The magic and version lead the page, so a reader
 * rejects a file that is not (yet, or no longer) a page of its version. */
#define CX_STATUS_MAGIC "cxla-status"
#define CX_STATUS_VERSION 1
#define CX_STATUS_STATE_IN "in"       /* inside a collective since `since` */
#define CX_STATUS_STATE_IDLE "idle"   /* between collectives since `since` */
#define CX_STATUS_STATE_MAX 7         /* characters of a state word at most */
/* printf: rank, pid, seq, state, since */
#define CX_STATUS_HEADER_FMT \
    CX_STATUS_MAGIC " " CX_STATUS_STR(CX_STATUS_VERSION) " rank %d pid %d seq %lld state %s since %lld"
/* sscanf of the same, into a char[CX_STATUS_STATE_MAX + 1] state: 5 fields */
#define CX_STATUS_HEADER_SCAN                                                                              \
    CX_STATUS_MAGIC " " CX_STATUS_STR(CX_STATUS_VERSION) " rank %d pid %d seq %lld state %" CX_STATUS_STR( \
        CX_STATUS_STATE_MAX) "s since %lld"
#define CX_STATUS_HEADER_FIELDS 5

/* A ring line. The description names the collective ("all_reduce
 * f32[1024]", or its label) in at most CX_STATUS_DESC_MAX characters,
 * which leaves room for the other fields within one line. */
#define CX_STATUS_DESC_MAX 99
#define CX_STATUS_RUNNING "running"
#define CX_STATUS_DONE "done"
#define CX_STATUS_FAILED "failed"
/* printf: seq, description, group size (-1: the world), running|done|failed, start, end (0 while running) */
#define CX_STATUS_RING_FMT "#%lld|%s|group %d|%s|start %lld|end %lld"
/* sscanf of its first two fields, into a char[CX_STATUS_DESC_MAX + 1] description */
#define CX_STATUS_RING_SCAN "#%lld|%" CX_STATUS_STR(CX_STATUS_DESC_MAX) "[^|]|"
#define CX_STATUS_RING_SCAN_FIELDS 2

/* The progress line: steps ended, when the page opened (after MPI_Init)
 * and when the first step ended, and by then the compile seconds,
 * persistent-cache hits and checkpoint-load seconds. */
/* printf: steps, open, first, compile, hits, load */
#define CX_STATUS_PROGRESS_FMT "progress steps %lld open %lld first %lld compile %.6f hits %lld load %.6f"
/* sscanf of the same (doubles for compile and load): 6 fields */
#define CX_STATUS_PROGRESS_SCAN "progress steps %lld open %lld first %lld compile %lf hits %lld load %lf"
#define CX_STATUS_PROGRESS_FIELDS 6

#endif
