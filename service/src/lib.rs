//! redis-ratelimit-service: Envoy's global rate limit service
//! (`envoy.service.ratelimit.v3.RateLimitService`) in front of the redis-ratelimit module.
//!
//! * [`config`]: envoyproxy/ratelimit's YAML format (unchanged) and its extensions, loaded and
//!   matched as envoyproxy/ratelimit does.
//! * [`service`]: a request's descriptors decided together (one Redis command per request on a
//!   single server; the slot protocol on Redis Cluster), with the failure policies, metrics and
//!   response headers.
//! * [`backend`]: the Redis side: connections, the commands, the cross-slot protocol.
//! * [`server`]: gRPC (tonic) and HTTP (`/json`, `/healthcheck`, `/metrics`, `/rlconfig`), and the
//!   configuration reloader.
//!
//! docs/service.md is the manual.

pub mod backend;
pub mod config;
pub mod headers;
pub mod json;
pub mod leases;
pub mod metrics;
pub mod reload;
pub mod server;
pub mod service;
pub mod settings;

/// The generated protocol types (from the trimmed copies of Envoy's protos in proto/).
pub mod pb {
    pub mod envoy {
        pub mod service {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.service.ratelimit.v3");
                }
            }
        }
        pub mod extensions {
            pub mod common {
                pub mod ratelimit {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                    }
                }
            }
        }
        pub mod config {
            pub mod core {
                pub mod v3 {
                    tonic::include_proto!("envoy.config.core.v3");
                }
            }
        }
        pub mod r#type {
            pub mod v3 {
                tonic::include_proto!("envoy.r#type.v3");
            }
        }
    }

    pub use envoy::config::core::v3::HeaderValue;
    pub use envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{Entry, RateLimitOverride};
    pub use envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    pub use envoy::r#type::v3::RateLimitUnit;
    pub use envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
    pub use envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus, RateLimit};
    pub use envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    pub use envoy::service::ratelimit::v3::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
    pub use envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
}
