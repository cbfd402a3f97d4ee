//! The limiter algorithms, and every fact the crates know about each, given once: in
//! [`Algorithm::facts`], one exhaustive `match` whose arms are whole [`Facts`], so that a new
//! algorithm does not compile until each of its facts is stated, and a new fact does not
//! compile until each algorithm states it. Nothing else in the workspace lists algorithms by
//! property.

/// The algorithms, and [`Algorithm::ALL`] in the same order (one list: the macro writes both).
macro_rules! algorithms {
    ($($(#[$doc:meta])* $variant:ident,)*) => {
        /// A limiter algorithm of the module (one `RL.*` command each).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Algorithm {
            $($(#[$doc])* $variant,)*
        }

        impl Algorithm {
            /// Every algorithm, in the order of their encoding tags.
            pub const ALL: [Algorithm; [$(Algorithm::$variant),*].len()] = [$(Algorithm::$variant),*];
        }
    };
}

algorithms! {
    /// `RL.GCRA`: sustained rate with bursts.
    Gcra,
    /// `RL.TOKENBUCKET`: the same answers as GCRA.
    TokenBucket,
    /// `RL.SLIDING`: sliding window counter.
    Sliding,
    /// `RL.FIXED`: fixed (calendar) window.
    Fixed,
    /// `RL.SLIDINGLOG`: exact sliding log.
    SlidingLog,
    /// `RL.LEAKY`: leaky bucket as a queue (replies carry `delay`).
    Leaky,
}

/// The window `w` of a limit's policy in the rate-limit headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyWindow {
    /// The period itself (the windows).
    Period,
    /// The time to refill the capacity from empty, `capacity × period ÷ limit` (the buckets).
    Refill,
}

/// How capacity comes back after units are taken (what local reservations can count on
/// between claims).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refill {
    /// Continuously, `limit` per `period` (the buckets).
    Continuous,
    /// All at once when the window ends (the fixed window).
    AtWindowEnd,
    /// As the previous window's weight decays, the current window's count becoming it at the
    /// window's end (the sliding counter).
    WindowWeight,
    /// Unit by unit as each leaves the trailing window (the sliding log).
    PerUnit,
}

/// What the crates know about an algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts {
    /// Its name, lower case: RL.INFO's `algorithm`, the module's messages, and (in any case)
    /// its word in RL.MULTI.
    pub name: &'static str,
    /// Its command: `RL.` and the name, upper case.
    pub command: &'static str,
    /// Its name in the service's configuration (`algorithm: token_bucket`) and Redis keys.
    pub config_name: &'static str,
    /// Its tag in the stored encoding (codec.rs): never changes.
    pub tag: u8,
    /// Rate-based (`limit` per `period`, a capacity of `BURST`), rather than `limit` per window.
    pub bucket: bool,
    /// RL.RETURN can give units back (a sliding log cannot tell its entries apart from other
    /// callers'; a leaky bucket's queue slots are all promised).
    pub returnable: bool,
    /// Local reservations can serve it from batches (the sliding log needs each request's
    /// instant; every admitted leaky request needs its own delay).
    pub leasable: bool,
    /// An admitted request may have to wait: the reply carries `delay`.
    pub delays: bool,
    pub refill: Refill,
    pub policy_window: PolicyWindow,
}

