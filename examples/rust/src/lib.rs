//! Async Rust client for redis-ratelimit, with the `redis` crate on tokio.
//!
//! * [`Decision`]: the limiter reply `[allowed, limit, remaining,
//!   retry_after_ms, reset_after_ms]`, typed (RESP2 array or RESP3 map), from
//!   the client crate `redis-ratelimit-client` (`client/` in this repository).
//! * [`check`]: one `RL.TOKENBUCKET key limit period BURST n` call on any async
//!   connection (the client crate's typed call). A `MultiplexedConnection` is cheap to clone and pipelines the
//!   calls of concurrent tasks over one socket.
//! * [`Decision::headers`]: the HTTP headers for a decision (docs/http-headers.md).
//! * [`serve`] / [`respond`]: a tiny HTTP/1.1 service rate-limited per
//!   `X-API-Key` (no HTTP framework: a few lines of tokio), as `src/main.rs` runs it.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::RedisResult;
use redis_ratelimit_client::commands::{self, Options};
use redis_ratelimit_client::http::HeaderMap;
use redis_ratelimit_client::spec::{parse_duration, Limit};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One limiter decision, typed (RESP2 array or RESP3 map), with `retry_after()` and the HTTP
/// `headers()`: the client crate's (`client/` in this repository).
pub use redis_ratelimit_client::Decision;

/// A token-bucket policy: `limit` tokens per `period` (e.g. `"1s"`, `"500ms"`,
/// `"1m"`), at most `burst` at once.
#[derive(Clone, Debug)]
pub struct Policy {
    /// The limit as the client crate describes it (validated by the module's rules).
    pub limit: Limit,
}

impl Policy {
    /// Panics on a malformed `period` or a limit the module would refuse (configuration read
    /// at start-up).
    pub fn new(limit: u64, period: &str, burst: u64) -> Self {
        let period = parse_duration(period).unwrap_or_else(|e| panic!("{e}"));
        let limit = Limit::token_bucket(limit, period).and_then(|l| l.with_burst(burst));
        Policy { limit: limit.unwrap_or_else(|e| panic!("{e}")) }
    }
}

/// `RL.TOKENBUCKET key limit period BURST burst`, on any async connection.
pub async fn check<C: ConnectionLike>(conn: &mut C, key: &str, policy: &Policy) -> RedisResult<Decision> {
    commands::check(conn, key, &policy.limit, Options::default()).await
}

/// An HTTP response, before it is written to a socket.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Lower-case names (`http` types), as the client crate renders them.
    pub headers: HeaderMap,
    pub body: String,
}

impl Response {
    fn json(status: u16, body: String, headers: HeaderMap) -> Self {
        Response { status, headers, body }
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
        out.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n", self.body.len()));
        for (k, v) in &self.headers {
            // Values the client renders are ASCII; anything else is left out, never sent raw.
            if let Ok(v) = v.to_str() {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        out.push_str("\r\n");
        out.push_str(&self.body);
        out
    }
}

/// The service's logic without the transport: rate-limit by API key (key
/// `apikey:<key>`), then answer 200, or 429 with the headers; 401 without a
/// key; 503 when Redis fails (fail closed).
pub async fn respond<C: ConnectionLike>(conn: &mut C, api_key: Option<&str>, policy: &Policy) -> Response {
    let Some(api_key) = api_key.filter(|k| !k.is_empty()) else {
        return Response::json(401, r#"{"error":"missing X-API-Key header"}"#.into(), HeaderMap::new());
    };
    match check(conn, &format!("apikey:{api_key}"), policy).await {
        Ok(d) if d.admitted() => Response::json(200, r#"{"ok":true}"#.into(), d.headers()),
        Ok(d) => Response::json(
            429,
            format!(
                r#"{{"error":"rate limit exceeded","retry_after_ms":{}}}"#,
                d.retry_after.map_or(-1, |r| r.as_millis() as i64)
            ),
            d.headers(),
        ),
        Err(e) => {
            eprintln!("rate limiter unavailable: {e}");
            Response::json(503, r#"{"error":"rate limiter unavailable"}"#.into(), HeaderMap::new())
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

async fn handle(mut stream: TcpStream, mut conn: MultiplexedConnection, policy: &Policy) -> std::io::Result<()> {
    let response = match tokio::time::timeout(HEAD_TIMEOUT, read_api_key(&mut stream)).await {
        Ok(Ok(api_key)) => respond(&mut conn, api_key.as_deref(), policy).await,
        _ => Response::json(400, r#"{"error":"bad request"}"#.into(), HeaderMap::new()),
    };
    stream.write_all(response.to_http().as_bytes()).await?;
    stream.shutdown().await
}

/// Serves HTTP on `listener` until it fails: one task per connection, all
/// sharing the multiplexed Redis connection. Request bodies are ignored.
pub async fn serve(listener: TcpListener, conn: MultiplexedConnection, policy: Policy) -> std::io::Result<()> {
    let policy = Arc::new(policy);
    loop {
        let (stream, _) = listener.accept().await?;
        let (conn, policy) = (conn.clone(), policy.clone());
        tokio::spawn(async move {
            let _ = handle(stream, conn, &policy).await;
        });
    }
}
