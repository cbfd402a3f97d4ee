//! The call timeouts of the driver's claims, without a tokio timer each: every claim's deadline
//! is its send plus the one call timeout, so deadlines come in (nearly) the order calls are
//! made, and one queue in that order, expired from its front by the housekeeping task, times
//! them all. A call registers when its first poll finds no reply yet (a lock and a push) and
//! finishes with a lock and a store; the housekeeping task wakes about once per timeout while
//! calls keep coming (at the front's deadline, popping every finished call before it) instead
//! of the timer wheel registering and removing an entry per call.
//!
//! A call registered after one with a later deadline (its first poll came later, by up to the
//! delay between a claim's making and its first poll: a refill task's scheduling) times out at
//! that later deadline: late by that delay, never early.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use std::task::Waker;

use redis_ratelimit_core::{AtomicNanos, Nanos};

/// A registered call: its entry is `ticket − head` in the queue while it is there.
pub(crate) type Ticket = u64;

struct Entry {
    deadline: Nanos,
    /// The task to wake at the deadline; `None` once the call has finished.
    waker: Option<Waker>,
}

#[derive(Default)]
struct Queue {
    /// The ticket of `entries[0]`.
    head: Ticket,
    entries: VecDeque<Entry>,
}

pub(crate) struct Timeouts {
    queue: Mutex<Queue>,
    /// The front entry's deadline (`Nanos::MAX`: none), for the housekeeping task's sleep.
    first: AtomicNanos,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts { queue: Mutex::default(), first: AtomicNanos::new(Nanos::MAX) }
    }
}

impl Timeouts {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a call due at `deadline` whose task `waker` wakes then. The flag: the
    /// queue was empty, so the front's deadline is new (the housekeeping task must learn it).
    pub(crate) fn register(&self, deadline: Nanos, waker: &Waker) -> (Ticket, bool) {
        let mut q = self.lock();
        let ticket = q.head + q.entries.len() as u64;
        let first = q.entries.is_empty();
        q.entries.push_back(Entry { deadline, waker: Some(waker.clone()) });
        if first {
            self.first.store(deadline, Ordering::SeqCst);
        }
        (ticket, first)
    }

    /// Whether the call may still wait for its reply (its deadline has not fired); if so its
    /// waker is brought up to date (the call may have moved to another task).
    pub(crate) fn pending(&self, ticket: Ticket, waker: &Waker) -> bool {
        let mut q = self.lock();
        let Some(i) = ticket.checked_sub(q.head) else { return false };
        match q.entries.get_mut(i as usize).and_then(|e| e.waker.as_mut()) {
            Some(w) => {
                if !w.will_wake(waker) {
                    w.clone_from(waker);
                }
                true
            }
            None => false,
        }
    }

    /// The call ended (answered, timed out or dropped): its entry goes when it reaches the front.
    pub(crate) fn finish(&self, ticket: Ticket) {
        let waker = {
            let mut q = self.lock();
            let Some(i) = ticket.checked_sub(q.head) else { return };
            q.entries.get_mut(i as usize).and_then(|e| e.waker.take())
        };
        // Dropped outside the lock: a waker's drop may run its task's code.
        drop(waker);
    }

    /// Fires every call due by `now` (wakes its task; its next poll finds it timed out) and
    /// drops the finished ones before the first still waiting ([`Timeouts::first`] then holds
    /// the next deadline).
    pub(crate) fn expire(&self, now: Nanos) {
        let mut due = Vec::new();
        {
            let mut q = self.lock();
            while let Some(e) = q.entries.front_mut() {
                match e.waker.take() {
                    None => {}
                    Some(w) if e.deadline <= now => due.push(w),
                    Some(w) => {
                        e.waker = Some(w);
                        break;
                    }
                }
                q.entries.pop_front();
                q.head += 1;
            }
            // A queue that grew for a burst of calls gives its memory back once it drains.
            if q.entries.is_empty() && q.entries.capacity() > 1024 {
                q.entries = VecDeque::new();
            }
            self.first.store(q.entries.front().map_or(Nanos::MAX, |e| e.deadline), Ordering::SeqCst);
        }
        for w in due {
            w.wake();
        }
    }

    /// The front entry's deadline (`Nanos::MAX`: none).
    pub(crate) fn first(&self) -> Nanos {
        self.first.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn n(ns: i64) -> Nanos {
        Nanos::new(ns)
    }
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    #[test]
    fn a_call_past_its_deadline_is_woken_and_no_longer_pending() {
        let t = Timeouts::default();
        let (count, w) = waker();
        let (a, first) = t.register(n(100), &w);
        assert!(first && t.first() == n(100));
        t.expire(n(99));
        assert_eq!(t.first(), n(100));
        assert!(t.pending(a, &w));
        t.expire(n(100));
        assert_eq!(t.first(), Nanos::MAX);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(!t.pending(a, &w));
        t.finish(a);
    }

    #[test]
    fn finished_calls_are_dropped_and_never_woken() {
        let t = Timeouts::default();
        let (count, w) = waker();
        let tickets: Vec<Ticket> = (0..10).map(|i| t.register(n(100 + i), &w).0).collect();
        assert!(!t.register(n(200), &w).1, "the queue was not empty");
        for &k in &tickets {
            t.finish(k);
        }
        t.expire(n(150));
        assert_eq!(t.first(), n(200), "finished calls go, the waiting one stays");
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        assert!(t.pending(10, &w));
    }

    #[test]
    fn a_waiting_front_holds_later_finished_calls_until_it_fires() {
        let t = Timeouts::default();
        let (count, w) = waker();
        let a = t.register(n(100), &w).0;
        let b = t.register(n(90), &w).0;
        t.finish(b);
        t.expire(n(95));
        assert_eq!(t.first(), n(100), "b is behind a");
        assert!(t.pending(a, &w));
        t.expire(n(100));
        assert_eq!(t.first(), Nanos::MAX);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        // A ticket long gone (fired or finished) is never pending, and finishing it is a no-op.
        assert!(!t.pending(b, &w));
        t.finish(b);
        let (c, _) = t.register(n(300), &w);
        assert_eq!(c, 2);
    }
}
