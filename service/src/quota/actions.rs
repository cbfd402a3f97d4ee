//! The bucket actions the service pushes, as Envoy 1.40 applies them (docs/quota-service.md,
//! "What Envoy 1.40 does"): a TTL of whole seconds, at least one (shorter or unset expires at
//! once); a lease as `[DENY_ALL, token_bucket]` in one response, which sets the instance's
//! tokens to exactly `max_tokens` (a token bucket pushed alone keeps or scales the tokens
//! left). Pure: protos in, protos out.

use redis_ratelimit_client::Nanos;

use super::plan::{TokenBucketShare, LEASE_FILL_INTERVAL_S, SECOND};
use crate::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use crate::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Kind, QuotaAssignmentAction,
};
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use crate::pb::envoy::service::rate_limit_quota::v3::BucketId;

/// A TTL as Envoy counts it: whole seconds (rounded up), at least 1.
pub fn ttl(t: Nanos) -> prost_types::Duration {
    prost_types::Duration { seconds: t.as_u64().div_ceil(SECOND.as_u64()).max(1) as i64, nanos: 0 }
}

fn assign(id: &BucketId, strategy: Strategy, life: Nanos) -> BucketAction {
    BucketAction {
        bucket_id: Some(id.clone()),
        bucket_action: Some(Kind::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(ttl(life)),
            rate_limit_strategy: Some(RateLimitStrategy { strategy: Some(strategy) }),
        })),
    }
}

pub fn allow_all(id: &BucketId, ttl: Nanos) -> BucketAction {
    assign(id, Strategy::BlanketRule(BlanketRule::AllowAll as i32), ttl)
}

pub fn deny_all(id: &BucketId, ttl: Nanos) -> BucketAction {
    assign(id, Strategy::BlanketRule(BlanketRule::DenyAll as i32), ttl)
}

pub fn token_bucket(id: &BucketId, tb: TokenBucketShare, ttl: Nanos) -> BucketAction {
    assign(
        id,
        Strategy::TokenBucket(TokenBucket {
            max_tokens: tb.max_tokens,
            tokens_per_fill: Some(tb.tokens_per_fill),
            fill_interval: Some(prost_types::Duration { seconds: tb.fill_interval_s, nanos: 0 }),
        }),
        ttl,
    )
}

/// A lease of `units` (at most `u32::MAX`): the instance holds exactly that many tokens, refilled
/// by one a day, for `ttl`. No units: `DENY_ALL` alone.
pub fn lease(id: &BucketId, units: u64, ttl: Nanos) -> Vec<BucketAction> {
    let deny = deny_all(id, ttl);
    if units == 0 {
        return vec![deny];
    }
    let tb = TokenBucketShare {
        max_tokens: units.min(u32::MAX as u64) as u32,
        tokens_per_fill: 1,
        fill_interval_s: LEASE_FILL_INTERVAL_S,
    };
    vec![deny, token_bucket(id, tb, ttl)]
}

pub fn abandon(id: &BucketId) -> BucketAction {
    BucketAction { bucket_id: Some(id.clone()), bucket_action: Some(Kind::AbandonAction(AbandonAction {})) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn id() -> BucketId {
        BucketId { bucket: [("name".to_string(), "b".to_string())].into_iter().collect() }
    }

    #[test]
    fn ttls_are_whole_seconds_of_at_least_one() {
        assert_eq!(ttl(Nanos::ZERO).seconds, 1);
        assert_eq!(ttl(Nanos::new(1)).seconds, 1);
        assert_eq!(ttl(SECOND).seconds, 1);
        assert_eq!(ttl(SECOND + Nanos::new(1)).seconds, 2);
        assert_eq!(ttl(60 * SECOND).seconds, 60);
        assert_eq!(ttl(Nanos::MAX).nanos, 0);
    }

    #[test]
    fn a_lease_is_deny_then_a_token_bucket_in_one_response() {
        let a = lease(&id(), 42, Nanos::from_millis(1500));
        assert_eq!(a.len(), 2);
        let assignment = |b: &BucketAction| match &b.bucket_action {
            Some(Kind::QuotaAssignmentAction(q)) => *q,
            other => panic!("{other:?}"),
        };
        let strategy = |b: &BucketAction| assignment(b).rate_limit_strategy.unwrap().strategy.unwrap();
        for b in &a {
            assert_eq!(assignment(b).assignment_time_to_live, Some(prost_types::Duration { seconds: 2, nanos: 0 }));
        }
        assert_eq!(strategy(&a[0]), Strategy::BlanketRule(BlanketRule::DenyAll as i32));
        assert_eq!(
            strategy(&a[1]),
            Strategy::TokenBucket(TokenBucket {
                max_tokens: 42,
                tokens_per_fill: Some(1),
                fill_interval: Some(prost_types::Duration { seconds: 86_400, nanos: 0 }),
            })
        );
        assert_eq!(lease(&id(), 0, SECOND).len(), 1);
        assert_eq!(
            strategy(&lease(&id(), u64::MAX, SECOND)[1]),
            Strategy::TokenBucket(TokenBucket {
                max_tokens: u32::MAX,
                tokens_per_fill: Some(1),
                fill_interval: Some(prost_types::Duration { seconds: 86_400, nanos: 0 }),
            })
        );
    }

    /// The bytes as Envoy reads them, written from the field numbers of Envoy's own protos
    /// (rlqs.proto: BucketAction {bucket_id = 1, quota_assignment_action = 2, abandon_action =
    /// 3}, QuotaAssignmentAction {assignment_time_to_live = 2, rate_limit_strategy = 3};
    /// ratelimit_strategy.proto: blanket_rule = 1, token_bucket = 3; token_bucket.proto:
    /// max_tokens = 1, tokens_per_fill = 2, fill_interval = 3), not from the trimmed copies.
    #[test]
    fn actions_encode_to_envoys_field_numbers() {
        #[rustfmt::skip]
        let bucket = [0x0A, 0x0B, 0x0A, 0x09, 0x0A, 0x04, b'n', b'a', b'm', b'e', 0x12, 0x01, b'b'];
        let mut want = bucket.to_vec();
        #[rustfmt::skip]
        want.extend([
            0x12, 0x08,                   // quota_assignment_action = 2
              0x12, 0x02, 0x08, 0x03,     //   assignment_time_to_live = 2 {seconds = 1: 3}
              0x1A, 0x02, 0x08, 0x01,     //   rate_limit_strategy = 3 {blanket_rule = 1: DENY_ALL}
        ]);
        assert_eq!(deny_all(&id(), 3 * SECOND).encode_to_vec(), want);
        let mut want = bucket.to_vec();
        #[rustfmt::skip]
        want.extend([
            0x12, 0x12,                   // quota_assignment_action = 2
              0x12, 0x02, 0x08, 0x01,     //   assignment_time_to_live {seconds: 1}
              0x1A, 0x0C, 0x1A, 0x0A,     //   rate_limit_strategy {token_bucket = 3}
                0x08, 0x07,               //     max_tokens = 1: 7
                0x12, 0x02, 0x08, 0x01,   //     tokens_per_fill = 2 {value = 1: 1}
                0x1A, 0x02, 0x08, 0x02,   //     fill_interval = 3 {seconds: 2}
        ]);
        let tb = TokenBucketShare { max_tokens: 7, tokens_per_fill: 1, fill_interval_s: 2 };
        assert_eq!(token_bucket(&id(), tb, SECOND).encode_to_vec(), want);
        let mut want = bucket.to_vec();
        want.extend([0x1A, 0x00]); // abandon_action = 3 {}
        assert_eq!(abandon(&id()).encode_to_vec(), want);
    }
}
