/* ferrocx example plugin in C: a device adaptor whose "device memory" is host memory.
 *
 * Build (from this directory; see README.md):
 *   cc -shared -fPIC -I ../../include plugin.c -o libferrocx_adaptor_cexample.so
 *
 * It exports one table, `ferrocx_device_adaptor_v1`, declared in the generated header
 * ferrocx_plugin.h. What it shows a C/C++ vendor:
 *   - the header every table starts with (magic, ABI version, struct_size, name);
 *   - a thread-local last error behind get_last_error, set by every failing entry;
 *   - get_properties writing no byte past the caller's struct_size;
 *   - handles (streams, events) checked before use: an unknown one is INVALID_HANDLE;
 *   - NULL entries for what it does not support (stream_wrap, IPC): the core then knows up front.
 *
 * Streams and events, as CUDA defines them. Each stream is a queue and a worker thread that
 * runs its operations (copies, memsets, host functions, event records, waits) one after another:
 * the enqueueing call returns at once, and work on a stream completes in the order it was
 * enqueued. An event record completes a fresh latch when its stream reaches it; the event keeps
 * its most recent latch, and stream_wait_event waits for the latch the event has *when the wait
 * is enqueued*, so re-recording an event does not redirect an earlier wait, and a wait on an
 * event never recorded does not wait. The null stream is a stream like the others (created on
 * first use), with no implicit synchronisation with other streams.
 *
 * C11 plus POSIX threads and clock_gettime; warning-free with -Wall -Wextra.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ferrocx_plugin.h"

#define FX_NAME "cexample"
/* Alignment of every allocation, as a GPU allocator gives. */
#define FX_ALIGN 256u
/* Event flag bit 0: no timing (the ABI's only event flag). */
#define FX_EVENT_DISABLE_TIMING 1u

/* ---- last error ------------------------------------------------------------------------- */

static _Thread_local char last_error[256];

static const char *get_last_error(void) { return last_error; }

/* Stores the message for get_last_error and returns `status`. */
static FerrocxStatus fail(FerrocxStatus status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(last_error, sizeof last_error, format, args);
    va_end(args);
    return status;
}

/* ---- state: allocations, streams, events ------------------------------------------------- */

/* Completed once, when the stream reaches the event_record that made it. Reference-counted: the
 * event (while it is the most recent record), the record operation and each wait hold one. */
typedef struct {
    int refs;
    bool done;
    struct timespec at; /* when it completed */
} FxLatch;

typedef enum { OP_COPY, OP_SET, OP_HOST_FUNC, OP_RECORD, OP_WAIT } FxOpKind;

typedef struct FxOp {
    FxOpKind kind;
    void *dst;          /* OP_COPY, OP_SET */
    const void *src;    /* OP_COPY */
    size_t bytes;       /* OP_COPY, OP_SET */
    uint8_t value;      /* OP_SET */
    FerrocxHostFn func; /* OP_HOST_FUNC */
    void *user;         /* OP_HOST_FUNC */
    FxLatch *latch;     /* OP_RECORD, OP_WAIT */
    struct FxOp *next;
} FxOp;

typedef struct FxStream {
    FxOp *head, *tail; /* pending operations, oldest first */
    bool busy;         /* the worker is running an operation */
    bool closing;      /* destroyed: the worker exits once the queue is empty */
    struct FxStream *next;
} FxStream;

typedef struct FxEvent {
    bool timing;
    FxLatch *latest; /* the most recent record; NULL before the first */
    struct FxEvent *next;
} FxEvent;

typedef struct FxAllocation {
    void *ptr;
    FerrocxMemKind kind;
    struct FxAllocation *next;
} FxAllocation;

/* One lock guards every list and object below; one condition announces every change (work
 * enqueued, an operation done, a latch completed, a worker gone). Entries may be called from
 * any thread. Handles are the objects' addresses, looked up in their list before any use. */
static pthread_mutex_t fx_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fx_changed = PTHREAD_COND_INITIALIZER;
static FxAllocation *allocations;
static FxStream *streams;        /* from stream_create */
static FxStream *default_stream; /* the null stream, started on first use */
static FxEvent *events;
static int workers; /* worker threads still running */

