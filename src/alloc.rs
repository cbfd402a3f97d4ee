//! The global allocator: Redis's allocator once the module is loaded (so `used_memory` and
//! `MEMORY USAGE` see our state), the system allocator when the library runs without Redis
//! (the core's tests).
//!
//! `RedisModule_Alloc` takes a size and no alignment. What it returns is aligned to 16 bytes
//! for every size that is a multiple of 16, and to 8 for 8 bytes: jemalloc (Redis's default)
//! keeps each small size class (8, 16, 32, 48, 64, 80, ... every one from 16 up a multiple of
//! 16) in page-aligned runs of regions of that size, so a region is aligned to the largest
//! power of two dividing its class, and glibc's malloc (`MALLOC=libc`) aligns everything to
//! 16. So a request rounded up to a multiple of its alignment comes back aligned, for
//! alignments up to `MAX_ALIGN` (an `i128`'s 16, the largest of this crate's own types; every
//! value box is one of these). Every such pointer is checked, and a misaligned one (an
//! allocator keeping a size header in front: zmalloc without `malloc_size`) is freed and
//! refused, an allocation failure rather than undefined behaviour; `check` tests the allocator
//! once at load. A larger alignment (a dependency's cache-line-aligned type) is served from a
//! block `align` bytes larger, with the block's address stored just before the aligned one.

use std::alloc::{GlobalAlloc, Layout, System};

use redis_module::raw;

/// The largest alignment Redis's allocator is relied on for.
pub const MAX_ALIGN: usize = 16;

pub struct ModuleAlloc;

// SAFETY: `alloc` returns null or `layout.size()` bytes aligned to `layout.align()` (checked,
// or aligned by hand), which `dealloc` frees with the allocator that made them: Redis's once
// loaded (the API table is filled before any of this crate's code runs in Redis, and stays),
// the system's without Redis.
unsafe impl GlobalAlloc for ModuleAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: reading the API table (see above).
        let Some(alloc) = (unsafe { raw::RedisModule_Alloc }) else {
            // SAFETY: the caller's contract is the one System.alloc needs.
            return unsafe { System.alloc(layout) };
        };
        let mask = layout.align() - 1;
        if mask >= MAX_ALIGN {
            // SAFETY: the caller's contract (a non-zero size).
            return unsafe { over_aligned(alloc, layout) };
        }
        // SAFETY: any size may be asked for; the size is rounded up to a multiple of the
        // alignment (a power of two at most 16: no overflow, as a Layout's size is at most
        // isize::MAX rounded up to its alignment).
        let p: *mut u8 = unsafe { alloc((layout.size() + mask) & !mask) }.cast();
        if p as usize & mask == 0 {
            p
        } else {
            refuse(p)
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: reading the API table; `ptr` came from `alloc` above with the same allocator
        // (Redis's is there from load to unload, the system's only without Redis).
        match unsafe { raw::RedisModule_Free } {
            // SAFETY: an over-aligned block's address is in the word before `ptr` (`alloc`).
            Some(free) if layout.align() > MAX_ALIGN => unsafe { free(ptr.cast::<*mut u8>().sub(1).read().cast()) },
            // SAFETY: as above.
            Some(free) => unsafe { free(ptr.cast()) },
            // SAFETY: as above.
            None => unsafe { System.dealloc(ptr, layout) },
        }
    }
}

/// Frees a misaligned block and fails the allocation.
#[cold]
fn refuse(p: *mut u8) -> *mut u8 {
    // SAFETY: a block RedisModule_Alloc just returned, unused.
    unsafe { raw::RedisModule_Free.unwrap()(p.cast()) };
    std::ptr::null_mut()
}

/// `layout` (alignment above MAX_ALIGN) from a block `align` bytes larger: the first multiple
/// of `align` in it, with the block's address in the word before.
///
/// # Safety
/// `layout` has a non-zero size (GlobalAlloc's contract).
#[cold]
unsafe fn over_aligned(alloc: unsafe extern "C" fn(usize) -> *mut std::os::raw::c_void, layout: Layout) -> *mut u8 {
    let align = layout.align();
    let Some(size) = layout.size().checked_add(align) else { return std::ptr::null_mut() };
    // SAFETY: any size may be asked for.
    let block: *mut u8 = unsafe { alloc(size) }.cast();
    if block.is_null() {
        return std::ptr::null_mut();
    }
    if !(block as usize).is_multiple_of(8) {
        return refuse(block);
    }
    // The first multiple of `align` past the block's start: 8 to `align` bytes in, so the
    // block's address fits just before it and the layout's size after it.
    let offset = align - (block as usize & (align - 1));
    // SAFETY: offset <= align, so [block + offset, + size) lies inside the block, and the 8
    // bytes before it too (offset >= 8: align is a power of two above 16 and the block is
    // 8-aligned); that word is aligned to 8.
    unsafe {
        let p = block.add(offset);
        p.cast::<*mut u8>().sub(1).write(block);
        p
    }
}

/// Checks at load that Redis's allocator aligns as described above, for the sizes this crate
/// allocates most (its boxes: 16 and 48 bytes; buffers). Err names a size that came back
/// misaligned: the module then refuses to load rather than fail allocations later.
pub fn check() -> Result<(), String> {
    // SAFETY: reading the API table.
    let (Some(alloc), Some(free)) = (unsafe { raw::RedisModule_Alloc }, unsafe { raw::RedisModule_Free }) else {
        return Ok(());
    };
    for size in [16usize, 32, 48, 64, 96, 128, 160, 256, 1024, 4096] {
        // SAFETY: a plain allocation, freed at once.
        let p = unsafe { alloc(size) };
        let misaligned = p as usize & (MAX_ALIGN - 1) != 0;
        // SAFETY: the block just allocated (free accepts null).
        unsafe { free(p) };
        if misaligned {
            return Err(format!("Redis's allocator returned a {size}-byte block not aligned to {MAX_ALIGN} bytes"));
        }
    }
    Ok(())
}
