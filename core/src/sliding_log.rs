//! Sliding window log, exact: a request is admitted when the units admitted in the half-open
//! interval (now − window, now] plus its cost fit the limit.
//!
//! Unlike the sorted-set log, its cost does not grow with the client's volume: the log is a
//! FIFO of entries (a microsecond timestamp and a unit count; requests in the same microsecond
//! share an entry) with a running total, so an admitted call pops the entries that left the
//! window (each entry is popped once: amortized O(1)) and pushes or merges one. Entries hold at
//! least one unit each, so the log never holds more than `limit` entries.
//!
//! In memory the entries are bytes, oldest first: each entry is the varint (LEB128) of
//! `gap << 1 | (count > 1)`, followed by the varint of `count` when that bit is set, where `gap`
//! is the µs since the previous entry (the first entry's since `Log::base`). A log only walks
//! its entries in order (from the oldest to evict and to count, at the newest to merge), so
//! gaps lose nothing: one byte per request under 64 µs apart, two under 8 ms, three under 1 s,
//! four under 2 min, five under 4.8 h, at most eight (any gap up to the year 2255); a count
//! above one adds its own varint. The stored encoding (codec.rs) is still one word per entry:
//! [`stored_entry`] and [`BIG`].

use super::{to_nanos, Decision, Nanos, Request, Window, NANOS_PER_MICRO};

const TS_BITS: u32 = 53;
const TS_MASK: u64 = (1 << TS_BITS) - 1;
/// Stored encoding: counts from 1 to BIG - 1 are stored in the entry's word; BIG marks an entry
/// whose count follows the entries, in entry order.
pub const BIG: u64 = (1 << (64 - TS_BITS)) - 1;
/// Latest representable timestamp (µs since the epoch: the year 2255).
pub const MAX_TS: i64 = TS_MASK as i64;

#[derive(Clone, Debug, Default)]
pub struct Log {
    /// The entries from `head` on, as described above. The bytes before `head` are entries
    /// already dropped: dropping is `head` moving on; the room is taken back (the live bytes
    /// moved to the front) when the buffer is full, once it is worth an eighth of them.
    buf: Vec<u8>,
    head: usize,
    /// The timestamp (µs) the oldest entry's gap counts from.
    base: i64,
    /// The newest entry's timestamp (meaningless when empty).
    newest: i64,
    /// Entries held (low 56 bits) and the newest entry's length in bytes (high 8): a merge
    /// rewrites that entry.
    len_and_back: u64,
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

/// Stored encoding: the timestamp of an entry's word.
pub fn ts_of(entry: u64) -> i64 {
    (entry & TS_MASK) as i64
}

/// Stored encoding: the word of an entry (its count is BIG when it does not fit the word).
pub fn stored_entry(ts: i64, count: u64) -> u64 {
    (count.min(BIG) << TS_BITS) | (ts as u64 & TS_MASK)
}

fn micros(now: Nanos) -> i64 {
    now.as_i64().div_euclid(NANOS_PER_MICRO).clamp(0, MAX_TS)
}

fn window_us(win: &Window) -> i64 {
    (win.window.as_i64() / NANOS_PER_MICRO).max(1)
}

const LEN_MASK: u64 = (1 << 56) - 1;

/// Reads a varint at `bytes[*at..]`, moving `at` past it (0 past the end: never happens on
/// bytes this module wrote).
#[inline]
fn read_varint(bytes: &[u8], at: &mut usize) -> u64 {
    let Some(&first) = bytes.get(*at) else { return 0 };
    *at += 1;
    if first < 0x80 {
        return first as u64;
    }
    let (mut v, mut shift) = ((first & 0x7f) as u64, 7u32);
    while let Some(&b) = bytes.get(*at) {
        *at += 1;
        v |= ((b & 0x7f) as u64) << (shift & 63);
        if b < 0x80 {
            break;
        }
        shift += 7;
    }
    v
}

/// The entry at `bytes[*at..]`: (gap µs, count), moving `at` past it.
#[inline]
fn read_entry(bytes: &[u8], at: &mut usize) -> (u64, u64) {
    let head = read_varint(bytes, at);
    let count = if head & 1 == 1 { read_varint(bytes, at) } else { 1 };
    (head >> 1, count)
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// jemalloc's size class for `n` bytes (Redis's allocator): 16-byte steps up to 128, then four
/// classes per doubling. A buffer sized to its class wastes nothing to rounding.
fn size_class(n: usize) -> usize {
    if n <= 8 {
        8
    } else if n <= 128 {
        n.next_multiple_of(16)
    } else {
        let step = 1usize << (usize::BITS - 1 - (n - 1).leading_zeros() - 2);
        n.next_multiple_of(step)
    }
}

/// The entries of a log, oldest first: (timestamp µs, units).
pub struct Entries<'a> {
    /// The live bytes: exactly the entries.
    bytes: &'a [u8],
    at: usize,
    ts: i64,
}

impl Iterator for Entries<'_> {
    type Item = (i64, u64);

    #[inline]
    fn next(&mut self) -> Option<(i64, u64)> {
        if self.at >= self.bytes.len() {
            return None;
        }
        let (gap, count) = read_entry(self.bytes, &mut self.at);
        self.ts += gap as i64;
        Some((self.ts, count))
    }
}

impl PartialEq for Log {
    /// The same entries (the bytes may differ in where the gaps count from).
    fn eq(&self, other: &Log) -> bool {
        self.len() == other.len() && self.total == other.total && self.iter().eq(other.iter())
    }
}

