//! Optimistic concurrency against locks: `VersionedCell` against
//! `arc-swap`, `RwLock`, `Mutex` and `parking_lot::Mutex`; `MemoryStore`
//! against `Mutex<HashMap>` and `dashmap`.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use calm::occ::{Version, VersionedCell};
use calm::store::{Expect, MemoryStore, PutOptions, Store, WriteOutcome};
use dashmap::DashMap;

use crate::harness::{Figure, Row, Side, compare, measure, now, on_threads, time_row};

const KEYS: usize = 1_000;

/// A versioned value in the lock-based peers.
type Slot = (u64, Vec<u8>);

/// Runs `n` reads on this thread while, if `writer` is set, another thread
/// writes as fast as it can; returns the time of the reads.
fn reads_under_writer(n: usize, writer: Option<&(dyn Fn() + Sync)>, read: &dyn Fn()) -> Duration {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        if let Some(w) = writer {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    w();
                }
            });
        }
        let start = Instant::now();
        for _ in 0..n {
            read();
        }
        let t = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        t
    })
}

fn key(i: usize) -> Vec<u8> {
    format!("key/{i:05}").into_bytes()
}

/// Runs every comparison and returns the rows.
pub fn run() -> Vec<Row> {
    let mut rows = Vec::new();
    let cell = VersionedCell::new(7u64);
    let swap = ArcSwap::from_pointee(7u64);
    let rw = RwLock::new(7u64);
    let mx = Mutex::new(7u64);
    let pl = parking_lot::Mutex::new(7u64);
    let load = || {
        let s = cell.load();
        (*s.value(), s.version())
    };

    let w = "u64 cell, one thread";
    rows.push(time_row(
        w,
        "read",
        "arc-swap load",
        compare(Side::looped(load), Side::looped(|| **swap.load())),
    ));
    rows.push(time_row(
        w,
        "read",
        "std RwLock read",
        compare(Side::looped(load), Side::looped(|| *rw.read().unwrap())),
    ));
    rows.push(time_row(
        w,
        "read",
        "std Mutex lock",
        compare(Side::looped(load), Side::looped(|| *mx.lock().unwrap())),
    ));

    let inc = || {
        cell.update(|n| n + 1).expect("uncontended");
    };
    rows.push(time_row(
        w,
        "read-modify-write",
        "std Mutex",
        compare(Side::looped(inc), Side::looped(|| *mx.lock().unwrap() += 1)),
    ));
    rows.push(time_row(
        w,
        "read-modify-write",
        "parking_lot Mutex",
        compare(Side::looped(inc), Side::looped(|| *pl.lock() += 1)),
    ));

    let w = "u64 cell, two threads contending";
    let contended = || {
        cell.update_with(
            &calm::occ::RetryPolicy::in_process().with_max_attempts(1 << 20),
            |n| n + 1,
        )
        .expect("within budget");
    };
    rows.push(time_row(
        w,
        "read-modify-write",
        "std Mutex",
        compare(
            Side::custom(|n| on_threads(2, n, contended)),
            Side::custom(|n| on_threads(2, n, || *mx.lock().unwrap() += 1)),
        ),
    ));
    rows.push(time_row(
        w,
        "read-modify-write",
        "parking_lot Mutex",
        compare(
            Side::custom(|n| on_threads(2, n, contended)),
            Side::custom(|n| on_threads(2, n, || *pl.lock() += 1)),
        ),
    ));

    // Readers under a writer: how much a reader slows when another thread
    // writes non-stop, for the cell, arc-swap and an RwLock; and, as the
    // machine's own share, when the other thread touches nothing shared.
    let w = "one reader, one writer hammering";
    let slowdown = |write: &(dyn Fn() + Sync), read: &dyn Fn()| {
        let alone = measure(Side::custom(|n| reads_under_writer(n, None, read)));
        let busy = measure(Side::custom(|n| reads_under_writer(n, Some(write), read)));
        (busy / alone, busy)
    };
    let cell_write = || {
        let _ = cell.update(|x| x + 1);
    };
    let (cell_factor, cell_busy) = slowdown(&cell_write, &|| {
        black_box(load());
    });
    let (swap_factor, swap_busy) = slowdown(&|| swap.store(std::sync::Arc::new(3)), &|| {
        black_box(**swap.load());
    });
    let (rw_factor, rw_busy) = slowdown(&|| *rw.write().unwrap() += 1, &|| {
        black_box(*rw.read().unwrap());
    });
    let unshared = std::sync::atomic::AtomicU64::new(0);
    let (machine_factor, _) = slowdown(
        &|| {
            unshared.fetch_add(1, Ordering::Relaxed);
        },
        &|| {
            black_box(load());
        },
    );
    for (peer, theirs) in [("arc-swap", swap_factor), ("std RwLock", rw_factor)] {
        rows.push(Row {
            workload: w.into(),
            metric: "reader slowdown (busy / alone)".into(),
            peer: peer.into(),
            ours: Figure::Factor(cell_factor),
            theirs: Figure::Factor(theirs),
        });
    }
    // A writer that writes every 10 µs, as a busy but not saturating one.
    let paced = |write: &(dyn Fn() + Sync)| {
        let start = Instant::now();
        write();
        while start.elapsed() < Duration::from_micros(10) {
            std::hint::spin_loop();
        }
    };
    let (cell_paced, _) = slowdown(&|| paced(&cell_write), &|| {
        black_box(load());
    });
    let (swap_paced, _) = slowdown(&|| paced(&|| swap.store(std::sync::Arc::new(3))), &|| {
        black_box(**swap.load());
    });
    let (rw_paced, _) = slowdown(&|| paced(&|| *rw.write().unwrap() += 1), &|| {
        black_box(*rw.read().unwrap());
    });
    for (peer, theirs) in [("arc-swap", swap_paced), ("std RwLock", rw_paced)] {
        rows.push(Row {
            workload: "one reader, one writer every 10 µs".into(),
            metric: "reader slowdown (busy / alone)".into(),
            peer: peer.into(),
            ours: Figure::Factor(cell_paced),
            theirs: Figure::Factor(theirs),
        });
    }
    rows.push(time_row(w, "read", "arc-swap load", (cell_busy, swap_busy)));
    rows.push(time_row(w, "read", "std RwLock read", (cell_busy, rw_busy)));
    rows.push(Row {
        workload: "one reader, other thread busy on unshared data".into(),
        metric: "reader slowdown (busy / alone)".into(),
        peer: "machine baseline".into(),
        ours: Figure::Factor(machine_factor),
        theirs: Figure::Factor(1.0),
    });

    // Stores: 1,000 keys, one thread.
    let store = MemoryStore::new();
    let map: Mutex<HashMap<Vec<u8>, Slot>> = Mutex::new(HashMap::new());
    let dash: DashMap<Vec<u8>, Slot> = DashMap::new();
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    for k in &keys {
        let _ = now(store.put(k, b"0", PutOptions::new())).expect("put");
        map.lock().unwrap().insert(k.clone(), (1, b"0".to_vec()));
        dash.insert(k.clone(), (1, b"0".to_vec()));
    }
    let next = std::cell::Cell::new(0usize);
    let pick = || {
        let i = next.get();
        next.set((i + 1) % KEYS);
        &keys[i]
    };
    let w = "1,000 keys, one thread";
    let get = || {
        now(store.get(pick()))
            .expect("get")
            .map(|kv| kv.value.len())
    };
    rows.push(time_row(
        w,
        "get",
        "Mutex<HashMap>",
        compare(
            Side::looped(get),
            Side::looped(|| map.lock().unwrap().get(pick()).map(|v| v.1.len())),
        ),
    ));
    rows.push(time_row(
        w,
        "get",
        "dashmap",
        compare(
            Side::looped(get),
            Side::looped(|| dash.get(pick()).map(|v| v.1.len())),
        ),
    ));
    let put = || {
        let _ = now(store.put(pick(), b"value", PutOptions::new())).expect("put");
    };
    let map_put = || {
        let k = pick();
        let mut m = map.lock().unwrap();
        let e = m.entry(k.clone()).or_insert((0, Vec::new()));
        *e = (e.0 + 1, b"value".to_vec());
    };
    let dash_put = || {
        let mut e = dash.entry(pick().clone()).or_insert((0, Vec::new()));
        *e = (e.0 + 1, b"value".to_vec());
    };
    rows.push(time_row(
        w,
        "put",
        "Mutex<HashMap>",
        compare(Side::looped(put), Side::looped(map_put)),
    ));
    rows.push(time_row(
        w,
        "put",
        "dashmap",
        compare(Side::looped(put), Side::looped(dash_put)),
    ));
    // Compare-and-set: read the version, write if unchanged.
    let cas = || {
        let k = pick();
        let v = now(store.get(k))
            .expect("get")
            .map_or(Version::ZERO, |kv| kv.mod_revision);
        let o = now(store.put(k, b"cas", PutOptions::new().with_expect(Expect::Version(v))))
            .expect("put");
        assert!(matches!(o, WriteOutcome::Committed { .. }));
    };
    let map_cas = || {
        let k = pick();
        let seen = map.lock().unwrap().get(k).map(|v| v.0);
        let mut m = map.lock().unwrap();
        let e = m.get_mut(k).expect("present");
        assert_eq!(Some(e.0), seen);
        *e = (e.0 + 1, b"cas".to_vec());
    };
    let dash_cas = || {
        let k = pick();
        let seen = dash.get(k).map(|v| v.0);
        let mut e = dash.get_mut(k).expect("present");
        assert_eq!(Some(e.0), seen);
        *e = (e.0 + 1, b"cas".to_vec());
    };
    rows.push(time_row(
        w,
        "compare-and-set",
        "Mutex<HashMap>",
        compare(Side::looped(cas), Side::looped(map_cas)),
    ));
    rows.push(time_row(
        w,
        "compare-and-set",
        "dashmap",
        compare(Side::looped(cas), Side::looped(dash_cas)),
    ));
    rows
}

