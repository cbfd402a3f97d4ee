//! A hashed timer wheel: the engine's per-shard deadlines (lease expiry, idle returns,
//! forgetting, lost claims), sans IO. Each slot holds the entries due within one granule;
//! inserting and firing cost O(1) per entry. [`Wheel::pop_due`] is exact (it yields every entry
//! due at or before `now`, and none later), while [`Wheel::next_due`] names the end of the
//! earliest non-empty granule, so a driver that sleeps until then wakes once per granule, at
//! most one granule late. An entry further than the wheel's span is kept in the last slot and
//! placed again when that slot comes round (a far deadline costs one move per revolution).
//! Idle cost does not depend on how many entries wait.

use redis_ratelimit_core::Nanos;

/// An entry: the slab index and generation of the key it wakes. Its instant is the owner's to
/// tell ([`Wheel::pop_due`] asks): 8 bytes per scheduled key, and a superseded entry is
/// recognised (its owner answers `None`) and dropped.
pub(crate) type Item = (u32, u32);

#[derive(Debug)]
pub(crate) struct Wheel {
    slots: Box<[Vec<Item>]>,
    granularity: Nanos,
    /// The start of the granule of the slot at `cursor` (the current one).
    start: Nanos,
    cursor: usize,
    len: usize,
    /// While `len > 0`: no slot before `cursor + first` (in wheel order) holds an entry, and
    /// that one does unless it was emptied by `pop_due`, which recomputes it.
    first: usize,
}

impl Wheel {
    pub fn new(granularity: Nanos, slots: usize) -> Wheel {
        Wheel {
            slots: (0..slots.max(2)).map(|_| Vec::new()).collect(),
            granularity: granularity.max(Nanos::new(1)),
            start: Nanos::ZERO,
            cursor: 0,
            len: 0,
            first: 0,
        }
    }

    /// Schedules `item` for `at`.
    pub fn insert(&mut self, now: Nanos, at: Nanos, item: Item) {
        if self.len == 0 && self.start + self.granularity <= now {
            self.start = now;
        }
        let n = self.slots.len() as u64;
        let ahead = (at - self.start).div_span(self.granularity).min(n - 1);
        let slot = &mut self.slots[(self.cursor + ahead as usize) % self.slots.len()];
        if slot.len() == slot.capacity() && slot.capacity() < 4 {
            // Most granules of a small shard hold one or two keys: room for 4 would be half
            // unused (issue 19's memory per key).
            slot.reserve_exact(1);
        }
        slot.push(item);
        self.first = if self.len == 0 { ahead as usize } else { self.first.min(ahead as usize) };
        self.len += 1;
    }

    /// Moves every entry due at `now` (its instant ≤ `now`, as `at_of` tells; `None`: superseded,
    /// dropped) into `out`.
    pub fn pop_due(&mut self, now: Nanos, at_of: impl Fn(Item) -> Option<Nanos>, out: &mut Vec<Item>) {
        let n = self.slots.len();
        let had = self.len > 0;
        let mut turns = 0;
        let mut later = Vec::new();
        while self.start + self.granularity <= now && turns < n {
            let slot = &mut self.slots[self.cursor];
            self.len -= slot.len();
            for item in slot.drain(..) {
                match at_of(item) {
                    Some(at) if at <= now => out.push(item),
                    // Beyond the span when inserted: placed again from here.
                    Some(at) => later.push((item, at)),
                    None => {}
                }
            }
            if slot.capacity() > 64 {
                // A burst of keys came and went: give the memory back.
                slot.shrink_to(8);
            }
            self.cursor = (self.cursor + 1) % n;
            self.start += self.granularity;
            turns += 1;
        }
        if self.start + self.granularity <= now {
            // Left for more than a revolution: every slot has been emptied.
            self.start = now;
        }
        // The current granule: only what is due.
        let slot = &mut self.slots[self.cursor];
        let before = slot.len();
        slot.retain(|&item| match at_of(item) {
            Some(at) if at <= now => {
                out.push(item);
                false
            }
            Some(_) => true,
            None => false,
        });
        self.len -= before - slot.len();
        self.first = (0..n).find(|k| !self.slots[(self.cursor + k) % n].is_empty()).unwrap_or(0);
        for (item, at) in later {
            self.insert(now, at, item);
        }
        if had && self.len == 0 {
            // Emptied (every key forgotten): the slots give their memory back.
            self.slots.iter_mut().for_each(|s| *s = Vec::new());
        }
    }

    /// The end of the earliest granule holding an entry (`None`: nothing scheduled).
    pub fn next_due(&self) -> Option<Nanos> {
        (self.len > 0).then(|| self.start + self.granularity * (self.first as u64 + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `next_due` by a scan of every slot (what the cached `first` stands for).
    fn scanned(w: &Wheel) -> Option<Nanos> {
        let n = w.slots.len();
        (0..n)
            .find(|k| !w.slots[(w.cursor + k) % n].is_empty())
            .map(|k| w.start + w.granularity * (k as u64 + 1))
            .filter(|_| w.len > 0)
    }

    #[test]
    fn next_due_is_the_earliest_non_empty_granule() {
        let ms = Nanos::from_millis;
        let mut w = Wheel::new(ms(10), 16);
        let mut next = crate::test_rng(0x2545_f491_4f6c_dd1d);
        let mut at: std::collections::HashMap<u32, Nanos> = Default::default();
        let (mut now, mut out) = (Nanos::ZERO, Vec::new());
        for id in 0..5_000u32 {
            if next().is_multiple_of(3) {
                now += ms(next() % 40);
                w.pop_due(now, |(k, _)| at.get(&k).copied(), &mut out);
            } else {
                let t = now + ms(next() % 400);
                at.insert(id, t);
                w.insert(now, t, (id, 0));
            }
            assert_eq!(w.next_due(), scanned(&w), "after step {id}");
        }
    }

    #[test]
    fn exact_when_asked_and_far_deadlines_come_round() {
        let ms = Nanos::from_millis;
        let mut w = Wheel::new(ms(10), 8);
        let at = |(k, _): Item| {
            Some(if k == 1 {
                ms(25)
            } else if k == 2 {
                ms(1000)
            } else {
                ms(9015)
            })
        };
        w.insert(ms(0), ms(25), (1, 0));
        w.insert(ms(0), ms(1000), (2, 0));
        assert_eq!(w.next_due(), Some(ms(30)));
        let mut out = Vec::new();
        w.pop_due(ms(24), at, &mut out);
        assert!(out.is_empty());
        w.pop_due(ms(25), at, &mut out);
        assert_eq!(out, vec![(1, 0)]);
        assert_eq!(w.next_due(), Some(ms(80)));
        w.pop_due(ms(90), at, &mut out);
        assert_eq!(out, vec![(1, 0)], "beyond the span: placed again, not yielded");
        assert_eq!(w.next_due(), Some(ms(170)));
        w.pop_due(ms(5000), at, &mut out);
        assert_eq!(out, vec![(1, 0), (2, 0)]);
        assert_eq!(w.next_due(), None);
        // Empty for a long time: the next entry is placed from now.
        w.insert(ms(9000), ms(9015), (3, 0));
        assert_eq!(w.next_due(), Some(ms(9020)));
        // A superseded entry is dropped.
        w.pop_due(ms(9100), |_| None, &mut out);
        assert_eq!((out.len(), w.next_due()), (2, None));
        assert!(w.slots.iter().all(|s| s.capacity() == 0), "an emptied wheel keeps no memory");
    }
}
