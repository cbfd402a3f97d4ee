//! The Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3.RateLimitQuotaService`):
//! Envoy's `rate_limit_quota` filter enforces in process what this service pushes, and the
//! service turns each pushed token bucket into a lease on the module's limit, so that the
//! fleet bound `c + r·(W + L + d)` holds however many Envoys and replicas there are.
//! docs/quota-service.md is the manual (what Envoy 1.40 does, the design, the bound).
//!
//! * [`plan`]: the pure core: lease sizes, lease lives, settling, the local failure share.
//! * [`actions`]: the bucket actions as Envoy 1.40 applies them.
//! * [`buckets`]: a bucket id read as a descriptor; the cap on tracked buckets.
//! * [`store`]: the seam to Redis (claim, give back), implemented by the service's backend.
//! * [`stream`]: the gRPC stream handler.
//! * [`settings`], [`metrics`].

pub mod actions;
pub mod buckets;
pub mod metrics;
pub mod plan;
pub mod settings;
pub mod store;
pub mod stream;

pub use settings::{QuotaFlags, QuotaSettings};
pub use stream::QuotaService;
