//! A scriptable Rate Limit Quota Service for finding out what Envoy does with the protocol
//! (docs/quota-service.md, "What Envoy does"): it logs every message Envoy sends and pushes
//! the actions it is told to, nothing else (no Redis, no configuration).
//!
//! `cargo run --release -p redis-ratelimit-service --example rlqs_probe -- 127.0.0.1:0`
//!
//! stdout, one JSON object per line, `t_ms` since the start:
//! `{"t_ms":…,"ev":"listening","addr":"127.0.0.1:…"}`, `{"ev":"open","stream":1}`,
//! `{"ev":"report","stream":1,"domain":"d","usages":[{"bucket":{…},"allowed":3,"denied":0,"elapsed_ns":…}]}`,
//! `{"ev":"closed","stream":1,"why":"…"}`.
//!
//! stdin, one JSON command per line:
//! * `{"auto": ACTION}`: answer every bucket a stream reports for the first time with ACTION;
//!   `{"auto": null}` stops;
//! * `{"push": ACTION}`: push ACTION now on every open stream, for every bucket it reported
//!   (or for `"bucket": {…}` only);
//! * `{"push_seq": [ACTION, …]}`: like push, the actions one after another for each bucket, all
//!   in one response (Envoy applies a response's actions in order);
//! * `{"close": true}`: end every open stream (status UNAVAILABLE).
//!
//! ACTION: `{"deny": true}`, `{"allow": true}`, `{"tb": [max_tokens, tokens_per_fill,
//! fill_interval_ms]}`, `{"rptu": [n, unit]}` (requests_per_time_unit), `{"abandon": true}`;
//! with `"ttl_ms": n` (assignment_time_to_live; absent: none) and `"bucket": {…}`.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::Stream;
use redis_ratelimit_service::pb::envoy::r#type::v3::{rate_limit_strategy, RateLimitStrategy, TokenBucket};
use redis_ratelimit_service::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::{
    bucket_action, BucketAction,
};
use redis_ratelimit_service::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use redis_ratelimit_service::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

type Bucket = BTreeMap<String, String>;

struct Stream1 {
    tx: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    buckets: Vec<Bucket>,
}

#[derive(Default)]
struct State {
    auto: Option<Value>,
    streams: HashMap<u64, Stream1>,
    next: u64,
}

#[derive(Clone)]
struct Probe {
    state: Arc<Mutex<State>>,
    start: Instant,
}

impl Probe {
    fn emit(&self, mut v: Value) {
        v["t_ms"] = json!(self.start.elapsed().as_secs_f64() * 1000.0);
        println!("{v}");
    }
}

fn duration_ms(ms: u64) -> prost_types::Duration {
    prost_types::Duration { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 }
}

/// ACTION (see the module docs) for `bucket`.
fn action(spec: &Value, bucket: &Bucket) -> BucketAction {
    let id = BucketId { bucket: bucket.iter().map(|(k, v)| (k.clone(), v.clone())).collect() };
    if spec.get("abandon").is_some() {
        return BucketAction {
            bucket_id: Some(id),
            bucket_action: Some(bucket_action::BucketAction::AbandonAction(Default::default())),
        };
    }
    let strategy = if spec.get("deny").is_some() {
        rate_limit_strategy::Strategy::BlanketRule(rate_limit_strategy::BlanketRule::DenyAll as i32)
    } else if let Some(tb) = spec.get("tb").and_then(Value::as_array) {
        let n = |i: usize| tb.get(i).and_then(Value::as_u64).unwrap_or(1);
        rate_limit_strategy::Strategy::TokenBucket(TokenBucket {
            max_tokens: n(0) as u32,
            tokens_per_fill: Some(n(1) as u32),
            fill_interval: Some(duration_ms(n(2))),
        })
    } else if let Some(r) = spec.get("rptu").and_then(Value::as_array) {
        rate_limit_strategy::Strategy::RequestsPerTimeUnit(rate_limit_strategy::RequestsPerTimeUnit {
            requests_per_time_unit: r.first().and_then(Value::as_u64).unwrap_or(1),
            time_unit: r.get(1).and_then(Value::as_i64).unwrap_or(1) as i32,
        })
    } else {
        rate_limit_strategy::Strategy::BlanketRule(rate_limit_strategy::BlanketRule::AllowAll as i32)
    };
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(bucket_action::QuotaAssignmentAction {
            assignment_time_to_live: spec.get("ttl_ms").and_then(Value::as_u64).map(duration_ms),
            rate_limit_strategy: Some(RateLimitStrategy { strategy: Some(strategy) }),
        })),
    }
}

