//! Reply and error conversions shared by several server tests (cluster, errors, multi,
//! replication, replies). Included with `#[path = "common/values.rs"] mod values;`
//! (not a test target).
#![allow(dead_code)]

use redis::Value;

/// An array of integers (borrowed), panicking on anything else.
pub fn ints(v: &Value) -> Vec<i64> {
    match v {
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::Int(i) => *i,
                other => panic!("expected integers, got {other:?} in {v:?}"),
            })
            .collect(),
        other => panic!("expected an array of integers, got {other:?}"),
    }
}

/// An array of integers (owned), panicking on anything else.
pub fn into_ints(v: Value) -> Vec<i64> {
    match v {
        Value::Array(items) => items
            .into_iter()
            .map(|i| match i {
                Value::Int(n) => n,
                other => panic!("not an integer: {other:?}"),
            })
            .collect(),
        other => panic!("not an array: {other:?}"),
    }
}

/// The server's error line ("CODE detail").
pub fn full_error(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}
