//! The global allocator: Redis's allocator once the module is loaded (so `used_memory` and
//! `MEMORY USAGE` see our state), the system allocator when the library runs without Redis
//! (the core's tests).

use std::alloc::{GlobalAlloc, Layout, System};

use redis_module::raw;

pub struct ModuleAlloc;

unsafe impl GlobalAlloc for ModuleAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match raw::RedisModule_Alloc {
            // Round up to the alignment: jemalloc aligns each size class to its size.
            Some(alloc) => alloc((layout.size() + layout.align() - 1) & !(layout.align() - 1)).cast(),
            None => System.alloc(layout),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match raw::RedisModule_Free {
            Some(free) => free(ptr.cast()),
            None => System.dealloc(ptr, layout),
        }
    }
}
