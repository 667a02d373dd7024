//! automerge documents and change deltas through calm's adapter.
//!
//! This target mostly finds automerge's own bugs. Panics inside automerge
//! are caught by the adapter and must come out as `DecodeError`s (a panic
//! that escapes ends the run). Allocations are another matter: automerge
//! 0.12's loader sizes some allocations from lengths in the input (a single
//! 2 GiB allocation from a 119-byte document, kept in
//! `fuzz/upstream/automerge-oom-2GiB`), which calm cannot bound; libFuzzer
//! reports those as out-of-memory. The adapter's docs say to decode
//! automerge documents only from peers you trust.
#![no_main]

use calm::adapt::automerge::Document;
use calm_fuzz::abort_only_on_uncaught_panics;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    abort_only_on_uncaught_panics();
    if let Ok(doc) = calm::codec::from_bytes::<Document>(data) {
        let _ = calm::codec::to_bytes(&doc);
    }
    let mut doc = Document::new();
    let before = doc.clone();
    if doc.apply_changes(data).is_err() {
        assert!(doc == before, "a refused delta changed the document");
    }
});
