//! The stored state of a key, whatever its algorithm, and its one binary encoding. The same
//! bytes go into the RDB file, DUMP payloads, the AOF and the replication stream, so a replica,
//! a reload and an AOF replay hold byte-identical state. Decoding validates everything: the
//! bytes may come from a user calling RL.SETSTATE.
//!
//! Loadable by construction: the set of states `decode` returns is closed under every call
//! (checks with any parameters, returns, any clock), so nothing a key holds can become a
//! payload the decoder refuses (tests/core_closure_props.rs). Decoding accepts every payload any
//! version of the module wrote, and brings the values no call stores (only a forged RL.SETSTATE
//! payload holds them) to the nearest state a call stores, with the same answers wherever one
//! exists: see each algorithm's `normalised`. On every state a call stores that is the
//! identity, so its encoding is unchanged byte for byte.

use super::spec::Update;
use super::{fixed, gcra, leaky, sliding, sliding_log, token_bucket, Algorithm, LimitError, Nanos, Rate, Window};

/// Version of the encoding, stored in every payload (and given to Redis as the type's
/// encoding version).
pub const ENCODING_VERSION: u8 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    Gcra(gcra::State),
    TokenBucket(token_bucket::State),
    Sliding(sliding::State),
    Fixed(fixed::State),
    /// Boxed: a log is large, and boxing keeps every other key's value small.
    SlidingLog(Box<sliding_log::State>),
    Leaky(leaky::State),
}

/// Bound on stored scaled instants and balances (|x| ≤ 2^115). A GCRA arrival time is
/// now × limit + debt: up to 2^63 × MAX_COUNT (< 2^113) plus burst × period (< 2^113), so every
/// reachable value fits (2^110 did not: limit 10^15 at today's clock is already 1.7 × 10^33);
/// still far below i128 overflow in the arithmetic that follows.
const SCALED_BOUND: i128 = 1 << 115;

