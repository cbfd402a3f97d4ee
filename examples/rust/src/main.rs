//! A tiny HTTP service rate-limited per `X-API-Key` with RL.TOKENBUCKET.
//!
//!     REDIS_URL=redis://127.0.0.1:6379/ LISTEN=127.0.0.1:8080 \
//!     RL_LIMIT=10 RL_PERIOD=1s RL_BURST=20 cargo run --release
//!     curl -i -H 'X-API-Key: alice' http://127.0.0.1:8080/

use std::env;

use ratelimit_example::{serve, Policy};

fn var(name: &str, default: &str) -> String {
    env::var(name).unwrap_or_else(|_| default.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = Policy::new(var("RL_LIMIT", "10").parse()?, &var("RL_PERIOD", "1s"), var("RL_BURST", "20").parse()?);
    let client = redis::Client::open(var("REDIS_URL", "redis://127.0.0.1:6379/"))?;
    let conn = client.get_multiplexed_async_connection().await?;
    let listener = tokio::net::TcpListener::bind(var("LISTEN", "127.0.0.1:8080")).await?;
    println!("listening on http://{} ({policy:?})", listener.local_addr()?);
    serve(listener, conn, policy).await?;
    Ok(())
}
