//! Replies decoded by name: the limiter reply (RESP2 array or RESP3 map), RL.MULTI's,
//! CL.THROTTLE's and RL.INFO's, and the conversions of `redis::Value` the tests share.
//! A test reads `reply.remaining`, never `reply[2]`.

use std::borrow::Borrow;

use redis::Value;

/// The limiter reply's fields, in RESP2 order (docs/commands.md, "The limiter reply");
/// `delay_ms` is RL.LEAKY's only.
pub const LIMITER_FIELDS: [&str; 6] = ["allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "delay_ms"];

/// The reply of RL.GCRA, RL.TOKENBUCKET, RL.LEAKY, RL.SLIDING, RL.FIXED, RL.SLIDINGLOG (and of
/// each limit of RL.MULTI), as the server sent it: -1 stays -1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimiterReply {
    pub allowed: i64,
    pub limit: i64,
    pub remaining: i64,
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
    /// RL.LEAKY only (its sixth field); None for the five-field replies.
    pub delay_ms: Option<i64>,
}

impl LimiterReply {
    /// From the RESP2 integers: five, or six for RL.LEAKY.
    pub fn from_ints(v: &[i64]) -> Result<LimiterReply, String> {
        match *v {
            [allowed, limit, remaining, retry_after_ms, reset_after_ms] => {
                Ok(LimiterReply { allowed, limit, remaining, retry_after_ms, reset_after_ms, delay_ms: None })
            }
            [allowed, limit, remaining, retry_after_ms, reset_after_ms, delay] => {
                Ok(LimiterReply { allowed, limit, remaining, retry_after_ms, reset_after_ms, delay_ms: Some(delay) })
            }
            _ => Err(format!("a limiter reply has 5 or 6 fields, not {}: {v:?}", v.len())),
        }
    }

    /// From a RESP2 array of integers or a RESP3 map whose keys are [`LIMITER_FIELDS`] in order.
    pub fn from_value(v: &Value) -> Result<LimiterReply, String> {
        let ints: Vec<i64> = match v {
            Value::Array(a) => a.iter().map(|x| int_of(x).ok_or_else(|| format!("field {x:?} in {v:?}"))).collect(),
            Value::Map(m) => m
                .iter()
                .enumerate()
                .map(|(i, (k, x))| match (text_of(k), int_of(x)) {
                    (Some(name), Some(n)) if LIMITER_FIELDS.get(i) == Some(&name.as_str()) => Ok(n),
                    _ => Err(format!("map entry {i} ({k:?}: {x:?}) in {v:?}")),
                })
                .collect(),
            other => Err(format!("not a limiter reply: {other:?}")),
        }?;
        LimiterReply::from_ints(&ints)
    }

    /// [`LimiterReply::from_value`], panicking on anything else.
    pub fn of(v: &Value) -> LimiterReply {
        LimiterReply::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Back to the RESP2 integers.
    pub fn ints(&self) -> Vec<i64> {
        let mut v = vec![self.allowed, self.limit, self.remaining, self.retry_after_ms, self.reset_after_ms];
        v.extend(self.delay_ms);
        v
    }

    /// At least one unit admitted.
    pub fn admitted(&self) -> bool {
        self.allowed > 0
    }
}

/// A whole reply against its RESP2 integers (`assert_eq!(reply, [1, 5, 4, -1, 200])`): the
/// field count counts too.
impl PartialEq<[i64]> for LimiterReply {
    fn eq(&self, other: &[i64]) -> bool {
        self.ints() == other
    }
}

impl PartialEq<Vec<i64>> for LimiterReply {
    fn eq(&self, other: &Vec<i64>) -> bool {
        self.ints() == *other
    }
}

impl<const N: usize> PartialEq<[i64; N]> for LimiterReply {
    fn eq(&self, other: &[i64; N]) -> bool {
        self.ints() == other
    }
}

/// RL.MULTI's reply: RESP2 `[allowed, retry_after_ms, reply_1, …]`, RESP3
/// `{allowed, retry_after_ms, limits: [map, …]}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiReply {
    pub allowed: i64,
    pub retry_after_ms: i64,
    pub limits: Vec<LimiterReply>,
}