static void latch_release_locked(FxLatch *latch) {
    if (--latch->refs == 0) free(latch);
}

/* Runs one operation; called by a worker with the lock held, which it drops around the work. */
static void run_op_locked(FxOp *op) {
    switch (op->kind) {
    case OP_COPY:
        pthread_mutex_unlock(&fx_lock);
        memmove(op->dst, op->src, op->bytes);
        pthread_mutex_lock(&fx_lock);
        break;
    case OP_SET:
        pthread_mutex_unlock(&fx_lock);
        memset(op->dst, op->value, op->bytes);
        pthread_mutex_lock(&fx_lock);
        break;
    case OP_HOST_FUNC:
        pthread_mutex_unlock(&fx_lock);
        op->func(op->user);
        pthread_mutex_lock(&fx_lock);
        break;
    case OP_RECORD:
        clock_gettime(CLOCK_MONOTONIC, &op->latch->at);
        op->latch->done = true;
        latch_release_locked(op->latch);
        break;
    case OP_WAIT:
        while (!op->latch->done) pthread_cond_wait(&fx_changed, &fx_lock);
        latch_release_locked(op->latch);
        break;
    }
}

static void *stream_worker(void *arg) {
    FxStream *s = arg;
    pthread_mutex_lock(&fx_lock);
    for (;;) {
        FxOp *op = s->head;
        if (!op) {
            if (s->closing) break;
            pthread_cond_wait(&fx_changed, &fx_lock);
            continue;
        }
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        s->busy = true;
        run_op_locked(op);
        s->busy = false;
        free(op);
        pthread_cond_broadcast(&fx_changed);
    }
    workers--;
    pthread_cond_broadcast(&fx_changed);
    pthread_mutex_unlock(&fx_lock);
    free(s);
    return NULL;
}

/* A new stream and its (detached) worker; called with the lock held. NULL if out of resources. */
static FxStream *stream_start_locked(void) {
    pthread_t thread;
    FxStream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (pthread_create(&thread, NULL, stream_worker, s) != 0) {
        free(s);
        return NULL;
    }
    pthread_detach(thread);
    workers++;
    return s;
}

/* The stream of a handle (null: the default stream); called with the lock held. */
static FerrocxStatus stream_locked(const char *entry, FerrocxStream handle, FxStream **out) {
    if (!handle) {
        if (!default_stream) default_stream = stream_start_locked();
        *out = default_stream;
        return default_stream ? FerrocxStatus_SUCCESS
                              : fail(FerrocxStatus_SYSTEM_ERROR,
                                     "%s: cannot start the default stream's thread", entry);
    }
    for (FxStream *s = streams; s; s = s->next) {
        if (s == handle) {
            *out = s;
            return FerrocxStatus_SUCCESS;
        }
    }
    return fail(FerrocxStatus_INVALID_HANDLE, "%s: unknown stream %p", entry, handle);
}

static FerrocxStatus event_locked(const char *entry, FerrocxEvent handle, FxEvent **out) {
    for (FxEvent *e = events; e; e = e->next) {
        if (e == handle) {
            *out = e;
            return FerrocxStatus_SUCCESS;
        }
    }
    return fail(FerrocxStatus_INVALID_HANDLE, "%s: unknown event %p", entry, handle);
}

static void push_locked(FxStream *s, FxOp *op) {
    op->next = NULL;
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    pthread_cond_broadcast(&fx_changed);
}

/* Enqueues a copy of `op` on `stream`. */
static FerrocxStatus enqueue(const char *entry, FerrocxStream stream, FxOp op) {
    FxStream *s = NULL;
    FerrocxStatus status;
    FxOp *queued = malloc(sizeof *queued);
    if (!queued) return fail(FerrocxStatus_OUT_OF_MEMORY, "%s: out of memory", entry);
    *queued = op;
    pthread_mutex_lock(&fx_lock);
    status = stream_locked(entry, stream, &s);
    if (status == FerrocxStatus_SUCCESS) push_locked(s, queued);
    pthread_mutex_unlock(&fx_lock);
    if (status != FerrocxStatus_SUCCESS) free(queued);
    return status;
}

