//! The POSIX shared-memory segments of a job, as the host backend names them
//! (`/dev/shm/ferrocx-<job>-…`).

use std::ffi::CString;

/// Segment files of job `job` now in `/dev/shm`, sorted (none where there is no `/dev/shm`).
pub fn segments_of_job(job: &str) -> Vec<String> {
    let prefix = format!("ferrocx-{job}-");
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Unlinks every segment of the job when dropped, so a failing test leaves nothing behind.
pub struct JobCleanup(pub String);

impl Drop for JobCleanup {
    fn drop(&mut self) {
        for name in segments_of_job(&self.0) {
            let c = CString::new(format!("/{name}")).expect("a segment name has no NUL");
            // SAFETY: a NUL-terminated name; shm_unlink only reads it.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
    }
}
