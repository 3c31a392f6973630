/* A stand-in for libcuda and libnccl in one library, for the NCCL adaptor's watchdog tests on
 * machines without a GPU. It is named to the CUDA adaptor's loader as the process's driver
 * (linked with a weak stub for every other symbol that loader binds, generated from
 * cuda_symbols.txt) and as the NCCL adaptor's libnccl, so the CUDA and NCCL halves share one
 * state.
 *
 * Streams are objects the test makes (fake_stream_new). A collective counts one operation on its
 * stream; the operation completes at once unless the stream is held (fake_stream_hold), and then
 * only through fake_stream_complete or an abort of a communicator that used the stream (NCCL's
 * kernels exit on abort). An event remembers how many operations its stream had when it was
 * recorded and is done once that many completed. Communicators keep counters by rank (0..15), so
 * tests running side by side each read their own. No CUDA or NCCL header is needed: the few
 * declarations are written out as the adaptor binds them. */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int result_t;

enum { MAX_RANKS = 16, MAX_STREAMS = 8, NOT_READY = 600, SUCCESS = 0, INVALID_ARGUMENT = 4 };

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_SEQ_CST)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_SEQ_CST)
#define ADD(x, v) __atomic_add_fetch(&(x), (v), __ATOMIC_SEQ_CST)

struct stream {
    uint64_t enqueued;
    uint64_t completed;
    int held;
    int capturing;
};

struct event {
    struct stream *s;
    uint64_t target;
};

struct comm {
    int rank;
    int nranks;
    struct stream *streams[MAX_STREAMS];
};

typedef struct {
    char internal[128];
} unique_id_t;

static int aborts[MAX_RANKS];
static int destroys[MAX_RANKS];
static int async_errors[MAX_RANKS];
static int init_holds[MAX_RANKS];
static int abort_holds_ms[MAX_RANKS];
static int aborts_finished[MAX_RANKS];
static long events_live;
static int context;

/* ---- controls for the tests ---- */

void *fake_stream_new(void) { return calloc(1, sizeof(struct stream)); }

void fake_stream_hold(void *s, int held) { STORE(((struct stream *)s)->held, held); }

void fake_stream_capture(void *s, int capturing) {
    STORE(((struct stream *)s)->capturing, capturing);
}

/* Completes the next `n` operations of the stream (at most those enqueued). */
void fake_stream_complete(void *sv, uint64_t n) {
    struct stream *s = sv;
    uint64_t done = LOAD(s->completed) + n;
    uint64_t all = LOAD(s->enqueued);
    STORE(s->completed, done < all ? done : all);
}

/* 1 when every operation of the stream completed (what a synchronize waits for). */
int fake_stream_idle(void *sv) {
    struct stream *s = sv;
    return LOAD(s->completed) == LOAD(s->enqueued);
}

int fake_aborts(int rank) { return LOAD(aborts[rank]); }

int fake_destroys(int rank) { return LOAD(destroys[rank]); }

void fake_set_async_error(int rank, int rc) { STORE(async_errors[rank], rc); }

/* While set, ncclCommInitRank of `rank` waits (as NCCL's does for a peer that never joins). */
void fake_init_hold(int rank, int hold) { STORE(init_holds[rank], hold); }

/* ncclCommAbort of `rank` takes `ms` after draining its streams (as a real abort can, while
 * NCCL tears down its proxy and connections). */
void fake_abort_hold(int rank, int ms) { STORE(abort_holds_ms[rank], ms); }

/* How many aborts of `rank` have returned. */
int fake_aborts_finished(int rank) { return LOAD(aborts_finished[rank]); }

long fake_events_live(void) { return LOAD(events_live); }

/* ---- NCCL ---- */

static void enqueue(struct comm *c, void *sv) {
    struct stream *s = sv;
    if (!s) {
        return;
    }
    uint64_t n = ADD(s->enqueued, 1);
    if (!LOAD(s->held)) {
        STORE(s->completed, n);
    }
    for (int i = 0; i < MAX_STREAMS; i++) {
        struct stream *seen = LOAD(c->streams[i]);
        if (seen == s) {
            return;
        }
        if (!seen) {
            STORE(c->streams[i], s);
            return;
        }
    }
}

result_t ncclGetVersion(int *v) {
    *v = 22605;
    return SUCCESS;
}

result_t ncclGetUniqueId(unique_id_t *id) {
    memset(id, 0, sizeof *id);
    return SUCCESS;
}

result_t ncclCommInitRank(struct comm **out, int nranks, unique_id_t id, int rank) {
    (void)id;
    if (rank < 0 || rank >= MAX_RANKS) {
        return INVALID_ARGUMENT;
    }
    while (LOAD(init_holds[rank])) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    struct comm *c = calloc(1, sizeof *c);
    c->rank = rank;
    c->nranks = nranks;
    *out = c;
    return SUCCESS;
}

result_t ncclCommFinalize(struct comm *c) {
    (void)c;
    return SUCCESS;
}

