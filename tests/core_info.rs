//! RL.INFO's fields (`redis_ratelimit_core::info`), without a server: names in reply order,
//! values in µs and units, and a redis-cell key's arrival time rounded up to the µs. The same
//! fields through redis-server: tests/replies.rs and tests/cell_interop.rs.

use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::info::{cell_fields, fields, Field};
use redis_ratelimit_core::spec::{Spec, Update};
use redis_ratelimit_core::{Nanos, Rate, Request, Window, NANOS_PER_SEC};

const T0: Nanos = Nanos::new(1_700_000_000 * NANOS_PER_SEC);
const MIN: Nanos = Nanos::from_secs(60);

fn state(spec: Spec, cost: u64) -> State {
    match spec.check(None, T0, Request::new(cost)).unwrap().1 {
        Some(Update::Replace(s)) => s,
        Some(u) => u.apply(None).unwrap().unwrap(),
        None => panic!("no state"),
    }
}

fn names(f: &[(&'static str, Field)]) -> Vec<&'static str> {
    f.iter().map(|(n, _)| *n).collect()
}

/// The field called `name`; panics if there is none.
fn field(f: &[(&'static str, Field)], name: &str) -> Field {
    f.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).unwrap_or_else(|| panic!("no field {name}: {f:?}"))
}

#[test]
fn gcra_fields_show_the_rate_the_arrival_time_and_what_is_available() {
    let s = state(Spec::Gcra(Rate::new(10, MIN, 10).unwrap()), 4);
    let f = fields(&s, T0);
    assert_eq!(names(&f), ["algorithm", "limit", "period_us", "burst", "tat_us", "available"]);
    assert_eq!(field(&f, "algorithm"), Field::Text("gcra"));
    assert_eq!(field(&f, "period_us"), Field::Int(60_000_000));
    // 4 units of 6 s each after T0.
    assert_eq!(field(&f, "tat_us"), Field::Int(T0.as_i64() / 1_000 + 24_000_000));
    assert_eq!(field(&f, "available"), Field::Int(6));
    // Later, more is available; nothing else moves.
    let later = fields(&s, T0 + Nanos::from_secs(12));
    assert_eq!(field(&later, "available"), Field::Int(8));
    assert_eq!(later[..5], f[..5]);
}

#[test]
fn every_algorithm_names_its_fields() {
    let w = Window::new(10, MIN).unwrap();
    let r = Rate::new(10, MIN, 10).unwrap();
    let cases: [(Spec, &[&str]); 5] = [
        (Spec::TokenBucket(r), &["algorithm", "limit", "period_us", "burst", "tokens", "last_us", "available"]),
        (Spec::Leaky(r), &["algorithm", "limit", "period_us", "burst", "tat_us", "available"]),
        (Spec::Sliding(w), &["algorithm", "limit", "window_us", "window_start_us", "previous", "current", "estimate"]),
        (Spec::Fixed(w), &["algorithm", "limit", "window_us", "window_start_us", "count"]),
        (
            Spec::SlidingLog(w),
            &["algorithm", "limit", "window_us", "entries", "units", "in_window", "oldest_us", "newest_us"],
        ),
    ];
    for (spec, want) in cases {
        let f = fields(&state(spec, 3), T0);
        assert_eq!(names(&f), want, "{spec:?}");
        assert_eq!(field(&f, "algorithm"), Field::Text(spec.algorithm().name()));
    }
}

#[test]
fn a_redis_cell_arrival_time_is_rounded_up_to_the_microsecond() {
    assert_eq!(
        cell_fields(1_700_000_000_000_000_001),
        [
            ("algorithm", Field::Text("gcra")),
            ("source", Field::Text("redis-cell")),
            ("tat_us", Field::Int(1_700_000_000_000_001))
        ]
    );
    assert_eq!(field(&cell_fields(-1_500), "tat_us"), Field::Int(-1));
    assert_eq!(field(&cell_fields(7_000), "tat_us"), Field::Int(7));
}
