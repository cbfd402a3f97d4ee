//! The word Redis keeps for a key's value: a boxed `State`, a 16-byte compact box, or, for the
//! small states, the state itself packed into the pointer-sized word (no allocation).
//!
//! Redis never dereferences a module value: it hands the word to the type's callbacks (free,
//! RDB, AOF rewrite, digest, memory usage, copy). An allocation is 8-aligned, so the low three
//! bits of a pointer are zero and the word's low bits tell the forms apart:
//!
//! ```text
//! bit 0 = 1      inline state:
//!   bits 1-12    id of the parameters in the table below (algorithm + rate or window)
//!   bits 13-63   the state's variable part (51 bits, unsigned), relative to the parameters:
//!                GCRA, leaky: (tat − origin) / step, step = gcd(limit × 1 µs, period)
//!                fixed:       count | (index − origin) << count_bits
//!                sliding:     prev | curr << count_bits | (index − origin) << 2 count_bits
//! bits 0-1 = 10  a compact box: the pointer | 2 to a `Compact` (16 bytes, not the general
//!                box's 64): 12 bits of table id and 116 bits of state, either a token
//!                bucket's tokens and instant, or the same variable part as an inline word
//!                with a signed time field 65 bits wider
//! bits 0-1 = 00  a pointer to a boxed `State` (the sliding log; anything that does not fit)
//! ```
//!
//! The origin is the entry's, fixed when its parameters enter the table: a sixteenth of the
//! inline range before the clock then (the range is 2^51 steps, or windows, less the count
//! bits), so the inline range covers the time after the parameters were first used in this
//! process, not the time since a fixed date. Words live only in this process's memory (the
//! RDB, AOF, replication and DUMP carry `State::encode`), so the origin needs no agreement
//! with any other process, and a state whose time falls outside the inline range, before or
//! after it, goes to the compact box (2^115 steps either way: every state of an ordinary limit
//! for far longer than an i64 of ns lasts).
//!
//! Every field is exact: a state that does not fit (a count wider than its limit's bits in the
//! room left, parameters beyond the table's capacity, the sliding log's states) stays in the
//! general box, and every form decodes to the same `State`, so replies, RL.INFO, the
//! RDB/AOF/replication encoding and DEBUG DIGEST do not depend on the form. Arrival times
//! stay multiples of the step: now is a whole µs (a multiple of limit × 1 µs in scaled units)
//! and every grant adds a multiple of the period; only a conversion between rates can leave
//! the grid, and that state is boxed. A token bucket (a balance and an instant) does not fit
//! 51 bits: it drops its parameters and the unused width of its fields into the compact box.
//!
//! The table of parameters only grows (a deployment uses a handful of rates; at CAPACITY
//! further ones are boxed). It is read and written on Redis's main thread; a fork (BGSAVE,
//! AOF rewrite) reads its copy. `free`, which Redis may call from its lazy-free thread, never
//! touches it (a compact box is freed by its pointer alone).

use std::collections::HashMap;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::{
    fixed, gcra, leaky, sliding, token_bucket, window_index, Nanos, Rate, Window, NANOS_PER_MICRO,
};

/// 2020-01-01T00:00:00Z in ns since the epoch: a compact token bucket's instant counts from
/// here (a raw value, as the packed encodings count).
pub const BASE: i64 = 1_577_836_800 * redis_ratelimit_core::NANOS_PER_SEC;
const ID_BITS: u32 = 12;
/// Parameter sets the table holds.
pub const CAPACITY: usize = (1 << ID_BITS) - 1;
const PAYLOAD_SHIFT: u32 = 1 + ID_BITS;
const PAYLOAD_BITS: u32 = 64 - PAYLOAD_SHIFT;
/// The compact box's state bits: 128 less the id.
const COMPACT_BITS: u32 = 128 - ID_BITS;

/// How a variable part is laid out: its width, and whether its time field is signed (the
/// compact box: either side of the origin) or not (an inline word: from the origin on).
/// Always a constant: `pack` and `unpack` are inlined where they are called, so each form's
/// code is specialized for it.
#[derive(Clone, Copy)]
struct Layout {
    bits: u32,
    signed: bool,
}

const INLINE_LAYOUT: Layout = Layout { bits: PAYLOAD_BITS, signed: false };
const COMPACT_LAYOUT: Layout = Layout { bits: COMPACT_BITS, signed: true };

/// Inline values are made only where Redis can swap a value in place
/// (RedisModule_ModuleTypeReplaceValue); see `state::Key::put`.
static INLINE: AtomicBool = AtomicBool::new(false);

