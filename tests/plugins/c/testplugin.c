/* A C adaptor plugin for the loader tests, built from the generated header with the system C
 * compiler. One source, several variants chosen with -D:
 *   (none)              a good plugin: device table + flat-map group + CCL table
 *   FX_MAJOR=2          the v1 symbol carries a header of ABI major 2
 *   FX_ONLY_V2          only `ferrocx_device_adaptor_v2` is exported (a newer major)
 *   FX_OLD_MINOR        struct_size stops before `stream_create`, as an older minor would
 *   FX_BAD_MAGIC        the header's magic is wrong
 *   FX_NO_SYMBOLS       an ELF with no ferrocx symbol at all
 *   FX_UNDEFINED        references a symbol no library defines (dlopen with RTLD_NOW fails)
 *   FX_DEVICE_SIZE_BYTES=N  the device table declares struct_size N
 *   FX_GROUP_SIZE_BYTES=N   the flat-map group declares struct_size N
 *   FX_DEVICE_COUNT=N   `device_count` answers N (SUCCESS), and `get_last_error` is 1 MiB long
 *   FX_INIT_CRASH       the device's `init` writes through a null pointer (SIGSEGV)
 *   FX_INIT_EXIT        the device's `init` calls exit(3)
 *   FX_INIT_LOOP        the device's `init` never returns
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ferrocx_plugin.h"

#ifndef FX_NAME
#define FX_NAME "testc"
#endif
#ifndef FX_MAJOR
#define FX_MAJOR Ferrocx_ABI_MAJOR
#endif
#ifdef FX_BAD_MAGIC
#define FX_MAGIC 0x12345678u
#else
#define FX_MAGIC Ferrocx_ABI_MAGIC
#endif

#ifdef FX_NO_SYMBOLS
int fx_not_a_plugin(void) { return 42; }
#else

#ifdef FX_UNDEFINED
extern int fx_symbol_that_does_not_exist(void);
int fx_call_missing(void) { return fx_symbol_that_does_not_exist(); }
#endif

static const char *last_error = "";

#ifdef FX_DEVICE_COUNT
static char huge_error[1 << 20];
static const char *get_last_error(void) {
    memset(huge_error, 'e', sizeof huge_error - 1);
    huge_error[sizeof huge_error - 1] = 0;
    return huge_error;
}
#else
static const char *get_last_error(void) { return last_error; }
#endif

static FerrocxStatus device_count(int32_t *count) {
    if (!count) { last_error = "device_count: `count` is null"; return FerrocxStatus_INVALID_ARGUMENT; }
#ifdef FX_DEVICE_COUNT
    *count = FX_DEVICE_COUNT;
#else
    *count = 2;
#endif
    return FerrocxStatus_SUCCESS;
}

static int32_t current_device = 0;

static FerrocxStatus set_device(int32_t device) {
    if (device < 0 || device >= 2) { last_error = "set_device: device out of range 0..2"; return FerrocxStatus_INVALID_ARGUMENT; }
    current_device = device;
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus get_device(int32_t *device) {
    if (!device) { last_error = "get_device: `device` is null"; return FerrocxStatus_INVALID_ARGUMENT; }
    *device = current_device;
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus get_properties(int32_t device, FerrocxDeviceProperties *props) {
    FerrocxDeviceProperties p;
    size_t n;
    if (!props) { last_error = "get_properties: `props` is null"; return FerrocxStatus_INVALID_ARGUMENT; }
    memset(&p, 0, sizeof p);
    strncpy(p.vendor, "ferrocx-test", sizeof p.vendor - 1);
    strncpy(p.name, "c test device", sizeof p.name - 1);
    p.capabilities = FerrocxCapabilities_HOST_ADDRESSABLE | FerrocxCapabilities_FLAT_MAP;
    p.device_count = 2;
    p.arch = (uint32_t)device;
    /* Write no byte past what the caller said it has. */
    n = props->struct_size < sizeof p ? props->struct_size : sizeof p;
    if (n > 8) memcpy((char *)props + 8, (const char *)&p + 8, n - 8);
    return FerrocxStatus_SUCCESS;
}

