//! What the client's benchmarks share: the process's CPU clock, environment knobs, medians, and
//! driving a check that may wait for Redis. (Each benchmark uses some of them.)
#![allow(dead_code)]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// The process's CPU time (every thread): on a shared machine a check's cost, where wall time
/// also counts the other processes.
pub fn cpu_now() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_PROCESS_CPUTIME_ID always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `$name` as a number, or `default` when unset or not a number.
pub fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The median (the upper one of an even count); `v` not empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Polls `fut` once; if it is not ready (it waits for Redis), counts it in `waited` and
/// finishes it on the runtime.
pub fn drive<F: Future>(rt: &tokio::runtime::Runtime, fut: F, waited: &mut u64) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => {
            *waited += 1;
            rt.block_on(fut)
        }
    }
}