pub fn enable_inline(on: bool) {
    INLINE.store(on, Ordering::Relaxed);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Params {
    Gcra(Rate),
    Leaky(Rate),
    Fixed(Window),
    Sliding(Window),
    /// Only for compact boxes: never an inline word.
    TokenBucket(Rate),
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    params: Params,
    /// The origin of the time field. GCRA/leaky: an arrival time on the grid (ns × limit);
    /// windows: a window index.
    base: i128,
    /// GCRA/leaky: the grid of arrival times; windows: the bits of a count.
    step: i128,
}

impl Entry {
    /// The entry for `params` first seen at `now` (ns): the origin a sixteenth of the inline
    /// range before `now`, so states a little older than their first use (a loaded RDB, a
    /// COPY) are inline too.
    fn new(params: Params, now: Nanos) -> Entry {
        let back = |bits: u32| if bits >= 4 { 1i128 << (bits - 4) } else { 0 };
        match params {
            Params::Gcra(r) | Params::Leaky(r) => {
                let l = r.limit as i128;
                let step = gcd(l * NANOS_PER_MICRO as i128, r.period.as_i128());
                // (step ≤ the period < 2^62 and limit ≤ 10^15: far from i128's limits)
                let start = now.as_i128() * l - back(PAYLOAD_BITS) * step;
                Entry { params, base: start.div_euclid(step) * step, step }
            }
            Params::Fixed(w) | Params::Sliding(w) => {
                let cb = 64 - w.limit.leading_zeros();
                let time_bits =
                    PAYLOAD_BITS.saturating_sub(if matches!(params, Params::Fixed(_)) { cb } else { 2 * cb });
                Entry { params, base: window_index(now, w.window) as i128 - back(time_bits), step: cb as i128 }
            }
            Params::TokenBucket(_) => Entry { params, base: 0, step: 1 },
        }
    }
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

// The table: entries in segments of SEGMENT, allocated as it grows, never changed or freed once
// published. `LEN` publishes them (Release after the write, Acquire before a read), so a read
// (every call decodes and re-encodes a value) takes no lock; additions and lookups by
// parameters (a new key) hold `IDS`.
const SEGMENT: usize = 64;
static SEGMENTS: [AtomicPtr<Entry>; CAPACITY.div_ceil(SEGMENT)] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; CAPACITY.div_ceil(SEGMENT)];
static LEN: AtomicUsize = AtomicUsize::new(0);
static IDS: LazyLock<Mutex<HashMap<Params, u16>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn entry(id: u16) -> Option<Entry> {
    let id = id as usize;
    if id >= LEN.load(Ordering::Acquire) {
        return None;
    }
    let segment = SEGMENTS[id / SEGMENT].load(Ordering::Acquire);
    // SAFETY: entry `id` was written (and its segment stored) before LEN passed it, and is
    // never written again; only this element is read (others may be being written).
    Some(unsafe { segment.add(id % SEGMENT).read() })
}

/// The id of `params`, added to the table if there is room.
fn intern(params: Params, hint: Option<u16>) -> Option<(u16, Entry)> {
    if let Some(e) = hint.and_then(|h| entry(h).filter(|e| e.params == params)) {
        return Some((hint.unwrap_or_default(), e));
    }
    let mut ids = IDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&id) = ids.get(&params) {
        return Some((id, entry(id)?));
    }
    let id = LEN.load(Ordering::Acquire);
    if id >= CAPACITY {
        return None;
    }
    let slot = &SEGMENTS[id / SEGMENT];
    if slot.load(Ordering::Acquire).is_null() {
        let segment = std::mem::ManuallyDrop::new(Vec::<Entry>::with_capacity(SEGMENT)).as_mut_ptr();
        slot.store(segment, Ordering::Release);
    }
    // The clock is read once per parameter set: an origin near the time it is first used.
    let e = Entry::new(params, crate::clock::now());
    // SAFETY: slot `id` of an allocation of SEGMENT entries; no reader looks at it before LEN
    // passes it, and writers hold IDS.
    unsafe { slot.load(Ordering::Acquire).add(id % SEGMENT).write(e) };
    LEN.store(id + 1, Ordering::Release);
    ids.insert(params, id as u16);
    Some((id as u16, e))
}

fn params_of(s: &State) -> Option<Params> {
    Some(match s {
        State::Gcra(g) => Params::Gcra(g.rate),
        State::Leaky(leaky::State(g)) => Params::Leaky(g.rate),
        State::Fixed(f) => Params::Fixed(f.win),
        State::Sliding(s) => Params::Sliding(s.win),
        State::TokenBucket(_) | State::SlidingLog(_) => return None,
    })
}

/// A state without its parameters, which are entry `id` of the table: 16 bytes, jemalloc's
/// 16-byte class (the general box takes 64).
///
/// A token bucket: `lo` its balance (units × period, at most BURST × period) as an i64, which
/// every balance is when BURST × period < 2^63 ns (BURST up to 106,751 over a day, 9.2 × 10^9
/// over a second) and larger buckets' are while they hold fewer units; the rest `last`, a whole
/// µs (as every call's now is) after BASE, within 2^52 µs (142 years).
///
/// GCRA, leaky, fixed and sliding: the 116 bits `(rest << 64) | lo` hold the variable part of
/// an inline word (`pack`), its time field signed and 65 bits wider: a state too far from its
/// entry's origin for an inline word, either way.
///
/// Any other state keeps the general box.
#[repr(C)]
pub struct Compact {
    lo: u64,
    /// The rest << ID_BITS | id.
    rest_and_id: u64,
}

impl Compact {
    fn bucket(tb: &token_bucket::State, id: u16) -> Option<Compact> {
        let tokens = i64::try_from(tb.tokens).ok()?;
        let since = tb.last.as_i64().checked_sub(BASE)?;
        if since < 0 || since % NANOS_PER_MICRO != 0 || since / NANOS_PER_MICRO >= 1 << (64 - ID_BITS) {
            return None;
        }
        Some(Compact { lo: tokens as u64, rest_and_id: ((since / NANOS_PER_MICRO) as u64) << ID_BITS | id as u64 })
    }

    /// The compact box of a GCRA, leaky or window state's variable part under entry `id`.
    fn packed(p: u128, id: u16) -> Compact {
        Compact { lo: p as u64, rest_and_id: ((p >> 64) as u64) << ID_BITS | id as u64 }
    }

