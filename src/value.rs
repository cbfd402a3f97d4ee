//! The word Redis keeps for a key's value: a boxed `State`, a compact box (token bucket), or,
//! for the small states, the state itself packed into the pointer-sized word (no allocation).
//!
//! Redis never dereferences a module value: it hands the word to the type's callbacks (free,
//! RDB, AOF rewrite, digest, memory usage, copy). An allocation is 8-aligned, so the low three
//! bits of a pointer are zero and the word's low bits tell the forms apart:
//!
//! ```text
//! bit 0 = 1      inline state:
//!   bits 1-12    id of the parameters in the table below (algorithm + rate or window)
//!   bits 13-63   the state's variable part (51 bits), relative to the parameters:
//!                GCRA, leaky: (tat − BASE × limit) / step, step = gcd(limit × 1 µs, period)
//!                fixed:       count | (index − BASE / window) << count_bits
//!                sliding:     prev | curr << count_bits | (index − BASE / window) << 2 count_bits
//! bits 0-1 = 10  a compact token bucket: the pointer | 2 to a `CompactBucket` (its tokens, their
//!                instant and the table id of its rate: 16 bytes, not the general box's 64)
//! bits 0-1 = 00  a pointer to a boxed `State` (the sliding log; anything that does not fit)
//! ```
//!
//! Every field is exact: a state that does not fit (an instant before BASE or too far after
//! it, a count wider than its limit's bits, parameters beyond the table's capacity, the
//! sliding log's states) stays in the general box, and every form decodes to the same
//! `State`, so replies, RL.INFO, the RDB/AOF/replication encoding and DEBUG DIGEST do not
//! depend on the form. Arrival times stay multiples of the step: now is a whole µs (a
//! multiple of limit × 1 µs in scaled units) and every grant adds a multiple of the period;
//! only a conversion between rates can leave the grid, and that state is boxed. A token
//! bucket (a balance and an instant) does not fit 51 bits: it drops its parameters and the
//! unused width of its fields into a 16-byte box.
//!
//! The table of parameters only grows (a deployment uses a handful of rates; at CAPACITY
//! further ones are boxed). It is read and written on Redis's main thread; a fork (BGSAVE,
//! AOF rewrite) reads its copy. `free`, which Redis may call from its lazy-free thread, never
//! touches it (a compact box is freed by its pointer alone).

use std::collections::HashMap;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::core::codec::State;
use crate::core::{fixed, gcra, leaky, sliding, token_bucket, Nanos, Rate, Window, NANOS_PER_MICRO};

/// 2020-01-01T00:00:00Z in ns: inline instants count from here.
pub const BASE: Nanos = 1_577_836_800 * crate::core::NANOS_PER_SEC;
const ID_BITS: u32 = 12;
/// Parameter sets the table holds.
pub const CAPACITY: usize = (1 << ID_BITS) - 1;
const PAYLOAD_SHIFT: u32 = 1 + ID_BITS;
const PAYLOAD_BITS: u32 = 64 - PAYLOAD_SHIFT;

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
    /// GCRA/leaky: BASE × limit; windows: the index of BASE's window.
    base: i128,
    /// GCRA/leaky: the grid of arrival times; windows: the bits of a count.
    step: i128,
}

