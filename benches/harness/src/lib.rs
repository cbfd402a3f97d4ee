//! Support for the benchmarks that run against real servers (`benches/server`: `make bench`):
//! the parts that do not depend on what is measured, so that another benchmark (the rate limit
//! service's) can reuse them.
//!
//! * [`servers`]: redis-server processes started through the integration tests' harness
//!   (`tests/common`, included as [`common`]), pinned to a CPU, with the server CPU they spent
//!   (Linux schedstat), a fresh connection per command (as `redis-cli` does), `redis-cli --pipe`
//!   loading and replica waits.
//! * [`load`]: one `redis-benchmark` run and the RESP text of many commands.
//! * [`stats`]: median, least and most, spread, percentiles, ratios and bounds over samples.
//! * [`report`]: Markdown tables and the report file; [`machine`]: what the report says about
//!   the machine and the run; [`settings`]: environment knobs.

#[path = "../../../tests/common/mod.rs"]
pub mod common;

pub mod load;
pub mod machine;
pub mod report;
pub mod servers;
pub mod settings;
pub mod stats;

use std::time::Instant;

/// Progress on stderr, prefixed with the benchmark's name and the seconds since `start`, as
/// `bench: [12s] …`.
pub struct Log {
    name: &'static str,
    start: Instant,
}

impl Log {
    pub fn new(name: &'static str) -> Log {
        Log { name, start: Instant::now() }
    }

    pub fn say(&self, message: &str) {
        eprintln!("{}: [{}s] {message}", self.name, self.start.elapsed().as_secs());
    }

    /// Seconds since the start.
    pub fn elapsed_secs(&self) -> u64 {
        self.start.elapsed().as_secs()
    }
}