impl Algorithm {
    /// Every fact of this algorithm.
    #[inline]
    pub const fn facts(self) -> Facts {
        match self {
            Algorithm::Gcra => Facts {
                name: "gcra",
                command: "RL.GCRA",
                config_name: "gcra",
                tag: 1,
                bucket: true,
                returnable: true,
                leasable: true,
                delays: false,
                refill: Refill::Continuous,
                policy_window: PolicyWindow::Refill,
            },
            Algorithm::TokenBucket => Facts {
                name: "tokenbucket",
                command: "RL.TOKENBUCKET",
                config_name: "token_bucket",
                tag: 2,
                bucket: true,
                returnable: true,
                leasable: true,
                delays: false,
                refill: Refill::Continuous,
                policy_window: PolicyWindow::Refill,
            },
            Algorithm::Sliding => Facts {
                name: "sliding",
                command: "RL.SLIDING",
                config_name: "sliding",
                tag: 3,
                bucket: false,
                returnable: true,
                leasable: true,
                delays: false,
                refill: Refill::WindowWeight,
                policy_window: PolicyWindow::Period,
            },
            Algorithm::Fixed => Facts {
                name: "fixed",
                command: "RL.FIXED",
                config_name: "fixed",
                tag: 4,
                bucket: false,
                returnable: true,
                leasable: true,
                delays: false,
                refill: Refill::AtWindowEnd,
                policy_window: PolicyWindow::Period,
            },
            Algorithm::SlidingLog => Facts {
                name: "slidinglog",
                command: "RL.SLIDINGLOG",
                config_name: "sliding_log",
                tag: 5,
                bucket: false,
                returnable: false,
                leasable: false,
                delays: false,
                refill: Refill::PerUnit,
                policy_window: PolicyWindow::Period,
            },
            Algorithm::Leaky => Facts {
                name: "leaky",
                command: "RL.LEAKY",
                config_name: "leaky",
                tag: 6,
                bucket: true,
                returnable: false,
                leasable: false,
                delays: true,
                refill: Refill::Continuous,
                policy_window: PolicyWindow::Refill,
            },
        }
    }

    /// RL.INFO's `algorithm` (`gcra`, `tokenbucket`, …).
    #[inline]
    pub const fn name(self) -> &'static str {
        self.facts().name
    }

    /// The command (`RL.GCRA`, …).
    #[inline]
    pub const fn command(self) -> &'static str {
        self.facts().command
    }

    /// The word in `RL.MULTI` (`GCRA`, `TOKENBUCKET`, …): the command without `RL.`.
    #[inline]
    pub fn multi_name(self) -> &'static str {
        &self.command()[3..]
    }

    /// The name in the service's configuration (`token_bucket`, `sliding_log`, …).
    #[inline]
    pub const fn config_name(self) -> &'static str {
        self.facts().config_name
    }

    /// The algorithm of a configuration name (exact: the service lower-cases first).
    pub fn from_config_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.config_name() == name)
    }

    /// The encoding's tag.
    #[inline]
    pub const fn tag(self) -> u8 {
        self.facts().tag
    }

    /// The algorithm of an encoding's tag.
    pub fn from_tag(tag: u8) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.tag() == tag)
    }

    /// GCRA, token bucket and leaky bucket: `limit` per `period` with a `BURST`.
    #[inline]
    pub const fn is_bucket(self) -> bool {
        self.facts().bucket
    }

    /// Whether `RL.RETURN` gives units back.
    #[inline]
    pub const fn returnable(self) -> bool {
        self.facts().returnable
    }

    /// Whether local reservations serve it from batches.
    #[inline]
    pub const fn leasable(self) -> bool {
        self.facts().leasable
    }

    /// Whether its replies carry `delay`.
    #[inline]
    pub const fn delays(self) -> bool {
        self.facts().delays
    }

    /// How capacity comes back.
    #[inline]
    pub const fn refill(self) -> Refill {
        self.facts().refill
    }

    /// The window `w` of its policy in the rate-limit headers.
    #[inline]
    pub const fn policy_window(self) -> PolicyWindow {
        self.facts().policy_window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_tags_are_one_fact_each() {
        for (i, a) in Algorithm::ALL.into_iter().enumerate() {
            let f = a.facts();
            // Tags in ALL's order, from 1 (the encoding's ids never move).
            assert_eq!(f.tag as usize, i + 1, "{a:?}");
            assert_eq!(Algorithm::from_tag(f.tag), Some(a));
            assert_eq!(Algorithm::from_config_name(f.config_name), Some(a));
            // The command is RL. and the name, upper case.
            assert_eq!(f.command, format!("RL.{}", f.name.to_ascii_uppercase()), "{a:?}");
            assert!(a.multi_name().eq_ignore_ascii_case(f.name));
        }
        assert_eq!(Algorithm::from_tag(0), None);
        assert_eq!(Algorithm::from_tag(Algorithm::ALL.len() as u8 + 1), None);
    }
}