    fn id(&self) -> u16 {
        (self.rest_and_id & ((1 << ID_BITS) - 1)) as u16
    }

    fn payload(&self) -> u128 {
        ((self.rest_and_id >> ID_BITS) as u128) << 64 | self.lo as u128
    }

    fn state(&self, e: &Entry) -> Option<State> {
        match e.params {
            Params::TokenBucket(rate) => {
                // (below 2^52 µs after BASE: at most 6.1 × 10^18 ns, an i64)
                let last = Nanos::new(BASE + (self.rest_and_id >> ID_BITS) as i64 * NANOS_PER_MICRO);
                Some(State::TokenBucket(token_bucket::State { rate, tokens: self.lo as i64 as i128, last }))
            }
            _ => unpack(e, self.payload(), COMPACT_LAYOUT),
        }
    }
}

const _: () = assert!(std::mem::size_of::<Compact>() == 16 && std::mem::align_of::<Compact>() == 8);

const COMPACT_TAG: usize = 0b10;
const TAG_MASK: usize = 0b11;

fn compact_ptr(word: *const c_void) -> Option<*mut Compact> {
    (word as usize & TAG_MASK == COMPACT_TAG).then_some((word as usize & !TAG_MASK) as *mut Compact)
}

/// The compact box's contents for `s`, with a table id for its parameters.
fn compact_of(s: &State, hint: Option<u16>) -> Option<Compact> {
    if !INLINE.load(Ordering::Relaxed) {
        return None;
    }
    match s {
        State::TokenBucket(tb) => {
            let c = Compact::bucket(tb, 0)?;
            let (id, _) = intern(Params::TokenBucket(tb.rate), hint)?;
            Some(Compact { rest_and_id: c.rest_and_id | id as u64, ..c })
        }
        _ => {
            let (id, e) = intern(params_of(s)?, hint)?;
            Some(Compact::packed(pack(&e, s, COMPACT_LAYOUT)?, id))
        }
    }
}

fn compact_word(c: Compact) -> Word {
    let p = Box::into_raw(Box::new(c));
    Word((p as usize | COMPACT_TAG) as *mut c_void)
}

// The tags live in the low bits of a box's address: every box the words point to is aligned
// to at least 4 (the allocator honours alignment: alloc.rs).
const _: () = assert!(std::mem::align_of::<Compact>() > TAG_MASK && std::mem::align_of::<State>() > TAG_MASK);

/// Writes `s` over a compact box in place, when it fits one. `prior`: the state decoded from
/// the box (the same parameters need no table lookup).
fn overwrite_compact(p: &mut Compact, prior: &State, s: &State) -> bool {
    let c = match (prior, s) {
        (State::TokenBucket(old), State::TokenBucket(tb)) if old.rate == tb.rate => Compact::bucket(tb, p.id()),
        (State::TokenBucket(_), _) | (_, State::TokenBucket(_)) => compact_of(s, Some(p.id())),
        _ => match (params_of(s), entry(p.id())) {
            (Some(params), Some(e)) if e.params == params => {
                pack(&e, s, COMPACT_LAYOUT).map(|v| Compact::packed(v, p.id()))
            }
            _ => compact_of(s, Some(p.id())),
        },
    };
    match c {
        Some(c) => {
            *p = c;
            true
        }
        None => false,
    }
}

/// `v` as an unsigned field of `bits` bits.
#[inline(always)]
fn fits(v: i128, bits: u32) -> Option<u128> {
    (0..1i128 << bits).contains(&v).then_some(v as u128)
}

/// `v` as the time field of `bits` bits in layout `l` (two's complement when signed).
#[inline(always)]
fn time_field(v: i128, bits: u32, l: Layout) -> Option<u128> {
    if !l.signed {
        return fits(v, bits);
    }
    let half = 1i128 << bits.checked_sub(1)?;
    (-half..half).contains(&v).then_some(v as u128 & ((1u128 << bits) - 1))
}

/// The time field of `bits` bits back from `p` (its low bits) in layout `l`.
#[inline(always)]
fn time_value(p: u128, bits: u32, l: Layout) -> i128 {
    match (l.signed, bits) {
        (false, _) | (true, 0) => p as i128,
        // Sign-extended from bit `bits - 1`.
        (true, _) => ((p << (128 - bits)) as i128) >> (128 - bits),
    }
}

/// The variable part of `s` under `e` in layout `l`, if it fits.
#[inline(always)]
fn pack(e: &Entry, s: &State, l: Layout) -> Option<u128> {
    match s {
        State::Gcra(g) | State::Leaky(leaky::State(g)) => {
            let d = g.tat.checked_sub(e.base)?;
            // One division: on the grid exactly when the quotient gives d back.
            let q = if d >= 0 { (d as u128 / e.step as u128) as i128 } else { d / e.step };
            if q * e.step != d {
                return None;
            }
            time_field(q, l.bits, l)
        }
        State::Fixed(f) => {
            let cb = e.step as u32;
            let count = fits(f.count as i128, cb)?;
            Some(time_field(f.index as i128 - e.base, l.bits.checked_sub(cb)?, l)? << cb | count)
        }
        State::Sliding(s) => {
            let cb = e.step as u32;
            let (prev, curr) = (fits(s.prev as i128, cb)?, fits(s.curr as i128, cb)?);
            Some(time_field(s.index as i128 - e.base, l.bits.checked_sub(2 * cb)?, l)? << (2 * cb) | curr << cb | prev)
        }
        State::TokenBucket(_) | State::SlidingLog(_) => None,
    }
}

