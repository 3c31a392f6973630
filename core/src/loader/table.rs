//! Reading a table a plugin exports: header checks, and a normalised copy in which every field
//! past the plugin's `struct_size` reads as absent.

use std::ffi::CStr;
use std::fmt;
use std::mem::{size_of, MaybeUninit};

use crate::abi::{AbiHeader, AbiTable, ABI_MAGIC, ABI_MAJOR, ABI_MINOR};

/// Why a table was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableError {
    /// The magic number is not `"FRCX"`.
    BadMagic(u32),
    /// The header's major is not the symbol's (and this build's) major.
    MajorMismatch {
        /// Major in the header.
        header: u16,
        /// Major this build reads.
        expected: u16,
    },
    /// `struct_size` is smaller than the header itself.
    TooSmall(u32),
    /// The name is null, not UTF-8, empty or too long.
    BadName(String),
    /// `struct_size` breaks [the size rule](Table::read): not whole entries, or larger than a
    /// table of its minor can be.
    BadSize {
        /// The declared `struct_size`.
        size: u32,
        /// The minor in the header.
        minor: u16,
        /// The rule it breaks.
        rule: String,
    },
}

/// Entries a table of a newer minor may have beyond this build's table: a minor appends a
/// handful of entries, so this many is far more than any plausible table while it keeps an
/// absurd `struct_size` (a garbage or hostile header) out.
pub const MAX_APPENDED_ENTRIES: usize = 256;

/// Checks a declared `struct_size` against the rule for a table whose header has minor
/// `minor`, when this build's table (ABI minor `known_minor`) is `known` bytes:
///
/// - it is the 24-byte header plus whole pointer-sized entries;
/// - a table of this build's minor or an older one is at most `known` bytes (an older minor has
///   fewer entries, never more);
/// - a table of a newer minor may append entries, at most [`MAX_APPENDED_ENTRIES`] of them.
pub fn check_size(size: u32, minor: u16, known: usize, known_minor: u16) -> Result<(), TableError> {
    let hdr = size_of::<AbiHeader>();
    let word = size_of::<usize>();
    let declared = size as usize;
    let bad = |rule: String| TableError::BadSize { size, minor, rule };
    if declared < hdr {
        return Err(TableError::TooSmall(size));
    }
    if (declared - hdr) % word != 0 {
        return Err(bad(format!(
            "a table is the {hdr}-byte header plus whole {word}-byte entries"
        )));
    }
    if minor <= known_minor && declared > known {
        return Err(bad(format!(
            "a table of ABI {}.{minor} is at most this build's {}.{known_minor} table ({known} bytes)",
            ABI_MAJOR, ABI_MAJOR
        )));
    }
    let cap = known + MAX_APPENDED_ENTRIES * word;
    if declared > cap {
        return Err(bad(format!(
            "a newer minor appends at most {MAX_APPENDED_ENTRIES} entries to this build's \
             {}.{known_minor} table ({known} bytes), so at most {cap} bytes",
            ABI_MAJOR
        )));
    }
    Ok(())
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableError::BadMagic(m) => {
                write!(f, "bad magic {m:#010x} (expected {ABI_MAGIC:#010x}): not a ferrocx table")
            }
            TableError::MajorMismatch { header, expected } => write!(
                f,
                "plugin built for ABI {header}.x, this build reads ABI {expected}.x (loader {ABI_MAJOR}.{ABI_MINOR})"
            ),
            TableError::TooSmall(s) => write!(
                f,
                "struct_size {s} is smaller than the header ({} bytes)",
                size_of::<AbiHeader>()
            ),
            TableError::BadName(why) => write!(f, "bad adaptor name: {why}"),
            TableError::BadSize { size, minor, rule } => write!(
                f,
                "struct_size {size} (ABI {ABI_MAJOR}.{minor}) refused: {rule}"
            ),
        }
    }
}

/// A table checked and copied out of a plugin (or a built-in), ready to dispatch through.
pub struct Table<T: AbiTable> {
    table: T,
    name: String,
    abi_minor: u16,
    struct_size: usize,
}

/// Longest adaptor name accepted.
pub const MAX_NAME: usize = 64;

impl<T: AbiTable> Table<T> {
    /// Checks the header at `ptr` and copies `min(struct_size, size_of::<T>())` bytes of the
    /// table; the rest of the copy is zero, i.e. `None`. `struct_size` must follow
    /// [`check_size`]'s rule (whole entries, not larger than a table of its minor can be), so
    /// no entry is ever copied in part.
    ///
    /// # Safety
    /// `ptr` must point to a readable [`AbiHeader`] followed by at least `struct_size - 24`
    /// readable bytes (what the plugin declared), and the function pointers in it must be
    /// callable with the ABI's signatures for as long as the table is used (libraries are never
    /// unloaded).
    pub unsafe fn read(ptr: *const T) -> Result<Self, TableError> {
        // SAFETY: the caller guarantees a readable header at `ptr`.
        let header: AbiHeader = unsafe { std::ptr::read_unaligned(ptr as *const AbiHeader) };
        if header.magic != ABI_MAGIC {
            return Err(TableError::BadMagic(header.magic));
        }
        if header.abi_major != T::MAJOR {
            return Err(TableError::MajorMismatch {
                header: header.abi_major,
                expected: T::MAJOR,
            });
        }
        let declared = header.struct_size as usize;
        check_size(
            header.struct_size,
            header.abi_minor,
            size_of::<T>(),
            ABI_MINOR,
        )?;
        // SAFETY: the caller guarantees `name` is null or a NUL-terminated static string.
        let name = unsafe { read_name(&header) }?;
        let mut copy = MaybeUninit::<T>::zeroed();
        let n = declared.min(size_of::<T>());
        // SAFETY: `n` bytes are readable at `ptr` (declared by the plugin) and fit in `copy`; an
        // all-zero `T` is valid (AbiTable's contract: every field past the header is an Option of
        // a function pointer), and the copied prefix holds valid values of the same fields.
        let table = unsafe {
            std::ptr::copy_nonoverlapping(ptr as *const u8, copy.as_mut_ptr() as *mut u8, n);
            copy.assume_init()
        };
        Ok(Table {
            table,
            name,
            abi_minor: header.abi_minor,
            struct_size: declared,
        })
    }

