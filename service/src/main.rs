//! `redis-ratelimit-service`: see docs/service.md.

use clap::Parser;
use redis_ratelimit_service::settings::Settings;

fn main() {
    let settings = Settings::parse();
    let filter = match settings.log_level.to_ascii_lowercase().as_str() {
        "debug" | "info" | "warn" | "error" | "trace" => {
            format!("{},h2=warn,tower=warn,hyper=warn", settings.log_level.to_ascii_lowercase())
        }
        "warning" => "warn".to_string(),
        other => other.to_string(),
    };
    let builder =
        tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::new(filter)).with_ansi(false);
    if settings.log_format.eq_ignore_ascii_case("json") {
        builder.json().init();
    } else {
        builder.init();
    }
    // envoyproxy/ratelimit's variables that this service does not implement: none is ignored
    // silently, and those that would make it enforce other limits stop it here.
    let unimplemented = redis_ratelimit_service::settings::unimplemented_settings(std::env::vars_os());
    for w in &unimplemented.warnings {
        tracing::warn!("{w}");
    }
    if !unimplemented.refusals.is_empty() {
        for r in &unimplemented.refusals {
            tracing::error!("{r}");
            eprintln!("redis-ratelimit-service: {r}");
        }
        std::process::exit(1);
    }
    let workers = match settings.worker_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("redis-ratelimit-service: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    tracing::info!("serving with {} worker thread(s)", rt.metrics().num_workers());
    if let Err(e) = rt.block_on(redis_ratelimit_service::server::run(settings)) {
        tracing::error!("{e}");
        eprintln!("redis-ratelimit-service: {e}");
        std::process::exit(1);
    }
}
