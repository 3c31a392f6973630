// ferrocx window all-reduce: one-shot, two-shot and one ring round, for every element type and
// reduction, as `extern "C"` kernels named fx_<algo>_<type>_<op> (fx_one_shot_bf16_sum).
//
// Every launch has the same grid on every rank (the host derives it from the message size),
// and reads its round from the rank's device-side counter (see fx_begin),
// and block b of a rank only ever synchronises with block b of its peers, through signal pad b:
// each algorithm splits its work so that block b reads from a peer only what that peer's block
// b wrote (the LL one-shot needs no pads: each line carries its own flag). A round uses the
// parity `epoch % 2` of the chunk slots (and of the LL region), so no kernel waits at its end
// for peers to finish reading (see the Rust `layout` module for why that is safe).

#include "ferrocx_common.cuh"

// Every rank's scratch window at this round's parity, and the mask of those that are peers'.
__device__ __forceinline__ u32 fx_parities(const FxArgs& a, const FxRound& r, u64* out) {
    for (u32 q = 0; q < a.world; q++) out[q] = a.peers[q] + r.parity;
    return ((1u << a.world) - 1u) & ~(1u << a.rank);
}

// One-shot. Up to a.ll_max bytes (at most FX_LL_SLOT / 2): LL lines (fx_one_shot_ll). Else, when the message
// fits a chunk slot, block b pushes its part of
// the input straight into slot `rank` of every peer's parity (remote stores are posted: no
// round trip), signals every peer's block b, waits for theirs, and reduces its part over every
// rank (in rank order, so every rank computes the same bits) from its own window's slots and
// its own input into the output. A larger message (up to a parity) is copied into this rank's
// parity and read from the peers' windows instead.
template <class E, class O>
__device__ void fx_one_shot_ll(const FxArgs& a, const FxRound& r);

template <class E, class O>
__device__ void fx_one_shot_ll128(const FxArgs& a, const FxRound& r);

template <class E, class O>
__device__ void fx_one_shot(const FxArgs& a, const FxRound& r) {
    typedef typename E::T T;
    const u64 g = 16 / sizeof(T);
    if (a.count * sizeof(T) <= a.ll_max) {
        fx_one_shot_ll<E, O>(a, r);
        return;
    }
    if (a.count * sizeof(T) <= a.ll128_max) {
        fx_one_shot_ll128<E, O>(a, r);
        return;
    }
    u64 lo, hi;
    fx_part(a.count, gridDim.x, blockIdx.x, g, &lo, &hi);
    u64 srcs[FX_MAX_RANKS];
    u32 peer_mask;
    if (a.count * sizeof(T) <= a.chunk) {
        u64 dsts[FX_MAX_RANKS];
        for (u32 q = 0; q < a.world; q++) {
            dsts[q] = a.peers[q] + r.parity + (u64)a.rank * a.chunk;
            srcs[q] = a.peers[a.rank] + r.parity + (u64)q * a.chunk;
        }
        srcs[a.rank] = a.send;
        peer_mask = ((1u << a.world) - 1u) & ~(1u << a.rank);
        fx_push<E>(dsts, peer_mask, a.world, a.send, lo, hi, a.vec);
        if (!fx_signal_all_and_wait(a, r.epoch, FX_ARRIVE, r.epoch)) return;
        // The peers' slots are this GPU's memory written over NVLink: read around L1 too.
    } else {
        u64 mine = a.peers[a.rank] + r.parity;
        fx_copy<E>(mine, a.send, lo, hi, a.vec, false);
        if (!fx_signal_all_and_wait(a, r.epoch, FX_ARRIVE, r.epoch)) return;
        peer_mask = fx_parities(a, r, srcs);
    }
    fx_reduce<E, O>(a.recv, 0, srcs, a.world, peer_mask, lo, hi, a.vec);
}