    /// A table compiled into this program (a built-in adaptor).
    pub fn builtin(table: &'static T) -> Result<Self, TableError> {
        // SAFETY: a `&'static T` is a whole, valid table of this build's own layout.
        unsafe { Self::read(table as *const T) }
    }

    /// The table, to call through. Fields past the plugin's `struct_size` are `None`.
    pub fn get(&self) -> &T {
        &self.table
    }

    /// The adaptor's name from the header.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `(major, minor)` the table was built against.
    pub fn version(&self) -> (u16, u16) {
        (T::MAJOR, self.abi_minor)
    }

    /// The `struct_size` the plugin declared.
    pub fn declared_size(&self) -> usize {
        self.struct_size
    }

    fn entry_set(&self, offset: usize) -> bool {
        // SAFETY: `offset` comes from `T::entries()`, a pointer-sized Option<fn> field within T.
        let word = unsafe {
            std::ptr::read_unaligned(
                (&self.table as *const T as *const u8).add(offset) as *const usize
            )
        };
        word != 0
    }

    /// Names of the entries the table provides.
    pub fn present(&self) -> Vec<&'static str> {
        T::entries()
            .iter()
            .filter(|(_, off)| self.entry_set(*off))
            .map(|(n, _)| *n)
            .collect()
    }

    /// Names of the entries the table leaves `None` within its `struct_size`.
    pub fn absent(&self) -> Vec<&'static str> {
        T::entries()
            .iter()
            .filter(|(_, off)| {
                *off + size_of::<usize>() <= self.struct_size && !self.entry_set(*off)
            })
            .map(|(n, _)| *n)
            .collect()
    }

    /// Names of the entries past the table's `struct_size` (an older minor): treated as absent.
    pub fn beyond_size(&self) -> Vec<&'static str> {
        T::entries()
            .iter()
            .filter(|(_, off)| *off + size_of::<usize>() > self.struct_size)
            .map(|(n, _)| *n)
            .collect()
    }
}

/// # Safety
/// `header.name` must be null or point to a NUL-terminated string.
unsafe fn read_name(header: &AbiHeader) -> Result<String, TableError> {
    let ptr = header.name.0;
    if ptr.is_null() {
        return Err(TableError::BadName("null".into()));
    }
    // SAFETY: non-null, NUL-terminated by the caller's contract.
    let c = unsafe { CStr::from_ptr(ptr) };
    let bytes = c.to_bytes();
    if bytes.is_empty() || bytes.len() > MAX_NAME {
        return Err(TableError::BadName(format!(
            "length {} (1..={MAX_NAME})",
            bytes.len()
        )));
    }
    let s = std::str::from_utf8(bytes).map_err(|_| TableError::BadName("not UTF-8".into()))?;
    if !s
        .chars()
        .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
    {
        return Err(TableError::BadName(format!(
            "{s:?} (use ASCII letters, digits, '_' and '-')"
        )));
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: usize = 24 + 8 * 20;

    #[test]
    fn a_size_must_be_the_header_plus_whole_entries() {
        assert_eq!(check_size(24, 1, KNOWN, 1), Ok(()));
        assert_eq!(check_size(KNOWN as u32, 1, KNOWN, 1), Ok(()));
        assert_eq!(check_size(23, 1, KNOWN, 1), Err(TableError::TooSmall(23)));
        for odd in [25, 28, 52, KNOWN as u32 - 4, KNOWN as u32 + 1] {
            let e = check_size(odd, 1, KNOWN, 1).unwrap_err();
            assert!(
                e.to_string()
                    .ends_with("the 24-byte header plus whole 8-byte entries"),
                "{odd}: {e}"
            );
        }
    }

    #[test]
    fn a_known_minor_is_no_larger_than_this_builds_table_and_a_newer_one_is_capped() {
        // One entry more than this build's table, claimed by this build's minor or an older one.
        for minor in [0, 1] {
            let e = check_size(KNOWN as u32 + 8, minor, KNOWN, 1).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "struct_size {} (ABI 1.{minor}) refused: a table of ABI 1.{minor} is at most \
                     this build's 1.1 table ({KNOWN} bytes)",
                    KNOWN + 8
                )
            );
        }
        // A newer minor appends entries, up to the cap.
        let cap = KNOWN + MAX_APPENDED_ENTRIES * 8;
        assert_eq!(check_size(KNOWN as u32 + 8, 2, KNOWN, 1), Ok(()));
        assert_eq!(check_size(cap as u32, 7, KNOWN, 1), Ok(()));
        let e = check_size(cap as u32 + 8, 7, KNOWN, 1).unwrap_err();
        assert!(
            e.to_string().contains(&format!("so at most {cap} bytes")),
            "{e}"
        );
        assert!(check_size(u32::MAX - 7, 7, KNOWN, 1).is_err());
    }
}
