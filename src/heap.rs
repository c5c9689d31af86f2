//! Gives freed heap memory back to the system. glibc's allocator keeps the memory of freed small
//! blocks in its per-thread arenas: after 2,000 SSE subscribers had come and gone, an idle
//! service still held the ~90 MB they had used. Every `PES_MEMORY_TRIM_SECONDS` this task asks
//! glibc how much free memory it holds and, past a threshold, returns it (`malloc_trim`). On other
//! platforms and allocators it does nothing.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Free heap memory held by the allocator past which it is returned to the system.
const TRIM_ABOVE_BYTES: usize = 8 * 1024 * 1024;

/// Trim every `every` until `stop` fires; `every` zero disables it.
pub async fn trim_periodically(every: Duration, stop: CancellationToken) {
    if every.is_zero() || !supported() {
        return;
    }
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        // Off the async threads: a trim walks every arena and may take a few milliseconds.
        let trimmed = tokio::task::spawn_blocking(trim_if_worth_it).await;
        if let Ok(Some(freed)) = trimmed {
            tracing::debug!(
                free_bytes = freed,
                "returned free heap memory to the system"
            );
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn supported() -> bool {
    true
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn supported() -> bool {
    false
}

/// Trim when the allocator holds more than [`TRIM_ABOVE_BYTES`] free; the free bytes it held.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_if_worth_it() -> Option<usize> {
    // SAFETY: both are plain glibc calls without preconditions; mallinfo2 exists since glibc 2.33
    // (Debian bookworm has 2.36).
    let free = unsafe { libc::mallinfo2() }.fordblks;
    if free < TRIM_ABOVE_BYTES {
        return None;
    }
    unsafe { libc::malloc_trim(0) };
    Some(free)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_if_worth_it() -> Option<usize> {
    None
}