// One-shot over LL lines (messages up to FX_LL_SLOT / 2 bytes): line k carries elements
// [k * K, k * K + K) (8 bytes). The thread of line k pushes this rank's line into slot `rank` of
// every peer's LL region (this round's parity), then waits for each peer's line k in its own
// region and reduces in rank order (this rank's own from its input). No block-wide step: each
// line is independent, so any grid works, and no fence or signal slot is involved.
template <class E, class O>
__device__ void fx_one_shot_ll(const FxArgs& a, const FxRound& r) {
    typedef typename E::T T;
    typedef typename E::A A;
    const u32 K = 8 / sizeof(T);
    union Line {
        u32 w[2];
        T e[8 / sizeof(T)];
    };
    const u64 lines = (a.count + K - 1) / K;
    const u32 flag = (u32)r.epoch;
    const u64 region = a.ll + (r.epoch & 1ull) * (u64)a.world * FX_LL_SLOT;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const T* send = (const T*)a.send;
    T* recv = (T*)a.recv;
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < lines; k += stride) {
        const u64 first = k * K;
        Line mine;
        mine.w[0] = 0;
        mine.w[1] = 0;
#pragma unroll
        for (u32 e = 0; e < K; e++)
            if (first + e < a.count) mine.e[e] = send[first + e];
        for (u32 q = 0; q < a.world; q++) {
            if (q == a.rank) continue;
            fx_ll_store(a.peers[q] + region + (u64)a.rank * FX_LL_SLOT + k * 16, mine.w[0],
                        mine.w[1], flag);
        }
        A acc[8 / sizeof(T)];
        for (u32 s = 0; s < a.world; s++) {
            Line v;
            if (s == a.rank) {
                v = mine;
            } else if (!fx_ll_wait(a, r.epoch, s,
                                   a.peers[a.rank] + region + (u64)s * FX_LL_SLOT + k * 16, flag,
                                   v.w)) {
                return;
            }
#pragma unroll
            for (u32 e = 0; e < K; e++) {
                A x = E::load(v.e[e]);
                acc[e] = s == 0 ? x : O::apply(acc[e], x);
            }
        }
#pragma unroll
        for (u32 e = 0; e < K; e++)
            if (first + e < a.count) recv[first + e] = E::store(acc[e]);
    }
}

