//! redis-ratelimit-service: Envoy's global rate limit service
//! (`envoy.service.ratelimit.v3.RateLimitService`) in front of the redis-ratelimit module.
//!
//! * [`config`]: envoyproxy/ratelimit's YAML format (unchanged) and its extensions, loaded and
//!   matched as envoyproxy/ratelimit does.
//! * [`service`]: a request's descriptors decided together (one Redis command per request on a
//!   single server; the slot protocol on Redis Cluster), with the failure policies, metrics and
//!   response headers.
//! * [`decision`]: the all-or-nothing rule of a request's descriptors (pure).
//! * [`backend`]: the Redis side: the commands, the cross-slot protocol.
//! * [`baseline`]: the benchmark's baseline (envoyproxy/ratelimit's Redis traffic).
//! * [`connection`]: the Redis connections.
//! * [`quota`]: the Rate Limit Quota Service (`StreamRateLimitQuotas`): Envoy enforces leases of
//!   the module's limits in process.
//! * [`server`]: gRPC (tonic) and HTTP (`/json`, `/healthcheck`, `/metrics`, `/rlconfig`), and the
//!   configuration reloader.
//!
//! docs/service.md is the manual.

pub mod backend;
pub mod baseline;
pub mod config;
pub mod connection;
pub mod decision;
pub mod headers;
pub mod json;
pub mod leases;
pub mod metrics;
pub mod quota;
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
            pub mod rate_limit_quota {
                pub mod v3 {
                    tonic::include_proto!("envoy.service.rate_limit_quota.v3");
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

#[cfg(test)]
mod wire {
    //! The messages as Envoy puts them on the wire: bytes written by hand from the field
    //! numbers of Envoy's own protos (api/envoy/service/ratelimit/v3/rls.proto,
    //! api/envoy/extensions/common/ratelimit/v3/ratelimit.proto, config/core/v3/base.proto),
    //! not from the trimmed copies, so a renumbered or retyped field fails here.
    use super::pb;
    use prost::Message;

    #[test]
    fn a_request_encoded_from_envoys_field_numbers_decodes() {
        #[rustfmt::skip]
        let bytes = [
            0x0A, 0x01, b'd',                    // domain = 1: "d"
            0x12, 0x12,                          // descriptors = 2: one, 18 bytes
              0x0A, 0x06,                        //   entries = 1
                0x0A, 0x01, b'k', 0x12, 0x01, b'v', //   key = 1, value = 2
              0x12, 0x04, 0x08, 0x07, 0x10, 0x02, //   limit = 2 {requests_per_unit = 1: 7, unit = 2: MINUTE}
              0x1A, 0x02, 0x08, 0x09,            //   hits_addend = 3 (UInt64Value {value = 1: 9})
            0x18, 0x05,                          // hits_addend = 3: 5
        ];
        let r = pb::RateLimitRequest::decode(&bytes[..]).unwrap();
        assert_eq!((r.domain.as_str(), r.hits_addend, r.descriptors.len()), ("d", 5, 1));
        let d = &r.descriptors[0];
        assert_eq!((d.entries[0].key.as_str(), d.entries[0].value.as_str()), ("k", "v"));
        let l = d.limit.as_ref().unwrap();
        assert_eq!((l.requests_per_unit, l.unit), (7, pb::RateLimitUnit::Minute as i32));
        assert_eq!(d.hits_addend, Some(9));
        assert_eq!(r.encode_to_vec(), bytes);
    }

    #[test]
    fn a_response_encodes_to_envoys_field_numbers() {
        let r = pb::RateLimitResponse {
            overall_code: pb::Code::OverLimit as i32,
            statuses: vec![pb::DescriptorStatus {
                code: pb::Code::OverLimit as i32,
                current_limit: Some(pb::RateLimit {
                    name: "n".into(),
                    requests_per_unit: 10,
                    unit: pb::Unit::Hour as i32,
                }),
                limit_remaining: 4,
                duration_until_reset: Some(prost_types::Duration { seconds: 30, nanos: 0 }),
                quota: None,
            }],
            response_headers_to_add: vec![pb::HeaderValue { key: "a".into(), value: "b".into(), raw_value: vec![] }],
            ..Default::default()
        };
        #[rustfmt::skip]
        let want = [
            0x08, 0x02,                          // overall_code = 1: OVER_LIMIT
            0x12, 0x11,                          // statuses = 2: 17 bytes
              0x08, 0x02,                        //   code = 1: OVER_LIMIT
              0x12, 0x07,                        //   current_limit = 2
                0x08, 0x0A, 0x10, 0x03,          //     requests_per_unit = 1: 10, unit = 2: HOUR
                0x1A, 0x01, b'n',                //     name = 3
              0x18, 0x04,                        //   limit_remaining = 3: 4
              0x22, 0x02, 0x08, 0x1E,            //   duration_until_reset = 4 {seconds = 1: 30}
            0x1A, 0x06,                          // response_headers_to_add = 3
              0x0A, 0x01, b'a', 0x12, 0x01, b'b', //   key = 1, value = 2
        ];
        assert_eq!(r.encode_to_vec(), want);
    }

    #[test]
    fn the_method_is_envoys() {
        assert_eq!(
            pb::envoy::service::ratelimit::v3::rate_limit_service_server::SERVICE_NAME,
            "envoy.service.ratelimit.v3.RateLimitService"
        );
    }
}
