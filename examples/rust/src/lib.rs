//! Async Rust client for redis-ratelimit, with the `redis` crate on tokio.
//!
//! * [`Decision`]: the limiter reply `[allowed, limit, remaining,
//!   retry_after_ms, reset_after_ms]`, typed, parsed by its
//!   [`FromRedisValue`] impl from a RESP2 array or a RESP3 map.
//! * [`check`]: one `RL.TOKENBUCKET key limit period BURST n` call on any async
//!   connection. A `MultiplexedConnection` is cheap to clone and pipelines the
//!   calls of concurrent tasks over one socket.
//! * [`Decision::headers`]: the HTTP headers for a decision (docs/http-headers.md).
//! * [`serve`] / [`respond`]: a tiny HTTP/1.1 service rate-limited per
//!   `X-API-Key` (no HTTP framework: a few lines of tokio), as `src/main.rs` runs it.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{FromRedisValue, ParsingError, RedisResult, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One limiter decision (the first five fields of any `RL.*` limiter reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Units admitted: the request's COST when admitted, 0 when limited.
    pub allowed: i64,
    /// The capacity (BURST for GCRA / token bucket / leaky bucket).
    pub limit: i64,
    /// Units that would still be admitted right after this call.
    pub remaining: i64,
    /// -1 when admitted; when limited, ms (rounded up) until the same request
    /// would pass; -1 also when it never can (COST above the capacity).
    pub retry_after_ms: i64,
    /// ms (rounded up) until the key is back to a fresh state (its TTL).
    pub reset_after_ms: i64,
}

const FIELDS: [&str; 5] = [
    "allowed",
    "limit",
    "remaining",
    "retry_after_ms",
    "reset_after_ms",
];

impl FromRedisValue for Decision {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let mut f: [Option<i64>; 5] = [None; 5];
        match v {
            // RESP2: an array of 5 integers (6 for RL.LEAKY: delay_ms is ignored here).
            Value::Array(items) if items.len() >= 5 => {
                for (slot, item) in f.iter_mut().zip(items) {
                    *slot = Some(redis::from_redis_value(item)?);
                }
            }
            // RESP3 (HELLO 3 / `?protocol=resp3`): a map keyed by field name.
            Value::Map(pairs) => {
                for (k, v) in pairs {
                    let k: String = redis::from_redis_value(k)?;
                    if let Some(i) = FIELDS.iter().position(|f| *f == k) {
                        f[i] = Some(redis::from_redis_value(v)?);
                    }
                }
            }
            other => return Err(format!("not a limiter reply: {other:?}").into()),
        }
        let get = |i: usize| {
            f[i].ok_or_else(|| ParsingError::from(format!("limiter reply lacks {}", FIELDS[i])))
        };
        Ok(Decision {
            allowed: get(0)?,
            limit: get(1)?,
            remaining: get(2)?,
            retry_after_ms: get(3)?,
            reset_after_ms: get(4)?,
        })
    }
}

/// Milliseconds to whole seconds, rounded up (a client is never told to come
/// back early); 0 for ms <= 0.
pub fn ceil_secs(ms: i64) -> i64 {
    if ms <= 0 {
        0
    } else {
        (ms + 999) / 1000
    }
}

impl Decision {
    pub fn admitted(&self) -> bool {
        self.allowed > 0
    }

    /// How long to wait before retrying: `Some` only when limited and the
    /// request can pass later.
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.admitted() && self.retry_after_ms >= 0)
            .then(|| Duration::from_millis(self.retry_after_ms as u64))
    }

    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (seconds,
    /// rounded up) and, when limited and it can pass later, `Retry-After`.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![
            ("RateLimit-Limit", self.limit.to_string()),
            ("RateLimit-Remaining", self.remaining.to_string()),
            (
                "RateLimit-Reset",
                ceil_secs(self.reset_after_ms).to_string(),
            ),
        ];
        if let Some(d) = self.retry_after() {
            h.push(("Retry-After", ceil_secs(d.as_millis() as i64).to_string()));
        }
        h
    }
}

/// A token-bucket policy: `limit` tokens per `period` (e.g. `"1s"`, `"500ms"`,
/// `"1m"`), at most `burst` at once.
#[derive(Clone, Debug)]
pub struct Policy {
    pub limit: u64,
    pub period: String,
    pub burst: u64,
}

impl Policy {
    pub fn new(limit: u64, period: impl Into<String>, burst: u64) -> Self {
        Policy {
            limit,
            period: period.into(),
            burst,
        }
    }
}

/// `RL.TOKENBUCKET key limit period BURST burst`, on any async connection.
pub async fn check<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    policy: &Policy,
) -> RedisResult<Decision> {
    redis::cmd("RL.TOKENBUCKET")
        .arg(key)
        .arg(policy.limit)
        .arg(&policy.period)
        .arg("BURST")
        .arg(policy.burst)
        .query_async(conn)
        .await
}

/// An HTTP response, before it is written to a socket.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

impl Response {
    fn json(status: u16, body: String, headers: Vec<(&'static str, String)>) -> Self {
        Response {
            status,
            headers,
            body,
        }
    }

    pub fn to_http(&self) -> String {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            401 => "Unauthorized",
            429 => "Too Many Requests",
            503 => "Service Unavailable",
            _ => "Unknown",
        };
        let mut out = format!("HTTP/1.1 {} {}\r\n", self.status, reason);
        out.push_str("Content-Type: application/json\r\n");
        out.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n",
            self.body.len()
        ));
        for (k, v) in &self.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.push_str(&self.body);
        out
    }
}

