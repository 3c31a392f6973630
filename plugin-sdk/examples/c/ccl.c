/* A minimal CCL in C: communicators of one rank, paired with the device of plugin.c.
 *
 * Built into the same library as plugin.c (see README.md), it exports
 * `ferrocx_ccl_adaptor_v1` beside `ferrocx_device_adaptor_v1`. With one rank every collective
 * is a copy of the rank's own data (a reduction over one contribution is that contribution),
 * enqueued on the caller's stream through the device table's `mem_copy_async`: buffers and
 * streams are the paired device's, passed through unchanged, so the copy runs in stream order
 * with the device's other work.
 *
 * `get_limits` declares what it claims: one rank, a subset of the data types and reductions.
 * Callers do not ask for more (the core refuses it, and the conformance kit reports it as
 * "not claimed"); the entries still refuse it themselves. Point-to-point, groups and the
 * CCL's own memory are NULL: not supported.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "ferrocx_plugin.h"

#ifndef FX_NAME
#define FX_NAME "cexample"
#endif

/* The device this CCL runs on: plugin.c's table. */
extern const FerrocxDeviceAdaptorV1 ferrocx_device_adaptor_v1;

static _Thread_local char last_error[256];

static const char *get_last_error(void) { return last_error; }

static FerrocxStatus fail(FerrocxStatus status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(last_error, sizeof last_error, format, args);
    va_end(args);
    return status;
}

/* What this CCL claims: one rank; these types and reductions. */
#define CLAIMED_DTYPES                                                                    \
    ((1ull << FerrocxDataType_F32) | (1ull << FerrocxDataType_F64) |                     \
     (1ull << FerrocxDataType_I32) | (1ull << FerrocxDataType_I64) |                     \
     (1ull << FerrocxDataType_U8))
#define CLAIMED_OPS                                                                       \
    ((1ull << FerrocxReduceOp_SUM) | (1ull << FerrocxReduceOp_MIN) |                     \
     (1ull << FerrocxReduceOp_MAX))

static FerrocxStatus get_limits(FerrocxCclLimits *limits) {
    if (limits == NULL) return fail(FerrocxStatus_INVALID_ARGUMENT, "get_limits: `limits` is null");
    /* Write no byte past the caller's struct_size (fields are appended in later minors). */
    FerrocxCclLimits mine = { .struct_size = sizeof mine, .reserved = 0, .max_ranks = 1,
                              .dtypes = CLAIMED_DTYPES, .reduce_ops = CLAIMED_OPS };
    size_t n = limits->struct_size < sizeof mine ? limits->struct_size : sizeof mine;
    if (n < 8) return fail(FerrocxStatus_INVALID_ARGUMENT, "get_limits: struct_size too small");
    memcpy((char *)limits + 8, (const char *)&mine + 8, n - 8);
    return FerrocxStatus_SUCCESS;
}

/* Communicators: a handle is a small tagged number; `live` marks the ones not destroyed. */
#define MAX_COMMS 64
static _Atomic int live[MAX_COMMS];
static int devices[MAX_COMMS];
static atomic_uint_fast64_t next_id = 1;

static int comm_index(FerrocxComm comm) {
    uintptr_t h = (uintptr_t)comm;
    if ((h & 0xF) != 0x5 || (h >> 4) == 0 || (h >> 4) > MAX_COMMS) return -1;
    int i = (int)(h >> 4) - 1;
    return atomic_load(&live[i]) ? i : -1;
}

#define CHECK_COMM(entry, comm)                                                           \
    int ci = comm_index(comm);                                                            \
    if (ci < 0) return fail(FerrocxStatus_INVALID_HANDLE, "%s: unknown communicator %p",  \
                            entry, (void *)(comm))

static size_t dtype_size(FerrocxDataType t) {
    switch (t) {
    case FerrocxDataType_F32: case FerrocxDataType_I32: case FerrocxDataType_U32: return 4;
    case FerrocxDataType_F64: case FerrocxDataType_I64: case FerrocxDataType_U64: return 8;
    case FerrocxDataType_F16: case FerrocxDataType_BF16: return 2;
    case FerrocxDataType_I8: case FerrocxDataType_U8: return 1;
    default: return 0;
    }
}

