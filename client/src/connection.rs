//! The recommended connection for a [`crate::Limiter`]: a multiplexed connection that
//! reconnects on demand, so that recovery after a Redis restart is paced by the limiter's
//! circuit breaker and nothing else.
//!
//! `redis::aio::ConnectionManager` reconnects by itself with a backoff of its own; with redis
//! 1.8's defaults it waits 100 ms to 6.4 s between attempts (0.27's: 1–2 s, then 60–120 s), and
//! a command sent meanwhile waits for that attempt: decisions fall to the failure policy for
//! seconds after Redis is back. [`Reconnecting`] has no backoff of its own: a call finds the
//! connection broken (an IO error, a dropped connection), drops it, and the next call connects
//! again (under `connect_timeout`). While Redis is down the limiter's breaker lets one call
//! through per cool-down (the half-open probe), so there is one connection attempt per
//! cool-down, jittered by when requests arrive, and a restart longer than the cool-down costs at
//! most one cool-down plus one connection attempt.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

/// A multiplexed connection that reconnects on demand (see the module docs). Cheap to clone:
/// clones share one connection.
#[derive(Clone)]
pub struct Reconnecting {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    db: i64,
    /// The live connection and its generation (so that a failure drops only the connection it
    /// happened on, not a newer one).
    slot: Mutex<(u64, Option<MultiplexedConnection>)>,
    /// One connection attempt at a time.
    connecting: tokio::sync::Mutex<()>,
}

/// Whether a failed call means the connection is gone (it is then dropped and made again).
fn is_broken(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_unrecoverable_error()
}

impl Reconnecting {
    /// Connects now (the first call fails fast if Redis is not there); later failures
    /// reconnect on demand. `connect_timeout` bounds each attempt (use the limiter's call
    /// timeout, or a little more).
    pub async fn connect(client: redis::Client, connect_timeout: Duration) -> RedisResult<Reconnecting> {
        let c = Reconnecting::lazy(client, connect_timeout);
        c.get().await?;
        Ok(c)
    }

    /// Connects on the first call.
    pub fn lazy(client: redis::Client, connect_timeout: Duration) -> Reconnecting {
        let db = client.get_connection_info().redis_settings().db();
        // No response timeout of the connection's own (redis 1.x sets 500 ms by default): the
        // limiter's call timeout governs every call.
        let config =
            AsyncConnectionConfig::new().set_connection_timeout(Some(connect_timeout)).set_response_timeout(None);
        Reconnecting {
            inner: Arc::new(Inner {
                client,
                config,
                connect_timeout,
                db,
                slot: Mutex::new((0, None)),
                connecting: tokio::sync::Mutex::new(()),
            }),
        }
    }

    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        let s = self.inner.slot.lock().unwrap_or_else(|e| e.into_inner());
        s.1.clone().map(|c| (s.0, c))
    }

    async fn get(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let _one = self.inner.connecting.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let attempt = self.inner.client.get_multiplexed_async_connection_with_config(&self.inner.config);
        let conn = match tokio::time::timeout(self.inner.connect_timeout, attempt).await {
            Ok(r) => r?,
            Err(_) => return Err(RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))),
        };
        let mut s = self.inner.slot.lock().unwrap_or_else(|e| e.into_inner());
        s.0 += 1;
        s.1 = Some(conn.clone());
        Ok((s.0, conn))
    }

    fn drop_if_broken<T>(&self, gen: u64, r: &RedisResult<T>) {
        if let Err(e) = r {
            if is_broken(e) {
                let mut s = self.inner.slot.lock().unwrap_or_else(|e| e.into_inner());
                if s.0 == gen {
                    s.1 = None;
                }
            }
        }
    }
}

impl ConnectionLike for Reconnecting {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (gen, mut conn) = self.get().await?;
            let r = conn.req_packed_command(cmd).await;
            self.drop_if_broken(gen, &r);
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (gen, mut conn) = self.get().await?;
            let r = conn.req_packed_commands(cmd, offset, count).await;
            self.drop_if_broken(gen, &r);
            r
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.db
    }
}
