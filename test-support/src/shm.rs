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

/// Removes MPICH's shared-memory segments (`/dev/shm/mpich_shm_*`) that no process maps and
/// that are older than a few seconds: the ones ranks left that ended without `MPI_Finalize` (a
/// test of an aborted or dead rank). A segment of a job still starting is younger, and one in
/// use is mapped. Returns how many were removed.
pub fn sweep_unmapped_mpich_segments() -> usize {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return 0;
    };
    let now = std::time::SystemTime::now();
    let old: Vec<String> = dir
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().into_string().ok()?;
            let age = now
                .duration_since(e.metadata().ok()?.modified().ok()?)
                .ok()?;
            (name.starts_with("mpich_shm_") && age > std::time::Duration::from_secs(5))
                .then_some(name)
        })
        .collect();
    if old.is_empty() {
        return 0;
    }
    // Every mapping of every process: a segment in use appears as /dev/shm/<name>.
    let mut mapped = String::new();
    if let Ok(procs) = std::fs::read_dir("/proc") {
        for p in procs.flatten() {
            if let Ok(maps) = std::fs::read_to_string(p.path().join("maps")) {
                mapped.push_str(&maps);
            }
        }
    }
    let mut removed = 0;
    for name in old {
        if !mapped.contains(&format!("/dev/shm/{name}")) {
            removed += usize::from(std::fs::remove_file(format!("/dev/shm/{name}")).is_ok());
        }
    }
    removed
}