/* Checks the arguments common to every collective, then enqueues the copy. */
static FerrocxStatus copy(const char *entry, FerrocxDevicePtr send, FerrocxDevicePtr recv,
                          size_t count, FerrocxDataType dtype, int has_op, FerrocxReduceOp op,
                          int has_root, int32_t root, FerrocxComm comm, FerrocxStream stream) {
    CHECK_COMM(entry, comm);
    (void)ci;
    size_t size = dtype_size(dtype);
    if (size == 0) return fail(FerrocxStatus_INVALID_ARGUMENT, "%s: unknown data type %u", entry, dtype);
    if (has_op && op > FerrocxReduceOp_AVG)
        return fail(FerrocxStatus_INVALID_ARGUMENT, "%s: unknown reduction %u", entry, op);
    if (!(CLAIMED_DTYPES & (1ull << dtype)))
        return fail(FerrocxStatus_UNSUPPORTED, "%s: data type %u is outside get_limits", entry, dtype);
    if (has_op && !(CLAIMED_OPS & (1ull << op)))
        return fail(FerrocxStatus_UNSUPPORTED, "%s: reduction %u is outside get_limits", entry, op);
    if (has_root && root != 0)
        return fail(FerrocxStatus_INVALID_ARGUMENT, "%s: root %d of a one-rank communicator", entry, root);
    if (count == 0 || send == recv) return FerrocxStatus_SUCCESS; /* nothing, or in place */
    if (send == 0 || recv == 0)
        return fail(FerrocxStatus_INVALID_ARGUMENT, "%s: a null buffer with count %zu", entry, count);
    /* The paired device enqueues it; its failure message is the device's. */
    FerrocxStatus s = ferrocx_device_adaptor_v1.mem_copy_async(recv, send, count * size, stream);
    if (s != FerrocxStatus_SUCCESS)
        return fail(s, "%s: the device's mem_copy_async failed: %s", entry,
                    ferrocx_device_adaptor_v1.get_last_error());
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus init(const FerrocxKeyValue *options, size_t n_options) {
    (void)options;
    (void)n_options;
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus finalize(void) { return FerrocxStatus_SUCCESS; }

static FerrocxStatus get_version(int32_t *version) {
    if (version == NULL) return fail(FerrocxStatus_INVALID_ARGUMENT, "get_version: null");
    *version = 1;
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus get_unique_id(uint8_t *id, size_t *len) {
    if (len == NULL) return fail(FerrocxStatus_INVALID_ARGUMENT, "get_unique_id: `len` is null");
    size_t cap = *len;
    *len = sizeof(uint64_t);
    if (id == NULL) return FerrocxStatus_SUCCESS;
    if (cap < sizeof(uint64_t))
        return fail(FerrocxStatus_BUFFER_TOO_SMALL, "get_unique_id: %zu bytes, 8 needed", cap);
    uint64_t v = atomic_fetch_add(&next_id, 1);
    memcpy(id, &v, sizeof v);
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus comm_init_rank(const FerrocxCommInitArgs *args, FerrocxComm *comm) {
    if (args == NULL || comm == NULL)
        return fail(FerrocxStatus_INVALID_ARGUMENT, "comm_init_rank: `args` or `comm` is null");
    if (args->nranks != 1 || args->rank != 0)
        return fail(FerrocxStatus_UNSUPPORTED,
                    "comm_init_rank: rank %d of %d; this CCL claims one rank (get_limits)",
                    args->rank, args->nranks);
    for (int i = 0; i < MAX_COMMS; i++) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&live[i], &expected, 1)) {
            devices[i] = args->device;
            *comm = (FerrocxComm)(uintptr_t)(((uintptr_t)(i + 1) << 4) | 0x5);
            return FerrocxStatus_SUCCESS;
        }
    }
    return fail(FerrocxStatus_OUT_OF_MEMORY, "comm_init_rank: %d communicators live", MAX_COMMS);
}

static FerrocxStatus comm_destroy(FerrocxComm comm) {
    CHECK_COMM("comm_destroy", comm);
    atomic_store(&live[ci], 0);
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus comm_get_async_error(FerrocxComm comm, FerrocxStatus *error) {
    CHECK_COMM("comm_get_async_error", comm);
    (void)ci;
    if (error == NULL) return fail(FerrocxStatus_INVALID_ARGUMENT, "comm_get_async_error: null");
    *error = FerrocxStatus_SUCCESS;
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus comm_count(FerrocxComm comm, int32_t *count) {
    CHECK_COMM("comm_count", comm);
    (void)ci;
    if (count == NULL) return fail(FerrocxStatus_INVALID_ARGUMENT, "comm_count: null");
    *count = 1;
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus comm_user_rank(FerrocxComm comm, int32_t *rank) {
    CHECK_COMM("comm_user_rank", comm);
    (void)ci;
    if (rank == NULL) return fail(FerrocxStatus_INVALID_ARGUMENT, "comm_user_rank: null");
    *rank = 0;
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus comm_device(FerrocxComm comm, int32_t *device) {
    CHECK_COMM("comm_device", comm);
    if (device == NULL) return fail(FerrocxStatus_INVALID_ARGUMENT, "comm_device: null");
    *device = devices[ci];
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus all_reduce(FerrocxDevicePtr send, FerrocxDevicePtr recv, size_t count,
                                FerrocxDataType dtype, FerrocxReduceOp op, FerrocxComm comm,
                                FerrocxStream stream) {
    return copy("all_reduce", send, recv, count, dtype, 1, op, 0, 0, comm, stream);
}

static FerrocxStatus all_gather(FerrocxDevicePtr send, FerrocxDevicePtr recv, size_t count,
                                FerrocxDataType dtype, FerrocxComm comm, FerrocxStream stream) {
    return copy("all_gather", send, recv, count, dtype, 0, 0, 0, 0, comm, stream);
}

static FerrocxStatus reduce_scatter(FerrocxDevicePtr send, FerrocxDevicePtr recv, size_t count,
                                    FerrocxDataType dtype, FerrocxReduceOp op, FerrocxComm comm,
                                    FerrocxStream stream) {
    return copy("reduce_scatter", send, recv, count, dtype, 1, op, 0, 0, comm, stream);
}

static FerrocxStatus broadcast(FerrocxDevicePtr send, FerrocxDevicePtr recv, size_t count,
                               FerrocxDataType dtype, int32_t root, FerrocxComm comm,
                               FerrocxStream stream) {
    return copy("broadcast", send, recv, count, dtype, 0, 0, 1, root, comm, stream);
}

static FerrocxStatus reduce(FerrocxDevicePtr send, FerrocxDevicePtr recv, size_t count,
                            FerrocxDataType dtype, FerrocxReduceOp op, int32_t root,
                            FerrocxComm comm, FerrocxStream stream) {
    return copy("reduce", send, recv, count, dtype, 1, op, 1, root, comm, stream);
}

static FerrocxStatus gather(FerrocxDevicePtr send, FerrocxDevicePtr recv, size_t count,
                            FerrocxDataType dtype, int32_t root, FerrocxComm comm,
                            FerrocxStream stream) {
    return copy("gather", send, recv, count, dtype, 0, 0, 1, root, comm, stream);
}

static FerrocxStatus scatter(FerrocxDevicePtr send, FerrocxDevicePtr recv, size_t count,
                             FerrocxDataType dtype, int32_t root, FerrocxComm comm,
                             FerrocxStream stream) {
    return copy("scatter", send, recv, count, dtype, 0, 0, 1, root, comm, stream);
}

static FerrocxStatus all_to_all(FerrocxDevicePtr send, FerrocxDevicePtr recv, size_t count,
                                FerrocxDataType dtype, FerrocxComm comm, FerrocxStream stream) {
    return copy("all_to_all", send, recv, count, dtype, 0, 0, 0, 0, comm, stream);
}

static FerrocxStatus all_to_allv(FerrocxDevicePtr send, const size_t *send_counts,
                                 const size_t *send_displs, FerrocxDevicePtr recv,
                                 const size_t *recv_counts, const size_t *recv_displs,
                                 FerrocxDataType dtype, FerrocxComm comm, FerrocxStream stream) {
    if (!send_counts || !send_displs || !recv_counts || !recv_displs)
        return fail(FerrocxStatus_INVALID_ARGUMENT, "all_to_allv: null counts or displacements");
    if (send_counts[0] != recv_counts[0])
        return fail(FerrocxStatus_INVALID_ARGUMENT, "all_to_allv: sends %zu to itself, receives %zu",
                    send_counts[0], recv_counts[0]);
    size_t size = dtype_size(dtype);
    return copy("all_to_allv", send + send_displs[0] * size, recv + recv_displs[0] * size,
                send_counts[0], dtype, 0, 0, 0, 0, comm, stream);
}

const FerrocxCclAdaptorV1 ferrocx_ccl_adaptor_v1 = {
    .header = { Ferrocx_ABI_MAGIC, Ferrocx_ABI_MAJOR, Ferrocx_ABI_MINOR,
                (uint32_t)sizeof(FerrocxCclAdaptorV1), 0, FX_NAME },
    .init = init,
    .finalize = finalize,
    .get_last_error = get_last_error,
    .get_version = get_version,
    .get_unique_id = get_unique_id,
    .comm_init_rank = comm_init_rank,
    .comm_destroy = comm_destroy,
    .comm_get_async_error = comm_get_async_error,
    .comm_count = comm_count,
    .comm_user_rank = comm_user_rank,
    .comm_device = comm_device,
    .all_reduce = all_reduce,
    .all_gather = all_gather,
    .reduce_scatter = reduce_scatter,
    .broadcast = broadcast,
    .reduce = reduce,
    .gather = gather,
    .scatter = scatter,
    .all_to_all = all_to_all,
    .all_to_allv = all_to_allv,
    /* comm_finalize, comm_abort, send, recv, group_start, group_end, mem_alloc, mem_free,
     * mem_register, mem_deregister, query_support: NULL, not supported. */
    .get_limits = get_limits,
};
