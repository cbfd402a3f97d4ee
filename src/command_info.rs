//! Command documentation and key specs, registered with `RedisModule_SetCommandInfo` (Redis
//! 7.0+): `COMMAND DOCS`, `COMMAND INFO`, redis-cli's argument hints, ACL key checks and
//! cluster routing all read them. Redis copies everything it is given, so the structures here
//! only live for the call.

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int};
use std::ptr::{null, null_mut};

use redis_module::raw;

#[derive(Clone, Copy)]
enum Kind {
    Key,
    Integer,
    Text,
    Token,
    OneOf,
    Block,
}

/// One argument: name, kind, token, optional/multiple, children.
#[derive(Clone)]
struct Arg {
    name: &'static str,
    kind: Kind,
    token: Option<&'static str>,
    optional: bool,
    multiple: bool,
    children: Vec<Arg>,
}

fn arg(name: &'static str, kind: Kind) -> Arg {
    Arg { name, kind, token: None, optional: false, multiple: false, children: Vec::new() }
}

impl Arg {
    fn token(mut self, t: &'static str) -> Arg {
        self.token = Some(t);
        self
    }
    fn optional(mut self) -> Arg {
        self.optional = true;
        self
    }
    fn multiple(mut self) -> Arg {
        self.multiple = true;
        self
    }
    fn of(mut self, children: Vec<Arg>) -> Arg {
        self.children = children;
        self
    }
}

fn flag(name: &'static str, token: &'static str) -> Arg {
    arg(name, Kind::Token).token(token).optional()
}

/// Which keys a command touches and how.
#[derive(Clone, Copy)]
enum Keys {
    None,
    /// The key at position 1.
    First(u64),
    /// `numkeys` at position 1, then that many keys.
    Numkeys(u64),
}

struct Doc {
    name: &'static CStr,
    summary: &'static str,
    complexity: &'static str,
    arity: c_int,
    keys: Keys,
    args: Vec<Arg>,
}

const RW_UPDATE: u64 =
    (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE) as u64;

fn limiter_args(with_burst: bool, period_name: &'static str) -> Vec<Arg> {
    let mut v = vec![arg("key", Kind::Key), arg("limit", Kind::Integer), arg(period_name, Kind::Text)];
    if with_burst {
        v.push(arg("burst", Kind::Integer).token("BURST").optional());
    }
    v.push(arg("cost", Kind::Integer).token("COST").optional());
    v.push(flag("dryrun", "DRYRUN"));
    v.push(flag("partial", "PARTIAL"));
    v
}

