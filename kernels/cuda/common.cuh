// ferrocx window collectives: what every kernel shares.
//
// Compiled by NVRTC at run time (no CUDA headers needed). The host prepends the constants
// FX_MAX_RANKS and FX_ARGS_SIZE from its own definitions, so the argument block below and
// the Rust `Args` cannot drift apart unnoticed (the static_assert fails the compile).
//
// The scratch window layout (see the Rust `layout` module, its single definition) reaches the
// kernels as offsets in FxArgs: `parity` (this round's half of the chunk slots), `chunk` (bytes
// of one slot), `signals` (the signal slots), `signal_stride` and `max_blocks`.

#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

// Threads per block of every launch.
#define FX_THREADS 512

// Signal kinds, as the Rust `layout::Signal`.
#define FX_ARRIVE 0u
#define FX_REDUCED 1u
#define FX_RING 2u

// The launch arguments, passed by value. Mirrors the Rust `cuda::Args`.
struct FxArgs {
    u64 peers[FX_MAX_RANKS];  // every rank's scratch window, as this GPU addresses it
    u64 send;                 // this call's (or ring round's) input
    u64 recv;                 // and output
    u64 count;                // elements of this call (or ring round)
    u64 counter;              // this rank's round counter: device memory, max_blocks u64 words
    u64 parity_bytes;         // bytes of one parity (round e uses the one at (e % 2) * this)
    u64 chunk;                // bytes of one chunk slot
    u64 signals;              // offset of the signal slots
    u64 timeout_ns;           // the communicator's timeout
    u64 status;               // a u64 in pinned host memory: the first failure, packed
    u64 ll;                   // offset of the LL region (two parities of world FX_LL_SLOT slots)
    u64 ll_max;               // the largest one-shot message sent as LL lines (<= FX_LL_SLOT / 2)
    u64 ll128;                // offset of the LL128 region (two parities of world ll128_slot slots)
    u64 ll128_slot;           // bytes of one LL128 slot
    u64 ll128_max;            // the largest one-shot message sent as LL128 lines (0: none)
    u32 rank;
    u32 world;
    u32 signal_stride;        // bytes between signal slots
    u32 max_blocks;           // signal pads per kind
    u32 vec;                  // 1 when send and recv are 16-byte aligned
    u32 algo;                 // 0 one-shot, 1 two-shot, 2 ring (pull), 3 ring (push): named in a failure record
};

static_assert(sizeof(FxArgs) == FX_ARGS_SIZE, "FxArgs differs from the host's Args");

// ---- rounds -------------------------------------------------------------------------------
// The round (epoch) of a launch lives in device memory, not in the arguments, so that a CUDA
// graph that captured the launch runs a new round each time it is replayed. The counter is one
// u64 per block index (a.max_blocks of them), all equal between launches: block b reads word b
// when it starts and writes the next round there when it ends, and block 0 also advances the
// words of the block indices this launch does not have. No block waits for another and no
// fence is needed: the next launch on the stream starts after this one completes, and within a
// launch each word is touched by one block only.

struct FxRound {
    u64 epoch;   // this launch's round
    u64 parity;  // offset of its parity in every scratch window
};

__device__ __forceinline__ FxRound fx_begin(const FxArgs& a) {
    __shared__ u64 epoch;
    if (threadIdx.x == 0) epoch = ((volatile const u64*)a.counter)[blockIdx.x];
    __syncthreads();
    FxRound r;
    r.epoch = epoch;
    r.parity = (epoch & 1ull) * a.parity_bytes;
    return r;
}

__device__ __forceinline__ void fx_end(const FxArgs& a, const FxRound& r) {
    volatile u64* words = (volatile u64*)a.counter;
    if (threadIdx.x == 0) words[blockIdx.x] = r.epoch + 1;
    if (blockIdx.x == 0)
        for (u32 b = gridDim.x + threadIdx.x; b < a.max_blocks; b += blockDim.x) words[b] = r.epoch + 1;
}

