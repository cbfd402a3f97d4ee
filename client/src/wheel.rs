//! A hashed timer wheel: the engine's per-shard deadlines (lease expiry, idle returns,
//! forgetting, lost claims), sans IO. Inserting and firing cost O(1) per entry; the wheel never
//! fires an entry early (an entry is due at or after its slot's instant), and one further than
//! the wheel's span fires at the span's end, where its owner re-arms it (so a far deadline
//! costs one firing per revolution). Idle cost does not depend on how many entries wait: the
//! driver sleeps until [`Wheel::next_due`].

use crate::time::Nanos;

/// An entry: the slab index and generation of the key it wakes.
pub(crate) type Item = (u32, u32);

#[derive(Debug)]
pub(crate) struct Wheel {
    slots: Box<[Vec<Item>]>,
    granularity: Nanos,
    /// The instant the slot at `cursor` fires.
    base: Nanos,
    cursor: usize,
    len: usize,
    /// The earliest instant a non-empty slot fires (`MAX`: empty); a lower bound after a pop
    /// until recomputed.
    next: Nanos,
}

impl Wheel {
    pub fn new(granularity: Nanos, slots: usize) -> Wheel {
        Wheel {
            slots: (0..slots.max(2)).map(|_| Vec::new()).collect(),
            granularity: granularity.max(Nanos::new(1)),
            base: Nanos::ZERO,
            cursor: 0,
            len: 0,
            next: Nanos::MAX,
        }
    }

    /// Schedules `item` for `at` (at the latest the wheel's span after `now`); answers the
    /// instant it will fire (never before `at` unless clamped to the span).
    pub fn insert(&mut self, now: Nanos, at: Nanos, item: Item) -> Nanos {
        if self.len == 0 && self.base < now {
            self.base = now;
        }
        let n = self.slots.len() as u64;
        let ahead = (at - self.base).as_u64().div_ceil(self.granularity.as_u64()).min(n - 1);
        let fires = self.base + self.granularity * ahead;
        let slot = (self.cursor + ahead as usize) % self.slots.len();
        self.slots[slot].push(item);
        self.len += 1;
        self.next = self.next.min(fires);
        fires
    }

    /// Moves every entry due at `now` into `out` (their slots' instants are ≤ `now`).
    pub fn pop_due(&mut self, now: Nanos, out: &mut Vec<Item>) {
        let n = self.slots.len();
        let mut turns = 0;
        while self.base <= now && turns < n {
            let slot = &mut self.slots[self.cursor];
            self.len -= slot.len();
            out.append(slot);
            if slot.capacity() > 64 {
                // A burst of keys came and went: give the memory back.
                slot.shrink_to(8);
            }
            self.cursor = (self.cursor + 1) % n;
            self.base += self.granularity;
            turns += 1;
        }
        if self.base <= now {
            // The wheel was left for more than a revolution: every slot has been emptied.
            let behind = (now - self.base).as_u64() / self.granularity.as_u64() + 1;
            self.base += self.granularity * behind;
        }
        self.next = self.scan();
    }

    fn scan(&self) -> Nanos {
        if self.len == 0 {
            return Nanos::MAX;
        }
        let n = self.slots.len();
        (0..n)
            .find(|k| !self.slots[(self.cursor + k) % n].is_empty())
            .map_or(Nanos::MAX, |k| self.base + self.granularity * k as u64)
    }

    /// When the next entry fires (`None`: nothing scheduled).
    pub fn next_due(&self) -> Option<Nanos> {
        (self.len > 0).then_some(self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_never_early_and_far_deadlines_at_the_span() {
        let ms = Nanos::from_millis;
        let mut w = Wheel::new(ms(10), 8);
        assert_eq!(w.insert(ms(0), ms(25), (1, 0)), ms(30));
        assert_eq!(w.insert(ms(0), ms(1000), (2, 0)), ms(70));
        assert_eq!(w.next_due(), Some(ms(30)));
        let mut out = Vec::new();
        w.pop_due(ms(29), &mut out);
        assert!(out.is_empty());
        w.pop_due(ms(30), &mut out);
        assert_eq!(out, vec![(1, 0)]);
        assert_eq!(w.next_due(), Some(ms(70)));
        w.pop_due(ms(5000), &mut out);
        assert_eq!(out, vec![(1, 0), (2, 0)]);
        assert_eq!(w.next_due(), None);
        // Empty for a long time: the next entry is placed from now.
        assert_eq!(w.insert(ms(9000), ms(9015), (3, 0)), ms(9020));
    }
}
