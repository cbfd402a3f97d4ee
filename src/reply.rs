//! Replies: an array of integers under RESP2, a map with named fields under RESP3.

use std::ffi::CString;
use std::os::raw::{c_char, c_long};

use redis_module::raw::{self, RedisModuleCtx};

use redis_ratelimit_core::info::Field;
use redis_ratelimit_core::{Decision, DECISION_FIELDS};

pub fn resp3(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: the API is loaded once the module is; ctx is the command's context.
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx) } as u32;
    flags & raw::REDISMODULE_CTX_FLAGS_RESP3 != 0
}

pub fn integer(ctx: *mut RedisModuleCtx, v: i64) {
    // SAFETY: ctx is the running command's context (lib.rs).
    unsafe { raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, v) };
}

pub fn bulk(ctx: *mut RedisModuleCtx, s: &[u8]) {
    // SAFETY: ctx is the running command's context (lib.rs); Redis copies the bytes.
    unsafe { raw::RedisModule_ReplyWithStringBuffer.unwrap()(ctx, s.as_ptr() as *const c_char, s.len()) };
}

pub fn simple(ctx: *mut RedisModuleCtx, s: &'static std::ffi::CStr) {
    // SAFETY: ctx is the running command's context (lib.rs); a NUL-terminated string Redis copies.
    unsafe { raw::RedisModule_ReplyWithSimpleString.unwrap()(ctx, s.as_ptr()) };
}

pub fn null(ctx: *mut RedisModuleCtx) {
    // SAFETY: ctx is the running command's context (lib.rs).
    unsafe { raw::RedisModule_ReplyWithNull.unwrap()(ctx) };
}

pub fn array(ctx: *mut RedisModuleCtx, len: usize) {
    // SAFETY: ctx is the running command's context (lib.rs).
    unsafe { raw::RedisModule_ReplyWithArray.unwrap()(ctx, len as c_long) };
}

pub fn map(ctx: *mut RedisModuleCtx, pairs: usize) {
    // SAFETY: ctx is the running command's context (lib.rs).
    unsafe { raw::RedisModule_ReplyWithMap.unwrap()(ctx, pairs as c_long) };
}

/// An error reply; `msg` starts with its code (ERR, WRONGTYPE, …).
pub fn error(ctx: *mut RedisModuleCtx, msg: &str) {
    let msg = CString::new(msg.replace(['\0', '\r', '\n'], " ")).unwrap_or_default();
    // SAFETY: ctx is the running command's context (lib.rs); a NUL-terminated string Redis copies.
    unsafe { raw::RedisModule_ReplyWithError.unwrap()(ctx, msg.as_ptr()) };
}

/// A limiter reply: `[allowed, limit, remaining, retry_after_ms, reset_after_ms(, delay_ms)]`,
/// or the same as a map under RESP3.
pub fn decision(ctx: *mut RedisModuleCtx, d: &Decision, with_delay: bool) {
    let (values, n) = d.reply_values(with_delay);
    named_integers(ctx, &DECISION_FIELDS[..n], &values[..n]);
}

/// Integers with names: a map under RESP3, a plain array of the values under RESP2.
pub fn named_integers(ctx: *mut RedisModuleCtx, names: &[&str], values: &[i64]) {
    if resp3(ctx) {
        map(ctx, names.len());
        for (name, v) in names.iter().zip(values) {
            bulk(ctx, name.as_bytes());
            integer(ctx, *v);
        }
    } else {
        array(ctx, values.len());
        values.iter().for_each(|v| integer(ctx, *v));
    }
}

/// Field/value pairs: a map under RESP3, a flat array under RESP2.
pub fn fields(ctx: *mut RedisModuleCtx, pairs: &[(&str, Field)]) {
    if resp3(ctx) {
        map(ctx, pairs.len());
    } else {
        array(ctx, pairs.len() * 2);
    }
    for (name, value) in pairs {
        bulk(ctx, name.as_bytes());
        match value {
            Field::Int(v) => integer(ctx, *v),
            Field::Text(t) => bulk(ctx, t.as_bytes()),
        }
    }
}