/// Nanoseconds per `update` with 1, 2, 4 and 8 threads contending on one
/// value: `VersionedCell`, `std::sync::Mutex`, `parking_lot::Mutex`.
pub fn contention_curve() -> Vec<(usize, f64, f64, f64)> {
    let cell = VersionedCell::new(0u64);
    let mx = Mutex::new(0u64);
    let pl = parking_lot::Mutex::new(0u64);
    let patient = calm::occ::RetryPolicy::in_process().with_max_attempts(1 << 20);
    [1usize, 2, 4, 8]
        .into_iter()
        .map(|threads| {
            let (ours, std_mutex) = compare(
                Side::custom(|n| {
                    on_threads(threads, n, || {
                        cell.update_with(&patient, |x| x + 1)
                            .expect("within budget");
                    })
                }),
                Side::custom(|n| on_threads(threads, n, || *mx.lock().unwrap() += 1)),
            );
            let (_, parking) = compare(
                Side::custom(|n| {
                    on_threads(threads, n, || {
                        cell.update_with(&patient, |x| x + 1)
                            .expect("within budget");
                    })
                }),
                Side::custom(|n| on_threads(threads, n, || *pl.lock() += 1)),
            );
            (threads, ours * 1e9, std_mutex * 1e9, parking * 1e9)
        })
        .collect()
}
