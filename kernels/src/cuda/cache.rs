//! The on-disk cache of compiled kernels: `<dir>/<hash>-sm_<arch>.cubin`, where the hash
//! covers the sources, the compile options and NVRTC's version, and `<dir>` is
//! `FERROCX_KERNEL_CACHE`, else `$XDG_CACHE_HOME/ferrocx/kernels`, else
//! `$HOME/.cache/ferrocx/kernels`. Files are written whole (a temporary file renamed into
//! place), so concurrent ranks compiling the same kernels never read half a file.

use std::path::PathBuf;

/// The environment variable naming the cache directory.
pub const ENV_KERNEL_CACHE: &str = "FERROCX_KERNEL_CACHE";

/// The cache directory from the environment `var`, if any can be named.
pub(crate) fn dir(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |k: &str| var(k).filter(|v| !v.is_empty());
    if let Some(d) = set(ENV_KERNEL_CACHE) {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = set("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("ferrocx/kernels"));
    }
    set("HOME").map(|h| PathBuf::from(h).join(".cache/ferrocx/kernels"))
}

/// FNV-1a over `parts`, each followed by a separator byte.
pub(crate) fn hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain(std::iter::once(&0xffu8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The file name of the kernels of hash `hash` for `sm_<arch>`.
pub(crate) fn file_name(hash: u64, arch: u32) -> String {
    format!("{hash:016x}-sm_{arch}.cubin")
}

/// The cached bytes of `name` in `dir`, if there.
pub(crate) fn read(dir: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    std::fs::read(dir.join(name)).ok().filter(|b| !b.is_empty())
}

/// Stores `bytes` as `name` in `dir` (made if missing).
pub(crate) fn write(dir: &std::path::Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, dir.join(name)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_follows_the_environment_in_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            dir(env(&[("FERROCX_KERNEL_CACHE", "/k"), ("HOME", "/h")])),
            Some(PathBuf::from("/k"))
        );
        assert_eq!(
            dir(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])),
            Some(PathBuf::from("/x/ferrocx/kernels"))
        );
        assert_eq!(
            dir(env(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/ferrocx/kernels"))
        );
        assert_eq!(dir(env(&[])), None);
    }

    #[test]
    fn the_key_changes_with_any_part() {
        let base = hash(&[b"source", b"--gpu-architecture=sm_90", b"12.8"]);
        assert_ne!(
            base,
            hash(&[b"source", b"--gpu-architecture=sm_90", b"12.9"])
        );
        assert_ne!(
            base,
            hash(&[b"sourc", b"e--gpu-architecture=sm_90", b"12.8"])
        );
        assert_eq!(file_name(0xab, 90), "00000000000000ab-sm_90.cubin");
    }

    #[test]
    fn written_files_read_back_whole() {
        let d = std::env::temp_dir().join(format!("ferrocx-kcache-{}", std::process::id()));
        write(&d, "a.cubin", b"\x7fELF-bytes").expect("write");
        assert_eq!(read(&d, "a.cubin").as_deref(), Some(&b"\x7fELF-bytes"[..]));
        assert_eq!(read(&d, "missing.cubin"), None);
        let left: Vec<_> = std::fs::read_dir(&d)
            .expect("dir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        assert_eq!(
            left,
            vec!["a.cubin".to_string()],
            "no temporary file is left"
        );
        std::fs::remove_dir_all(&d).expect("clean up");
    }
}