/// The state back from `pack`'s `p` (its `l.bits` low bits).
#[inline(always)]
fn unpack(e: &Entry, p: u128, l: Layout) -> Option<State> {
    // (`pack` made `p` from a state, so the sums give that state back; checked all the same)
    let mask = |bits: u32| (1u128 << bits) - 1;
    let tat = || e.base.checked_add(time_value(p, l.bits, l).checked_mul(e.step)?);
    Some(match e.params {
        Params::Gcra(rate) => State::Gcra(gcra::State { rate, tat: tat()? }),
        Params::Leaky(rate) => State::Leaky(leaky::State(gcra::State { rate, tat: tat()? })),
        Params::Fixed(win) => {
            let cb = e.step as u32;
            let index = e.base.checked_add(time_value(p >> cb, l.bits.checked_sub(cb)?, l))?;
            State::Fixed(fixed::State { win, index: i64::try_from(index).ok()?, count: (p & mask(cb)) as u64 })
        }
        Params::Sliding(win) => {
            let cb = e.step as u32;
            let index = e.base.checked_add(time_value(p >> (2 * cb), l.bits.checked_sub(2 * cb)?, l))?;
            State::Sliding(sliding::State {
                win,
                index: i64::try_from(index).ok()?,
                prev: (p & mask(cb)) as u64,
                curr: ((p >> cb) & mask(cb)) as u64,
            })
        }
        Params::TokenBucket(_) => return None,
    })
}

/// The inline word for `s`, or None when it must be boxed. `hint`: the id the key's previous
/// inline value used (skips the table's hash lookup when the parameters did not change).
pub fn inline(s: &State, hint: Option<u16>) -> Option<usize> {
    if !INLINE.load(Ordering::Relaxed) {
        return None;
    }
    let (id, e) = intern(params_of(s)?, hint)?;
    inline_word(&e, id, s)
}

#[inline(always)]
fn inline_word(e: &Entry, id: u16, s: &State) -> Option<usize> {
    let p = pack(e, s, INLINE_LAYOUT)?;
    Some(((p as usize) << PAYLOAD_SHIFT) | ((id as usize) << 1) | 1)
}

/// The word for `s` when it needs no general box: inline, else a compact box.
fn small_word(s: &State, hint: Option<u16>) -> Option<Word> {
    if !INLINE.load(Ordering::Relaxed) {
        return None;
    }
    match s {
        State::TokenBucket(_) => compact_of(s, hint).map(compact_word),
        _ => {
            let (id, e) = intern(params_of(s)?, hint)?;
            if let Some(w) = inline_word(&e, id, s) {
                return Some(Word(w as *mut c_void));
            }
            Some(compact_word(Compact::packed(pack(&e, s, COMPACT_LAYOUT)?, id)))
        }
    }
}

fn boxed_word(s: State) -> Word {
    Word(Box::into_raw(Box::new(s)) as *mut c_void)
}

/// A value word this module made and still owns (not yet handed to Redis): dropping it frees
/// it. `into_raw` hands it over.
pub struct Word(*mut c_void);

impl Word {
    /// The word for `s`: inline if it fits, a compact box for a token bucket, boxed otherwise.
    /// `hint`: a table id the state's parameters may have (skips the table's hash lookup).
    pub fn new(s: State, hint: Option<u16>) -> Word {
        match small_word(&s, hint) {
            Some(w) => w,
            None => boxed_word(s),
        }
    }

    pub fn as_ptr(&self) -> *mut c_void {
        self.0
    }

    /// Gives the word up (to Redis, which frees it through the type's `free`).
    pub fn into_raw(self) -> *mut c_void {
        std::mem::ManuallyDrop::new(self).0
    }
}

impl Drop for Word {
    fn drop(&mut self) {
        // SAFETY: the word was made by `Word::new`/`small_word` and never given up (`into_raw`
        // forgets it), so nothing else holds it.
        unsafe { free(self.0) }
    }
}

/// The word for `s`, given up at once (for Redis's callbacks that return a new value).
pub fn into_word(s: State, hint: Option<u16>) -> *mut c_void {
    Word::new(s, hint).into_raw()
}

pub fn is_inline(word: *const c_void) -> bool {
    word as usize & 1 == 1
}

/// The table id of an inline word.
pub fn inline_id(word: *const c_void) -> Option<u16> {
    is_inline(word).then_some(((word as usize >> 1) & ((1 << ID_BITS) - 1)) as u16)
}

/// A value's state, read in place: the state in its box, or decoded from an inline word or a
/// compact box. Borrowed for `'k` from what holds the value (`state::Entry`, or a type
/// callback for its duration): its forms are private, so safe code cannot make one from an
/// arbitrary pointer, and writing over it (`rewrite`) consumes it, so nothing can read a value
/// through it after the value was replaced or freed.
pub struct Loaded<'k>(Repr<'k>);

