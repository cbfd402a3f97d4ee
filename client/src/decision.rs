//! The limiter reply, typed: [`Decision`] from a RESP2 array or a RESP3 map. Its HTTP headers
//! (`Decision::headers`) are rendered by [`crate::headers`], as docs/http-headers.md maps them.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

/// One limiter decision: the reply of `RL.GCRA`, `RL.TOKENBUCKET`, `RL.LEAKY`, `RL.SLIDING`,
/// `RL.FIXED`, `RL.SLIDINGLOG` (and each limit of `RL.MULTI`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Decision {
    /// Units admitted: the COST when admitted, the units granted with PARTIAL, 0 when limited
    /// or peeking.
    pub allowed: u64,
    /// The capacity: BURST for the buckets, `limit` for the windows.
    pub limit: u64,
    /// Units that would still be admitted right after this call (also when limited).
    pub remaining: u64,
    /// When limited: how long until this same request would pass (rounded up to the ms by the
    /// server, never early). `None` when admitted, peeking, or when it never can (COST above
    /// the capacity).
    pub retry_after: Option<Duration>,
    /// How long until the limiter is back to a fresh state (the key's TTL).
    pub reset_after: Duration,
    /// RL.LEAKY only: how long an admitted request waits before going on.
    pub delay: Option<Duration>,
}

/// The reply fields by name, in RESP2 order.
const FIELDS: [&str; 6] = ["allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "delay_ms"];

/// Milliseconds (-1 = none) to an optional duration.
fn opt_ms(ms: i64) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// Whole seconds, rounded up (a client is never told to come back early).
pub fn ceil_secs(d: Duration) -> u64 {
    let ms = d.as_millis() as u64 + u64::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    ms.div_ceil(1000)
}

fn parse_error(msg: String) -> ParsingError {
    ParsingError::from(format!("not a limiter reply: {msg}"))
}

impl Decision {
    /// Builds a decision from the raw reply fields (`retry_after_ms`, `reset_after_ms`,
    /// `delay_ms` as the server sends them, -1 meaning none).
    pub fn from_fields(
        allowed: i64,
        limit: i64,
        remaining: i64,
        retry_after_ms: i64,
        reset_after_ms: i64,
        delay_ms: Option<i64>,
    ) -> Decision {
        Decision {
            allowed: allowed.max(0) as u64,
            limit: limit.max(0) as u64,
            remaining: remaining.max(0) as u64,
            retry_after: opt_ms(retry_after_ms),
            reset_after: Duration::from_millis(reset_after_ms.max(0) as u64),
            delay: delay_ms.and_then(opt_ms),
        }
    }

    /// At least one unit admitted.
    pub fn admitted(&self) -> bool {
        self.allowed > 0
    }

    /// Limited and can never pass (COST above the capacity): no `Retry-After`.
    pub fn never(&self) -> bool {
        !self.admitted() && self.retry_after.is_none()
    }
}

fn int(v: &Value) -> Result<i64, ParsingError> {
    i64::from_redis_value_ref(v)
}

fn field_name(v: &Value) -> Result<String, ParsingError> {
    String::from_redis_value_ref(v)
}

/// The fields of a limiter reply by position (RESP2) or name (RESP3); `None` for absent ones.
fn fields(v: &Value) -> Result<[Option<i64>; 6], ParsingError> {
    let mut f = [None; 6];
    match v {
        Value::Array(items) if items.len() == 5 || items.len() == 6 => {
            for (slot, item) in f.iter_mut().zip(items) {
                *slot = Some(int(item)?);
            }
        }
        Value::Map(pairs) => {
            for (k, v) in pairs {
                let name = field_name(k)?;
                if let Some(i) = FIELDS.iter().position(|f| *f == name) {
                    f[i] = Some(int(v)?);
                }
            }
        }
        other => return Err(parse_error(format!("{other:?}"))),
    }
    Ok(f)
}

// Parsed from a reference (the fields are read in place); the owned form borrows it.
impl FromRedisValue for Decision {
    fn from_redis_value(v: Value) -> Result<Decision, ParsingError> {
        Decision::from_redis_value_ref(&v)
    }

    fn from_redis_value_ref(v: &Value) -> Result<Decision, ParsingError> {
        let f = fields(v)?;
        let get = |i: usize| f[i].ok_or_else(|| parse_error(format!("the reply lacks {}", FIELDS[i])));
        Ok(Decision::from_fields(get(0)?, get(1)?, get(2)?, get(3)?, get(4)?, f[5]))
    }
}

/// The reply of `RL.MULTI`: overall `allowed` and `retry_after`, and each limit's decision.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MultiDecision {
    pub allowed: u64,
    /// The largest among the refusing limits; `None` when admitted or when a refusing limit
    /// can never admit.
    pub retry_after: Option<Duration>,
    pub limits: Vec<Decision>,
}

