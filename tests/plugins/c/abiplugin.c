/* C device plugins of several ABI versions, for the ABI evolution tests
 * (tests/tests/abi_evolution.rs). One source, variants chosen with -D:
 *   (none)          ABI 1.1: the whole device table of this header (which ABI 1.2 left as it
 *                   was), header minor 1, `mem_get_info` set
 *   FX_ABI_1_0      ABI 1.0: header minor 0 and struct_size = offsetof(mem_get_info), as a plugin
 *                   compiled against the 1.0 header declares; `mem_get_info` is set in the
 *                   initializer anyway and must read as absent (it is past struct_size)
 *   FX_ABI_1_7      ABI 1.7, a newer minor: the 1.1 table followed by entries this build does
 *                   not know yet (they abort if ever called), struct_size covering them all
 *   FX_TWO_MAJORS   ABI 1.1 under `ferrocx_device_adaptor_v1` plus a table of a future major 2
 *                   with another layout under `ferrocx_device_adaptor_v2`: the loader must use v1
 *
 * The device: one device with 8 MiB of memory of which 3 MiB are free (as `mem_get_info` says).
 * The v2 table reports 99 devices, so a test sees at once which table it went through.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ferrocx_plugin.h"

#ifndef FX_NAME
#define FX_NAME "abi11"
#endif

/* What mem_get_info reports. */
#define FX_FREE ((size_t)3 << 20)
#define FX_TOTAL ((size_t)8 << 20)

static const char *last_error = "";

static const char *get_last_error(void) { return last_error; }

static FerrocxStatus device_count(int32_t *count) {
    if (!count) { last_error = "device_count: `count` is null"; return FerrocxStatus_INVALID_ARGUMENT; }
    *count = 1;
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus set_device(int32_t device) {
    if (device != 0) { last_error = "set_device: device out of range 0..1"; return FerrocxStatus_INVALID_ARGUMENT; }
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus get_device(int32_t *device) {
    if (!device) { last_error = "get_device: `device` is null"; return FerrocxStatus_INVALID_ARGUMENT; }
    *device = 0;
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus mem_get_info(size_t *free_bytes, size_t *total_bytes) {
    if (!free_bytes || !total_bytes) {
        last_error = "mem_get_info: `free` or `total` is null";
        return FerrocxStatus_INVALID_ARGUMENT;
    }
    *free_bytes = FX_FREE;
    *total_bytes = FX_TOTAL;
    return FerrocxStatus_SUCCESS;
}

#define FX_V1_ENTRIES                  \
    .get_last_error = get_last_error, \
    .device_count = device_count,     \
    .set_device = set_device,         \
    .get_device = get_device,         \
    .mem_get_info = mem_get_info

#if defined(FX_ABI_1_0)

const FerrocxDeviceAdaptorV1 ferrocx_device_adaptor_v1 = {
    .header = { Ferrocx_ABI_MAGIC, Ferrocx_ABI_MAJOR, 0,
                (uint32_t)offsetof(FerrocxDeviceAdaptorV1, mem_get_info), 0, FX_NAME },
    FX_V1_ENTRIES,
};

#elif defined(FX_ABI_1_7)

/* Entries of minors 1.2 to 1.7, unknown to this build: never read, so never called. */
static FerrocxStatus future_entry(int32_t device) {
    (void)device;
    abort();
}

typedef struct {
    FerrocxDeviceAdaptorV1 v1_1;
    FerrocxStatus (*future_a)(int32_t device);
    FerrocxStatus (*future_b)(int32_t device);
    FerrocxStatus (*future_c)(int32_t device);
} FxDeviceAdaptorV1_7;

const FxDeviceAdaptorV1_7 ferrocx_device_adaptor_v1 = {
    .v1_1 = {
        .header = { Ferrocx_ABI_MAGIC, Ferrocx_ABI_MAJOR, 7, (uint32_t)sizeof(FxDeviceAdaptorV1_7),
                    0, FX_NAME },
        FX_V1_ENTRIES,
    },
    .future_a = future_entry,
    .future_b = future_entry,
    .future_c = future_entry,
};

#else /* ABI 1.1, alone or with a v2 table */

const FerrocxDeviceAdaptorV1 ferrocx_device_adaptor_v1 = {
    .header = { Ferrocx_ABI_MAGIC, Ferrocx_ABI_MAJOR, 1,
                (uint32_t)sizeof(FerrocxDeviceAdaptorV1), 0, FX_NAME },
    FX_V1_ENTRIES,
};

#endif

#ifdef FX_TWO_MAJORS
/* A future major may reorder and retype anything after the header. */
static FerrocxStatus v2_device_count(int32_t *count) {
    if (!count) return FerrocxStatus_INVALID_ARGUMENT;
    *count = 99;
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus v2_mem_get_info(int32_t device, size_t *free_bytes, size_t *total_bytes) {
    (void)device;
    return mem_get_info(free_bytes, total_bytes);
}

typedef struct {
    FerrocxAbiHeader header;
    uint64_t feature_flags;
    FerrocxStatus (*mem_get_info)(int32_t device, size_t *free_bytes, size_t *total_bytes);
    FerrocxStatus (*device_count)(int32_t *count);
} FxDeviceAdaptorV2;

const FxDeviceAdaptorV2 ferrocx_device_adaptor_v2 = {
    .header = { Ferrocx_ABI_MAGIC, 2, 0, (uint32_t)sizeof(FxDeviceAdaptorV2), 0, FX_NAME },
    .feature_flags = 0xffu,
    .mem_get_info = v2_mem_get_info,
    .device_count = v2_device_count,
};
#endif
