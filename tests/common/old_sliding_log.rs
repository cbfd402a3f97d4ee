//! The sliding log's store as it was before its entries became bytes (git 212e45f): 8-byte
//! words in a VecDeque growing by half, big counts in a side FIFO. The reference the byte log
//! is checked against (tests/core_props.rs), entry by entry and byte by byte of the encoding;
//! the decisions are checked against the naive model there.
#![allow(dead_code)]

use std::collections::VecDeque;

use redis_ratelimit_core::sliding_log::Commit;
use redis_ratelimit_core::Window;

const TS_BITS: u32 = 53;
const TS_MASK: u64 = (1 << TS_BITS) - 1;
pub const BIG: u64 = (1 << (64 - TS_BITS)) - 1;

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
}

/// The encoding codec.rs wrote for this log (version 1, the sliding log's tag 5).
pub fn encode(s: &State) -> Vec<u8> {
    let mut out = vec![1u8, 5];
    let mut put = |v: u64| out.extend_from_slice(&v.to_le_bytes());
    put(s.win.limit);
    put(s.win.window.as_i64() as u64);
    put(s.log.entries.len() as u64);
    s.log.entries.iter().for_each(|&e| put(e));
    put(s.log.big.len() as u64);
    s.log.big.iter().for_each(|&c| put(c));
    out
}
