//! Sliding window log, exact: a request is admitted when the units admitted in the half-open
//! interval (now − window, now] plus its cost fit the limit.
//!
//! Unlike the sorted-set log, its cost does not grow with the client's volume: the log is a
//! FIFO of 8-byte entries (microsecond timestamp and unit count packed in one word; requests
//! in the same microsecond share an entry) with a running total, so an admitted call pops the
//! entries that left the window (each entry is popped once: amortized O(1)) and pushes or
//! merges one. Entries hold at least one unit each, so the log never holds more than `limit`
//! entries. Counts too large for the 11-bit field live in a side FIFO, in entry order.

use std::collections::VecDeque;

use super::{to_nanos, Decision, Nanos, Request, Window, NANOS_PER_MICRO};

const TS_BITS: u32 = 53;
const TS_MASK: u64 = (1 << TS_BITS) - 1;
/// Counts from 1 to BIG - 1 are stored inline; BIG marks an entry whose count is in `big`.
pub const BIG: u64 = (1 << (64 - TS_BITS)) - 1;
/// Latest representable timestamp (µs since the epoch: the year 2255).
pub const MAX_TS: i64 = TS_MASK as i64;

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Log {
    /// `count << 53 | timestamp_us`, oldest first, timestamps non-decreasing.
    pub entries: VecDeque<u64>,
    /// Counts of the entries marked BIG, in entry order.
    pub big: VecDeque<u64>,
    /// Sum of all counts.
    pub total: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    pub win: Window,
    pub log: Log,
}

/// What an admitted call changes: drop the entries at or before `cutoff` (µs), then record
/// `units` at `ts` (µs), under (possibly new) parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Commit {
    pub win: Window,
    pub cutoff: i64,
    pub ts: i64,
    pub units: u64,
}

pub fn ts_of(entry: u64) -> i64 {
    (entry & TS_MASK) as i64
}

fn inline_count(entry: u64) -> u64 {
    entry >> TS_BITS
}

fn pack(ts: i64, count: u64) -> u64 {
    debug_assert!((1..=BIG).contains(&count));
    (count << TS_BITS) | (ts as u64 & TS_MASK)
}

fn micros(now: Nanos) -> i64 {
    now.div_euclid(NANOS_PER_MICRO).clamp(0, MAX_TS)
}

fn window_us(win: &Window) -> i64 {
    (win.window / NANOS_PER_MICRO).max(1)
}

impl Log {
    /// Iterates (timestamp µs, units), oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (i64, u64)> + '_ {
        let mut big = self.big.iter();
        self.entries.iter().map(move |&e| {
            let c = inline_count(e);
            (ts_of(e), if c == BIG { *big.next().unwrap_or(&0) } else { c })
        })
    }

    /// Units in entries at or before `cutoff`: those that have left the window.
    fn units_through(&self, cutoff: i64) -> u64 {
        self.iter().take_while(|&(ts, _)| ts <= cutoff).map(|(_, c)| c).sum()
    }

    fn pop_through(&mut self, cutoff: i64) {
        while let Some(&e) = self.entries.front() {
            if ts_of(e) > cutoff {
                break;
            }
            self.entries.pop_front();
            let c = inline_count(e);
            let c = if c == BIG { self.big.pop_front().unwrap_or(0) } else { c };
            self.total = self.total.saturating_sub(c);
        }
        shrink(&mut self.entries);
        shrink(&mut self.big);
    }

    fn push(&mut self, ts: i64, units: u64) {
        // Timestamps never go backwards in the log (a clock stepping back records at the newest).
        let ts = self.newest().map_or(ts, |n| n.max(ts));
        self.total = self.total.saturating_add(units);
        if let Some(back) = self.entries.back_mut() {
            if ts_of(*back) == ts {
                let c = inline_count(*back);
                if c == BIG {
                    *self.big.back_mut().expect("BIG entry without its count") += units;
                } else if c + units < BIG {
                    *back = pack(ts, c + units);
                } else {
                    *back = pack(ts, BIG);
                    self.big.push_back(c + units);
                }
                return;
            }
        }
        if units < BIG {
            self.entries.push_back(pack(ts, units));
        } else {
            self.entries.push_back(pack(ts, BIG));
            self.big.push_back(units);
        }
    }

    pub fn newest(&self) -> Option<i64> {
        self.entries.back().map(|&e| ts_of(e))
    }

    pub fn oldest(&self) -> Option<i64> {
        self.entries.front().map(|&e| ts_of(e))
    }

    /// Bytes of heap this log holds.
    pub fn heap_bytes(&self) -> usize {
        (self.entries.capacity() + self.big.capacity()) * std::mem::size_of::<u64>()
    }
}