result_t ncclCommDestroy(struct comm *c) {
    ADD(destroys[c->rank], 1);
    return SUCCESS;
}

/* Like NCCL's: the communicator's kernels exit, so its streams drain. The object is kept (not
 * freed) so that a second teardown would be counted rather than crash. */
result_t ncclCommAbort(struct comm *c) {
    ADD(aborts[c->rank], 1);
    for (int i = 0; i < MAX_STREAMS; i++) {
        struct stream *s = LOAD(c->streams[i]);
        if (s) {
            STORE(s->completed, LOAD(s->enqueued));
        }
    }
    int hold = LOAD(abort_holds_ms[c->rank]);
    if (hold > 0) {
        struct timespec t = {hold / 1000, (long)(hold % 1000) * 1000000L};
        nanosleep(&t, NULL);
    }
    ADD(aborts_finished[c->rank], 1);
    return SUCCESS;
}

result_t ncclCommGetAsyncError(struct comm *c, result_t *rc) {
    *rc = LOAD(async_errors[c->rank]);
    return SUCCESS;
}

result_t ncclCommCount(struct comm *c, int *n) {
    *n = c->nranks;
    return SUCCESS;
}

result_t ncclCommUserRank(struct comm *c, int *r) {
    *r = c->rank;
    return SUCCESS;
}

result_t ncclCommCuDevice(struct comm *c, int *d) {
    (void)c;
    *d = 0;
    return SUCCESS;
}

result_t ncclAllReduce(const void *s, void *r, size_t n, int t, int op, struct comm *c, void *st) {
    (void)s, (void)r, (void)n, (void)t, (void)op;
    enqueue(c, st);
    return SUCCESS;
}

result_t ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, struct comm *c,
                           void *st) {
    return ncclAllReduce(s, r, n, t, op, c, st);
}

result_t ncclAllGather(const void *s, void *r, size_t n, int t, struct comm *c, void *st) {
    (void)s, (void)r, (void)n, (void)t;
    enqueue(c, st);
    return SUCCESS;
}

result_t ncclBroadcast(const void *s, void *r, size_t n, int t, int root, struct comm *c,
                       void *st) {
    (void)s, (void)r, (void)n, (void)t, (void)root;
    enqueue(c, st);
    return SUCCESS;
}

result_t ncclReduce(const void *s, void *r, size_t n, int t, int op, int root, struct comm *c,
                    void *st) {
    (void)s, (void)r, (void)n, (void)t, (void)op, (void)root;
    enqueue(c, st);
    return SUCCESS;
}

result_t ncclSend(const void *b, size_t n, int t, int peer, struct comm *c, void *st) {
    (void)b, (void)n, (void)t, (void)peer;
    enqueue(c, st);
    return SUCCESS;
}

result_t ncclRecv(void *b, size_t n, int t, int peer, struct comm *c, void *st) {
    (void)b, (void)n, (void)t, (void)peer;
    enqueue(c, st);
    return SUCCESS;
}

result_t ncclGroupStart(void) { return SUCCESS; }

result_t ncclGroupEnd(void) { return SUCCESS; }

const char *ncclGetErrorString(result_t rc) {
    return rc == 6 ? "remote process exited or there was a network error" : "fake error";
}

const char *ncclGetLastError(struct comm *c) {
    (void)c;
    return "";
}

/* ---- CUDA driver ---- */

int cuInit(unsigned flags) {
    (void)flags;
    return SUCCESS;
}

int cuGetErrorName(int rc, const char **name) {
    (void)rc;
    *name = "CUDA_ERROR_FAKE";
    return SUCCESS;
}

int cuCtxGetCurrent(void **ctx) {
    *ctx = &context;
    return SUCCESS;
}

int cuCtxSetCurrent(void *ctx) {
    (void)ctx;
    return SUCCESS;
}

int cuCtxPushCurrent_v2(void *ctx) {
    (void)ctx;
    return SUCCESS;
}

int cuCtxPopCurrent_v2(void **ctx) {
    *ctx = &context;
    return SUCCESS;
}

int cuEventCreate(struct event **e, unsigned flags) {
    (void)flags;
    *e = calloc(1, sizeof **e);
    ADD(events_live, 1);
    return SUCCESS;
}

int cuEventRecord(struct event *e, struct stream *s) {
    e->s = s;
    e->target = s ? LOAD(s->enqueued) : 0;
    return SUCCESS;
}

int cuEventQuery(struct event *e) {
    if (!e->s || LOAD(e->s->completed) >= e->target) {
        return SUCCESS;
    }
    return NOT_READY;
}

int cuEventDestroy_v2(struct event *e) {
    free(e);
    ADD(events_live, -1);
    return SUCCESS;
}

int cuStreamIsCapturing(struct stream *s, int *status) {
    *status = s ? LOAD(s->capturing) : 0;
    return SUCCESS;
}

int cuThreadExchangeStreamCaptureMode(int *mode) {
    (void)mode;
    return SUCCESS;
}