enum Repr<'k> {
    Boxed(&'k mut State),
    /// The decoded state and the table id of its parameters.
    Inline(State, u16),
    /// A state decoded from its compact box, and the box.
    Compact(State, &'k mut Compact),
}

impl<'k> Loaded<'k> {
    /// Reads a word Redis holds for this type. None: an inline word naming no table entry
    /// (cannot happen: words are only made from entries, which are never removed).
    ///
    /// # Safety
    /// `word` is a live value of this module's type, and for `'k` nothing else reads, writes,
    /// replaces or frees it (the result is its only way in).
    pub unsafe fn from_word(word: *mut c_void) -> Option<Loaded<'k>> {
        if word.is_null() {
            return None;
        }
        if let Some(p) = compact_ptr(word) {
            // SAFETY: a compact word is the tagged pointer to a live `Compact` (`compact_word`),
            // and the caller lends it to us alone for 'k.
            let p = unsafe { &mut *p };
            return Some(Loaded(Repr::Compact(p.state(&entry(p.id())?)?, p)));
        }
        match inline_id(word) {
            // SAFETY: an untagged word is a `Box<State>` given up by `Word::into_raw`; lent to
            // us alone for 'k, as above.
            None => Some(Loaded(Repr::Boxed(unsafe { &mut *(word as *mut State) }))),
            Some(id) => {
                let e = entry(id)?;
                Some(Loaded(Repr::Inline(unpack(&e, (word as usize >> PAYLOAD_SHIFT) as u128, INLINE_LAYOUT)?, id)))
            }
        }
    }

    /// The box, for in-place changes (a sliding log is always boxed).
    pub fn boxed(&mut self) -> Option<&mut State> {
        match &mut self.0 {
            Repr::Boxed(s) => Some(s),
            Repr::Inline(..) | Repr::Compact(..) => None,
        }
    }

    /// The table id the value's parameters use (a hint for a copy's word).
    pub fn table_id(&self) -> Option<u16> {
        match &self.0 {
            Repr::Inline(_, id) => Some(*id),
            Repr::Compact(_, p) => Some(p.id()),
            Repr::Boxed(_) => None,
        }
    }

    /// Writes `s` over the value: in place where its form allows (a box over a box, a compact
    /// token bucket over one), else the word to swap in for it, after which the old word is
    /// the caller's to free (this borrow, its only way in, is gone).
    pub fn rewrite(self, s: State) -> Option<Word> {
        match self.0 {
            Repr::Inline(_, id) => Some(small_word(&s, Some(id)).unwrap_or_else(|| boxed_word(s))),
            // Back inline when the state fits again (cheaper than its box); else it stays in
            // its box when it fits one.
            Repr::Compact(old, p) => {
                if !matches!(s, State::TokenBucket(_)) {
                    if let Some(w) = inline(&s, Some(p.id())) {
                        return Some(Word(w as *mut c_void));
                    }
                }
                match overwrite_compact(p, &old, &s) {
                    true => None,
                    false => Some(small_word(&s, None).unwrap_or_else(|| boxed_word(s))),
                }
            }
            Repr::Boxed(b) => match small_word(&s, None) {
                Some(w) => Some(w),
                // Boxed before and after: overwrite the box.
                None => {
                    *b = s;
                    None
                }
            },
        }
    }
}

impl std::ops::Deref for Loaded<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        match &self.0 {
            Repr::Boxed(s) => s,
            Repr::Inline(s, _) | Repr::Compact(s, _) => s,
        }
    }
}

/// Frees a word (a box; an inline word owns nothing). Reads no table: Redis may call it from
/// its lazy-free thread.
///
/// # Safety
/// `word` is a value of this module's type that nothing uses any more.
pub unsafe fn free(word: *mut c_void) {
    if word.is_null() || is_inline(word) {
        return;
    }
    match compact_ptr(word) {
        // SAFETY: a compact word tags a `Box<Compact>` (`compact_word`), any other a
        // `Box<State>` (`boxed_word`); the caller gives up the last use of it.
        Some(p) => drop(unsafe { Box::from_raw(p) }),
        // SAFETY: as above.
        None => drop(unsafe { Box::from_raw(word as *mut State) }),
    }
}

/// The allocation behind a word, untagged (None for an inline word).
pub fn allocation(word: *mut c_void) -> Option<*mut c_void> {
    (!word.is_null() && !is_inline(word)).then_some((word as usize & !TAG_MASK) as *mut c_void)
}

/// The word for an allocation moved from `old`'s (same form, same tag).
pub fn moved_word(old: *mut c_void, moved: *mut c_void) -> *mut c_void {
    (moved as usize | (old as usize & TAG_MASK)) as *mut c_void
}

/// The forms a value word takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    Inline,
    Compact,
    Boxed,
}

/// The form of a live word.
pub fn form(word: *const c_void) -> Form {
    if is_inline(word) {
        Form::Inline
    } else if compact_ptr(word).is_some() {
        Form::Compact
    } else {
        Form::Boxed
    }
}

/// The form `into_word` gives `s` (adds its parameters to the table, as `into_word` would).
pub fn form_of(s: &State) -> Form {
    match s {
        State::TokenBucket(_) => match compact_of(s, None) {
            Some(_) => Form::Compact,
            None => Form::Boxed,
        },
        _ if inline(s, None).is_some() => Form::Inline,
        _ if compact_of(s, None).is_some() => Form::Compact,
        _ => Form::Boxed,
    }
}

