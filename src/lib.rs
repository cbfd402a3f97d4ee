//! redis-ratelimit: native rate-limit commands for Redis. Registration only; see `commands`
//! for the commands, `core` for the algorithms, `state` for the native type.

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
pub mod core;
pub mod defrag_guard;
pub mod eviction;
pub mod metrics;
pub mod propagation;
pub mod reply;
mod state;
pub mod value;

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::{raw, redis_module, Context, RedisString, Status};

use commands::Args;
use state::RL_TYPE;

type Body = fn(*mut raw::RedisModuleCtx, Args) -> commands::CommandResult;

macro_rules! register {
    ($ctx:expr, $name:literal, $body:path, $flags:literal, $first:expr, $last:expr, $step:expr) => {{
        extern "C" fn run(ctx: *mut raw::RedisModuleCtx, argv: *mut *mut raw::RedisModuleString, argc: c_int) -> c_int {
            commands::dispatch(ctx, argv, argc, $name, $body as Body)
        }
        create_command(
            $ctx,
            CStr::from_bytes_with_nul(concat!($name, "\0").as_bytes()).unwrap(),
            run,
            $flags,
            $first,
            $last,
            $step,
        )?;
    }};
}

fn create_command(
    ctx: *mut raw::RedisModuleCtx,
    name: &CStr,
    run: extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int,
    flags: &CStr,
    first: c_int,
    last: c_int,
    step: c_int,
) -> Result<(), String> {
    // SAFETY: called from OnLoad with its context; the strings are NUL-terminated and Redis
    // copies them.
    let status = unsafe {
        raw::RedisModule_CreateCommand.unwrap()(ctx, name.as_ptr(), Some(run), flags.as_ptr(), first, last, step)
    };
    if status != raw::REDISMODULE_OK as c_int {
        return Err(format!("failed to register {}", name.to_string_lossy()));
    }
    Ok(())
}

fn register_commands(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    register!(ctx, "rl.gcra", commands::gcra_command, c"write deny-oom fast", 1, 1, 1);
    register!(ctx, "rl.tokenbucket", commands::token_bucket_command, c"write deny-oom fast", 1, 1, 1);
    register!(ctx, "rl.sliding", commands::sliding_command, c"write deny-oom fast", 1, 1, 1);
    register!(ctx, "rl.slidinglog", commands::sliding_log_command, c"write deny-oom fast", 1, 1, 1);
    register!(ctx, "rl.fixed", commands::fixed_command, c"write deny-oom fast", 1, 1, 1);
    register!(ctx, "rl.leaky", commands::leaky_command, c"write deny-oom fast", 1, 1, 1);
    register!(ctx, "cl.throttle", commands::cl_throttle, c"write deny-oom fast", 1, 1, 1);
    register!(ctx, "rl.multi", commands::multi, c"write deny-oom fast getkeys-api", 0, 0, 0);
    register!(ctx, "rl.info", commands::info, c"readonly fast", 1, 1, 1);
    register!(ctx, "rl.reset", commands::reset, c"write fast", 1, 1, 1);
    register!(ctx, "rl.setstate", commands::set_state, c"write deny-oom", 1, 1, 1);
    register!(ctx, "rl.debug", commands::debug, c"fast", 0, 0, 0);
    register!(ctx, "rl.return", commands::give_back, c"write deny-oom fast", 1, 1, 1);
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
            other => {
                ctx.log_warning(&format!(
                    "ratelimit: unknown module argument '{other}' (expected DEBUG_CLOCK or NO_DEFRAG_GUARD)"
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
    if let Err(e) = command_info::register(ctx.ctx) {
        ctx.log_warning(&format!("ratelimit: {e}"));
        return Status::Err;
    }
    match acl::register(ctx.ctx) {
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
