//! A counting global allocator, so the benchmarks can report the heap a
//! library needs while it works (peak) and keeps afterwards (retained).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Forwards to the system allocator and counts live bytes.
pub struct Counting;

/// Bytes currently allocated.
static CURRENT: AtomicUsize = AtomicUsize::new(0);
/// The most bytes allocated at once since the last [`measure`].
static PEAK: AtomicUsize = AtomicUsize::new(0);

// Relaxed is enough: the benchmarks measure on one thread, and the counters
// are only read on that thread after the measured work returned.
fn grow(n: usize) {
    let now = CURRENT.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

fn shrink(n: usize) {
    CURRENT.fetch_sub(n, Ordering::Relaxed);
}

// SAFETY: every method forwards its arguments unchanged to `System`, which
// upholds the `GlobalAlloc` contract; the only addition is arithmetic on two
// atomics, which neither allocates nor unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (so from `System`) with
        // this layout.
        unsafe { System.dealloc(ptr, layout) };
        shrink(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grow(new_size - layout.size());
            } else {
                shrink(layout.size() - new_size);
            }
        }
        p
    }
}

/// Heap used by one piece of work.
#[derive(Debug, Clone, Copy)]
pub struct Heap {
    /// The most bytes allocated at once while it ran, above what was
    /// allocated before.
    pub peak: usize,
    /// Bytes still allocated when it returned (held by its result).
    pub retained: usize,
}

/// Runs `f` and reports the heap it needed and what its result keeps.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Heap) {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    let now = CURRENT.load(Ordering::Relaxed);
    let heap = Heap {
        peak: PEAK.load(Ordering::Relaxed) - base,
        retained: now.saturating_sub(base),
    };
    (out, heap)
}