fn docs() -> Vec<Doc> {
    let limiter = |name, summary, complexity, burst, period| Doc {
        name,
        summary,
        complexity,
        arity: -4,
        keys: Keys::First(RW_UPDATE),
        args: limiter_args(burst, period),
    };
    let algorithms = ["GCRA", "TOKENBUCKET", "LEAKY", "SLIDING", "FIXED", "SLIDINGLOG"];
    vec![
        limiter(c"rl.gcra", "Rate-limits with GCRA: limit per period sustained, up to BURST at once", "O(1)", true, "period"),
        limiter(c"rl.tokenbucket", "Rate-limits with a token bucket of BURST tokens refilled at limit per period", "O(1)", true, "period"),
        limiter(c"rl.leaky", "Leaky bucket as a queue: admits up to BURST queued requests and replies how long to wait", "O(1)", true, "period"),
        limiter(c"rl.sliding", "Rate-limits with a sliding window counter (two weighted window counts)", "O(1)", false, "window"),
        limiter(c"rl.fixed", "Rate-limits with an epoch-aligned fixed window counter (quotas, daily caps)", "O(1)", false, "window"),
        limiter(
            c"rl.slidinglog",
            "Exact sliding window: admits when the units in the trailing window plus COST fit the limit",
            "O(1) amortized for admitted calls",
            false,
            "window",
        ),
        Doc {
            name: c"rl.multi",
            summary: "Checks several limits atomically, all or nothing (one limit spec per key)",
            complexity: "O(N) for N limits",
            arity: -6,
            // VARIABLE_FLAGS: Redis then asks the getkeys callback rather than the key spec,
            // so a malformed call declares no keys (and gets its own error, not CROSSSLOT);
            // clients still route by the spec.
            keys: Keys::Numkeys(RW_UPDATE | raw::REDISMODULE_CMD_KEY_VARIABLE_FLAGS as u64),
            args: vec![
                arg("numkeys", Kind::Integer),
                arg("key", Kind::Key).multiple(),
                arg("limit", Kind::Block).multiple().of(vec![
                    arg("algorithm", Kind::OneOf).of(algorithms.iter().map(|a| arg(a, Kind::Token).token(a)).collect()),
                    arg("limit", Kind::Integer),
                    arg("period", Kind::Text),
                    arg("burst", Kind::Integer).token("BURST").optional(),
                ]),
                arg("cost", Kind::Integer).token("COST").optional(),
                flag("dryrun", "DRYRUN"),
                flag("partial", "PARTIAL"),
            ],
        },
        Doc {
            name: c"rl.info",
            summary: "Returns a ratelimit key's algorithm, parameters, state and TTL",
            complexity: "O(1)",
            arity: 2,
            keys: Keys::First((raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS) as u64),
            args: vec![arg("key", Kind::Key)],
        },
        Doc {
            name: c"rl.reset",
            summary: "Deletes a ratelimit key",
            complexity: "O(1)",
            arity: 2,
            keys: Keys::First((raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE) as u64),
            args: vec![arg("key", Kind::Key)],
        },
        Doc {
            name: c"cl.throttle",
            summary: "redis-cell compatible GCRA check: [limited, limit, remaining, retry_after_s, reset_after_s]",
            complexity: "O(1)",
            arity: -5,
            keys: Keys::First(RW_UPDATE),
            args: vec![
                arg("key", Kind::Key),
                arg("max_burst", Kind::Integer),
                arg("count_per_period", Kind::Integer),
                arg("period", Kind::Integer),
                arg("quantity", Kind::Integer).optional(),
            ],
        },
        Doc {
            name: c"rl.setstate",
            summary: "Internal: stores a limiter state as computed by the primary (replication, AOF)",
            complexity: "O(N) for a payload of N bytes",
            arity: -3,
            keys: Keys::First(RW_UPDATE),
            args: vec![
                arg("key", Kind::Key),
                arg("payload", Kind::Text),
                arg("unix-time-milliseconds", Kind::Integer).token("PXAT").optional(),
            ],
        },
        Doc {
            name: c"rl.debug",
            summary: "Test clock (only when loaded with DEBUG_CLOCK): SET, ADVANCE, REAL, GET",
            complexity: "O(1)",
            arity: -3,
            keys: Keys::None,
            args: vec![
                arg("clock", Kind::Token).token("CLOCK"),
                arg("action", Kind::OneOf).of(vec![
                    arg("unix-us", Kind::Integer).token("SET"),
                    arg("us", Kind::Integer).token("ADVANCE"),
                    arg("real", Kind::Token).token("REAL"),
                    arg("get", Kind::Token).token("GET"),
                ]),
            ],
        },
        Doc {
            name: c"rl.return",
            summary: "Gives unused units back to a limiter: never above its capacity, only into the window they were taken from",
            complexity: "O(1)",
            arity: -3,
            keys: Keys::First(RW_UPDATE),
            args: vec![arg("key", Kind::Key), arg("n", Kind::Integer), arg("ms", Kind::Integer).token("AGE").optional()],
        },
    ]
}

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

    fn args(&mut self, args: &[Arg]) -> *mut raw::RedisModuleCommandArg {
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
            c.subargs = self.args(&a.children);
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

/// Registers the docs of every command; a failure is logged, not fatal (the commands work
/// without docs).
pub fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    // SAFETY: reading the API table (None before Redis 7.0).
    let Some(set_info) = (unsafe { raw::RedisModule_SetCommandInfo }) else {
        return Ok(());
    };
    for doc in docs() {
        let mut arena = Arena::default();
        let mut specs = key_specs(doc.keys);
        // SAFETY: a C struct of integers and pointers: all zeroes is a valid value (no fields
        // set), the way C callers initialise it.
        let mut info: raw::RedisModuleCommandInfo = unsafe { std::mem::zeroed() };
        info.version = &INFO_VERSION;
        info.summary = arena.cstr(doc.summary);
        info.complexity = arena.cstr(doc.complexity);
        info.since = arena.cstr("0.1.0");
        info.arity = doc.arity;
        info.key_specs = if specs.is_empty() { null_mut() } else { specs.as_mut_ptr() };
        info.args = arena.args(&doc.args);
        // SAFETY: OnLoad's context and a NUL-terminated name.
        let command = unsafe { raw::RedisModule_GetCommand.unwrap()(ctx, doc.name.as_ptr()) };
        // SAFETY: a command of ours; `info` and everything it points to (the arena, the key
        // specs) live until the call returns, and Redis copies them.
        if command.is_null() || unsafe { set_info(command, &info) } != raw::REDISMODULE_OK as c_int {
            return Err(format!("could not set the command info of {}", doc.name.to_string_lossy()));
        }
    }
    Ok(())
}
