//! The engine's key storage (issue 19): a dense vector kept in fixed-size chunks instead of
//! one doubling allocation, so that its memory follows the number of keys at every size: a
//! doubling `Vec` sits at its power-of-two capacity, up to twice what it holds (297 B per key
//! at 10,000 keys, where 16,384 slots of 160 bytes were allocated). Here fewer than [`STEP`]
//! slots are unused after a growth, and at most half the last chunk after removals. A chunk
//! is never moved once full, so growing copies at most one chunk (a doubling `Vec` of a
//! million keys copies 160 MB under the shard's lock), and the allocator's heap does not
//! fragment as one array grown by small steps does (measured: 300 MiB resident for 180 MB of
//! keys over 64 shards).
//!
//! Only the last chunk is ever partly filled: [`Slab::swap_remove`] takes the last element, so
//! a chunk left empty is freed at once and forgotten keys give their memory back. An index is
//! one bounds check, a shift and a mask: the element of `i` is `chunks[i >> SHIFT][i & MASK]`.

use std::ops::{Index, IndexMut};

/// Elements per chunk, as a power of two (32 slots of the engine: 5 KiB; 256-slot chunks
/// measured the same per key, and more resident memory over 64 shards).
const SHIFT: u32 = 5;
const CHUNK: usize = 1 << SHIFT;
const MASK: usize = CHUNK - 1;
/// The last chunk grows by this many elements at a time (a shard of a few keys wastes at most
/// this; a growth copies at most one chunk: 8 elements per insert, amortized).
const STEP: usize = 2;

#[derive(Debug)]
pub(crate) struct Slab<T> {
    /// Every chunk but the last holds exactly `CHUNK` elements; the last holds 1 to `CHUNK`.
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { chunks: Vec::new(), len: 0 }
    }
}

impl<T> Slab<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn get(&self, i: usize) -> Option<&T> {
        // SAFETY: `i < len` (checked), which is enough by the invariant of `chunks`.
        (i < self.len).then(|| unsafe { self.get_unchecked(i) })
    }

    /// One bounds check (against `len`), not two, on the local path.
    ///
    /// # Safety
    /// `i < self.len`.
    #[inline]
    unsafe fn get_unchecked(&self, i: usize) -> &T {
        // SAFETY: every chunk but the last holds `CHUNK` elements and the last the rest (the
        // invariant of `chunks`, kept by `push` and `swap_remove`, the only writers), so for
        // `i < len` chunk `i >> SHIFT` exists and holds element `i & MASK`.
        unsafe { self.chunks.get_unchecked(i >> SHIFT).get_unchecked(i & MASK) }
    }

    /// # Safety
    /// `i < self.len`.
    #[inline]
    unsafe fn get_unchecked_mut(&mut self, i: usize) -> &mut T {
        // SAFETY: as `get_unchecked`.
        unsafe { self.chunks.get_unchecked_mut(i >> SHIFT).get_unchecked_mut(i & MASK) }
    }

    /// Appends `value` at index `len()`.
    pub fn push(&mut self, value: T) {
        match self.chunks.last_mut() {
            Some(last) if last.len() < CHUNK => {
                if last.len() == last.capacity() {
                    last.reserve_exact(STEP.min(CHUNK - last.len()));
                }
                last.push(value);
            }
            _ => {
                if self.chunks.len() == self.chunks.capacity() && self.chunks.len() < 4 {
                    // Most shards hold one chunk: room for one, not a `Vec`'s first four.
                    self.chunks.reserve_exact(1);
                }
                let mut chunk = Vec::with_capacity(STEP);
                chunk.push(value);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    /// Removes the element at `i`, the last element taking its place (as `Vec::swap_remove`).
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn swap_remove(&mut self, i: usize) -> T {
        assert!(i < self.len, "swap_remove index {i} out of {}", self.len);
        let last = self.chunks.last_mut().expect("not empty");
        let mut value = last.pop().expect("chunks are never empty");
        if last.is_empty() {
            self.chunks.pop();
            if self.chunks.is_empty() {
                self.chunks = Vec::new();
            } else if self.chunks.capacity() > 16 && 4 * self.chunks.len() < self.chunks.capacity() {
                self.chunks.shrink_to(self.chunks.len() * 2);
            }
        } else if 2 * last.len() < last.capacity() {
            // Keys forgotten since the chunk grew: half of it goes back (not every few
            // removals: each is a reallocation).
            last.shrink_to(last.len() + STEP);
        }
        self.len -= 1;
        if i != self.len {
            std::mem::swap(&mut self[i], &mut value);
        }
        value
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.chunks.iter_mut().flatten()
    }

    /// Elements the slab has room for without allocating (tests).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum()
    }
}

impl<T> Index<usize> for Slab<T> {
    type Output = T;

    #[inline]
    fn index(&self, i: usize) -> &T {
        if i >= self.len {
            out_of_bounds(i, self.len);
        }
        // SAFETY: `i < len`, checked above.
        unsafe { self.get_unchecked(i) }
    }
}

impl<T> IndexMut<usize> for Slab<T> {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut T {
        if i >= self.len {
            out_of_bounds(i, self.len);
        }
        // SAFETY: `i < len`, checked above.
        unsafe { self.get_unchecked_mut(i) }
    }
}

#[cold]
#[inline(never)]
fn out_of_bounds(i: usize, len: usize) -> ! {
    panic!("slab index {i} out of bounds (len {len})")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slab against a `Vec` doing the same pushes and swap_removes, with its memory bound.
    #[test]
    fn behaves_as_a_vec_and_wastes_at_most_a_step_or_half_a_chunk() {
        let (mut slab, mut model) = (Slab::default(), Vec::new());
        let mut next = crate::test_rng(0x2545_f491_4f6c_dd1d);
        // Grow to 20,000, shrink to 100, grow again, empty.
        for (target, grow) in [(20_000, true), (100, false), (1_000, true), (0, false)] {
            while (grow && model.len() < target) || (!grow && model.len() > target) {
                if (grow && !next().is_multiple_of(4)) || model.is_empty() {
                    let (v, cap) = (next(), slab.capacity());
                    slab.push(v);
                    model.push(v);
                    if slab.capacity() != cap {
                        assert!(slab.capacity() - slab.len() < STEP, "grown by more than a step");
                    }
                } else {
                    let i = (next() % model.len() as u64) as usize;
                    assert_eq!(slab.swap_remove(i), model.swap_remove(i));
                }
                assert_eq!(slab.len(), model.len());
                let waste = slab.capacity() - slab.len();
                assert!(waste <= CHUNK / 2, "{} for {}", slab.capacity(), slab.len());
                assert!(slab.chunks.capacity() <= 16 || slab.chunks.capacity() <= 4 * slab.chunks.len());
            }
            assert!(slab.iter().eq(model.iter()));
            for (i, v) in model.iter().enumerate() {
                assert_eq!((&slab[i], slab.get(i)), (v, Some(v)));
            }
            assert_eq!(slab.get(model.len()), None);
        }
        assert!(slab.is_empty());
        assert_eq!(slab.capacity(), 0, "an empty slab holds no chunk");
    }
}