// ---- memory order -------------------------------------------------------------------------

// Publishes `v` to a peer: everything this block wrote before (ordered by a __syncthreads
// ahead of the call) becomes visible to whoever acquires the value.
__device__ __forceinline__ void fx_store_release(u64 addr, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(addr), "l"(v) : "memory");
}

__device__ __forceinline__ u64 fx_load_acquire(u64 addr) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(addr) : "memory");
    return v;
}

__device__ __forceinline__ u64 fx_now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// 16 bytes of a peer's memory, read around the L1 cache (the peer wrote it after this SM may
// have cached an older round's bytes at the same address).
__device__ __forceinline__ uint4 fx_load16_peer(u64 addr) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(addr));
    return v;
}

// ---- signals ------------------------------------------------------------------------------

// The slot where `src` signals `kind` to `owner`, for this block.
__device__ __forceinline__ u64 fx_slot(const FxArgs& a, u32 owner, u32 kind, u32 src) {
    u64 index = ((u64)kind * a.max_blocks + blockIdx.x) * a.world + src;
    return a.peers[owner] + a.signals + index * a.signal_stride;
}

// Records a timeout waiting for `peer` (the first one stays: later writers see it set).
// Packed in one 64-bit store, which the host reads whole: bit 0 set, the algorithm in bits
// 4-7, the signal kind in bits 8-15, the peer in bits 16-31, the round's low 32 bits in 32-63.
__device__ void fx_fail(const FxArgs& a, u64 epoch, u32 peer, u32 kind) {
    volatile u64* s = (volatile u64*)a.status;
    if (*s == 0) {
        *s = 1ull | ((u64)(a.algo & 0xf) << 4) | ((u64)(kind & 0xff) << 8) |
             ((u64)(peer & 0xffff) << 16) | ((epoch & 0xffffffffull) << 32);
        __threadfence_system();
    }
}

// Waits until `src` signalled at least `value` of `kind` to this rank; false at the deadline
// (recorded, with the round `epoch`).
__device__ bool fx_wait(const FxArgs& a, u64 epoch, u32 src, u32 kind, u64 value) {
    u64 slot = fx_slot(a, a.rank, kind, src);
    if (fx_load_acquire(slot) >= value) return true;
    u64 start = fx_now_ns();
    u32 polls = 0;
    while (fx_load_acquire(slot) < value) {
        if (++polls > 64) {
            if (fx_now_ns() - start > a.timeout_ns) {
                fx_fail(a, epoch, src, kind);
                return false;
            }
            __nanosleep(32);
        }
    }
    return true;
}

// Block-wide: every thread's writes so far are published to every peer with `value` of
// `kind`, then the block waits for every peer's `value`. False when a peer timed out.
__device__ bool fx_signal_all_and_wait(const FxArgs& a, u64 epoch, u32 kind, u64 value) {
    __shared__ int failed;
    if (threadIdx.x == 0) failed = 0;
    __syncthreads();
    u32 t = threadIdx.x;
    if (t < a.world && t != a.rank) {
        fx_store_release(fx_slot(a, t, kind, a.rank), value);
        if (!fx_wait(a, epoch, t, kind, value)) failed = 1;
    }
    __syncthreads();
    bool ok = failed == 0;
    // No thread may reset `failed` for a later call before every thread has read it.
    __syncthreads();
    return ok;
}

// ---- elements -----------------------------------------------------------------------------

struct F32 {
    typedef float T;
    typedef float A;
    static __device__ __forceinline__ A load(T v) { return v; }
    static __device__ __forceinline__ T store(A a) { return a; }
};

struct F16 {
    typedef u16 T;
    typedef float A;
    static __device__ __forceinline__ A load(T v) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
        return f;
    }
    // Round to nearest even; too large gives infinity (as the host's f32_to_f16).
    static __device__ __forceinline__ T store(A a) {
        u16 h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(a));
        return h;
    }
};

