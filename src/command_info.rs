//! Command documentation and key specs, registered with `RedisModule_SetCommandInfo` (Redis
//! 7.0+): `COMMAND DOCS`, `COMMAND INFO`, redis-cli's argument hints, ACL key checks and
//! cluster routing all read them. Each command's docs, arity and keys are in its table entry
//! beside its body (`commands`); this module has their vocabulary and registers them. Redis
//! copies everything it is given, so the C structures here only live for the call.

use std::ffi::CString;
use std::os::raw::{c_char, c_int};
use std::ptr::{null, null_mut};

use redis_module::raw;

use crate::commands::Command;

#[derive(Clone, Copy)]
pub enum Kind {
    Key,
    Integer,
    Text,
    Token,
    OneOf,
    Block,
}

/// One argument in a command's docs: name, kind, token, optional/multiple, children.
pub struct ArgDoc {
    name: &'static str,
    kind: Kind,
    token: Option<&'static str>,
    optional: bool,
    multiple: bool,
    children: &'static [ArgDoc],
}

pub const fn arg(name: &'static str, kind: Kind) -> ArgDoc {
    ArgDoc { name, kind, token: None, optional: false, multiple: false, children: &[] }
}

impl ArgDoc {
    pub const fn token(mut self, t: &'static str) -> ArgDoc {
        self.token = Some(t);
        self
    }
    pub const fn optional(mut self) -> ArgDoc {
        self.optional = true;
        self
    }
    pub const fn multiple(mut self) -> ArgDoc {
        self.multiple = true;
        self
    }
    pub const fn of(mut self, children: &'static [ArgDoc]) -> ArgDoc {
        self.children = children;
        self
    }
}

/// An optional pure token (DRYRUN, PARTIAL).
pub const fn flag(name: &'static str, token: &'static str) -> ArgDoc {
    arg(name, Kind::Token).token(token).optional()
}

/// Which keys a command touches and how (the flags of its key spec).
#[derive(Clone, Copy)]
pub enum Keys {
    None,
    /// The key at position 1.
    First(u64),
    /// `numkeys` at position 1, then that many keys.
    Numkeys(u64),
}

/// A command's docs for `COMMAND DOCS` and redis-cli.
pub struct Doc {
    pub summary: &'static str,
    pub complexity: &'static str,
    pub args: &'static [ArgDoc],
}

/// Key spec flags: read-write access + update (the checks), read-only access (RL.INFO), and a
/// delete (RL.RESET).
pub const RW_UPDATE: u64 =
    (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE) as u64;
/// Read-write + update, no access: changes what the key holds (a sliding-log commit applies to
/// the stored log) and returns nothing of it (RL.SETSTATE): write permission on the key only.
pub const RW_UPDATE_NO_ACCESS: u64 = (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE) as u64;
pub const RO_ACCESS: u64 = (raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS) as u64;
pub const RW_DELETE: u64 = (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE) as u64;

/// Keeps the C strings and arrays alive while Redis copies them.
#[derive(Default)]
struct Arena {
    strings: Vec<CString>,
    arrays: Vec<Vec<raw::RedisModuleCommandArg>>,
}

impl Arena {
    fn cstr(&mut self, s: &str) -> *const c_char {
        let c = CString::new(s).expect("no NUL in docs");
        let p = c.as_ptr();
        self.strings.push(c);
        p
    }

    fn args(&mut self, args: &[ArgDoc]) -> *mut raw::RedisModuleCommandArg {
        if args.is_empty() {
            return null_mut();
        }
        let mut out: Vec<raw::RedisModuleCommandArg> = Vec::with_capacity(args.len() + 1);
        for a in args {
            // SAFETY: a C struct of integers, pointers and unions of those: all zeroes is a valid
            // value (null pointers, no flags), the way C callers initialise it.
            let mut c: raw::RedisModuleCommandArg = unsafe { std::mem::zeroed() };
            c.name = self.cstr(a.name);
            c.type_ = match a.kind {
                Kind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
                Kind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                Kind::Text => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                Kind::Token => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
                Kind::OneOf => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
                Kind::Block => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
            };
            c.key_spec_index = if matches!(a.kind, Kind::Key) { 0 } else { -1 };
            c.token = a.token.map_or(null(), |t| self.cstr(t));
            c.flags = (if a.optional { raw::REDISMODULE_CMD_ARG_OPTIONAL } else { 0 }
                | if a.multiple { raw::REDISMODULE_CMD_ARG_MULTIPLE } else { 0 }) as c_int;
            c.subargs = self.args(a.children);
            out.push(c);
        }
        // SAFETY: as above; the all-zero entry ends the array.
        out.push(unsafe { std::mem::zeroed() });
        let p = out.as_mut_ptr();
        self.arrays.push(out);
        p
    }
}

static INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};

fn key_specs(keys: Keys) -> Vec<raw::RedisModuleCommandKeySpec> {
    // SAFETY: a C struct of integers, pointers and unions of those: all zeroes is a valid value
    // (null pointers, no flags), the way C callers initialise it.
    let mut spec: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    match keys {
        Keys::None => return Vec::new(),
        Keys::First(flags) => {
            spec.flags = flags;
            spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
            spec.bs.index.pos = 1;
            spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
            spec.fk.range =
                raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 { lastkey: 0, keystep: 1, limit: 0 };
        }
        Keys::Numkeys(flags) => {
            spec.flags = flags;
            spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
            spec.bs.index.pos = 1;
            spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
            spec.fk.keynum =
                raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2 { keynumidx: 0, firstkey: 1, keystep: 1 };
        }
    }
    // SAFETY: as above; the all-zero spec ends the array.
    vec![spec, unsafe { std::mem::zeroed() }]
}

/// Registers the docs and key specs of every command; a failure is logged, not fatal (the
/// commands work without docs).
pub fn register(ctx: *mut raw::RedisModuleCtx, commands: &[Command]) -> Result<(), String> {
    // SAFETY: reading the API table (None before Redis 7.0).
    let Some(set_info) = (unsafe { raw::RedisModule_SetCommandInfo }) else {
        return Ok(());
    };
    for command in commands {
        let (name, doc) = (command.name, &command.doc);
        let mut arena = Arena::default();
        let mut specs = key_specs(command.keys);
        // SAFETY: a C struct of integers and pointers: all zeroes is a valid value (no fields
        // set), the way C callers initialise it.
        let mut info: raw::RedisModuleCommandInfo = unsafe { std::mem::zeroed() };
        info.version = &INFO_VERSION;
        info.summary = arena.cstr(doc.summary);
        info.complexity = arena.cstr(doc.complexity);
        info.since = arena.cstr("0.1.0");
        info.arity = command.arity;
        info.key_specs = if specs.is_empty() { null_mut() } else { specs.as_mut_ptr() };
        info.args = arena.args(doc.args);
        // SAFETY: OnLoad's context and a NUL-terminated name.
        let registered = unsafe { raw::RedisModule_GetCommand.unwrap()(ctx, name.as_ptr()) };
        // SAFETY: a command of ours; `info` and everything it points to (the arena, the key
        // specs) live until the call returns, and Redis copies them.
        if registered.is_null() || unsafe { set_info(registered, &info) } != raw::REDISMODULE_OK as c_int {
            return Err(format!("could not set the command info of {}", name.to_string_lossy()));
        }
    }
    Ok(())
}