/// The service's logic without the transport: rate-limit by API key (key
/// `apikey:<key>`), then answer 200, or 429 with the headers; 401 without a
/// key; 503 when Redis fails (fail closed).
pub async fn respond<C: ConnectionLike>(
    conn: &mut C,
    api_key: Option<&str>,
    policy: &Policy,
) -> Response {
    let Some(api_key) = api_key.filter(|k| !k.is_empty()) else {
        return Response::json(
            401,
            r#"{"error":"missing X-API-Key header"}"#.into(),
            vec![],
        );
    };
    match check(conn, &format!("apikey:{api_key}"), policy).await {
        Ok(d) if d.admitted() => Response::json(200, r#"{"ok":true}"#.into(), d.headers()),
        Ok(d) => Response::json(
            429,
            format!(
                r#"{{"error":"rate limit exceeded","retry_after_ms":{}}}"#,
                d.retry_after_ms
            ),
            d.headers(),
        ),
        Err(e) => {
            eprintln!("rate limiter unavailable: {e}");
            Response::json(
                503,
                r#"{"error":"rate limiter unavailable"}"#.into(),
                vec![],
            )
        }
    }
}

/// Largest request head accepted, and how long a client may take to send it.
const MAX_HEAD: u64 = 16 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads the request head and returns the `X-API-Key` value, if any
/// (`Err` for a malformed, too large or too slow request).
async fn read_api_key(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let mut reader = BufReader::new(stream.take(MAX_HEAD));
    let mut line = String::new();
    let mut api_key = None;
    let mut first = true;
    loop {
        line.clear();
        if reader.read_line(&mut line).await? == 0 {
            return Err(bad("request head truncated"));
        }
        let l = line.trim_end_matches(['\r', '\n']);
        if first {
            first = false;
            if !l.contains(" HTTP/1.") {
                return Err(bad("not an HTTP/1.x request"));
            }
            continue;
        }
        if l.is_empty() {
            return Ok(api_key);
        }
        if let Some((name, value)) = l.split_once(':') {
            if name.trim().eq_ignore_ascii_case("x-api-key") {
                api_key = Some(value.trim().to_string());
            }
        }
    }
}

async fn handle(
    mut stream: TcpStream,
    mut conn: MultiplexedConnection,
    policy: &Policy,
) -> std::io::Result<()> {
    let response = match tokio::time::timeout(HEAD_TIMEOUT, read_api_key(&mut stream)).await {
        Ok(Ok(api_key)) => respond(&mut conn, api_key.as_deref(), policy).await,
        _ => Response::json(400, r#"{"error":"bad request"}"#.into(), vec![]),
    };
    stream.write_all(response.to_http().as_bytes()).await?;
    stream.shutdown().await
}

/// Serves HTTP on `listener` until it fails: one task per connection, all
/// sharing the multiplexed Redis connection. Request bodies are ignored.
pub async fn serve(
    listener: TcpListener,
    conn: MultiplexedConnection,
    policy: Policy,
) -> std::io::Result<()> {
    let policy = Arc::new(policy);
    loop {
        let (stream, _) = listener.accept().await?;
        let (conn, policy) = (conn.clone(), policy.clone());
        tokio::spawn(async move {
            let _ = handle(stream, conn, &policy).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(v: &[i64]) -> Value {
        Value::Array(v.iter().map(|&i| Value::Int(i)).collect())
    }

    #[test]
    fn parses_resp2_array() {
        let d: Decision = redis::from_redis_value(ints(&[0, 5, 0, 1001, 5000])).unwrap();
        assert_eq!(
            d,
            Decision {
                allowed: 0,
                limit: 5,
                remaining: 0,
                retry_after_ms: 1001,
                reset_after_ms: 5000
            }
        );
        // RL.LEAKY's sixth field (delay_ms) is ignored.
        let d: Decision = redis::from_redis_value(ints(&[1, 10, 9, -1, 100, 0])).unwrap();
        assert!(d.admitted());
    }

    #[test]
    fn parses_resp3_map_in_any_order() {
        let m = Value::Map(
            [
                ("reset_after_ms", 2000),
                ("allowed", 1),
                ("limit", 3),
                ("remaining", 2),
                ("retry_after_ms", -1),
            ]
            .into_iter()
            .map(|(k, v)| (Value::SimpleString(k.into()), Value::Int(v)))
            .collect(),
        );
        let d: Decision = redis::from_redis_value(m).unwrap();
        assert_eq!(
            d,
            Decision {
                allowed: 1,
                limit: 3,
                remaining: 2,
                retry_after_ms: -1,
                reset_after_ms: 2000
            }
        );
    }

    #[test]
    fn rejects_other_shapes() {
        assert!(redis::from_redis_value::<Decision>(ints(&[1, 2, 3])).is_err());
        assert!(redis::from_redis_value::<Decision>(Value::Nil).is_err());
        assert!(redis::from_redis_value::<Decision>(Value::Map(vec![])).is_err());
    }

    #[test]
    fn headers_round_up_and_skip_retry_after_when_never() {
        let limited = Decision {
            allowed: 0,
            limit: 5,
            remaining: 0,
            retry_after_ms: 1001,
            reset_after_ms: 4999,
        };
        let h = limited.headers();
        assert!(h.contains(&("Retry-After", "2".into())));
        assert!(h.contains(&("RateLimit-Reset", "5".into())));
        let never = Decision {
            allowed: 0,
            limit: 5,
            remaining: 5,
            retry_after_ms: -1,
            reset_after_ms: 0,
        };
        assert!(never.retry_after().is_none());
        assert!(!never.headers().iter().any(|(k, _)| *k == "Retry-After"));
        assert_eq!([-1, 0, 1, 1000, 1001].map(ceil_secs), [0, 0, 1, 1, 2]);
    }
}