impl MultiDecision {
    pub fn admitted(&self) -> bool {
        self.allowed > 0
    }

    /// The limit whose headers describe the request (docs/http-headers.md, RL.MULTI):
    /// [`crate::headers::binding`] of [`MultiDecision::statuses`].
    pub fn binding(&self) -> Option<&Decision> {
        let statuses = self.statuses();
        let b = crate::headers::binding(&statuses)?;
        self.limits.get(statuses.iter().position(|s| std::ptr::eq(s, b))?)
    }
}

impl FromRedisValue for MultiDecision {
    fn from_redis_value(v: Value) -> Result<MultiDecision, ParsingError> {
        MultiDecision::from_redis_value_ref(&v)
    }

    fn from_redis_value_ref(v: &Value) -> Result<MultiDecision, ParsingError> {
        let (allowed, retry, limits) = match v {
            Value::Array(items) if items.len() >= 3 => {
                (int(&items[0])?, int(&items[1])?, Decision::from_redis_value_refs(&items[2..])?)
            }
            Value::Map(pairs) => {
                let (mut a, mut r, mut l) = (None, None, None);
                for (k, v) in pairs {
                    match field_name(k)?.as_str() {
                        "allowed" => a = Some(int(v)?),
                        "retry_after_ms" => r = Some(int(v)?),
                        "limits" => l = Some(Vec::<Decision>::from_redis_value_ref(v)?),
                        _ => {}
                    }
                }
                match (a, r, l) {
                    (Some(a), Some(r), Some(l)) => (a, r, l),
                    _ => return Err(parse_error("RL.MULTI map lacks a field".into())),
                }
            }
            other => return Err(parse_error(format!("{other:?}"))),
        };
        Ok(MultiDecision { allowed: allowed.max(0) as u64, retry_after: opt_ms(retry), limits })
    }
}

/// The reply of `CL.THROTTLE` (redis-cell): times in whole seconds as redis-cell rounds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ThrottleDecision {
    pub limited: bool,
    /// `max_burst + 1`.
    pub limit: u64,
    pub remaining: u64,
    /// Seconds; `None` when admitted or never.
    pub retry_after_secs: Option<u64>,
    pub reset_after_secs: u64,
}

impl FromRedisValue for ThrottleDecision {
    fn from_redis_value(v: Value) -> Result<ThrottleDecision, ParsingError> {
        ThrottleDecision::from_redis_value_ref(&v)
    }