/// Give memory back when a log has shrunk to a quarter of its allocation, so a key's memory
/// follows its traffic, not its peak.
fn shrink(q: &mut VecDeque<u64>) {
    if q.capacity() > 16 && q.len() < q.capacity() / 4 {
        q.shrink_to(q.len() * 2);
    }
}

impl State {
    pub fn new(win: Window) -> State {
        State { win, log: Log::default() }
    }

    pub fn apply(&mut self, c: &Commit) {
        self.win = c.win;
        self.log.pop_through(c.cutoff);
        if c.units > 0 {
            // Grow by half rather than double: memory stays close to 8 bytes per entry.
            if self.log.entries.len() == self.log.entries.capacity() {
                let extra = (self.log.entries.len() / 2).max(4);
                self.log.entries.reserve_exact(extra);
            }
            self.log.push(c.ts, c.units);
        }
    }

    /// The stored total once `c` is applied: the module never writes more than the limit, and
    /// a commit that would (a forged RL.SETSTATE) is refused so every log stays loadable.
    pub fn total_after(&self, c: &Commit) -> u64 {
        let expired = self.log.units_through(c.cutoff);
        (self.log.total - expired.min(self.log.total)).saturating_add(c.units)
    }

    /// Units admitted within (now − window, now].
    pub fn in_window(&self, now: Nanos) -> u64 {
        let cutoff = micros(now) - window_us(&self.win);
        self.log.total - self.log.units_through(cutoff)
    }
}

pub fn check(state: Option<&State>, win: &Window, now: Nanos, req: Request) -> (Decision, Option<Commit>) {
    let empty = Log::default();
    let log = state.map_or(&empty, |s| &s.log);
    let now_us = micros(now);
    let w = window_us(win);
    let cutoff = now_us - w;
    let expired = log.units_through(cutoff);
    let counted = log.total - expired;
    let available = win.limit.saturating_sub(counted);
    let granted = req.grant(available);
    // A clock that stepped back records at the newest timestamp: the entry then leaves the
    // window no earlier than its neighbours, never handing out capacity early.
    let ts = log.newest().map_or(now_us, |n| n.max(now_us));
    let after = counted + granted;
    let newest = if granted > 0 { Some(ts) } else { log.newest().filter(|&n| n > cutoff) };
    let decision = Decision {
        allowed: granted,
        limit: win.limit,
        remaining: win.limit.saturating_sub(after),
        retry_after: if granted > 0 || req.cost == 0 {
            None
        } else {
            retry_after(log, win, now, counted, req.needed())
        },
        reset_after: newest.map_or(0, |n| until(n + w, now)),
        delay: None,
    };
    let commit = (granted > 0).then_some(Commit { win: *win, cutoff, ts, units: granted });
    (decision, commit)
}

/// Exact: the instant enough of the oldest units have left the window for `need` to fit.
fn retry_after(log: &Log, win: &Window, now: Nanos, counted: u64, need: u64) -> Option<Nanos> {
    if need > win.limit {
        return None;
    }
    let w = window_us(win);
    let cutoff = micros(now) - w;
    let excess = counted + need - win.limit;
    let mut freed = 0u64;
    for (ts, units) in log.iter().skip_while(|&(ts, _)| ts <= cutoff) {
        freed += units;
        if freed >= excess {
            return Some(until(ts + w, now).max(1));
        }
    }
    None
}

/// Nanoseconds from `now` until the instant `at_us`.
fn until(at_us: i64, now: Nanos) -> Nanos {
    to_nanos(at_us as i128 * NANOS_PER_MICRO as i128 - now as i128)
}