// One-shot over LL128 lines (messages up to a.ll128_max bytes): line k carries message bytes
// [120 k, 120 k + 120). A warp takes 4 lines at a time, 8 threads a line: thread j of a line
// holds bytes [16 j, 16 j + 16) of it (the last thread 8 bytes, then the round). The warp stores
// this rank's 4 lines into slot `rank` of every peer's LL128 region (this round's parity) with
// one 16-byte store per thread, then for each source in rank order loads its 4 lines from its
// own region until every line's last thread sees the round (a warp-wide vote, so the whole warp
// polls and proceeds together), and reduces into the output.
template <class E, class O>
__device__ void fx_one_shot_ll128(const FxArgs& a, const FxRound& r) {
    typedef typename E::T T;
    typedef typename E::A A;
    const u32 NE = 16 / sizeof(T);
    union Part {
        u64 w[2];
        T e[16 / sizeof(T)];
    };
    const u64 bytes = a.count * sizeof(T);
    const u64 lines = (bytes + FX_LL128_DATA - 1) / FX_LL128_DATA;
    const u32 lane = threadIdx.x & 31u, j = lane & 7u;
    const u64 warps = (u64)gridDim.x * blockDim.x / 32;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const u64 flag = r.epoch;
    const u64 region = a.ll128 + (r.epoch & 1ull) * (u64)a.world * a.ll128_slot;
    const bool aligned = ((a.send | a.recv) & 7ull) == 0;
    for (u64 first = warp * 4; first < lines; first += warps * 4) {
        const u64 k = first + (lane >> 3);
        const bool active = k < lines;
        const u64 off = k * FX_LL128_DATA + j * 16;
        // The message bytes this thread carries: 16, 8 for a line's last thread, fewer (or none)
        // at the end of the message.
        u64 have = 0;
        if (active && off < bytes) {
            have = bytes - off;
            const u64 most = j == 7 ? 8 : 16;
            if (have > most) have = most;
        }
        Part mine;
        mine.w[0] = 0;
        mine.w[1] = 0;
        if (have == 16 && aligned) {
            mine.w[0] = *(const u64*)(a.send + off);
            mine.w[1] = *(const u64*)(a.send + off + 8);
        } else if (have == 8 && aligned) {
            mine.w[0] = *(const u64*)(a.send + off);
        } else {
            for (u32 e = 0; e < have / sizeof(T); e++) mine.e[e] = ((const T*)(a.send + off))[e];
        }
        const u64 at = k * FX_LL128_LINE + j * 16;
        if (active) {
            const u64 w1 = j == 7 ? flag : mine.w[1];
            for (u32 q = 0; q < a.world; q++)
                if (q != a.rank)
                    fx_store16_u64(a.peers[q] + region + (u64)a.rank * a.ll128_slot + at, mine.w[0], w1);
        }
        A acc[16 / sizeof(T)];
        for (u32 s = 0; s < a.world; s++) {
            Part v;
            v.w[0] = 0;
            v.w[1] = 0;
            if (s == a.rank) {
                v = mine;
            } else {
                const u64 src = a.peers[a.rank] + region + (u64)s * a.ll128_slot + at;
                u64 start = 0;
                u32 polls = 0;
                for (;;) {
                    bool ready = true;
                    if (active) {
                        fx_load16_u64(src, v.w);
                        ready = j != 7 || v.w[1] == flag;
                    }
                    if (__all_sync(0xffffffffu, ready)) break;
                    if (++polls == 64) start = fx_now_ns();
                    bool late = polls > 64 && (polls & 63) == 0 && fx_now_ns() - start > a.timeout_ns;
                    if (__any_sync(0xffffffffu, late)) {
                        if (lane == 0) fx_fail(a, r.epoch, s, FX_ARRIVE);
                        return;
                    }
                }
            }
#pragma unroll
            for (u32 e = 0; e < NE; e++) {
                A x = E::load(v.e[e]);
                acc[e] = s == 0 ? x : O::apply(acc[e], x);
            }
        }
        Part out;
#pragma unroll
        for (u32 e = 0; e < NE; e++) out.e[e] = E::store(acc[e]);
        if (have == 16 && aligned) {
            *(u64*)(a.recv + off) = out.w[0];
            *(u64*)(a.recv + off + 8) = out.w[1];
        } else if (have == 8 && aligned) {
            *(u64*)(a.recv + off) = out.w[0];
        } else {
            for (u32 e = 0; e < have / sizeof(T); e++) ((T*)(a.recv + off))[e] = out.e[e];
        }
    }
}

// Two-shot: share s of the message (part s over the ranks) is reduced by rank s, in slot t of
// rank s's parity where rank t pushes it (share s's element i at slot + (i - share_lo) * size).
// Block b handles sub-part b of every share: it pushes sub-part b of every other rank's share
// into that rank's window, signals; reduces sub-part b of this rank's share over every rank (its
// own input read in place) into the output and into its own slot, signals; and copies sub-part
// b of every other share from its owner's slot into the output. A share never exceeds a slot:
// the message fits a parity.
template <class E, class O>
__device__ void fx_two_shot(const FxArgs& a, const FxRound& r) {
    typedef typename E::T T;
    const u64 g = 16 / sizeof(T);
    const u32 me = a.rank;
    for (u32 s = 0; s < a.world; s++) {
        if (s == me) continue;
        u64 slo, shi, blo, bhi;
        fx_part(a.count, a.world, s, g, &slo, &shi);
        fx_part(shi - slo, gridDim.x, blockIdx.x, g, &blo, &bhi);
        u64 dst = a.peers[s] + r.parity + (u64)me * a.chunk - slo * sizeof(T);
        fx_push<E>(&dst, 1u, 1, a.send, slo + blo, slo + bhi, a.vec);
    }
    if (!fx_signal_all_and_wait(a, r.epoch, FX_ARRIVE, r.epoch)) return;
    {
        u64 slo, shi, blo, bhi;
        fx_part(a.count, a.world, me, g, &slo, &shi);
        fx_part(shi - slo, gridDim.x, blockIdx.x, g, &blo, &bhi);
        u64 srcs[FX_MAX_RANKS];
        for (u32 t = 0; t < a.world; t++)
            srcs[t] = a.peers[me] + r.parity + (u64)t * a.chunk - slo * sizeof(T);
        u64 result = srcs[me];
        srcs[me] = a.send;
        u32 written = ((1u << a.world) - 1u) & ~(1u << me);
        fx_reduce<E, O>(a.recv, result, srcs, a.world, written, slo + blo, slo + bhi, a.vec);
    }
    if (!fx_signal_all_and_wait(a, r.epoch, FX_REDUCED, r.epoch)) return;
    for (u32 s = 0; s < a.world; s++) {
        if (s == me) continue;
        u64 slo, shi, blo, bhi;
        fx_part(a.count, a.world, s, g, &slo, &shi);
        fx_part(shi - slo, gridDim.x, blockIdx.x, g, &blo, &bhi);
        u64 slot = a.peers[s] + r.parity + (u64)s * a.chunk - slo * sizeof(T);
        fx_copy<E>(a.recv, slot, slo + blo, slo + bhi, a.vec, true);
    }
}