impl Eq for Log {}

impl Log {
    /// Iterates (timestamp µs, units), oldest first.
    pub fn iter(&self) -> Entries<'_> {
        Entries { bytes: self.live(), at: 0, ts: self.base }
    }

    fn live(&self) -> &[u8] {
        &self.buf[self.head..]
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        (self.len_and_back & LEN_MASK) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn back_len(&self) -> usize {
        (self.len_and_back >> 56) as usize
    }

    fn set_len(&mut self, len: usize, back_len: usize) {
        self.len_and_back = (len as u64 & LEN_MASK) | (back_len as u64) << 56;
    }

    /// Units in entries at or before `cutoff`: those that have left the window.
    fn units_through(&self, cutoff: i64) -> u64 {
        let mut units = 0;
        for (ts, count) in self.iter() {
            if ts > cutoff {
                break;
            }
            units += count;
        }
        units
    }

    fn pop_through(&mut self, cutoff: i64) {
        let (mut ts, mut at, mut popped) = (self.base, 0usize, 0usize);
        let mut total = self.total;
        let live = &self.buf[self.head..];
        while at < live.len() {
            let mut next = at;
            let (gap, count) = read_entry(live, &mut next);
            if ts + gap as i64 > cutoff {
                break;
            }
            (ts, at, popped) = (ts + gap as i64, next, popped + 1);
            total = total.saturating_sub(count);
        }
        if popped == 0 {
            return;
        }
        self.total = total;
        self.base = ts;
        let len = self.len() - popped;
        if len == 0 {
            self.buf.clear();
            self.head = 0;
            self.set_len(0, 0);
        } else {
            self.head += at;
            self.set_len(len, self.back_len());
        }
        // Give memory back when a log has shrunk to a quarter of its allocation, so a key's
        // memory follows its traffic, not its peak.
        let cap = self.buf.capacity();
        if cap > 64 && self.buf.len() - self.head < cap / 4 {
            self.compact();
            self.buf.shrink_to(size_class(self.buf.len() * 2));
        }
    }

    /// Moves the live bytes to the front of the buffer.
    fn compact(&mut self) {
        if self.head > 0 {
            self.buf.drain(..self.head);
            self.head = 0;
        }
    }

    /// Records `units` at `ts`; `merge`: into the newest entry when it has the same timestamp.
    fn push(&mut self, ts: i64, units: u64, merge: bool) {
        self.total = self.total.saturating_add(units);
        let len = self.len();
        if len == 0 {
            self.base = ts;
        } else if merge && ts == self.newest {
            let start = self.buf.len() - self.back_len();
            let (gap, count) = read_entry(&self.buf, &mut start.clone());
            self.buf.truncate(start);
            let n = self.append(gap, count.saturating_add(units));
            self.set_len(len, n);
            return;
        }
        let gap = (ts - if len == 0 { ts } else { self.newest }) as u64;
        let n = self.append(gap, units);
        self.newest = ts;
        self.set_len(len + 1, n);
    }

    /// Appends an entry's bytes; returns their length.
    fn append(&mut self, gap: u64, count: u64) -> usize {
        let head = gap << 1 | (count > 1) as u64;
        let n = varint_len(head) + if count > 1 { varint_len(count) } else { 0 };
        if self.buf.len() + n > self.buf.capacity() {
            let live = self.buf.len() - self.head;
            let room_back = self.head >= live / 8 && self.buf.capacity() - live >= n;
            self.compact();
            if !room_back {
                // Grow to the next size class (an eighth to a quarter more): a few bytes of
                // slack per entry rather than doubling's half; amortized O(1) per byte.
                let want = size_class((live + n).max(self.buf.capacity() + 1));
                self.buf.reserve_exact(want - live);
            }
        }
        put_varint(&mut self.buf, head);
        if count > 1 {
            put_varint(&mut self.buf, count);
        }
        n
    }

    /// Appends an entry as stored (no merge): the decoder's way in. Timestamps must not
    /// decrease and counts must be positive (the decoder checks both).
    pub fn push_stored(&mut self, ts: i64, count: u64) {
        debug_assert!(count > 0 && (self.is_empty() || ts >= self.newest));
        self.push(ts, count, false);
    }

    pub fn newest(&self) -> Option<i64> {
        (!self.is_empty()).then_some(self.newest)
    }

    pub fn oldest(&self) -> Option<i64> {
        self.iter().next().map(|(ts, _)| ts)
    }

    /// Bytes of heap this log holds.
    pub fn heap_bytes(&self) -> usize {
        self.buf.capacity()
    }

    /// The buffer, for active defragmentation (which moves it without changing a byte).
    pub fn buffer_mut(&mut self) -> &mut Vec<u8> {
        &mut self.buf
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
            // Timestamps never go backwards in the log (a clock stepping back records at the
            // newest).
            let ts = self.log.newest().map_or(c.ts, |n| n.max(c.ts));
            self.log.push(ts, c.units, true);
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
        reset_after: newest.map_or(Nanos::ZERO, |n| until(n + w, now)),
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
            return Some(until(ts + w, now).max(Nanos::new(1)));
        }
    }
    None
}

/// Nanoseconds from `now` until the instant `at_us`.
fn until(at_us: i64, now: Nanos) -> Nanos {
    to_nanos(at_us as i128 * NANOS_PER_MICRO as i128 - now.as_i128())
}
