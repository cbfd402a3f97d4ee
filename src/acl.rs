//! ACL categories of the commands, where the server has them.
//!
//! Redis 7.0 puts module commands in no ACL category: they are granted by name only. From
//! Redis 7.2 (and in every Valkey) `RedisModule_SetCommandACLCategories` places them in the
//! built-in categories, and from Redis 7.4 / Valkey 8 `RedisModule_AddACLCategory` adds the
//! module's own `@ratelimit`, so `ACL SETUSER app +@ratelimit` grants exactly the application
//! commands. Whatever the server offers is used at load; on 7.0 nothing is done.
//!
//! Each command's categories are in its table entry beside its body (`commands`).
//!
//! RL.SETSTATE (stores any valid state it is given) and RL.DEBUG (moves the module clock when
//! loaded with DEBUG_CLOCK) are not application commands: they are not in `@ratelimit`, and are
//! in `@dangerous` like RESTORE and DEBUG, so `-@dangerous` removes them (docs/operations.md).

use std::os::raw::c_int;

use redis_module::raw;

use crate::commands::Command;

/// The module's own category.
pub const CATEGORY: &str = "ratelimit";

/// One command's categories (its `acl` in its table entry, `commands`).
#[derive(Clone, Copy, Debug)]
pub struct Acl {
    /// Built-in categories implied by what the command does.
    pub builtin: &'static str,
    /// Also in `@ratelimit`: what an application needs.
    pub ratelimit: bool,
}

/// What the server let us do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Redis 7.0: no categories for module commands.
    None,
    /// Redis 7.2: built-in categories only.
    Builtin,
    /// Redis 7.4+, Valkey 8+: built-in categories and `@ratelimit`.
    WithRatelimit,
}

impl Support {
    pub fn describe(self) -> &'static str {
        match self {
            Support::None => "none (this server puts module commands in no ACL category: grant them by name)",
            Support::Builtin => "built-in categories only (this server cannot add @ratelimit)",
            Support::WithRatelimit => "built-in categories and @ratelimit",
        }
    }
}

/// Puts every registered command in its categories. Called once from the module's OnLoad,
/// after the commands are registered (both APIs only work during OnLoad).
pub fn register(ctx: *mut raw::RedisModuleCtx, commands: &[Command]) -> Result<Support, String> {
    // SAFETY: the API table is filled in by RedisModule_Init; a function this server does not
    // export stays None.
    let (Some(set_categories), Some(get_command)) = (
        unsafe { raw::RedisModule_SetCommandACLCategories },
        // SAFETY: as above.
        unsafe { raw::RedisModule_GetCommand },
    ) else {
        return Ok(Support::None);
    };
    // SAFETY: as above.
    let with_ratelimit = match unsafe { raw::RedisModule_AddACLCategory } {
        None => false,
        Some(add) => {
            let name = c"ratelimit";
            // SAFETY: OnLoad's context and a NUL-terminated name.
            if unsafe { add(ctx, name.as_ptr()) } == raw::REDISMODULE_OK as c_int {
                true
            } else {
                let error = std::io::Error::last_os_error();
                // EBUSY: the category exists already; categories outlive a module (Redis never
                // removes one), so it is ours from an earlier load or shared with another module.
                match error.raw_os_error() {
                    Some(libc::EBUSY) => true,
                    _ => return Err(format!("could not add the ACL category @{CATEGORY}: {error}")),
                }
            }
        }
    };
    for c in commands {
        let categories = match (with_ratelimit, c.acl.ratelimit) {
            (true, true) => format!("{} {CATEGORY}\0", c.acl.builtin),
            _ => format!("{}\0", c.acl.builtin),
        };
        // SAFETY: OnLoad's context and a NUL-terminated name.
        let command = unsafe { get_command(ctx, c.name.as_ptr()) };
        if command.is_null() {
            return Err(format!("ACL categories for {}: no such command", c.name.to_string_lossy()));
        }
        // SAFETY: a command of ours and a NUL-terminated list, which Redis parses during the call.
        if unsafe { set_categories(command, categories.as_ptr().cast()) } != raw::REDISMODULE_OK as c_int {
            return Err(format!(
                "could not set the ACL categories '{}' of {}",
                categories.trim_end_matches('\0'),
                c.name.to_string_lossy()
            ));
        }
    }
    Ok(if with_ratelimit { Support::WithRatelimit } else { Support::Builtin })
}
