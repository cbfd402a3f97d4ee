//! Following the primary that Redis Sentinel names (see the module docs of
//! [`super`]): a query task asks the sentinels (`SENTINEL get-master-addr-by-name`, first
//! answer wins) when told to ([`Tracker::ask_again`]: a connection broke, an attempt failed)
//! and every second; a task per sentinel subscribes to `+switch-master` and moves the address
//! the moment a sentinel announces a failover. The address is a `watch` channel: the pool's
//! tasks drop their connections to the old address when it changes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::RedisConnectionInfo;
use tokio::sync::{watch, Notify};

use super::{classify, tls, Addr, Backoff, Error, ErrorKind};

/// How often the sentinels are asked when nothing happens (a `+switch-master` missed while a
/// subscription was down is caught by then).
const POLL: Duration = Duration::from_secs(1);

pub(crate) struct Tracker {
    master_name: String,
    sentinels: Vec<Addr>,
    info: RedisConnectionInfo,
    tls: Option<Arc<tls::Connector>>,
    connect_timeout: Duration,
    master: watch::Sender<Option<Addr>>,
    wake: Notify,
    /// The latest event or problem, for the status.
    note: Mutex<Option<String>>,
}

impl Tracker {
    pub(crate) fn new(
        master_name: String,
        sentinels: Vec<Addr>,
        info: RedisConnectionInfo,
        tls: Option<Arc<tls::Connector>>,
        connect_timeout: Duration,
        master: watch::Sender<Option<Addr>>,
    ) -> Tracker {
        Tracker {
            master_name,
            sentinels,
            info,
            tls,
            connect_timeout,
            master,
            wake: Notify::new(),
            note: Mutex::new(None),
        }
    }

    pub(crate) fn spawn(self: Arc<Self>, rt: &tokio::runtime::Handle, closed: watch::Receiver<bool>) {
        rt.spawn(self.clone().query_loop(closed.clone()));
        for i in 0..self.sentinels.len() {
            rt.spawn(self.clone().subscribe_loop(i, closed.clone()));
        }
    }

    /// Asks the sentinels again now (coalesced).
    pub(crate) fn ask_again(&self) {
        self.wake.notify_one();
    }

    pub(crate) fn note(&self) -> Option<String> {
        self.note.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_note(&self, n: String) {
        *self.note.lock().unwrap_or_else(|e| e.into_inner()) = Some(n);
    }

    /// Moves to `addr` (if it is new): the pool drops its connections to the old one.
    fn set_master(&self, addr: Addr, why: &str) {
        let changed = self.master.send_if_modified(|m| {
            if m.as_ref() == Some(&addr) {
                false
            } else {
                *m = Some(addr.clone());
                true
            }
        });
        if changed {
            tracing::warn!("redis sentinel: the master '{}' is at {addr} ({why})", self.master_name);
            self.set_note(format!("sentinel master '{}' at {addr}: {why}", self.master_name));
        }
    }

    async fn query_loop(self: Arc<Self>, mut closed: watch::Receiver<bool>) {
        loop {
            match self.ask().await {
                Ok(addr) => self.set_master(addr, "asked the sentinels"),
                Err(e) => {
                    tracing::warn!("redis sentinel: {e}");
                    self.set_note(e.to_string());
                }
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(POLL) => {}
                _ = closed.changed() => return,
            }
        }
    }

    /// The first sentinel's answer.
    async fn ask(&self) -> Result<Addr, Error> {
        let mut problems = Vec::new();
        for s in &self.sentinels {
            let one = async {
                let mut d = super::open(s, &self.info, self.tls.as_deref()).await?;
                let reply: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master_name)
                    .query_async(&mut d.conn)
                    .await
                    .map_err(classify)?;
                d.driver.abort();
                Ok::<_, Error>(reply)
            };
            match tokio::time::timeout(self.connect_timeout, one).await {
                Ok(Ok(Some((host, port)))) => return Ok(Addr::Tcp { host, port }),
                Ok(Ok(None)) => problems.push(format!("{s}: no master named '{}'", self.master_name)),
                Ok(Err(e)) => problems.push(format!("{s}: {e}")),
                Err(_) => problems.push(format!("{s}: timed out")),
            }
        }
        let kind = if problems.iter().any(|p| p.contains("TLS")) { ErrorKind::Tls } else { ErrorKind::Unavailable };
        Err(Error::new(kind, format!("no sentinel named the master: {}", problems.join("; "))))
    }

    /// Follows one sentinel's `+switch-master` events.
    async fn subscribe_loop(self: Arc<Self>, i: usize, mut closed: watch::Receiver<bool>) {
        let s = &self.sentinels[i];
        let mut backoff = Backoff::new(100 + i as u64);
        loop {
            let sub = async {
                let stream = super::stream(s, self.tls.as_deref()).await?;
                let mut ps = match stream {
                    super::Stream::Tcp(t) => redis::aio::PubSub::new(&self.info, t).await,
                    super::Stream::Tls(t) => redis::aio::PubSub::new(&self.info, *t).await,
                    super::Stream::Unix(u) => redis::aio::PubSub::new(&self.info, u).await,
                }
                .map_err(classify)?;
                ps.subscribe("+switch-master").await.map_err(classify)?;
                Ok::<_, Error>(ps)
            };
            match tokio::time::timeout(self.connect_timeout, sub).await {
                Ok(Ok(mut ps)) => {
                    backoff.reset();
                    // Events may have been missed while not subscribed.
                    self.ask_again();
                    let mut messages = ps.on_message();
                    loop {
                        tokio::select! {
                            m = messages.next() => match m {
                                Some(m) => {
                                    let payload: String = m.get_payload().unwrap_or_default();
                                    self.on_switch(&payload);
                                }
                                None => break,
                            },
                            _ = closed.changed() => return,
                        }
                    }
                }
                Ok(Err(e)) => tracing::debug!("redis sentinel {s}: cannot subscribe: {e}"),
                Err(_) => tracing::debug!("redis sentinel {s}: subscribing timed out"),
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff.delay()) => {}
                _ = closed.changed() => return,
            }
        }
    }

    /// `+switch-master <name> <old ip> <old port> <new ip> <new port>`.
    fn on_switch(&self, payload: &str) {
        let f: Vec<&str> = payload.split_whitespace().collect();
        if f.len() != 5 || f[0] != self.master_name {
            return;
        }
        let Ok(port) = f[4].parse::<u16>() else { return };
        let why = format!("+switch-master from {}:{}", f[1], f[2]);
        self.set_master(Addr::Tcp { host: f[3].to_string(), port }, &why);
    }
}