static FerrocxStatus stream_query(FerrocxStream stream) {
    (void)stream;
    return FerrocxStatus_SUCCESS;
}

#ifdef FX_ONLY_V2
/* Tables of a future major, exported only under the v2 symbols. */
#define FX_DEVICE_SYMBOL ferrocx_device_adaptor_v2
#define FX_CCL_SYMBOL ferrocx_ccl_adaptor_v2
#undef FX_MAJOR
#define FX_MAJOR 2
#else
#define FX_DEVICE_SYMBOL ferrocx_device_adaptor_v1
#define FX_CCL_SYMBOL ferrocx_ccl_adaptor_v1
#endif

#if defined(FX_DEVICE_SIZE_BYTES)
#define FX_DEVICE_SIZE FX_DEVICE_SIZE_BYTES
#elif defined(FX_OLD_MINOR)
#define FX_DEVICE_SIZE offsetof(FerrocxDeviceAdaptorV1, stream_create)
#else
#define FX_DEVICE_SIZE sizeof(FerrocxDeviceAdaptorV1)
#endif

#if defined(FX_INIT_CRASH) || defined(FX_INIT_EXIT) || defined(FX_INIT_LOOP)
#define FX_HAS_INIT
static FerrocxStatus init(const FerrocxKeyValue *options, size_t n_options) {
    (void)options; (void)n_options;
#if defined(FX_INIT_CRASH)
    {
        /* A real fault (raise() would meet the host program's own SIGSEGV handler). */
        volatile int *volatile null = NULL;
        *null = 1;
    }
#elif defined(FX_INIT_EXIT)
    exit(3);
#else
    {
        volatile int spin = 1;
        while (spin) {}
    }
#endif
    return FerrocxStatus_SUCCESS;
}
#endif

const FerrocxDeviceAdaptorV1 FX_DEVICE_SYMBOL = {
    .header = { FX_MAGIC, FX_MAJOR, Ferrocx_ABI_MINOR, (uint32_t)FX_DEVICE_SIZE, 0, FX_NAME },
    .get_last_error = get_last_error,
#ifdef FX_HAS_INIT
    .init = init,
#endif
    .device_count = device_count,
    .set_device = set_device,
    .get_device = get_device,
    .get_properties = get_properties,
    /* Past the older minor's struct_size: must read as absent in the FX_OLD_MINOR variant. */
    .stream_query = stream_query,
};

#ifndef FX_ONLY_V2
static FerrocxStatus flat_reserve(size_t bytes, FerrocxDevicePtr *base) {
    (void)bytes; (void)base;
    last_error = "flat_reserve: not implemented by the C test plugin";
    return FerrocxStatus_UNSUPPORTED;
}
#endif

#ifndef FX_ONLY_V2
const FerrocxDeviceFlatMapV1 ferrocx_device_flatmap_v1 = {
#ifdef FX_GROUP_SIZE_BYTES
    .header = { FX_MAGIC, FX_MAJOR, Ferrocx_ABI_MINOR, FX_GROUP_SIZE_BYTES, 0, FX_NAME },
#else
    .header = { FX_MAGIC, FX_MAJOR, Ferrocx_ABI_MINOR, sizeof(FerrocxDeviceFlatMapV1), 0, FX_NAME },
#endif
    .flat_reserve = flat_reserve,
};
#endif

static FerrocxStatus get_version(int32_t *version) {
    if (!version) { last_error = "get_version: `version` is null"; return FerrocxStatus_INVALID_ARGUMENT; }
    *version = 20800;
    return FerrocxStatus_SUCCESS;
}

const FerrocxCclAdaptorV1 FX_CCL_SYMBOL = {
    .header = { FX_MAGIC, FX_MAJOR, Ferrocx_ABI_MINOR, sizeof(FerrocxCclAdaptorV1), 0, FX_NAME },
    .get_last_error = get_last_error,
    .get_version = get_version,
};
#endif /* FX_NO_SYMBOLS */