// One ring round over `count` elements. Piece j is part j over the ranks, kept in chunk slot j
// (its element i at slot + (i - piece_lo) * size). At step s rank r takes piece p = r - s:
// its input, plus (s > 0) the partial of step s - 1 from the left neighbour, and signals its
// right neighbour (or, at the last step, everyone). After the last step rank r holds piece
// r + 1 reduced over every rank, in its slot and in its output; the all-gather reads piece j
// from rank j - 1. Block b handles sub-part b of every piece, signalling through pad b.
//
// Two ways to move the partials (`a.algo`): pull (2) keeps step s's partial in the rank's own
// slot p, where the right neighbour reads it; push (3) writes it straight into the right
// neighbour's slot p, so that every load of a step is local and the link carries posted
// stores only. Either way slot p of a rank is written once per round before the last step.
template <class E, class O>
__device__ void fx_ring(const FxArgs& a, const FxRound& r) {
    typedef typename E::T T;
    const u64 g = 16 / sizeof(T);
    const u32 P = a.world, me = a.rank;
    const u32 left = (me + P - 1) % P, right = (me + 1) % P;
    const bool push = a.algo == 3;
    __shared__ int failed;
    if (threadIdx.x == 0) failed = 0;
    for (u32 step = 0; step < P; step++) {
        const bool last = step + 1 == P;
        u32 p = (me + P - step) % P;
        u64 plo, phi, blo, bhi;
        fx_part(a.count, P, p, g, &plo, &phi);
        fx_part(phi - plo, gridDim.x, blockIdx.x, g, &blo, &bhi);
        // Element-indexed bases of slot p at this rank, its left and its right neighbour.
        u64 mine = a.peers[me] + r.parity + p * a.chunk - plo * sizeof(T);
        u64 theirs = a.peers[left] + r.parity + p * a.chunk - plo * sizeof(T);
        u64 next = a.peers[right] + r.parity + p * a.chunk - plo * sizeof(T);
        __syncthreads();
        if (step > 0) {
            if (threadIdx.x == 0 && !fx_wait(a, r.epoch, left, FX_RING, r.epoch * P + step - 1)) failed = 1;
            __syncthreads();
            if (failed) return;
        }
        // Where this step's partial goes (the last step's, the reduced piece, also to the output).
        u64 dst = push && !last ? next : mine;
        u64 out = last ? a.recv : 0;
        if (step == 0) {
            if (last) fx_copy<E>(a.recv, a.send, plo + blo, plo + bhi, a.vec, false);
            else fx_copy<E>(dst, a.send, plo + blo, plo + bhi, a.vec, false);
        } else {
            // The partial arrived in this rank's slot (push) or is read from the left's (pull);
            // either way a peer wrote it: read around L1.
            u64 srcs[2] = {a.send, push ? mine : theirs};
            fx_reduce<E, O>(dst, out, srcs, 2, 2u, plo + blo, plo + bhi, a.vec);
        }
        __syncthreads();
        u64 value = r.epoch * P + step;
        if (!last) {
            if (threadIdx.x == 0) fx_store_release(fx_slot(a, right, FX_RING, me), value);
        } else if (threadIdx.x < P && threadIdx.x != me) {
            fx_store_release(fx_slot(a, threadIdx.x, FX_RING, me), value);
        }
    }
    // Every rank owns one reduced piece; wait for all of them at once.
    if (threadIdx.x < P && threadIdx.x != me &&
        !fx_wait(a, r.epoch, threadIdx.x, FX_RING, r.epoch * P + P - 1))
        failed = 1;
    __syncthreads();
    if (failed) return;
    for (u32 j = 0; j < P; j++) {
        u32 owner = (j + P - 1) % P;
        if (owner == me) continue;  // written to the output at the last step
        u64 plo, phi, blo, bhi;
        fx_part(a.count, P, j, g, &plo, &phi);
        fx_part(phi - plo, gridDim.x, blockIdx.x, g, &blo, &bhi);
        u64 slot = a.peers[owner] + r.parity + j * a.chunk - plo * sizeof(T);
        fx_copy<E>(a.recv, slot, plo + blo, plo + bhi, a.vec, true);
    }
}