    fn from_redis_value_ref(v: &Value) -> Result<ThrottleDecision, ParsingError> {
        let f: Vec<i64> = match v {
            Value::Array(items) if items.len() == 5 => items.iter().map(int).collect::<Result<_, _>>()?,
            other => return Err(parse_error(format!("{other:?}"))),
        };
        Ok(ThrottleDecision {
            limited: f[0] != 0,
            limit: f[1].max(0) as u64,
            remaining: f[2].max(0) as u64,
            retry_after_secs: (f[3] >= 0).then_some(f[3] as u64),
            reset_after_secs: f[4].max(0) as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(v: &[i64]) -> Value {
        Value::Array(v.iter().map(|&i| Value::Int(i)).collect())
    }

    fn map(v: &[(&str, i64)]) -> Value {
        Value::Map(v.iter().map(|(k, v)| (Value::SimpleString(k.to_string()), Value::Int(*v))).collect())
    }

    #[test]
    fn resp2_and_resp3_agree() {
        let a: Decision = redis::from_redis_value_ref(&ints(&[0, 5, 0, 1001, 5000])).unwrap();
        // The owned form (what query_async uses) parses as the borrowed one.
        let m: Decision = redis::from_redis_value(map(&[
            ("reset_after_ms", 5000),
            ("allowed", 0),
            ("limit", 5),
            ("remaining", 0),
            ("retry_after_ms", 1001),
        ]))
        .unwrap();
        assert_eq!(a, m);
        assert_eq!(a.retry_after, Some(Duration::from_millis(1001)));
        assert!(!a.admitted() && !a.never());
        let leaky: Decision = redis::from_redis_value_ref(&ints(&[1, 10, 8, -1, 200, 100])).unwrap();
        assert_eq!(leaky.delay, Some(Duration::from_millis(100)));
        assert_eq!(leaky.retry_after, None);
    }

    #[test]
    fn rejects_other_shapes() {
        assert!(redis::from_redis_value_ref::<Decision>(&ints(&[1, 2, 3])).is_err());
        assert!(redis::from_redis_value_ref::<Decision>(&Value::Nil).is_err());
        assert!(redis::from_redis_value_ref::<Decision>(&Value::Map(vec![])).is_err());
    }

    #[test]
    fn headers_round_up_and_skip_retry_after_when_never() {
        let d = Decision::from_fields(0, 5, 0, 1001, 4999, None);
        let h = d.headers();
        assert_eq!(h["retry-after"], "2");
        assert_eq!(h["ratelimit-reset"], "5");
        let never = Decision::from_fields(0, 5, 5, -1, 0, None);
        assert!(never.never());
        assert!(!never.headers().contains_key("retry-after"));
        // docs/http-headers.md's example table.
        let rows = [
            ([1, 3, 2, -1, 2000], "2", None),
            ([1, 3, 1, -1, 3988], "4", None),
            ([0, 3, 0, 1968, 5968], "6", Some("2")),
        ];
        for (r, reset, retry) in rows {
            let d: Decision = redis::from_redis_value_ref(&ints(&r)).unwrap();
            let h = d.headers();
            assert_eq!(h["ratelimit-reset"], reset);
            assert_eq!(h.get("retry-after").map(|v| v.to_str().unwrap()), retry);
        }
        assert_eq!(ceil_secs(Duration::from_micros(1_000_001)), 2);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }

    #[test]
    fn multi_binding_limit() {
        // docs/http-headers.md, RL.MULTI table, 3rd and 4th calls.
        let v = Value::Array(vec![
            Value::Int(0),
            Value::Int(5000),
            ints(&[0, 2, 0, 5000, 10000]),
            ints(&[0, 3, 1, -1, 120000]),
        ]);
        let m: MultiDecision = redis::from_redis_value_ref(&v).unwrap();
        assert_eq!(m.binding().unwrap().limit, 2);
        let h = m.headers();
        assert_eq!(h["retry-after"], "5");
        assert_eq!(h["ratelimit-limit"], "2");
        assert_eq!(h["ratelimit"], r#""limit1";r=0;t=5, "limit2";r=1;t=120"#);
        let v = Value::Array(vec![
            Value::Int(1),
            Value::Int(-1),
            ints(&[1, 2, 0, -1, 10000]),
            ints(&[1, 3, 0, -1, 115000]),
        ]);
        let m: MultiDecision = redis::from_redis_value_ref(&v).unwrap();
        assert_eq!(m.binding().unwrap().limit, 3);
        assert!(!m.headers().contains_key("retry-after"));
        // Refused for good by the second limit (capacity 3 below COST 5): the first would have
        // admitted (both report -1); no retry-after, the headers of a limit without a retry.
        let v = Value::Array(vec![Value::Int(0), Value::Int(-1), ints(&[0, 10, 9, -1, 0]), ints(&[0, 3, 3, -1, 0])]);
        let m: MultiDecision = redis::from_redis_value_ref(&v).unwrap();
        assert_eq!(m.binding().unwrap().limit, 3);
        assert!(!m.headers().contains_key("retry-after"));
        let r3 = Value::Map(vec![
            (Value::SimpleString("allowed".into()), Value::Int(1)),
            (Value::SimpleString("retry_after_ms".into()), Value::Int(-1)),
            (
                Value::SimpleString("limits".into()),
                Value::Array(vec![map(&[
                    ("allowed", 1),
                    ("limit", 2),
                    ("remaining", 1),
                    ("retry_after_ms", -1),
                    ("reset_after_ms", 5000),
                ])]),
            ),
        ]);
        let m3: MultiDecision = redis::from_redis_value_ref(&r3).unwrap();
        assert_eq!(m3.limits.len(), 1);
        assert_eq!(redis::from_redis_value::<MultiDecision>(r3).unwrap(), m3);
    }

    #[test]
    fn throttle_reply() {
        let t: ThrottleDecision = redis::from_redis_value_ref(&ints(&[1, 3, 0, 2, 6])).unwrap();
        assert!(t.limited);
        let h = t.headers();
        assert_eq!(h["retry-after"], "2");
        assert_eq!(h["ratelimit-reset"], "6");
        assert_eq!(h["ratelimit"], r#""default";r=0;t=2"#);
    }
}
