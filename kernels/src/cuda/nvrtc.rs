//! NVRTC, opened at run time: `FERROCX_NVRTC_LIBRARY`, else `libnvrtc.so.13`,
//! `libnvrtc.so.12`, `libnvrtc.so`.
//!
//! Only the ten entry points the kernels need are bound, each looked up by name; a library
//! that lacks one is reported, never a panic. (cudarc's `nvrtc` feature binds its whole API
//! for one CUDA version and panics on a library that lacks any of it, which a newer or older
//! NVRTC than the bindings' can.)

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// The environment variable naming the NVRTC library to open.
pub const ENV_NVRTC_LIBRARY: &str = "FERROCX_NVRTC_LIBRARY";
const CANDIDATES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

type Program = *mut c_void;
type Result_ = c_int;

/// The bound entry points.
pub(crate) struct Nvrtc {
    /// Which file was opened.
    pub path: String,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Result_,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Result_,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Result_,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Result_,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Result_,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> Result_,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> Result_,
    destroy: unsafe extern "C" fn(*mut Program) -> Result_,
    error_string: unsafe extern "C" fn(Result_) -> *const c_char,
    _lib: libloading::Library,
}

/// NVRTC, opened once (a missing library is not looked for again).
pub(crate) fn load() -> Result<&'static Nvrtc, String> {
    static NVRTC: OnceLock<Result<Nvrtc, String>> = OnceLock::new();
    NVRTC.get_or_init(open).as_ref().map_err(Clone::clone)
}

fn open() -> Result<Nvrtc, String> {
    let names: Vec<String> = match std::env::var(ENV_NVRTC_LIBRARY) {
        Ok(p) if !p.is_empty() => vec![p],
        _ => CANDIDATES.iter().map(|s| s.to_string()).collect(),
    };
    let mut tried = Vec::new();
    for name in &names {
        // SAFETY: loading NVRTC runs only its own initialisers.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return bind(lib, name),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "NVRTC not found (set {ENV_NVRTC_LIBRARY} to its path): {}",
        tried.join("; ")
    ))
}

/// Entry point `name` of `lib` as the function-pointer type `T`.
///
/// # Safety
/// `T` is the C signature of the library's `name`.
pub(crate) unsafe fn symbol<T: Copy>(
    lib: &libloading::Library,
    path: &str,
    name: &str,
) -> Result<T, String> {
    let mut bytes = name.as_bytes().to_vec();
    bytes.push(0);
    // SAFETY: the caller's contract: `T` is the symbol's type.
    let s = unsafe { lib.get::<T>(&bytes) }.map_err(|e| format!("{path} lacks {name}: {e}"))?;
    Ok(*s)
}

fn bind(lib: libloading::Library, path: &str) -> Result<Nvrtc, String> {
    // SAFETY: (every call) the field's type is the C signature NVRTC documents for the name.
    unsafe {
        Ok(Nvrtc {
            path: path.to_string(),
            version: symbol(&lib, path, "nvrtcVersion")?,
            create: symbol(&lib, path, "nvrtcCreateProgram")?,
            compile: symbol(&lib, path, "nvrtcCompileProgram")?,
            log_size: symbol(&lib, path, "nvrtcGetProgramLogSize")?,
            log: symbol(&lib, path, "nvrtcGetProgramLog")?,
            cubin_size: symbol(&lib, path, "nvrtcGetCUBINSize")?,
            cubin: symbol(&lib, path, "nvrtcGetCUBIN")?,
            destroy: symbol(&lib, path, "nvrtcDestroyProgram")?,
            error_string: symbol(&lib, path, "nvrtcGetErrorString")?,
            _lib: lib,
        })
    }
}

/// A program, destroyed on drop.
struct Prog<'a> {
    nvrtc: &'a Nvrtc,
    handle: Program,
}

impl Drop for Prog<'_> {
    fn drop(&mut self) {
        // SAFETY: a program nvrtcCreateProgram made, destroyed once.
        unsafe { (self.nvrtc.destroy)(&mut self.handle) };
    }
}

impl Nvrtc {
    /// `(major, minor)` of the library.
    pub(crate) fn version(&self) -> (i32, i32) {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        unsafe { (self.version)(&mut major, &mut minor) };
        (major, minor)
    }

    fn check(&self, what: &str, r: Result_) -> Result<(), String> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: NVRTC returns a static string for any result code.
        let msg = unsafe { CStr::from_ptr((self.error_string)(r)) };
        Err(format!("{what} failed: {} ({r})", msg.to_string_lossy()))
    }

    /// Compiles `source` (named `name`, with `headers` as `(include name, text)`) with
    /// `options` into a CUBIN. A compile error carries NVRTC's log.
    pub(crate) fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[String],
    ) -> Result<Vec<u8>, String> {
        let cstr = |s: &str| CString::new(s).map_err(|_| format!("a NUL byte in {s:?}"));
        let source_c = cstr(source)?;
        let name_c = cstr(name)?;
        let header_texts: Vec<CString> = headers
            .iter()
            .map(|(_, t)| cstr(t))
            .collect::<Result<_, _>>()?;
        let header_names: Vec<CString> = headers
            .iter()
            .map(|(n, _)| cstr(n))
            .collect::<Result<_, _>>()?;
        let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();
        let name_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
        let mut handle: Program = std::ptr::null_mut();
        // SAFETY: NUL-terminated strings and arrays of `headers.len()` of them, alive across
        // the call; a valid out-pointer.
        let r = unsafe {
            (self.create)(
                &mut handle,
                source_c.as_ptr(),
                name_c.as_ptr(),
                headers.len() as c_int,
                text_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
            )
        };
        self.check("nvrtcCreateProgram", r)?;
        let prog = Prog {
            nvrtc: self,
            handle,
        };
        let opts: Vec<CString> = options.iter().map(|o| cstr(o)).collect::<Result<_, _>>()?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();
        // SAFETY: a live program and an array of NUL-terminated options.
        let r = unsafe { (self.compile)(prog.handle, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        if r != 0 {
            let log = self.log(&prog);
            return Err(format!(
                "{}\nNVRTC log:\n{log}",
                self.check("nvrtcCompileProgram", r)
                    .err()
                    .unwrap_or_default()
            ));
        }
        let log = self.log(&prog);
        if !log.trim().is_empty() {
            tracing::warn!("NVRTC compiled {name} with messages:\n{log}");
        }
        let mut size = 0usize;
        // SAFETY: a compiled program and a valid out-pointer.
        self.check("nvrtcGetCUBINSize", unsafe {
            (self.cubin_size)(prog.handle, &mut size)
        })?;
        let mut cubin = vec![0u8; size];
        // SAFETY: the buffer holds the size NVRTC reported.
        self.check("nvrtcGetCUBIN", unsafe {
            (self.cubin)(prog.handle, cubin.as_mut_ptr().cast())
        })?;
        Ok(cubin)
    }

    fn log(&self, prog: &Prog<'_>) -> String {
        let mut size = 0usize;
        // SAFETY: a live program and a valid out-pointer.
        if unsafe { (self.log_size)(prog.handle, &mut size) } != 0 || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: the buffer holds the size NVRTC reported (with its NUL).
        if unsafe { (self.log)(prog.handle, buf.as_mut_ptr().cast()) } != 0 {
            return String::new();
        }
        String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .to_string()
    }
}