#define FX_KERNEL(ALGO, TYPE, OP, E, O) \
    extern "C" __global__ void __launch_bounds__(FX_THREADS) fx_##ALGO##_##TYPE##_##OP(FxArgs a) { \
        FxRound r = fx_begin(a); \
        fx_##ALGO<E, O>(a, r); \
        fx_end(a, r); \
    }

#define FX_OPS(ALGO, TYPE, E) \
    FX_KERNEL(ALGO, TYPE, sum, E, Sum) \
    FX_KERNEL(ALGO, TYPE, min, E, Min) \
    FX_KERNEL(ALGO, TYPE, max, E, Max)

#define FX_TYPES(ALGO) \
    FX_OPS(ALGO, f32, F32) \
    FX_OPS(ALGO, bf16, BF16) \
    FX_OPS(ALGO, f16, F16) \
    FX_OPS(ALGO, i32, I32)

FX_TYPES(one_shot)
FX_TYPES(two_shot)
FX_TYPES(ring)

// All-gather of a.count bytes per rank (at most a.chunk): block b pushes its part of this rank's
// input into slot `rank` of every peer's chunk slots (this round's parity) and copies it into
// this rank's place in the output, signals every peer's block b, waits for theirs, then copies
// its part of every peer's input from its own slots into the output. Bytes, so every element
// type takes it; vector moves when the buffers and the size are 16-byte multiples.
struct U8 {
    typedef unsigned char T;
};

extern "C" __global__ void __launch_bounds__(FX_THREADS) fx_all_gather(FxArgs a) {
    FxRound r = fx_begin(a);
    u64 lo, hi;
    fx_part(a.count, gridDim.x, blockIdx.x, 16, &lo, &hi);
    u64 dsts[FX_MAX_RANKS];
    for (u32 q = 0; q < a.world; q++) dsts[q] = a.peers[q] + r.parity + (u64)a.rank * a.chunk;
    const u32 peer_mask = ((1u << a.world) - 1u) & ~(1u << a.rank);
    fx_push<U8>(dsts, peer_mask, a.world, a.send, lo, hi, a.vec);
    const u64 own = a.recv + (u64)a.rank * a.count;
    if (own != a.send) fx_copy<U8>(own, a.send, lo, hi, a.vec, false);
    if (fx_signal_all_and_wait(a, r.epoch, FX_ARRIVE, r.epoch)) {
        // The peers' slots are this GPU's memory written over NVLink: read around L1 too.
        for (u32 q = 0; q < a.world; q++) {
            if (q == a.rank) continue;
            fx_copy<U8>(a.recv + (u64)q * a.count, a.peers[a.rank] + r.parity + (u64)q * a.chunk,
                        lo, hi, a.vec, true);
        }
    }
    fx_end(a, r);
}