/// Bytes a state's value costs the module in `form`: nothing inline, the compact box, or the
/// box (and a log's buffers).
pub fn value_bytes(s: &State, form: Form) -> usize {
    match form {
        Form::Inline => 0,
        Form::Compact => std::mem::size_of::<Compact>(),
        Form::Boxed => {
            std::mem::size_of::<State>()
                + match s {
                    State::SlidingLog(l) => {
                        std::mem::size_of::<redis_ratelimit_core::sliding_log::State>() + l.log.heap_bytes()
                    }
                    _ => 0,
                }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis_ratelimit_core::{NANOS_PER_MILLI, NANOS_PER_SEC};

    /// The tests count time in raw i64 ns; this makes one the core's `Nanos`.
    fn ns(raw: i64) -> Nanos {
        Nanos::new(raw)
    }

    fn roundtrip(s: State) -> bool {
        enable_inline(true);
        match inline(&s, None) {
            None => false,
            Some(w) => {
                // SAFETY: a live word made above, used by nothing else meanwhile.
                let back = unsafe { Loaded::from_word(w as *mut c_void) }.expect("entry");
                assert_eq!(*back, s, "inline word {w:#x} decodes to another state");
                true
            }
        }
    }

    #[test]
    fn small_states_fit_and_decode_exactly() {
        let now = 1_764_460_800 * NANOS_PER_SEC + 123_456_000; // 2025-11-30, a whole µs
        let rate = Rate::new(1000, ns(86_400 * NANOS_PER_SEC), 1000).unwrap();
        let odd = Rate::new(3, ns(NANOS_PER_SEC), 7).unwrap(); // 3 per second: 333,333.3.. ns apart
        for r in [rate, odd] {
            for grants in [0i128, 1, 2, 7] {
                let tat = now as i128 * r.limit as i128 + grants * r.period.as_i128();
                assert!(roundtrip(State::Gcra(gcra::State { rate: r, tat })));
                assert!(roundtrip(State::Leaky(leaky::State(gcra::State { rate: r, tat }))));
            }
            // Off the grid (a conversion between rates) or before BASE: boxed.
            let tat = now as i128 * r.limit as i128 + 1;
            assert!(!roundtrip(State::Gcra(gcra::State { rate: r, tat })));
            assert!(!roundtrip(State::Gcra(gcra::State { rate: r, tat: (BASE as i128 - 1_000) * r.limit as i128 })));
        }
        let win = Window::new(1000, ns(60 * NANOS_PER_SEC)).unwrap();
        let index = now / win.window.as_i64();
        assert!(roundtrip(State::Fixed(fixed::State { win, index, count: 1000 })));
        assert!(roundtrip(State::Fixed(fixed::State { win, index, count: 0 })));
        assert!(!roundtrip(State::Fixed(fixed::State { win, index, count: 1024 })));
        assert!(roundtrip(State::Sliding(sliding::State { win, index, prev: 999, curr: 1 })));
        // Before the origin (a sixteenth of the 2^31 windows of the inline range before the
        // first use): not inline.
        assert!(!roundtrip(State::Sliding(sliding::State { win, index: -(1 << 40), prev: 1, curr: 1 })));
        // A 1 ms window over limit 10^15: 2 × 50 count bits leave no room for the index.
        let wide = Window::new(1_000_000_000_000_000, ns(NANOS_PER_MILLI)).unwrap();
        assert!(!roundtrip(State::Sliding(sliding::State {
            win: wide,
            index: now / NANOS_PER_MILLI,
            prev: 0,
            curr: 1
        })));
    }

    #[test]
    fn words_are_odd_and_ids_are_reused() {
        enable_inline(true);
        let r = Rate::new(5, ns(NANOS_PER_SEC), 5).unwrap();
        let s = State::Gcra(gcra::State { rate: r, tat: crate::clock::now().as_i64() as i128 * 5 });
        let (a, b) = (inline(&s, None).unwrap(), inline(&s, None).unwrap());
        assert_eq!(a, b);
        assert_eq!(a & 1, 1);
        assert_eq!(inline(&s, inline_id(a as *const c_void)), Some(a));
    }

    const YEAR: i64 = 31_557_600 * NANOS_PER_SEC;

    /// The word `into_word` makes for `s`: its form, and the state it decodes to.
    fn word_roundtrip(s: &State) -> Form {
        let w = into_word(s.clone(), None);
        // SAFETY: a live word made above, used by nothing else meanwhile.
        let back = unsafe { Loaded::from_word(w) }.expect("entry");
        assert_eq!(*back, *s, "{:?} word {w:p} decodes to another state", form(w));
        assert_eq!(back.encode(), s.encode());
        let f = form(w);
        assert_eq!(form_of(s), f);
        // SAFETY: the word made above, not used after.
        unsafe { free(w) };
        f
    }

    /// Limits that share few factors with the period in µs (a step of 1 µs × a few, so few
    /// inline years) and a long-lived process: inline from their first use, compact (16 bytes)
    /// beyond, for any time an i64 of ns can name; never the general box (issue 17.5).
    #[test]
    fn ordinary_rates_stay_small_for_decades() {
        enable_inline(true);
        let now = crate::clock::now().as_i64();
        let per = |limit: u64, period: i64| Rate::new(limit, ns(period), limit).unwrap();
        let rates = [
            per(11, NANOS_PER_SEC),
            per(13, NANOS_PER_SEC),
            per(17, NANOS_PER_SEC),
            per(23, NANOS_PER_SEC),
            per(1000, 60 * NANOS_PER_SEC),
            per(7, NANOS_PER_SEC),
            per(3, NANOS_PER_SEC),
            per(999, NANOS_PER_SEC),
            per(999_983, 3_600 * NANOS_PER_SEC),
            per(1_000_000_000_000_000, NANOS_PER_SEC),
        ];
        for r in rates {
            let (l, p) = (r.limit as i128, r.period.as_i128());
            // The inline range of this rate: 2^51 steps, a sixteenth of it before the first use.
            let step = gcd(l * NANOS_PER_MICRO as i128, p);
            let inline_years = ((step << PAYLOAD_BITS) / l) as f64 / YEAR as f64;
            for years in [-60i64, -1, 0, 1, 10, 30, 100, 200] {
                let Some(at) = now.checked_add(years * YEAR).map(|t| t - t.rem_euclid(NANOS_PER_MICRO)) else {
                    continue;
                };
                for grants in [0i128, 1, 7, l] {
                    let tat = at as i128 * l + grants * p;
                    for s in [
                        State::Gcra(gcra::State { rate: r, tat }),
                        State::Leaky(leaky::State(gcra::State { rate: r, tat })),
                    ] {
                        let f = word_roundtrip(&s);
                        assert_ne!(f, Form::Boxed, "{s:?} at {years} years");
                        if (0..=1).contains(&years) && inline_years > 3.0 {
                            assert_eq!(f, Form::Inline, "{s:?} at {years} years (inline range {inline_years:.1} y)");
                        }
                    }
                }
                // Off the grid (a conversion between rates): the general box.
                let s = State::Gcra(gcra::State { rate: r, tat: at as i128 * l + 1 });
                assert_eq!(word_roundtrip(&s), Form::Boxed, "{s:?}");
            }
        }
        // Windows: inline from their first use; out of the inline range, compact.
        let wins = [
            (1000, 60 * NANOS_PER_SEC),
            (100_000, NANOS_PER_SEC),
            (1_000_000, NANOS_PER_MILLI),
            (1000, 86_400 * NANOS_PER_SEC),
        ];
        for (limit, window) in wins {
            let win = Window::new(limit, ns(window)).unwrap();
            for years in [-30i64, 0, 10, 30, 100] {
                let index = (now + years * YEAR) / window;
                for s in [
                    State::Fixed(fixed::State { win, index, count: limit }),
                    State::Sliding(sliding::State { win, index, prev: limit, curr: limit / 2 }),
                ] {
                    assert_ne!(word_roundtrip(&s), Form::Boxed, "{s:?} at {years} years");
                }
            }
        }
        // Counts too wide for the compact box (2 × 51 bits and the index): the general box.
        let wide = Window::new(1_000_000_000_000_000, ns(NANOS_PER_MILLI)).unwrap();
        let s = State::Sliding(sliding::State { win: wide, index: i64::MAX, prev: 2_000_000_000_000_000, curr: 1 });
        assert_eq!(word_roundtrip(&s), Form::Boxed);
    }

    /// Any state of the small algorithms, near its origin or far (either side), on its grid or
    /// not, any parameters: the word made for it decodes to it exactly, whatever its form.
    #[test]
    fn every_state_decodes_from_its_word() {
        enable_inline(true);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            // splitmix64
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let now = crate::clock::now().as_i64();
        let mut forms = [0usize; 3];
        for _ in 0..20_000 {
            // Limits and periods from small sets (the table is shared with the other tests: it
            // must keep room), ordinary and extreme.
            const LIMITS: [u64; 10] = [1, 3, 7, 11, 23, 999, 1000, 999_983, 123_456_789_012_345, 1_000_000_000_000_000];
            const PERIODS: [i64; 8] = [
                1,
                1_000,
                999_999,
                NANOS_PER_SEC,
                3_600 * NANOS_PER_SEC,
                86_400 * NANOS_PER_SEC,
                7_777_777_777_777,
                redis_ratelimit_core::MAX_PERIOD.as_i64(),
            ];
            let (limit, period) = (LIMITS[next() as usize % 10], PERIODS[next() as usize % 8]);
            let Ok(r) = Rate::new(limit, ns(period), limit) else { continue };
            let Ok(win) = Window::new(limit, ns(period)) else { continue };
            let l = limit as i128;
            let at = match next() % 4 {
                0 => now,
                1 => now + (next() % (200 * YEAR as u64)) as i64,
                2 => now - (next() % (60 * YEAR as u64)) as i64,
                _ => next() as i64,
            };
            let at = at - at.rem_euclid(NANOS_PER_MICRO);
            let tat = match next() % 3 {
                0 => at as i128 * l + (next() % 1000) as i128 * period as i128,
                1 => at as i128 * l + (next() % 1_000_000) as i128,
                _ => (next() as i128) << (next() % 64),
            };
            let index = at.div_euclid(period);
            let count = next() % (2 * limit + 1);
            for s in [
                State::Gcra(gcra::State { rate: r, tat }),
                State::Leaky(leaky::State(gcra::State { rate: r, tat })),
                State::Fixed(fixed::State { win, index, count }),
                State::Sliding(sliding::State { win, index, prev: count, curr: next() % (limit + 1) }),
            ] {
                forms[word_roundtrip(&s) as usize] += 1;
            }
        }
        // Each form made (inline, compact, boxed).
        assert!(forms.iter().all(|&n| n > 0), "{forms:?}");
    }

    /// A compact GCRA value is rewritten in place at its parameters, goes back inline when its
    /// state fits again, and to the general box when it leaves the grid.
    #[test]
    fn compact_values_move_between_forms() {
        enable_inline(true);
        let r = Rate::new(999_983, ns(3_600 * NANOS_PER_SEC), 999_983).unwrap(); // ~37 inline minutes
        let now = crate::clock::now().as_i64() as i128 * r.limit as i128;
        let at = |years: i128, grants: i128| {
            State::Gcra(gcra::State {
                rate: r,
                tat: now + years * YEAR as i128 * r.limit as i128 + grants * r.period.as_i128(),
            })
        };
        let w = into_word(at(10, 0), None);
        assert_eq!(form(w), Form::Compact);
        // SAFETY: a live word made above, used by nothing else meanwhile (for each borrow below).
        let back = unsafe { Loaded::from_word(w) }.unwrap();
        assert!(back.rewrite(at(10, 3)).is_none(), "rewritten in place");
        // SAFETY: as above.
        assert_eq!(*unsafe { Loaded::from_word(w) }.unwrap(), at(10, 3));
        // SAFETY: as above.
        let back = unsafe { Loaded::from_word(w) }.unwrap();
        let inline = back.rewrite(at(0, 1)).expect("a new word");
        assert_eq!(form(inline.as_ptr()), Form::Inline);
        // SAFETY: as above.
        assert_eq!(*unsafe { Loaded::from_word(inline.as_ptr()) }.unwrap(), at(0, 1));
        // SAFETY: as above.
        let back = unsafe { Loaded::from_word(w) }.unwrap();
        let off = State::Gcra(gcra::State { rate: r, tat: now + 1 });
        let boxed = back.rewrite(off.clone()).expect("a new word");
        assert_eq!(form(boxed.as_ptr()), Form::Boxed);
        // SAFETY: as above.
        assert_eq!(*unsafe { Loaded::from_word(boxed.as_ptr()) }.unwrap(), off);
        // SAFETY: the word made above, replaced (its new words drop with their `Word`s).
        unsafe { free(w) };
    }

    #[test]
    fn token_buckets_are_compact_and_decode_exactly() {
        enable_inline(true);
        let rate = Rate::new(1000, ns(86_400 * NANOS_PER_SEC), 1000).unwrap();
        let now = 1_764_460_800 * NANOS_PER_SEC + 1_000; // a whole µs, as every call's now
        for tokens in [0i128, 1, -1, rate.capacity_scaled(), i64::MIN as i128, i64::MAX as i128] {
            let s = State::TokenBucket(token_bucket::State { rate, tokens, last: ns(now) });
            assert_eq!(form_of(&s), Form::Compact);
            let w = into_word(s.clone(), None);
            assert_eq!(w as usize & TAG_MASK, COMPACT_TAG);
            assert_eq!(form(w), Form::Compact);
            // SAFETY: a live word made above, used by nothing else meanwhile.
            let back = unsafe { Loaded::from_word(w) }.expect("entry");
            assert_eq!(*back, s);
            assert_eq!(back.encode(), s.encode());
            assert_eq!(value_bytes(&back, form(w)), 16);
            // Rewritten in place, same word.
            let next = State::TokenBucket(token_bucket::State { rate, tokens: tokens / 2 - 7, last: ns(now + 5_000) });
            assert!(back.rewrite(next.clone()).is_none());
            // SAFETY: a live word made above, used by nothing else meanwhile.
            let back = unsafe { Loaded::from_word(w) }.unwrap();
            assert_eq!(*back, next);
            // A state of another algorithm written into the box: its own parameters' id.
            let Repr::Compact(_, p) = back.0 else { panic!("not compact") };
            let g = State::Gcra(gcra::State { rate, tat: now as i128 * 1000 });
            assert!(overwrite_compact(p, &next, &g));
            assert_eq!(p.state(&entry(p.id()).unwrap()), Some(g.clone()));
            // Another rate: rewritten in place with that rate's id.
            let other = Rate::new(999, ns(86_400 * NANOS_PER_SEC), 1000).unwrap();
            let moved = State::TokenBucket(token_bucket::State { rate: other, tokens: 5, last: ns(now) });
            assert!(overwrite_compact(p, &g, &moved));
            let id = p.id();
            // SAFETY: a live word made above, used by nothing else meanwhile.
            let back = unsafe { Loaded::from_word(w) }.unwrap();
            assert_eq!(*back, moved);
            assert_eq!(back.table_id(), Some(id));
            // SAFETY: the word made above, not used after.
            unsafe { free(w) };
        }
        // What a compact box cannot hold exactly keeps the general box, and decodes the same.
        let latest = BASE + ((1i64 << 52) - 1) * NANOS_PER_MICRO;
        for (tokens, last, fits) in [
            (i64::MAX as i128 + 1, now, false),
            (i64::MIN as i128 - 1, now, false),
            (0, now + 1, false),
            (0, BASE - NANOS_PER_MICRO, false),
            (0, BASE, true),
            (0, latest, true),
            (0, latest + NANOS_PER_MICRO, false),
            (0, i64::MAX, false),
            (0, i64::MIN, false),
        ] {
            let s = State::TokenBucket(token_bucket::State { rate, tokens, last: ns(last) });
            assert_eq!(form_of(&s) == Form::Compact, fits, "{s:?}");
            let w = into_word(s.clone(), None);
            assert_eq!(form(w) == Form::Compact, fits);
            // SAFETY: a live word made above, used by nothing else meanwhile.
            assert_eq!(*unsafe { Loaded::from_word(w) }.unwrap(), s);
            // SAFETY: the word made above, not used after.
            unsafe { free(w) };
        }
    }
}
