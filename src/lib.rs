//! redis-ratelimit: native rate-limit commands for Redis. Registration only; see `commands`
//! for the commands (and their table), the `redis-ratelimit-core` crate (`core/`) for the
//! algorithms, `state` for the native type.

// The glue's functions take the context pointer Redis hands to a command (or callback), valid
// for its duration; marking each `unsafe` would only move the same contract around. Everything
// else that rests on a contract is `unsafe`, and every unsafe block says why it holds.
#![allow(clippy::not_unsafe_ptr_arg_deref)]
#![warn(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

pub mod acl;
pub mod alloc;
pub mod args;
pub mod clock;
pub mod command_info;
mod commands;
pub mod defrag_guard;
pub mod eviction;
pub mod metrics;
pub mod propagation;
pub mod reply;
mod state;
pub mod value;

use std::os::raw::c_int;

use redis_module::{raw, redis_module, Context, RedisString, Status};

use state::RL_TYPE;

/// The commands' table (each command's facts beside its body, in `commands`).
pub use commands::{Command, ALL as COMMANDS};

/// Registers every command of the table: its entry point and flags. The first, last and step
/// of its keys: the key at position 1, or none declared by position (RL.MULTI finds its keys
/// with the getkeys API, RL.DEBUG has none).
fn register_commands(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    for c in COMMANDS {
        let (first, last, step) = match c.keys {
            command_info::Keys::First(_) => (1, 1, 1),
            command_info::Keys::Numkeys(_) | command_info::Keys::None => (0, 0, 0),
        };
        // SAFETY: called from OnLoad with its context; the strings are NUL-terminated and Redis
        // copies them; the entry point is a plain function that lives as long as the module.
        let status = unsafe {
            raw::RedisModule_CreateCommand.unwrap()(
                ctx,
                c.name.as_ptr(),
                Some(c.run),
                c.flags.as_ptr(),
                first,
                last,
                step,
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(format!("failed to register {}", c.name.to_string_lossy()));
        }
    }
    Ok(())
}

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    for arg in args {
        match arg.to_string_lossy().to_ascii_uppercase().as_str() {
            "DEBUG_CLOCK" => {
                clock::enable_debug();
                ctx.log_warning("ratelimit: DEBUG_CLOCK is on: RL.DEBUG can set the module's clock (tests only)");
            }
            "NO_DEFRAG_GUARD" => defrag_guard::disable(),
            "REDIS_CELL_KEYS" => {
                state::enable_cell_keys();
                ctx.log_notice("ratelimit: REDIS_CELL_KEYS: the RL.* commands read and take over keys redis-cell left");
            }
            other => {
                ctx.log_warning(&format!(
                    "ratelimit: unknown module argument '{other}' (expected DEBUG_CLOCK, NO_DEFRAG_GUARD or REDIS_CELL_KEYS)"
                ));
                return Status::Err;
            }
        }
    }
    if let Err(e) = alloc::check() {
        ctx.log_warning(&format!("ratelimit: {e}: this module needs 16-byte aligned allocations"));
        return Status::Err;
    }
    state::set_module_options(ctx.ctx);
    // SAFETY: reading the API table RedisModule_Init filled in.
    let replace_value = unsafe { raw::RedisModule_ModuleTypeReplaceValue };
    value::enable_inline(replace_value.is_some());
    if let Err(e) = register_commands(ctx.ctx) {
        ctx.log_warning(&format!("ratelimit: {e}"));
        return Status::Err;
    }
    if let Err(e) = command_info::register(ctx.ctx, COMMANDS) {
        ctx.log_warning(&format!("ratelimit: {e}"));
        return Status::Err;
    }
    match acl::register(ctx.ctx, COMMANDS) {
        Ok(support) => ctx.log_notice(&format!("ratelimit: ACL categories: {}", support.describe())),
        Err(e) => {
            ctx.log_warning(&format!("ratelimit: {e}"));
            return Status::Err;
        }
    }
    // SAFETY: OnLoad's context; the callback is a plain function that lives as long as the module.
    unsafe { raw::RedisModule_RegisterInfoFunc.unwrap()(ctx.ctx, Some(metrics::info)) };
    let config_events = eviction::watch(ctx.ctx);
    propagation::watch(ctx.ctx, config_events);
    Status::Ok
}

redis_module! {
    name: "ratelimit",
    version: 1,
    allocator: (alloc::ModuleAlloc, alloc::ModuleAlloc),
    data_types: [RL_TYPE],
    init: init,
}
