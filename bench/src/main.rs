//! Side-by-side benchmarks of calm against its peers, reported as ratios.
//!
//! `cargo run -p calm-bench --release -- <suite> [filter]`; suites: `crdt`,
//! `occ`, `coord`, `adapt`, `backend` (real PostgreSQL and etcd servers; the
//! filter `postgres` or `etcd` runs one, `durable` only the rows on a
//! PostgreSQL server with `fsync` on),
//! `fence` (only the backend suite's fenced-transaction rows), `redis`
//! (calm's Redis lock against the bare recipe, on a real `redis-server`),
//! `partition` (a single writer per key against locks, and the partition
//! log against its raw transactions; `partition log` runs only the latter),
//! `text` (the traces, then the concurrent trace and scenarios; the filter
//! picks traces and scenarios whose name contains it, `B2` say, `cjk`
//! replays the traces with their letters as CJK characters, and
//! `synthetic` runs generated traces of other shapes); `report` runs
//! them all and writes `BENCHMARKS.md` (`report text` reruns one suite and
//! replaces only its section).

mod adapt;
mod alloc;
mod backend;
mod concurrent;
mod coord;
mod crdt;
mod harness;
mod occ;
mod partition;
mod redis;
mod report;
mod rng;
mod scenarios;
mod synthetic;
mod text;

/// Every allocation is counted, for the heap figures of the `text` suite.
#[global_allocator]
static GLOBAL: alloc::Counting = alloc::Counting;

fn main() {
    let suite = std::env::args().nth(1).unwrap_or_else(|| "crdt".into());
    let rows = match suite.as_str() {
        "crdt" => crdt::run(),
        "occ" => occ::run(),
        "coord" => coord::run(),
        "adapt" => adapt::run(),
        "backend" => backend::run(std::env::args().nth(2).as_deref()),
        "fence" => backend::run_fence(),
        "partition" => partition::run(std::env::args().nth(2).as_deref()),
        "redis" => redis::run(),
        "text" => text::run(std::env::args().nth(2).as_deref()),
        "report" => report::run(std::env::args().nth(2).as_deref()),
        other => {
            eprintln!(
                "unknown suite {other:?}; suites: crdt, occ, coord, adapt, backend, fence, partition, redis, text; or report"
            );
            std::process::exit(2);
        }
    };
    print!("{}", harness::markdown(&rows));
}
