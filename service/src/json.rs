//! `/json`: the same request and response as gRPC, in protobuf's JSON mapping (lowerCamelCase
//! names, the original snake_case names accepted too; enums by name; 64-bit integers as numbers
//! or strings; durations as `"1.500s"`; default values left out), as envoyproxy/ratelimit's
//! /json endpoint.

use serde::{Deserialize, Serialize};

use crate::pb::{self, Code, RateLimitRequest, RateLimitResponse, RateLimitUnit, Unit};

/// A protobuf-JSON unsigned integer (a number or a decimal string) from 0 to `max`; an error
/// names the field (`field()`: only formatted then).
fn uint(v: &serde_json::Value, max: u64, field: impl FnOnce() -> String) -> Result<u64, String> {
    let n = match v {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) if s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
        _ => None,
    };
    n.filter(|&n| n <= max).ok_or_else(|| format!("{} {v} is not an integer from 0 to {max}", field()))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct JEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JOverride {
    #[serde(default, alias = "requests_per_unit", rename = "requestsPerUnit")]
    requests_per_unit: Option<serde_json::Value>,
    #[serde(default)]
    unit: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JDescriptor {
    #[serde(default)]
    entries: Vec<JEntry>,
    #[serde(default)]
    limit: Option<JOverride>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JDescriptor>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<serde_json::Value>,
}

/// A unit by name (`"MINUTE"`) or number (`2`), as protobuf JSON has enums; an error names
/// the field. UNKNOWN (0) passes: the request's validation refuses it as for gRPC.
fn unit_from_json(v: &serde_json::Value, field: impl FnOnce() -> String) -> Result<i32, String> {
    let unit = match v {
        serde_json::Value::Number(n) => {
            n.as_i64().and_then(|i| i32::try_from(i).ok()).and_then(|i| RateLimitUnit::try_from(i).ok())
        }
        serde_json::Value::String(s) => RateLimitUnit::from_str_name(s),
        _ => None,
    };
    unit.map(|u| u as i32).ok_or_else(|| {
        format!("{} {v} is not a unit: expected SECOND, MINUTE, HOUR, DAY, MONTH or YEAR (or 1 to 6)", field())
    })
}

/// Parses a /json body into the gRPC request.
pub fn parse_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let j: JRequest = serde_json::from_slice(body).map_err(|e| format!("invalid JSON request: {e}"))?;
    let hits_addend = match &j.hits_addend {
        None => 0,
        Some(v) => uint(v, u32::MAX.into(), || "hitsAddend".into())? as u32,
    };
    let mut descriptors = Vec::with_capacity(j.descriptors.len());
    for (i, d) in j.descriptors.into_iter().enumerate() {
        let limit = match d.limit {
            None => None,
            Some(o) => Some(pb::RateLimitOverride {
                requests_per_unit: match &o.requests_per_unit {
                    None => 0,
                    Some(v) => uint(v, u32::MAX.into(), || format!("descriptors[{i}].limit.requestsPerUnit"))? as u32,
                },
                unit: match &o.unit {
                    None => 0,
                    Some(v) => unit_from_json(v, || format!("descriptors[{i}].limit.unit"))?,
                },
            }),
        };
        let hits_addend = match &d.hits_addend {
            None => None,
            Some(v) => Some(uint(v, u64::MAX, || format!("descriptors[{i}].hitsAddend"))?),
        };
        descriptors.push(pb::RateLimitDescriptor {
            entries: d.entries.into_iter().map(|e| pb::Entry { key: e.key, value: e.value }).collect(),
            limit,
            hits_addend,
        });
    }
    Ok(RateLimitRequest { domain: j.domain, descriptors, hits_addend })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OLimit {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(skip_serializing_if = "is_zero32")]
    requests_per_unit: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    unit: Option<&'static str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<OLimit>,
    #[serde(skip_serializing_if = "is_zero32")]
    limit_remaining: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

#[derive(Serialize)]
struct OHeader {
    key: String,
    value: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OResponse {
    #[serde(skip_serializing_if = "Option::is_none")]
    overall_code: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    statuses: Vec<OStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<OHeader>,
}

fn is_zero32(v: &u32) -> bool {
    *v == 0
}

fn code_name(c: i32) -> Option<&'static str> {
    match Code::try_from(c).unwrap_or(Code::Unknown) {
        Code::Unknown => None,
        c => Some(c.as_str_name()),
    }
}

/// protobuf JSON's Duration: seconds with 0, 3, 6 or 9 fractional digits and an `s`.
fn duration_json(d: &prost_types::Duration) -> String {
    let (s, n) = (d.seconds, d.nanos);
    if n == 0 {
        format!("{s}s")
    } else if n % 1_000_000 == 0 {
        format!("{s}.{:03}s", n / 1_000_000)
    } else if n % 1000 == 0 {
        format!("{s}.{:06}s", n / 1000)
    } else {
        format!("{s}.{n:09}s")
    }
}

/// Renders a response as /json answers it.
pub fn render_response(r: &RateLimitResponse) -> String {
    let o = OResponse {
        overall_code: code_name(r.overall_code),
        statuses: r
            .statuses
            .iter()
            .map(|s| OStatus {
                code: code_name(s.code),
                current_limit: s.current_limit.as_ref().map(|l| OLimit {
                    name: l.name.clone(),
                    requests_per_unit: l.requests_per_unit,
                    unit: match Unit::try_from(l.unit).unwrap_or(Unit::Unknown) {
                        Unit::Unknown => None,
                        u => Some(u.as_str_name()),
                    },
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s.duration_until_reset.as_ref().map(duration_json),
            })
            .collect(),
        response_headers_to_add: r
            .response_headers_to_add
            .iter()
            .map(|h| OHeader { key: h.key.clone(), value: h.value.clone() })
            .collect(),
    };
    serde_json::to_string(&o).unwrap_or_else(|_| "{}".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_spellings_and_string_integers() {
        let r = parse_request(
            br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"hits_addend":"3","limit":{"requestsPerUnit":5,"unit":"MINUTE"}}],"hitsAddend":2}"#,
        )
        .unwrap();
        assert_eq!(r.domain, "d");
        assert_eq!(r.hits_addend, 2);
        assert_eq!(r.descriptors[0].hits_addend, Some(3));
        assert_eq!(r.descriptors[0].limit.as_ref().unwrap().unit, RateLimitUnit::Minute as i32);
        assert!(parse_request(b"{\"domain\":1}").is_err());
        assert!(parse_request(b"{\"domian\":\"d\"}").is_err());
    }

    #[test]
    fn out_of_range_numbers_are_refused_naming_the_field() {
        let one =
            |d: &str| parse_request(format!(r#"{{"domain":"d","descriptors":[{{"entries":[]}},{d}]}}"#).as_bytes());
        let cases = [
            // 2^40 + 1 truncated to 32 bits is 1, SECOND.
            (r#"{"limit":{"requestsPerUnit":5,"unit":1099511627777}}"#, "descriptors[1].limit.unit 1099511627777"),
            (r#"{"limit":{"requestsPerUnit":5,"unit":4294967298}}"#, "descriptors[1].limit.unit"),
            (r#"{"limit":{"requestsPerUnit":5,"unit":7}}"#, "descriptors[1].limit.unit 7 is not a unit"),
            (r#"{"limit":{"requestsPerUnit":5,"unit":-1}}"#, "descriptors[1].limit.unit -1"),
            (r#"{"limit":{"requestsPerUnit":5,"unit":1.5}}"#, "descriptors[1].limit.unit 1.5"),
            (r#"{"limit":{"requestsPerUnit":5,"unit":"FORTNIGHT"}}"#, "descriptors[1].limit.unit \"FORTNIGHT\""),
            (r#"{"limit":{"requestsPerUnit":5,"unit":[]}}"#, "descriptors[1].limit.unit"),
            (r#"{"limit":{"requestsPerUnit":4294967296,"unit":"SECOND"}}"#, "descriptors[1].limit.requestsPerUnit"),
            (r#"{"limit":{"requestsPerUnit":-1,"unit":"SECOND"}}"#, "descriptors[1].limit.requestsPerUnit -1"),
            (r#"{"limit":{"requests_per_unit":"5x","unit":"SECOND"}}"#, "descriptors[1].limit.requestsPerUnit"),
            (r#"{"hitsAddend":18446744073709551616}"#, "descriptors[1].hitsAddend"),
            (r#"{"hits_addend":"-3"}"#, "descriptors[1].hitsAddend"),
            (r#"{"hitsAddend":true}"#, "descriptors[1].hitsAddend true"),
        ];
        for (d, want) in cases {
            let e = one(d).unwrap_err();
            assert!(e.starts_with(want), "{d}: {e}");
        }
        let e = parse_request(br#"{"domain":"d","hitsAddend":4294967296}"#).unwrap_err();
        assert!(e.starts_with("hitsAddend 4294967296 is not an integer from 0 to 4294967295"), "{e}");
        // In range, as numbers or strings, by name or number.
        let r =
            one(r#"{"limit":{"requestsPerUnit":"4294967295","unit":6},"hitsAddend":"18446744073709551615"}"#).unwrap();
        let l = r.descriptors[1].limit.as_ref().unwrap();
        assert_eq!((l.requests_per_unit, l.unit), (u32::MAX, RateLimitUnit::Year as i32));
        assert_eq!(r.descriptors[1].hits_addend, Some(u64::MAX));
        let r = one(r#"{"limit":{"unit":null},"hitsAddend":null}"#).unwrap();
        assert_eq!((r.descriptors[1].limit.as_ref().unwrap().unit, r.descriptors[1].hits_addend), (0, None));
    }

    #[test]
    fn renders_proto3_json() {
        let r = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![pb::DescriptorStatus {
                code: Code::OverLimit as i32,
                current_limit: Some(pb::RateLimit {
                    name: String::new(),
                    requests_per_unit: 1,
                    unit: Unit::Minute as i32,
                }),
                limit_remaining: 0,
                duration_until_reset: Some(prost_types::Duration { seconds: 59, nanos: 500_000_000 }),
                quota: None,
            }],
            ..Default::default()
        };
        assert_eq!(
            render_response(&r),
            r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":{"requestsPerUnit":1,"unit":"MINUTE"},"durationUntilReset":"59.500s"}]}"#
        );
    }
}
