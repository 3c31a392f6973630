//! What the ferrocx tests share, written once: the multi-process harness ([`procs`]: a test
//! executable re-runs one of its own tests as the ranks of a job), descriptor passing
//! ([`fds`]), a socket between two workers ([`sock`]), the shared-memory segments of a job
//! ([`shm`]) and deterministic data ([`Rng`], [`random_bytes`], [`hex`]).
//!
//! A dev-dependency only: nothing here is part of ferrocx.

pub mod fds;
pub mod procs;
pub mod shm;
pub mod sock;

/// Hex encoding, for passing ids in the environment.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Hex decoding (panics on anything but pairs of hex digits).
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// xorshift64*: deterministic pseudo-random numbers every rank can reproduce.
pub struct Rng(u64);

impl Rng {
    /// A generator for `(seed, stream)`.
    pub fn new(seed: u64, stream: u64) -> Self {
        Rng((seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// An integer in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }
}

/// `n` pseudo-random bytes (xorshift64*), the same for the same seed in every process.
pub fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

/// A seed that differs between runs (and between processes).
pub fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_nanos() as u64;
    t ^ ((std::process::id() as u64) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_data_is_reproducible() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex(&b), "0001abff");
        assert_eq!(unhex("0001abff"), b);
        assert_eq!(random_bytes(7, 64), random_bytes(7, 64));
        assert_ne!(random_bytes(7, 64), random_bytes(8, 64));
        let (mut a, mut c) = (Rng::new(1, 2), Rng::new(1, 2));
        assert_eq!(a.next_u64(), c.next_u64());
        assert!((0..1000).all(|_| (-3..=3).contains(&a.range(-3, 3))));
    }
}