/* ---- memory size: /proc/meminfo ----------------------------------------------------------- */

/* Reads `MemTotal` and `MemAvailable` (bytes). Returns false if the file cannot be read. */
static bool read_meminfo(size_t *total, size_t *available) {
    char line[128];
    unsigned long long kib;
    bool got_total = false, got_available = false;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return false;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) {
            *total = (size_t)kib * 1024u;
            got_total = true;
        } else if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
            *available = (size_t)kib * 1024u;
            got_available = true;
        }
    }
    fclose(f);
    return got_total && got_available;
}

/* ---- adaptor ------------------------------------------------------------------------------ */

static FerrocxStatus init(const FerrocxKeyValue *options, size_t n_options) {
    if (n_options > 0 && !options)
        return fail(FerrocxStatus_INVALID_ARGUMENT, "init: `options` is null");
    /* This device has no options; a real one reads e.g. a library path here. */
    for (size_t i = 0; i < n_options; i++)
        if (!options[i].key || !options[i].value)
            return fail(FerrocxStatus_INVALID_ARGUMENT, "init: option %zu is null", i);
    return FerrocxStatus_SUCCESS;
}

/* Lets every stream finish its work, stops the workers, and frees everything. */
static FerrocxStatus finalize(void) {
    pthread_mutex_lock(&fx_lock);
    for (FxStream *s = streams; s; s = s->next) s->closing = true;
    if (default_stream) default_stream->closing = true;
    streams = NULL;
    default_stream = NULL;
    pthread_cond_broadcast(&fx_changed);
    while (workers > 0) pthread_cond_wait(&fx_changed, &fx_lock);
    while (events) {
        FxEvent *e = events;
        events = e->next;
        if (e->latest) latch_release_locked(e->latest);
        free(e);
    }
    while (allocations) {
        FxAllocation *a = allocations;
        allocations = a->next;
        free(a->ptr);
        free(a);
    }
    pthread_mutex_unlock(&fx_lock);
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus device_count(int32_t *count) {
    if (!count) return fail(FerrocxStatus_INVALID_ARGUMENT, "device_count: `count` is null");
    *count = 1;
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus set_device(int32_t device) {
    if (device != 0)
        return fail(FerrocxStatus_INVALID_ARGUMENT,
                    "set_device: device %d does not exist (this adaptor has device 0)",
                    (int)device);
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus get_device(int32_t *device) {
    if (!device) return fail(FerrocxStatus_INVALID_ARGUMENT, "get_device: `device` is null");
    *device = 0;
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus get_properties(int32_t device, FerrocxDeviceProperties *props) {
    FerrocxDeviceProperties p;
    size_t total = 0, available = 0, n;
    if (!props) return fail(FerrocxStatus_INVALID_ARGUMENT, "get_properties: `props` is null");
    if (device != 0)
        return fail(FerrocxStatus_INVALID_ARGUMENT,
                    "get_properties: device %d does not exist", (int)device);
    if (props->struct_size < 8)
        return fail(FerrocxStatus_INVALID_ARGUMENT,
                    "get_properties: `props->struct_size` %u is too small",
                    (unsigned)props->struct_size);
    memset(&p, 0, sizeof p);
    strncpy(p.vendor, "ferrocx-example", sizeof p.vendor - 1);
    strncpy(p.name, "host memory (C example)", sizeof p.name - 1);
    p.capabilities = FerrocxCapabilities_HOST_ADDRESSABLE | FerrocxCapabilities_HOST_FUNC |
                     FerrocxCapabilities_TIMED_EVENTS;
    if (read_meminfo(&total, &available)) p.total_memory = total;
    p.device_count = 1;
    /* The caller's struct may be older (smaller) than ours: write no byte past its size, and
     * keep its own struct_size and reserved words (the first 8 bytes). */
    n = props->struct_size < sizeof p ? props->struct_size : sizeof p;
    memcpy((char *)props + 8, (const char *)&p + 8, n - 8);
    return FerrocxStatus_SUCCESS;
}

/* ABI 1.1. A plugin compiled against the 1.0 header has no such field, and loads all the same. */
static FerrocxStatus mem_get_info(size_t *free_bytes, size_t *total_bytes) {
    if (!free_bytes || !total_bytes)
        return fail(FerrocxStatus_INVALID_ARGUMENT, "mem_get_info: `free` or `total` is null");
    if (!read_meminfo(total_bytes, free_bytes))
        return fail(FerrocxStatus_SYSTEM_ERROR, "mem_get_info: cannot read /proc/meminfo");
    return FerrocxStatus_SUCCESS;
}

/* ---- memory -------------------------------------------------------------------------------- */

static FerrocxStatus mem_alloc(size_t bytes, FerrocxMemKind kind, FerrocxDevicePtr *ptr) {
    void *p;
    FxAllocation *a;
    if (!ptr) return fail(FerrocxStatus_INVALID_ARGUMENT, "mem_alloc: `ptr` is null");
    if (bytes == 0) return fail(FerrocxStatus_INVALID_ARGUMENT, "mem_alloc: cannot allocate 0 bytes");
    if (kind != FerrocxMemKind_DEVICE && kind != FerrocxMemKind_HOST && kind != FerrocxMemKind_PINNED)
        return fail(FerrocxStatus_INVALID_ARGUMENT, "mem_alloc: unknown memory kind %u",
                    (unsigned)kind);
    if (bytes > SIZE_MAX - FX_ALIGN)
        return fail(FerrocxStatus_OUT_OF_MEMORY, "mem_alloc: %zu bytes is too large", bytes);
    /* aligned_alloc wants a multiple of the alignment */
    p = aligned_alloc(FX_ALIGN, (bytes + FX_ALIGN - 1) / FX_ALIGN * FX_ALIGN);
    a = malloc(sizeof *a);
    if (!p || !a) {
        free(p);
        free(a);
        return fail(FerrocxStatus_OUT_OF_MEMORY, "mem_alloc: %zu bytes: out of memory", bytes);
    }
    a->ptr = p;
    a->kind = kind;
    pthread_mutex_lock(&fx_lock);
    a->next = allocations;
    allocations = a;
    pthread_mutex_unlock(&fx_lock);
    *ptr = (FerrocxDevicePtr)(uintptr_t)p;
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus mem_free(FerrocxDevicePtr ptr, FerrocxMemKind kind) {
    void *p = (void *)(uintptr_t)ptr;
    FxAllocation *found = NULL, **link;
    FerrocxMemKind allocated_as = kind;
    if (!p) return FerrocxStatus_SUCCESS; /* as free(NULL) and cudaFree(0) */
    pthread_mutex_lock(&fx_lock);
    for (link = &allocations; *link; link = &(*link)->next) {
        if ((*link)->ptr == p) {
            allocated_as = (*link)->kind;
            if (allocated_as == kind) {
                found = *link;
                *link = found->next;
            }
            break;
        }
    }
    pthread_mutex_unlock(&fx_lock);
    if (allocated_as != kind)
        return fail(FerrocxStatus_INVALID_ARGUMENT,
                    "mem_free: %p was allocated as kind %u, freed as kind %u", p,
                    (unsigned)allocated_as, (unsigned)kind);
    if (!found)
        return fail(FerrocxStatus_INVALID_HANDLE,
                    "mem_free: %p is not an allocation of this device (or was freed)", p);
    free(found->ptr);
    free(found);
    return FerrocxStatus_SUCCESS;
}

/* Unified addressing: any two addresses of this process, allocations or not, as cuMemcpy. */
static FerrocxStatus mem_copy(FerrocxDevicePtr dst, FerrocxDevicePtr src, size_t bytes) {
    if (bytes == 0) return FerrocxStatus_SUCCESS;
    if (!dst || !src) return fail(FerrocxStatus_INVALID_ARGUMENT, "mem_copy: null address");
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus mem_copy_async(FerrocxDevicePtr dst, FerrocxDevicePtr src, size_t bytes,
                                    FerrocxStream stream) {
    FxOp op = {0};
    if (bytes > 0 && (!dst || !src))
        return fail(FerrocxStatus_INVALID_ARGUMENT, "mem_copy_async: null address");
    op.kind = OP_COPY;
    op.dst = (void *)(uintptr_t)dst;
    op.src = (const void *)(uintptr_t)src;
    op.bytes = bytes;
    return enqueue("mem_copy_async", stream, op);
}

static FerrocxStatus mem_set(FerrocxDevicePtr dst, uint8_t value, size_t bytes) {
    if (bytes == 0) return FerrocxStatus_SUCCESS;
    if (!dst) return fail(FerrocxStatus_INVALID_ARGUMENT, "mem_set: null address");
    memset((void *)(uintptr_t)dst, value, bytes);
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus mem_set_async(FerrocxDevicePtr dst, uint8_t value, size_t bytes,
                                   FerrocxStream stream) {
    FxOp op = {0};
    if (bytes > 0 && !dst)
        return fail(FerrocxStatus_INVALID_ARGUMENT, "mem_set_async: null address");
    op.kind = OP_SET;
    op.dst = (void *)(uintptr_t)dst;
    op.value = value;
    op.bytes = bytes;
    return enqueue("mem_set_async", stream, op);
}

/* ---- streams ------------------------------------------------------------------------------- */

static FerrocxStatus stream_create(uint32_t flags, FerrocxStream *stream) {
    FxStream *s = NULL;
    if (!stream) return fail(FerrocxStatus_INVALID_ARGUMENT, "stream_create: `stream` is null");
    if (flags > 1)
        return fail(FerrocxStatus_INVALID_ARGUMENT, "stream_create: unknown flags %#x",
                    (unsigned)flags);
    pthread_mutex_lock(&fx_lock);
    s = stream_start_locked();
    if (s) {
        s->next = streams;
        streams = s;
    }
    pthread_mutex_unlock(&fx_lock);
    if (!s) return fail(FerrocxStatus_SYSTEM_ERROR, "stream_create: cannot start a thread");
    *stream = s;
    return FerrocxStatus_SUCCESS;
}

/* Returns at once; the stream's worker finishes the work enqueued, then exits. */
static FerrocxStatus stream_destroy(FerrocxStream stream) {
    FxStream *found = NULL;
    if (!stream)
        return fail(FerrocxStatus_INVALID_HANDLE,
                    "stream_destroy: the default stream cannot be destroyed");
    pthread_mutex_lock(&fx_lock);
    for (FxStream **link = &streams; *link; link = &(*link)->next) {
        if (*link == stream) {
            found = *link;
            *link = found->next;
            found->closing = true;
            pthread_cond_broadcast(&fx_changed);
            break;
        }
    }
    pthread_mutex_unlock(&fx_lock);
    if (!found) return fail(FerrocxStatus_INVALID_HANDLE, "stream_destroy: unknown stream %p", stream);
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus stream_synchronize(FerrocxStream stream) {
    FxStream *s = NULL;
    FerrocxStatus status;
    pthread_mutex_lock(&fx_lock);
    status = stream_locked("stream_synchronize", stream, &s);
    if (status == FerrocxStatus_SUCCESS)
        while (s->head || s->busy) pthread_cond_wait(&fx_changed, &fx_lock);
    pthread_mutex_unlock(&fx_lock);
    return status;
}

static FerrocxStatus stream_query(FerrocxStream stream) {
    FxStream *s = NULL;
    FerrocxStatus status;
    pthread_mutex_lock(&fx_lock);
    status = stream_locked("stream_query", stream, &s);
    if (status == FerrocxStatus_SUCCESS && (s->head || s->busy)) status = FerrocxStatus_NOT_READY;
    pthread_mutex_unlock(&fx_lock);
    return status;
}

static FerrocxStatus launch_host_func(FerrocxStream stream, FerrocxHostFn func, void *user) {
    FxOp op = {0};
    if (!func) return fail(FerrocxStatus_INVALID_ARGUMENT, "launch_host_func: `func` is null");
    op.kind = OP_HOST_FUNC;
    op.func = func;
    op.user = user;
    return enqueue("launch_host_func", stream, op);
}

/* ---- events -------------------------------------------------------------------------------- */

static FerrocxStatus event_create(uint32_t flags, FerrocxEvent *event) {
    FxEvent *e = NULL;
    if (!event) return fail(FerrocxStatus_INVALID_ARGUMENT, "event_create: `event` is null");
    if (flags & ~FX_EVENT_DISABLE_TIMING)
        return fail(FerrocxStatus_INVALID_ARGUMENT, "event_create: unknown flags %#x",
                    (unsigned)flags);
    e = calloc(1, sizeof *e);
    if (!e) return fail(FerrocxStatus_OUT_OF_MEMORY, "event_create: out of memory");
    e->timing = !(flags & FX_EVENT_DISABLE_TIMING);
    pthread_mutex_lock(&fx_lock);
    e->next = events;
    events = e;
    pthread_mutex_unlock(&fx_lock);
    *event = e;
    return FerrocxStatus_SUCCESS;
}

/* Waits already enqueued hold their own reference to the latch and still complete. */
static FerrocxStatus event_destroy(FerrocxEvent event) {
    FxEvent *found = NULL;
    pthread_mutex_lock(&fx_lock);
    for (FxEvent **link = &events; *link; link = &(*link)->next) {
        if (*link == event) {
            found = *link;
            *link = found->next;
            if (found->latest) latch_release_locked(found->latest);
            break;
        }
    }
    pthread_mutex_unlock(&fx_lock);
    if (!found) return fail(FerrocxStatus_INVALID_HANDLE, "event_destroy: unknown event %p", event);
    free(found);
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus event_record(FerrocxEvent event, FerrocxStream stream) {
    FxStream *s = NULL;
    FxEvent *e = NULL;
    FerrocxStatus status;
    FxOp *op = calloc(1, sizeof *op);
    FxLatch *latch = calloc(1, sizeof *latch);
    if (!op || !latch) {
        free(op);
        free(latch);
        return fail(FerrocxStatus_OUT_OF_MEMORY, "event_record: out of memory");
    }
    pthread_mutex_lock(&fx_lock);
    status = event_locked("event_record", event, &e);
    if (status == FerrocxStatus_SUCCESS) status = stream_locked("event_record", stream, &s);
    if (status == FerrocxStatus_SUCCESS) {
        latch->refs = 2; /* the event's and the record operation's */
        if (e->latest) latch_release_locked(e->latest);
        e->latest = latch;
        op->kind = OP_RECORD;
        op->latch = latch;
        push_locked(s, op);
    }
    pthread_mutex_unlock(&fx_lock);
    if (status != FerrocxStatus_SUCCESS) {
        free(op);
        free(latch);
    }
    return status;
}

static FerrocxStatus stream_wait_event(FerrocxStream stream, FerrocxEvent event) {
    FxStream *s = NULL;
    FxEvent *e = NULL;
    FerrocxStatus status;
    FxOp *op = calloc(1, sizeof *op);
    if (!op) return fail(FerrocxStatus_OUT_OF_MEMORY, "stream_wait_event: out of memory");
    pthread_mutex_lock(&fx_lock);
    status = event_locked("stream_wait_event", event, &e);
    if (status == FerrocxStatus_SUCCESS) status = stream_locked("stream_wait_event", stream, &s);
    if (status == FerrocxStatus_SUCCESS && e->latest) { /* never recorded: nothing to wait for */
        e->latest->refs++;
        op->kind = OP_WAIT;
        op->latch = e->latest;
        push_locked(s, op);
        op = NULL;
    }
    pthread_mutex_unlock(&fx_lock);
    free(op);
    return status;
}

static FerrocxStatus event_synchronize(FerrocxEvent event) {
    FxEvent *e = NULL;
    FerrocxStatus status;
    pthread_mutex_lock(&fx_lock);
    status = event_locked("event_synchronize", event, &e);
    if (status == FerrocxStatus_SUCCESS && e->latest) {
        FxLatch *latch = e->latest;
        latch->refs++; /* the event may be re-recorded or destroyed while this waits */
        while (!latch->done) pthread_cond_wait(&fx_changed, &fx_lock);
        latch_release_locked(latch);
    }
    pthread_mutex_unlock(&fx_lock);
    return status;
}

static FerrocxStatus event_query(FerrocxEvent event) {
    FxEvent *e = NULL;
    FerrocxStatus status;
    pthread_mutex_lock(&fx_lock);
    status = event_locked("event_query", event, &e);
    if (status == FerrocxStatus_SUCCESS && e->latest && !e->latest->done)
        status = FerrocxStatus_NOT_READY;
    pthread_mutex_unlock(&fx_lock);
    return status;
}

static FerrocxStatus event_elapsed_ms(FerrocxEvent start, FerrocxEvent end, float *ms) {
    FxEvent *a = NULL, *b = NULL;
    FerrocxStatus status;
    if (!ms) return fail(FerrocxStatus_INVALID_ARGUMENT, "event_elapsed_ms: `ms` is null");
    pthread_mutex_lock(&fx_lock);
    status = event_locked("event_elapsed_ms", start, &a);
    if (status == FerrocxStatus_SUCCESS) status = event_locked("event_elapsed_ms", end, &b);
    if (status != FerrocxStatus_SUCCESS) {
        /* the message is set */
    } else if (!a->timing || !b->timing) {
        status = fail(FerrocxStatus_INVALID_ARGUMENT,
                      "event_elapsed_ms: an event created with DISABLE_TIMING has no time");
    } else if (!a->latest || !b->latest) {
        status = fail(FerrocxStatus_INVALID_ARGUMENT,
                      "event_elapsed_ms: both events must have been recorded");
    } else if (!a->latest->done || !b->latest->done) {
        status = fail(FerrocxStatus_NOT_READY, "event_elapsed_ms: a record has not completed yet");
    } else {
        struct timespec ta = a->latest->at, tb = b->latest->at;
        *ms = (float)((double)(tb.tv_sec - ta.tv_sec) * 1e3 +
                      (double)(tb.tv_nsec - ta.tv_nsec) / 1e6);
    }
    pthread_mutex_unlock(&fx_lock);
    return status;
}

/* ---- the table ------------------------------------------------------------------------------ */

/* Designated initializers: an entry left out is NULL, "not supported". struct_size is the size
 * of the table as this file was compiled, so a newer loader knows which entries exist. */
const FerrocxDeviceAdaptorV1 ferrocx_device_adaptor_v1 = {
    .header = { Ferrocx_ABI_MAGIC, Ferrocx_ABI_MAJOR, Ferrocx_ABI_MINOR,
                (uint32_t)sizeof(FerrocxDeviceAdaptorV1), 0, FX_NAME },
    .init = init,
    .finalize = finalize,
    .get_last_error = get_last_error,
    .device_count = device_count,
    .set_device = set_device,
    .get_device = get_device,
    .get_properties = get_properties,
    .mem_alloc = mem_alloc,
    .mem_free = mem_free,
    .mem_copy = mem_copy,
    .mem_copy_async = mem_copy_async,
    .mem_set = mem_set,
    .mem_set_async = mem_set_async,
    .stream_create = stream_create,
    .stream_wrap = NULL, /* no foreign streams to wrap */
    .stream_destroy = stream_destroy,
    .stream_synchronize = stream_synchronize,
    .stream_query = stream_query,
    .stream_wait_event = stream_wait_event,
    .event_create = event_create,
    .event_destroy = event_destroy,
    .event_record = event_record,
    .event_synchronize = event_synchronize,
    .event_query = event_query,
    .event_elapsed_ms = event_elapsed_ms,
    .launch_host_func = launch_host_func,
    .ipc_export = NULL, /* heap memory cannot be shared with another process */
    .ipc_import = NULL,
    .ipc_close = NULL,
    .mem_get_info = mem_get_info,
};
