//! The table of recent first requests ([`crate::EngineConfig::sightings`]): which keys not
//! remembered asked before, within L. A key's first request is a one-off exact claim that
//! leaves nothing behind; its second within L finds its own entry and the key is remembered.
//!
//! Each entry is 4 bytes: the instant in units of 2^20 ns (~1 ms, 20 bits: wraps every
//! ~18 min) above a 12-bit key fingerprint (never 0: 0 is a free entry). The low bits of the
//! key's hash pick the entry and bits 40-51 make the fingerprint (a driver picks its shard by
//! the top ones). A younger first request of another key sharing the entry keeps it for at most
//! L, so a key that keeps coming back is remembered within L plus two requests. After a wrap of
//! the instant an old entry may look recent once: its key is then remembered early, or another
//! waits at most L more.

use redis_ratelimit_core::Nanos;

/// What the table says of a request of a key not remembered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sighting {
    /// The key's own first request is in its entry, younger than L: remember the key (the
    /// entry is freed).
    Again,
    /// No first request of this key within L. `free`: the entry holds nothing recent, so
    /// [`Sightings::note`] may take it; else another key's recent first request keeps it.
    First { free: bool },
}

const INSTANT: u32 = 0xf_ffff;

#[derive(Debug, Default)]
pub(crate) struct Sightings {
    /// Allocated at the first lookup (an engine that never sees a new key pays nothing).
    seen: Box<[u32]>,
}

impl Sightings {
    /// `entries` (rounded up to a power of two, above zero) and `lease` (L) are the engine's.
    pub(crate) fn look(&mut self, now: Nanos, hash: u64, entries: usize, lease: Nanos) -> Sighting {
        if self.seen.is_empty() {
            self.seen = vec![0; entries.max(1).next_power_of_two()].into_boxed_slice();
        }
        let (at, fingerprint, instant) = self.place(now, hash);
        let window = (lease.as_u64() >> 20).clamp(1, (INSTANT / 2) as u64) as u32;
        let entry = self.seen[at];
        let recent = entry != 0 && instant.wrapping_sub(entry >> 12) & INSTANT <= window;
        if recent && entry & 0xfff == fingerprint {
            self.seen[at] = 0;
            return Sighting::Again;
        }
        Sighting::First { free: !recent }
    }

    /// Notes the first request of the key of `hash` (after [`Sightings::look`] found its entry
    /// free).
    pub(crate) fn note(&mut self, now: Nanos, hash: u64) {
        let (at, fingerprint, instant) = self.place(now, hash);
        self.seen[at] = instant << 12 | fingerprint;
    }

    fn place(&self, now: Nanos, hash: u64) -> (usize, u32, u32) {
        let at = hash as usize & (self.seen.len() - 1);
        let fingerprint = ((hash >> 40) as u32 & 0xfff) | 1;
        let instant = (now.as_u64() >> 20) as u32 & INSTANT;
        (at, fingerprint, instant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Nanos = Nanos::from_secs(1);

    /// A request of `hash` at `now` as the engine makes it: looked up, noted when free.
    fn request(t: &mut Sightings, now: Nanos, hash: u64) -> Sighting {
        let s = t.look(now, hash, 16, L);
        if s == (Sighting::First { free: true }) {
            t.note(now, hash);
        }
        s
    }

    #[test]
    fn a_key_asking_again_within_l_is_remembered_once() {
        let mut t = Sightings::default();
        let (a, t0) = (0x0000_0123_4567_0003_u64, Nanos::from_secs(5));
        assert_eq!(request(&mut t, t0, a), Sighting::First { free: true });
        assert_eq!(request(&mut t, t0 + L / 2, a), Sighting::Again);
        // The entry was freed: a key forgotten since starts again from its first request.
        assert_eq!(request(&mut t, t0 + L * 3 / 4, a), Sighting::First { free: true });
    }

    #[test]
    fn a_first_request_older_than_l_counts_for_nothing() {
        let mut t = Sightings::default();
        let (a, t0) = (0x0000_0abc_0000_0005_u64, Nanos::from_secs(5));
        assert_eq!(request(&mut t, t0, a), Sighting::First { free: true });
        assert_eq!(request(&mut t, t0 + L * 2, a), Sighting::First { free: true });
        assert_eq!(request(&mut t, t0 + L * 2 + L / 4, a), Sighting::Again);
    }

    #[test]
    fn another_key_of_the_entry_keeps_it_for_at_most_l() {
        let mut t = Sightings::default();
        // The same entry (low bits 7), different fingerprints (bits 40-51).
        let (a, b, t0) = (0x0000_0100_0000_0007_u64, 0x0000_0200_0000_0007_u64, Nanos::from_secs(5));
        assert_eq!(request(&mut t, t0, a), Sighting::First { free: true });
        // b's first request finds a's recent one: a one-off, not noted.
        assert_eq!(request(&mut t, t0 + L / 4, b), Sighting::First { free: false });
        assert_eq!(request(&mut t, t0 + L / 2, b), Sighting::First { free: false });
        // a's entry aged past L: b takes it, and is remembered at its next request.
        assert_eq!(request(&mut t, t0 + L * 2, b), Sighting::First { free: true });
        assert_eq!(request(&mut t, t0 + L * 2 + L / 4, b), Sighting::Again);
    }

    #[test]
    fn entries_are_picked_by_the_low_bits() {
        let mut t = Sightings::default();
        let t0 = Nanos::from_secs(5);
        // 16 entries: hashes 1..=16 differ in their low 4 bits but 16, which shares entry 0.
        for h in 0..16_u64 {
            assert_eq!(request(&mut t, t0, h | 0x0000_0100_0000_0000), Sighting::First { free: true });
        }
        assert_eq!(request(&mut t, t0, 16 | 0x0000_0200_0000_0000), Sighting::First { free: false });
        for h in 0..16_u64 {
            assert_eq!(request(&mut t, t0 + L / 2, h | 0x0000_0100_0000_0000), Sighting::Again, "{h}");
        }
    }

    #[test]
    fn the_instant_wraps_without_locking_an_entry() {
        let mut t = Sightings::default();
        let (a, b) = (0x0000_0100_0000_0001_u64, 0x0000_0200_0000_0001_u64);
        // Just before the 20-bit instant wraps (2^40 ns), and just after.
        let before = Nanos::new((1_i64 << 40) - (1 << 20));
        assert_eq!(request(&mut t, before, a), Sighting::First { free: true });
        assert_eq!(request(&mut t, before + L / 2, a), Sighting::Again);
        assert_eq!(request(&mut t, before, a), Sighting::First { free: true });
        // Across the wrap the age is still ~L/2: b waits; past L it takes the entry.
        assert_eq!(request(&mut t, before + L / 2, b), Sighting::First { free: false });
        assert_eq!(request(&mut t, before + L * 2, b), Sighting::First { free: true });
    }
}