struct BF16 {
    typedef u16 T;
    typedef float A;
    static __device__ __forceinline__ A load(T v) { return __uint_as_float(((u32)v) << 16); }
    // Round to nearest even, NaN stays NaN: the same bits as the host's f32_to_bf16.
    static __device__ __forceinline__ T store(A a) {
        u32 x = __float_as_uint(a);
        if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);
        return (u16)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
    }
};

struct I32 {
    typedef int T;
    typedef int A;
    static __device__ __forceinline__ A load(T v) { return v; }
    static __device__ __forceinline__ T store(A a) { return a; }
};

struct Sum {
    static __device__ __forceinline__ float apply(float a, float b) { return __fadd_rn(a, b); }
    // Wrapping, as the host's (signed overflow is undefined in C++, unsigned is not).
    static __device__ __forceinline__ int apply(int a, int b) { return (int)((u32)a + (u32)b); }
};

struct Min {
    static __device__ __forceinline__ float apply(float a, float b) { return fminf(a, b); }
    static __device__ __forceinline__ int apply(int a, int b) { return a < b ? a : b; }
};

struct Max {
    static __device__ __forceinline__ float apply(float a, float b) { return fmaxf(a, b); }
    static __device__ __forceinline__ int apply(int a, int b) { return a > b ? a : b; }
};

// 16 bytes of elements.
template <class E>
union FxPack {
    uint4 v;
    typename E::T e[16 / sizeof(typename E::T)];
};

// ---- partitions ---------------------------------------------------------------------------

// Elements [lo, hi) of part i when n elements are split into `parts` parts of whole granules
// of g elements: the Rust `layout::part`, the same on every rank.
__device__ __forceinline__ void fx_part(u64 n, u64 parts, u64 i, u64 g, u64* lo, u64* hi) {
    u64 granules = (n + g - 1) / g;
    u64 base = granules / parts, extra = granules % parts;
    u64 glo = i * base + (i < extra ? i : extra);
    u64 ghi = glo + base + (i < extra ? 1 : 0);
    *lo = glo * g < n ? glo * g : n;
    *hi = ghi * g < n ? ghi * g : n;
}

// ---- block-wide moves ---------------------------------------------------------------------
// Element i of an array lives at base + i * sizeof(T). `lo` is a multiple of the pack size
// whenever `vec` is set, so packs are 16-byte aligned. Vector moves go FX_UNROLL packs per
// thread at a time, all of them loaded before the first is used, so that a thread keeps
// FX_UNROLL loads in flight (a peer's memory answers a load in about a microsecond).

#ifndef FX_UNROLL
#define FX_UNROLL 4
#endif

// 16 bytes at `addr`: around L1 when another rank wrote it (`peer`).
__device__ __forceinline__ uint4 fx_load16(u64 addr, bool peer) {
    return peer ? fx_load16_peer(addr) : *(const uint4*)addr;
}

// dst[lo, hi) = src[lo, hi). `peer_src`: src is another rank's memory (or written by one).
template <class E>
__device__ void fx_copy(u64 dst, u64 src, u64 lo, u64 hi, bool vec, bool peer_src) {
    typedef typename E::T T;
    const u64 N = 16 / sizeof(T);
    u64 i = lo;
    if (vec) {
        const u64 packs = (hi - lo) / N, step = blockDim.x, base = lo * sizeof(T);
        u64 k = threadIdx.x;
        for (; k + (FX_UNROLL - 1) * step < packs; k += FX_UNROLL * step) {
            uint4 v[FX_UNROLL];
#pragma unroll
            for (u32 u = 0; u < FX_UNROLL; u++) v[u] = fx_load16(src + base + (k + u * step) * 16, peer_src);
#pragma unroll
            for (u32 u = 0; u < FX_UNROLL; u++) *(uint4*)(dst + base + (k + u * step) * 16) = v[u];
        }
        for (; k < packs; k += step) *(uint4*)(dst + base + k * 16) = fx_load16(src + base + k * 16, peer_src);
        i = lo + packs * N;
    }
    for (u64 j = i + threadIdx.x; j < hi; j += blockDim.x) {
        T v = peer_src ? *(volatile const T*)(src + j * sizeof(T)) : *(const T*)(src + j * sizeof(T));
        *(T*)(dst + j * sizeof(T)) = v;
    }
}