impl State {
    pub fn algorithm(&self) -> Algorithm {
        match self {
            State::Gcra(_) => Algorithm::Gcra,
            State::TokenBucket(_) => Algorithm::TokenBucket,
            State::Sliding(_) => Algorithm::Sliding,
            State::Fixed(_) => Algorithm::Fixed,
            State::SlidingLog(_) => Algorithm::SlidingLog,
            State::Leaky(_) => Algorithm::Leaky,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.encode_into(&mut out);
        out
    }

    /// Appends the encoding to `out` (the hot path reuses one buffer).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let out = &mut *out;
        out.push(ENCODING_VERSION);
        out.push(self.algorithm().tag());
        match self {
            State::Gcra(s) | State::Leaky(leaky::State(s)) => {
                put_rate(out, &s.rate);
                out.extend_from_slice(&s.tat.to_le_bytes());
            }
            State::TokenBucket(s) => {
                put_rate(out, &s.rate);
                out.extend_from_slice(&s.tokens.to_le_bytes());
                out.extend_from_slice(&s.last.as_i64().to_le_bytes());
            }
            State::Sliding(s) => {
                put_window(out, &s.win);
                put_u64(out, s.index as u64);
                put_u64(out, s.prev);
                put_u64(out, s.curr);
            }
            State::Fixed(s) => {
                put_window(out, &s.win);
                put_u64(out, s.index as u64);
                put_u64(out, s.count);
            }
            State::SlidingLog(s) => {
                put_window(out, &s.win);
                // One word per entry, then the counts that do not fit their word, in order.
                put_u64(out, s.log.len() as u64);
                let mut bigs = 0u64;
                for (ts, count) in s.log.iter() {
                    put_u64(out, sliding_log::stored_entry(ts, count));
                    bigs += (count >= sliding_log::BIG) as u64;
                }
                put_u64(out, bigs);
                s.log.iter().filter(|&(_, c)| c >= sliding_log::BIG).for_each(|(_, c)| put_u64(out, c));
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<State, &'static str> {
        let mut r = Reader(bytes);
        if r.u8()? != ENCODING_VERSION {
            return Err("unknown encoding version");
        }
        let algo = Algorithm::from_tag(r.u8()?).ok_or("unknown algorithm")?;
        let state = match algo {
            Algorithm::Gcra | Algorithm::Leaky => {
                let s = gcra::State { rate: r.rate()?, tat: r.scaled()? }.normalised();
                if algo == Algorithm::Gcra {
                    State::Gcra(s)
                } else {
                    State::Leaky(leaky::State(s))
                }
            }
            Algorithm::TokenBucket => {
                let rate = r.rate()?;
                let tokens = r.scaled()?;
                if tokens > rate.capacity_scaled() {
                    return Err("tokens above capacity");
                }
                State::TokenBucket(token_bucket::State { rate, tokens, last: Nanos::new(r.i64()?) }.normalised())
            }
            Algorithm::Sliding => State::Sliding(
                sliding::State { win: r.window()?, index: r.i64()?, prev: r.units()?, curr: r.units()? }.normalised(),
            ),
            Algorithm::Fixed => {
                State::Fixed(fixed::State { win: r.window()?, index: r.i64()?, count: r.units()? }.normalised())
            }
            Algorithm::SlidingLog => State::SlidingLog(Box::new(decode_log(&mut r)?)),
        };
        if !r.0.is_empty() {
            return Err("trailing bytes");
        }
        Ok(state)
    }
}

/// Tag of an update payload that carries a sliding-log commit rather than a whole state.
const LOG_COMMIT_TAG: u8 = 0x81;

impl Update {
    /// The replication payload of an update: a whole state, or a sliding-log commit.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            Update::Replace(s) => s.encode_into(out),
            Update::Log(c) => {
                out.push(ENCODING_VERSION);
                out.push(LOG_COMMIT_TAG);
                put_window(out, &c.win);
                put_u64(out, c.cutoff as u64);
                put_u64(out, c.ts as u64);
                put_u64(out, c.units);
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Update, &'static str> {
        if bytes.get(1) != Some(&LOG_COMMIT_TAG) {
            return State::decode(bytes).map(Update::Replace);
        }
        let mut r = Reader(bytes);
        if r.u8()? != ENCODING_VERSION {
            return Err("unknown encoding version");
        }
        r.u8()?;
        let win = r.window()?;
        let (cutoff, ts) = (r.i64()?, r.i64()?);
        let units = r.units()?;
        if !(0..=sliding_log::MAX_TS).contains(&ts) || units == 0 || !r.0.is_empty() {
            return Err("invalid log commit");
        }
        Ok(Update::Log(sliding_log::Commit { win, cutoff, ts, units }))
    }
}

fn decode_log(r: &mut Reader) -> Result<sliding_log::State, &'static str> {
    let mut s = sliding_log::State::new(r.window()?);
    let n = r.len()?;
    let mut entries = Vec::with_capacity(n);
    let mut last_ts = 0;
    let mut bigs = 0usize;
    for _ in 0..n {
        let e = r.u64()?;
        let (ts, count) = (sliding_log::ts_of(e), e >> 53);
        if ts < last_ts || count == 0 {
            return Err("log entries out of order");
        }
        last_ts = ts;
        bigs += (count == sliding_log::BIG) as usize;
        entries.push((ts, count));
    }
    if r.len()? != bigs {
        return Err("log counts do not match");
    }
    for (_, count) in entries.iter_mut().filter(|(_, c)| *c == sliding_log::BIG) {
        *count = r.units()?;
        if *count == 0 {
            return Err("log count is zero");
        }
    }
    let mut total = 0u64;
    for (_, count) in &entries {
        total = total.checked_add(*count).filter(|t| *t <= super::MAX_STORED_COUNT).ok_or("log total too large")?;
    }
    for (ts, count) in entries {
        s.log.push_stored(ts, count);
    }
    Ok(s)
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_rate(out: &mut Vec<u8>, r: &Rate) {
    put_u64(out, r.limit);
    put_u64(out, r.period.as_i64() as u64);
    put_u64(out, r.burst);
}

fn put_window(out: &mut Vec<u8>, w: &Window) {
    put_u64(out, w.limit);
    put_u64(out, w.window.as_i64() as u64);
}

/// A payload's parameters the module would refuse, as the decoder reports them.
fn decode_error(e: LimitError) -> &'static str {
    match e {
        LimitError::Limit(_) | LimitError::Burst(_) => "count out of range",
        LimitError::Period(_) => "period out of range",
        LimitError::Refill => super::limit::REFILL_MESSAGE,
        LimitError::BurstNotAllowed(_) => "BURST on a window",
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], &'static str> {
        if self.0.len() < N {
            return Err("truncated payload");
        }
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        Ok(head.try_into().expect("split at N"))
    }
    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take::<1>()?[0])
    }
    fn u64(&mut self) -> Result<u64, &'static str> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn i64(&mut self) -> Result<i64, &'static str> {
        Ok(i64::from_le_bytes(self.take()?))
    }
    fn units(&mut self) -> Result<u64, &'static str> {
        let v = self.u64()?;
        if v > super::MAX_STORED_COUNT {
            return Err("count too large");
        }
        Ok(v)
    }
    /// A length no larger than the bytes left could hold (so a forged length cannot make us
    /// reserve gigabytes).
    fn len(&mut self) -> Result<usize, &'static str> {
        let n = self.u64()?;
        if n > (self.0.len() / 8) as u64 {
            return Err("length exceeds payload");
        }
        Ok(n as usize)
    }
    fn scaled(&mut self) -> Result<i128, &'static str> {
        let v = i128::from_le_bytes(self.take()?);
        if !(-SCALED_BOUND..=SCALED_BOUND).contains(&v) {
            return Err("stored value out of range");
        }
        Ok(v)
    }
    fn period(&mut self) -> Result<Nanos, &'static str> {
        let p = Nanos::new(self.i64()?);
        super::check_period(p).map_err(decode_error)?;
        Ok(p)
    }
    fn rate(&mut self) -> Result<Rate, &'static str> {
        let limit = self.u64()?;
        let period = self.period()?;
        Rate::new(limit, period, self.u64()?).map_err(decode_error)
    }
    fn window(&mut self) -> Result<Window, &'static str> {
        let limit = self.u64()?;
        Window::new(limit, self.period()?).map_err(decode_error)
    }
}

#[cfg(test)]
mod size_tests {
    /// Every key's value is one allocation of this size: keep it in jemalloc's 48-byte class
    /// for the O(1) algorithms except the token bucket's 64.
    #[test]
    fn state_stays_small() {
        assert!(std::mem::size_of::<super::State>() <= 64, "{}", std::mem::size_of::<super::State>());
        assert!(std::mem::size_of::<super::gcra::State>() <= 40);
    }
}