impl Entry {
    fn new(params: Params) -> Entry {
        match params {
            Params::Gcra(r) | Params::Leaky(r) => {
                let l = r.limit as i128;
                Entry { params, base: BASE as i128 * l, step: gcd(l * NANOS_PER_MICRO as i128, r.period as i128) }
            }
            Params::Fixed(w) | Params::Sliding(w) => {
                Entry { params, base: BASE.div_euclid(w.window) as i128, step: (64 - w.limit.leading_zeros()) as i128 }
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
    let e = Entry::new(params);
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

/// A token bucket's state without its parameters, which are entry `id` of the table: 16
/// bytes, jemalloc's 16-byte class (the general box takes 64). Only for states it holds
/// exactly: the balance (units × period, at most BURST × period) within an i64, which every
/// balance is when BURST × period < 2^63 ns (BURST up to 106,751 over a day, 9.2 × 10^9 over a
/// second) and larger buckets' are while they hold fewer units; `last` a whole µs (as every
/// call's now is) after BASE, within 2^52 µs (142 years). Any other token bucket keeps the
/// general box.
#[repr(C)]
pub struct CompactBucket {
    /// `token_bucket::State::tokens`.
    tokens: i64,
    /// `(last − BASE) / 1 µs` << ID_BITS | id.
    last_and_id: u64,
}

impl CompactBucket {
    fn new(tb: &token_bucket::State, id: u16) -> Option<CompactBucket> {
        let tokens = i64::try_from(tb.tokens).ok()?;
        let since = tb.last.checked_sub(BASE)?;
        if since < 0 || since % NANOS_PER_MICRO != 0 || since / NANOS_PER_MICRO >= 1 << (64 - ID_BITS) {
            return None;
        }
        Some(CompactBucket { tokens, last_and_id: ((since / NANOS_PER_MICRO) as u64) << ID_BITS | id as u64 })
    }

    fn id(&self) -> u16 {
        (self.last_and_id & ((1 << ID_BITS) - 1)) as u16
    }

    fn state(&self, rate: Rate) -> State {
        // (below 2^52 µs after BASE: at most 6.1 × 10^18 ns, an i64)
        let last = BASE + (self.last_and_id >> ID_BITS) as Nanos * NANOS_PER_MICRO;
        State::TokenBucket(token_bucket::State { rate, tokens: self.tokens as i128, last })
    }
}

const _: () = assert!(std::mem::size_of::<CompactBucket>() == 16 && std::mem::align_of::<CompactBucket>() == 8);

const COMPACT_TAG: usize = 0b10;
const TAG_MASK: usize = 0b11;

fn compact_ptr(word: *const c_void) -> Option<*mut CompactBucket> {
    (word as usize & TAG_MASK == COMPACT_TAG).then_some((word as usize & !TAG_MASK) as *mut CompactBucket)
}

/// The compact box's contents for `s`: a token bucket that fits one, with a table id for its
/// rate.
fn compact_of(s: &State, hint: Option<u16>) -> Option<CompactBucket> {
    match s {
        State::TokenBucket(tb) if INLINE.load(Ordering::Relaxed) => {
            let c = CompactBucket::new(tb, 0)?;
            let (id, _) = intern(Params::TokenBucket(tb.rate), hint)?;
            Some(CompactBucket { last_and_id: c.last_and_id | id as u64, ..c })
        }
        _ => None,
    }
}

/// A compact word for `s` (allocates), or None when `s` does not fit one.
fn compact(s: &State, hint: Option<u16>) -> Option<*mut c_void> {
    let p = Box::into_raw(Box::new(compact_of(s, hint)?));
    Some((p as usize | COMPACT_TAG) as *mut c_void)
}

// The tags live in the low bits of a box's address: every box the words point to is aligned
// to at least 4 (the allocator honours alignment: alloc.rs).
const _: () = assert!(std::mem::align_of::<CompactBucket>() > TAG_MASK && std::mem::align_of::<State>() > TAG_MASK);

/// Writes `s` over a compact box in place, when it fits one. `prior`: the state decoded from
/// the box (the same rate needs no table lookup).
fn overwrite_compact(p: &mut CompactBucket, prior: &State, s: &State) -> bool {
    let c = match (prior, s) {
        (State::TokenBucket(old), State::TokenBucket(tb)) if old.rate == tb.rate => CompactBucket::new(tb, p.id()),
        _ => compact_of(s, Some(p.id())),
    };
    match c {
        Some(c) => {
            *p = c;
            true
        }
        None => false,
    }
}

fn fits(v: i128, bits: u32) -> Option<u64> {
    (0..1i128 << bits).contains(&v).then_some(v as u64)
}

/// The variable part of `s` under `e`, if it fits.
fn pack(e: &Entry, s: &State) -> Option<u64> {
    match s {
        State::Gcra(g) | State::Leaky(leaky::State(g)) => {
            let d = g.tat - e.base;
            if d < 0 {
                return None;
            }
            // One division: on the grid exactly when the quotient gives d back.
            let q = (d as u128 / e.step as u128) as i128;
            if q * e.step != d {
                return None;
            }
            fits(q, PAYLOAD_BITS)
        }
        State::Fixed(f) => {
            let cb = e.step as u32;
            let count = fits(f.count as i128, cb)?;
            Some(fits(f.index as i128 - e.base, PAYLOAD_BITS.checked_sub(cb)?)? << cb | count)
        }
        State::Sliding(s) => {
            let cb = e.step as u32;
            let (prev, curr) = (fits(s.prev as i128, cb)?, fits(s.curr as i128, cb)?);
            Some(fits(s.index as i128 - e.base, PAYLOAD_BITS.checked_sub(2 * cb)?)? << (2 * cb) | curr << cb | prev)
        }
        State::TokenBucket(_) | State::SlidingLog(_) => None,
    }
}

fn unpack(e: &Entry, p: u64) -> Option<State> {
    let mask = |bits: u32| (1u64 << bits) - 1;
    Some(match e.params {
        Params::Gcra(rate) => State::Gcra(gcra::State { rate, tat: e.base + p as i128 * e.step }),
        Params::Leaky(rate) => State::Leaky(leaky::State(gcra::State { rate, tat: e.base + p as i128 * e.step })),
        Params::Fixed(win) => {
            let cb = e.step as u32;
            State::Fixed(fixed::State { win, index: (e.base + (p >> cb) as i128) as i64, count: p & mask(cb) })
        }
        Params::Sliding(win) => {
            let cb = e.step as u32;
            State::Sliding(sliding::State {
                win,
                index: (e.base + (p >> (2 * cb)) as i128) as i64,
                prev: p & mask(cb),
                curr: (p >> cb) & mask(cb),
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
    let p = pack(&e, s)?;
    Some(((p as usize) << PAYLOAD_SHIFT) | ((id as usize) << 1) | 1)
}

/// The word for `s` when it needs no general box: inline, or a compact token bucket.
fn small_word(s: &State, hint: Option<u16>) -> Option<Word> {
    match s {
        State::TokenBucket(_) => compact(s, hint).map(Word),
        _ => inline(s, hint).map(|w| Word(w as *mut c_void)),
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
    /// A token bucket decoded from its compact box, and the box.
    Compact(State, &'k mut CompactBucket),
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
            // SAFETY: a compact word is the tagged pointer to a live `CompactBucket` (`compact`),
            // and the caller lends it to us alone for 'k.
            let p = unsafe { &mut *p };
            let Params::TokenBucket(rate) = entry(p.id())?.params else { return None };
            return Some(Loaded(Repr::Compact(p.state(rate), p)));
        }
        match inline_id(word) {
            // SAFETY: an untagged word is a `Box<State>` given up by `Word::into_raw`; lent to
            // us alone for 'k, as above.
            None => Some(Loaded(Repr::Boxed(unsafe { &mut *(word as *mut State) }))),
            Some(id) => {
                let e = entry(id)?;
                Some(Loaded(Repr::Inline(unpack(&e, (word as usize >> PAYLOAD_SHIFT) as u64)?, id)))
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
            // A compact token bucket stays in its box when its rate has a table id.
            Repr::Compact(old, p) => match overwrite_compact(p, &old, &s) {
                true => None,
                false => Some(small_word(&s, None).unwrap_or_else(|| boxed_word(s))),
            },
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
        // SAFETY: a compact word tags a `Box<CompactBucket>` (`compact`), any other a
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
        State::TokenBucket(_) if compact_of(s, None).is_some() => Form::Compact,
        _ if inline(s, None).is_some() => Form::Inline,
        _ => Form::Boxed,
    }
}

/// Bytes a state's value costs the module in `form`: nothing inline, the compact box, or the
/// box (and a log's buffers).
pub fn value_bytes(s: &State, form: Form) -> usize {
    match form {
        Form::Inline => 0,
        Form::Compact => std::mem::size_of::<CompactBucket>(),
        Form::Boxed => {
            std::mem::size_of::<State>()
                + match s {
                    State::SlidingLog(l) => std::mem::size_of::<crate::core::sliding_log::State>() + l.log.heap_bytes(),
                    _ => 0,
                }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{NANOS_PER_MILLI, NANOS_PER_SEC};

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
        let rate = Rate::new(1000, 86_400 * NANOS_PER_SEC, 1000).unwrap();
        let odd = Rate::new(3, NANOS_PER_SEC, 7).unwrap(); // 3 per second: 333,333.3.. ns apart
        for r in [rate, odd] {
            for grants in [0i128, 1, 2, 7] {
                let tat = now as i128 * r.limit as i128 + grants * r.period as i128;
                assert!(roundtrip(State::Gcra(gcra::State { rate: r, tat })));
                assert!(roundtrip(State::Leaky(leaky::State(gcra::State { rate: r, tat }))));
            }
            // Off the grid (a conversion between rates) or before BASE: boxed.
            let tat = now as i128 * r.limit as i128 + 1;
            assert!(!roundtrip(State::Gcra(gcra::State { rate: r, tat })));
            assert!(!roundtrip(State::Gcra(gcra::State { rate: r, tat: (BASE as i128 - 1_000) * r.limit as i128 })));
        }
        let win = Window::new(1000, 60 * NANOS_PER_SEC).unwrap();
        let index = now / win.window;
        assert!(roundtrip(State::Fixed(fixed::State { win, index, count: 1000 })));
        assert!(roundtrip(State::Fixed(fixed::State { win, index, count: 0 })));
        assert!(!roundtrip(State::Fixed(fixed::State { win, index, count: 1024 })));
        assert!(roundtrip(State::Sliding(sliding::State { win, index, prev: 999, curr: 1 })));
        assert!(!roundtrip(State::Sliding(sliding::State { win, index: -5, prev: 1, curr: 1 })));
        // A 1 ms window over limit 10^15: 2 × 50 count bits leave no room for the index.
        let wide = Window::new(1_000_000_000_000_000, NANOS_PER_MILLI).unwrap();
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
        let r = Rate::new(5, NANOS_PER_SEC, 5).unwrap();
        let s = State::Gcra(gcra::State { rate: r, tat: (BASE as i128 + 1_000_000) * 5 });
        let (a, b) = (inline(&s, None).unwrap(), inline(&s, None).unwrap());
        assert_eq!(a, b);
        assert_eq!(a & 1, 1);
        assert_eq!(inline(&s, inline_id(a as *const c_void)), Some(a));
    }

    #[test]
    fn token_buckets_are_compact_and_decode_exactly() {
        enable_inline(true);
        let rate = Rate::new(1000, 86_400 * NANOS_PER_SEC, 1000).unwrap();
        let now = 1_764_460_800 * NANOS_PER_SEC + 1_000; // a whole µs, as every call's now
        for tokens in [0i128, 1, -1, rate.capacity_scaled(), i64::MIN as i128, i64::MAX as i128] {
            let s = State::TokenBucket(token_bucket::State { rate, tokens, last: now });
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
            let next = State::TokenBucket(token_bucket::State { rate, tokens: tokens / 2 - 7, last: now + 5_000 });
            assert!(back.rewrite(next.clone()).is_none());
            // SAFETY: a live word made above, used by nothing else meanwhile.
            let back = unsafe { Loaded::from_word(w) }.unwrap();
            assert_eq!(*back, next);
            // A state of another algorithm is never written into a compact box.
            let Repr::Compact(_, p) = back.0 else { panic!("not compact") };
            let g = State::Gcra(gcra::State { rate, tat: now as i128 * 1000 });
            assert!(!overwrite_compact(p, &next, &g));
            // Another rate: rewritten in place with that rate's id.
            let other = Rate::new(999, 86_400 * NANOS_PER_SEC, 1000).unwrap();
            let moved = State::TokenBucket(token_bucket::State { rate: other, tokens: 5, last: now });
            assert!(overwrite_compact(p, &next, &moved));
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
            let s = State::TokenBucket(token_bucket::State { rate, tokens, last });
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