// U packs at `at[0..U)` of dst (and dst2 when it is not 0) = srcs[0] op srcs[1] op ... (in that
// order, accumulated in E::A, rounded once); srcs[s] is a peer's memory when bit s of
// `peer_mask` is set. Each source's U loads are in flight together.
template <class E, class O, u32 U>
__device__ __forceinline__ void fx_reduce_packs(u64 dst, u64 dst2, const u64* srcs, u32 nsrc,
                                                u32 peer_mask, const u64* at) {
    typedef typename E::A A;
    const u32 N = 16 / sizeof(typename E::T);
    A acc[U][N];
    for (u32 s = 0; s < nsrc; s++) {
        const bool peer = (peer_mask >> s) & 1;
        FxPack<E> p[U];
#pragma unroll
        for (u32 u = 0; u < U; u++) p[u].v = fx_load16(srcs[s] + at[u], peer);
#pragma unroll
        for (u32 u = 0; u < U; u++)
#pragma unroll
            for (u32 e = 0; e < N; e++) {
                A x = E::load(p[u].e[e]);
                acc[u][e] = s == 0 ? x : O::apply(acc[u][e], x);
            }
    }
#pragma unroll
    for (u32 u = 0; u < U; u++) {
        FxPack<E> out;
#pragma unroll
        for (u32 e = 0; e < N; e++) out.e[e] = E::store(acc[u][e]);
        *(uint4*)(dst + at[u]) = out.v;
        if (dst2) *(uint4*)(dst2 + at[u]) = out.v;
    }
}

// dst[lo, hi) = srcs[0] op srcs[1] op ... (in that order, accumulated in E::A, rounded once);
// also into dst2 when it is not 0. srcs[s] is a peer's memory when bit s of `peer_mask` is set.
// One thread owns each element, so dst may be one of the sources.
template <class E, class O>
__device__ void fx_reduce(u64 dst, u64 dst2, const u64* srcs, u32 nsrc, u32 peer_mask, u64 lo,
                          u64 hi, bool vec) {
    typedef typename E::T T;
    typedef typename E::A A;
    const u64 N = 16 / sizeof(T);
    u64 i = lo;
    if (vec) {
        const u64 packs = (hi - lo) / N, step = blockDim.x, base = lo * sizeof(T);
        u64 k = threadIdx.x;
        for (; k + (FX_UNROLL - 1) * step < packs; k += FX_UNROLL * step) {
            u64 at[FX_UNROLL];
#pragma unroll
            for (u32 u = 0; u < FX_UNROLL; u++) at[u] = base + (k + u * step) * 16;
            fx_reduce_packs<E, O, FX_UNROLL>(dst, dst2, srcs, nsrc, peer_mask, at);
        }
        for (; k < packs; k += step) {
            u64 at = base + k * 16;
            fx_reduce_packs<E, O, 1>(dst, dst2, srcs, nsrc, peer_mask, &at);
        }
        i = lo + packs * N;
    }
    for (u64 j = i + threadIdx.x; j < hi; j += blockDim.x) {
        u64 at = j * sizeof(T);
        A acc = 0;
        for (u32 s = 0; s < nsrc; s++) {
            T v = (peer_mask >> s) & 1 ? *(volatile const T*)(srcs[s] + at)
                                       : *(const T*)(srcs[s] + at);
            A x = E::load(v);
            acc = s == 0 ? x : O::apply(acc, x);
        }
        T out = E::store(acc);
        *(T*)(dst + at) = out;
        if (dst2) *(T*)(dst2 + at) = out;
    }
}

