//! How the runner's process allocates large buffers, so that memory one call
//! used is given back when the call ends.
//!
//! A call can carry a whole file (tens of MiB) in its arguments, and each
//! stage briefly holds a copy (the decoded message, the parsed value, the
//! provider's input). glibc's malloc serves an allocation of 128 KiB or more
//! with its own `mmap`, returned to the system on `free`, but it raises that
//! threshold to the size of each such block freed (up to 32 MiB) and the trim
//! threshold to twice that. After the first large call, the next ones come
//! from the per-thread arenas, and a freed arena block is kept: four parallel
//! 30 MiB writes left the runner at ~370 MB resident for good.
//!
//! Fixing both thresholds turns the adjustment off: large buffers are mapped
//! and unmapped per call, small ones stay in the arenas as before. Measured by
//! `benches/rss.rs`. A different allocator (jemalloc, mimalloc) would also
//! return the memory, after its own decay delay, at the cost of a dependency
//! for every build; these two settings are enough here.

/// Allocations of at least this many bytes get their own mapping.
pub const MMAP_THRESHOLD_BYTES: i32 = 1 << 20;
/// Free memory at the top of an arena above this is returned to the system.
pub const TRIM_THRESHOLD_BYTES: i32 = 4 << 20;

/// Set to `1`, leaves glibc's defaults (to measure the difference).
pub const DEFAULTS_ENV: &str = "OMICOS_ALLOCATOR_DEFAULTS";

/// Applies the thresholds, unless [`DEFAULTS_ENV`] is `1`. Call once, early
/// in `main`. A no-op outside glibc.
pub fn return_large_buffers() {
    if std::env::var(DEFAULTS_ENV).is_ok_and(|v| v == "1") {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it takes the allocator's
    // own lock and may be called at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES);
    }
}