type Out = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for Probe {
    type StreamRateLimitQuotasStream = Out;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Out>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let id = {
            let mut st = self.state.lock().unwrap();
            st.next += 1;
            let id = st.next;
            st.streams.insert(id, Stream1 { tx: tx.clone(), buckets: Vec::new() });
            id
        };
        self.emit(json!({"ev": "open", "stream": id}));
        let me = self.clone();
        tokio::spawn(async move {
            let why = loop {
                match inbound.message().await {
                    Ok(Some(m)) => {
                        let usages: Vec<Value> = m
                            .bucket_quota_usages
                            .iter()
                            .map(|u| {
                                let b: Bucket = u
                                    .bucket_id
                                    .as_ref()
                                    .map(|b| b.bucket.clone().into_iter().collect())
                                    .unwrap_or_default();
                                let e = u.time_elapsed.map(|d| d.seconds as i128 * 1_000_000_000 + d.nanos as i128);
                                json!({"bucket": b, "allowed": u.num_requests_allowed,
                                       "denied": u.num_requests_denied, "elapsed_ns": e.map(|e| e as i64)})
                            })
                            .collect();
                        me.emit(json!({"ev": "report", "stream": id, "domain": m.domain, "usages": usages}));
                        let mut answers = Vec::new();
                        {
                            let mut st = me.state.lock().unwrap();
                            let auto = st.auto.clone();
                            if let Some(s) = st.streams.get_mut(&id) {
                                for u in &m.bucket_quota_usages {
                                    let b: Bucket = u
                                        .bucket_id
                                        .as_ref()
                                        .map(|b| b.bucket.clone().into_iter().collect())
                                        .unwrap_or_default();
                                    if !s.buckets.contains(&b) {
                                        s.buckets.push(b.clone());
                                        if let Some(a) = &auto {
                                            answers.push(action(a, &b));
                                        }
                                    }
                                }
                            }
                        }
                        if !answers.is_empty() {
                            let _ = tx.send(Ok(RateLimitQuotaResponse { bucket_action: answers })).await;
                        }
                    }
                    Ok(None) => break "end of stream".to_string(),
                    Err(e) => break e.to_string(),
                }
            };
            me.state.lock().unwrap().streams.remove(&id);
            me.emit(json!({"ev": "closed", "stream": id, "why": why}));
        });
        Ok(Response::new(Box::pin(tokio_stream_from(rx))))
    }
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<Result<RateLimitQuotaResponse, Status>>,
) -> impl Stream<Item = Result<RateLimitQuotaResponse, Status>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn command(probe: &Probe, line: &str) {
    let v: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return probe.emit(json!({"ev": "bad_command", "error": e.to_string()})),
    };
    let mut st = probe.state.lock().unwrap();
    if let Some(a) = v.get("auto") {
        st.auto = (!a.is_null()).then(|| a.clone());
    }
    if let Some(a) = v.get("push") {
        let only: Option<Bucket> = a.get("bucket").and_then(|b| serde_json::from_value(b.clone()).ok());
        for s in st.streams.values() {
            let actions: Vec<BucketAction> =
                s.buckets.iter().filter(|b| only.as_ref().is_none_or(|o| o == *b)).map(|b| action(a, b)).collect();
            if !actions.is_empty() {
                let _ = s.tx.try_send(Ok(RateLimitQuotaResponse { bucket_action: actions }));
            }
        }
    }
    if let Some(seq) = v.get("push_seq").and_then(Value::as_array) {
        for s in st.streams.values() {
            let actions: Vec<BucketAction> =
                s.buckets.iter().flat_map(|b| seq.iter().map(move |a| action(a, b))).collect();
            if !actions.is_empty() {
                let _ = s.tx.try_send(Ok(RateLimitQuotaResponse { bucket_action: actions }));
            }
        }
    }
    if v.get("close").is_some() {
        for (_, s) in st.streams.drain() {
            let _ = s.tx.try_send(Err(Status::unavailable("probe: closed")));
        }
    }
    drop(st);
    probe.emit(json!({"ev": "done", "command": v}));
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    let probe = Probe { state: Arc::default(), start: Instant::now() };
    probe.emit(json!({"ev": "listening", "addr": listener.local_addr().unwrap().to_string()}));
    let p = probe.clone();
    let (ltx, mut lrx) = mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if ltx.send(line).is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(line) = lrx.recv().await {
            command(&p, &line);
        }
        std::process::exit(0);
    });
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tonic::transport::Server::builder()
        .add_service(RateLimitQuotaServiceServer::new(probe))
        .serve_with_incoming(incoming)
        .await
        .expect("serve");
}