// Block-wide push: src[lo, hi) into dsts[q][lo, hi) for every q with bit q of `mask` set (each
// pack is loaded once and stored to every destination; a destination is usually another
// rank's memory, so the stores are posted and overlap).
template <class E>
__device__ void fx_push(const u64* dsts, u32 mask, u32 ndst, u64 src, u64 lo, u64 hi, bool vec) {
    typedef typename E::T T;
    const u64 N = 16 / sizeof(T);
    u64 i = lo;
    if (vec) {
        const u64 packs = (hi - lo) / N, step = blockDim.x, base = lo * sizeof(T);
        u64 k = threadIdx.x;
        for (; k + (FX_UNROLL - 1) * step < packs; k += FX_UNROLL * step) {
            uint4 v[FX_UNROLL];
#pragma unroll
            for (u32 u = 0; u < FX_UNROLL; u++) v[u] = *(const uint4*)(src + base + (k + u * step) * 16);
            for (u32 q = 0; q < ndst; q++)
                if ((mask >> q) & 1)
#pragma unroll
                    for (u32 u = 0; u < FX_UNROLL; u++) *(uint4*)(dsts[q] + base + (k + u * step) * 16) = v[u];
        }
        for (; k < packs; k += step) {
            uint4 v = *(const uint4*)(src + base + k * 16);
            for (u32 q = 0; q < ndst; q++)
                if ((mask >> q) & 1) *(uint4*)(dsts[q] + base + k * 16) = v;
        }
        i = lo + packs * N;
    }
    for (u64 j = i + threadIdx.x; j < hi; j += blockDim.x) {
        T v = *(const T*)(src + j * sizeof(T));
        for (u32 q = 0; q < ndst; q++)
            if ((mask >> q) & 1) *(T*)(dsts[q] + j * sizeof(T)) = v;
    }
}

// ---- LL128 lines --------------------------------------------------------------------------
// 128 bytes, stored by 8 consecutive threads of a warp with one 16-byte store each: 120 data
// bytes, then the round (the whole epoch) in the last 8. A warp's store of a 128-byte aligned
// line reaches a peer over NVLink as one write, and a warp's load of it reads it whole, so a
// reader that sees the round in the last word sees the line's data.

#define FX_LL128_LINE 128u
#define FX_LL128_DATA 120u

__device__ __forceinline__ void fx_store16_u64(u64 addr, u64 w0, u64 w1) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(addr), "l"(w0), "l"(w1)
                 : "memory");
}

__device__ __forceinline__ void fx_load16_u64(u64 addr, u64* w) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
                 : "=l"(w[0]), "=l"(w[1])
                 : "l"(addr)
                 : "memory");
}

// ---- LL lines -----------------------------------------------------------------------------
// 16 bytes {data0, flag, data1, flag}, stored and loaded whole: a reader that sees both flags
// equal to the round's sees the round's 8 data bytes, with no fence or signal in between.

__device__ __forceinline__ void fx_ll_store(u64 addr, u32 d0, u32 d1, u32 flag) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(addr), "r"(d0),
                 "r"(flag), "r"(d1), "r"(flag)
                 : "memory");
}

// Waits for the line at `addr` to carry `flag`; its data in d[0], d[1]. False at the deadline
// (recorded as `src` not arriving in round `epoch`).
__device__ bool fx_ll_wait(const FxArgs& a, u64 epoch, u32 src, u64 addr, u32 flag, u32* d) {
    u64 start = 0;
    u32 polls = 0;
    for (;;) {
        uint4 v;
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(addr)
                     : "memory");
        if (v.y == flag && v.w == flag) {
            d[0] = v.x;
            d[1] = v.z;
            return true;
        }
        if (++polls == 64) start = fx_now_ns();
        if (polls > 64 && (polls & 63) == 0 && fx_now_ns() - start > a.timeout_ns) {
            fx_fail(a, epoch, src, FX_ARRIVE);
            return false;
        }
    }
}