impl MultiReply {
    pub fn from_value(v: &Value) -> Result<MultiReply, String> {
        let (allowed, retry, limits): (&Value, &Value, &[Value]) = match v {
            Value::Array(a) if a.len() >= 3 => (&a[0], &a[1], &a[2..]),
            Value::Map(m) => {
                let names: Vec<Option<String>> = m.iter().map(|(k, _)| text_of(k)).collect();
                let want = ["allowed", "retry_after_ms", "limits"].map(|n| Some(n.to_string()));
                match (&m[..], names == want) {
                    ([(_, a), (_, r), (_, Value::Array(l))], true) => (a, r, l),
                    _ => return Err(format!("RL.MULTI map: {v:?}")),
                }
            }
            other => return Err(format!("not an RL.MULTI reply: {other:?}")),
        };
        Ok(MultiReply {
            allowed: int_of(allowed).ok_or_else(|| format!("RL.MULTI allowed: {v:?}"))?,
            retry_after_ms: int_of(retry).ok_or_else(|| format!("RL.MULTI retry_after_ms: {v:?}"))?,
            limits: limits.iter().map(LimiterReply::from_value).collect::<Result<_, _>>()?,
        })
    }

    /// [`MultiReply::from_value`], panicking on anything else.
    pub fn of(v: &Value) -> MultiReply {
        MultiReply::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// CL.THROTTLE's reply (redis-cell's): `[limited (0/1), max_burst + 1, remaining,
/// retry_after_s, reset_after_s]`, always an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CellReply {
    pub limited: i64,
    pub limit: i64,
    pub remaining: i64,
    pub retry_after_s: i64,
    pub reset_after_s: i64,
}

impl CellReply {
    pub fn from_ints(v: &[i64]) -> Result<CellReply, String> {
        match *v {
            [limited, limit, remaining, retry_after_s, reset_after_s] => {
                Ok(CellReply { limited, limit, remaining, retry_after_s, reset_after_s })
            }
            _ => Err(format!("CL.THROTTLE replies 5 integers, not {v:?}")),
        }
    }

    pub fn of(v: &Value) -> CellReply {
        CellReply::from_ints(&ints(v)).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn ints(&self) -> Vec<i64> {
        vec![self.limited, self.limit, self.remaining, self.retry_after_s, self.reset_after_s]
    }
}

impl<const N: usize> PartialEq<[i64; N]> for CellReply {
    fn eq(&self, other: &[i64; N]) -> bool {
        self.ints() == other
    }
}

impl PartialEq<Vec<i64>> for CellReply {
    fn eq(&self, other: &Vec<i64>) -> bool {
        self.ints() == *other
    }
}

/// RL.INFO's fields in order (RESP2 flat array or RESP3 map), `ttl_ms` included.
#[derive(Clone, Debug, PartialEq)]
pub struct RlInfo(pub Vec<(String, Value)>);

impl RlInfo {
    /// None for nil (no key); panics on a reply that is not a field/value list.
    pub fn of(v: &Value) -> Option<RlInfo> {
        match v {
            Value::Nil => None,
            Value::Array(items) => {
                assert!(items.len() % 2 == 0, "odd RL.INFO field/value array {items:?}");
                Some(RlInfo(items.chunks(2).map(|kv| (text(&kv[0]), kv[1].clone())).collect()))
            }
            Value::Map(m) => Some(RlInfo(m.iter().map(|(k, v)| (text(k), v.clone())).collect())),
            other => panic!("not an RL.INFO reply: {other:?}"),
        }
    }

    pub fn names(&self) -> Vec<&str> {
        self.0.iter().map(|(n, _)| n.as_str()).collect()
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// An integer field; panics if it is missing or not an integer.
    pub fn int(&self, name: &str) -> i64 {
        match self.get(name) {
            Some(Value::Int(i)) => *i,
            other => panic!("RL.INFO field {name}: {other:?} in {:?}", self.0),
        }
    }

    /// The `algorithm` field.
    pub fn algorithm(&self) -> String {
        text(self.get("algorithm").unwrap_or_else(|| panic!("RL.INFO without algorithm: {:?}", self.0)))
    }

    /// The fields without `ttl_ms` (it runs on the real clock).
    pub fn without_ttl(&self) -> RlInfo {
        RlInfo(self.0.iter().filter(|(n, _)| n != "ttl_ms").cloned().collect())
    }
}

fn int_of(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// A string reply (bulk, simple or verbatim) as text; panics on anything else.
pub fn text(v: &Value) -> String {
    text_of(v).unwrap_or_else(|| panic!("not a string: {v:?}"))
}

/// An integer reply; panics on anything else.
pub fn int(v: &Value) -> i64 {
    int_of(v).unwrap_or_else(|| panic!("expected an integer, got {v:?}"))
}

/// An array of integers (owned or borrowed), panicking on anything else.
pub fn ints(v: impl Borrow<Value>) -> Vec<i64> {
    let v = v.borrow();
    match v {
        Value::Array(a) => {
            a.iter().map(|x| int_of(x).unwrap_or_else(|| panic!("expected integers, got {x:?} in {v:?}"))).collect()
        }
        other => panic!("expected an array of integers, got {other:?}"),
    }
}

/// The server's error line ("CODE detail"), or the client's error when there is no code.
pub fn err_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}
