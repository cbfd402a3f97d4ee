//! Traffic through a `Limiter` while a test breaks Redis: one task checking one key at a fixed
//! rate until stopped, recording every answer and the span of each enforced admission (for
//! `common::certain_max_in_window`).
#![allow(dead_code)] // each test file uses a part

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis_ratelimit_client::{Limiter, Source};

/// What the traffic saw.
#[derive(Clone, Default)]
pub struct Seen {
    /// Each answer: when it came, its source, whether it admitted.
    pub answers: Vec<(Instant, Source, bool)>,
    /// (sent, answered), ns after the start, of each admission decided from units claimed
    /// (`Source::Local` or `Source::Redis`), sorted when returned by [`Traffic::stop`].
    pub spans: Vec<(u64, u64)>,
}

/// A decision from units claimed, not a failure policy's or a cache's.
pub fn enforced(s: Source) -> bool {
    matches!(s, Source::Local | Source::Redis)
}

pub struct Traffic {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    /// Checks `key` (1 unit) `per_second` times a second, from `t0`, until stopped.
    pub fn start<C: ConnectionLike + Clone + Send + Sync + 'static>(
        limiter: &Limiter<C>,
        key: &'static str,
        per_second: u64,
        t0: Instant,
    ) -> Traffic {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let (limiter, seen, stop) = (limiter.clone(), seen.clone(), stop.clone());
            tokio::spawn(async move {
                let ns = |t: Instant| t.duration_since(t0).as_nanos() as u64;
                let mut every = tokio::time::interval(Duration::from_micros(1_000_000 / per_second));
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                while !stop.load(Ordering::Relaxed) {
                    every.tick().await;
                    let before = Instant::now();
                    let o = limiter.check(key, 1).await;
                    let after = Instant::now();
                    let mut seen = seen.lock().unwrap();
                    if o.allowed && enforced(o.source) {
                        seen.spans.push((ns(before), ns(after)));
                    }
                    seen.answers.push((after, o.source, o.allowed));
                }
            })
        };
        Traffic { seen, stop, task }
    }

    /// The first answer after `since` from units claimed, if one came.
    pub fn enforced_after(&self, since: Instant) -> Option<Instant> {
        self.seen.lock().unwrap().answers.iter().find(|(t, s, _)| *t > since && enforced(*s)).map(|a| a.0)
    }

    /// Stops the traffic; what it saw.
    pub async fn stop(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        let mut seen = self.seen.lock().unwrap().clone();
        seen.spans.sort();
        seen
    }
}
