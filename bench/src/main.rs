//! Side-by-side benchmarks of calm against its peers, reported as ratios.
//!
//! `cargo run -p calm-bench --release -- <suite>`; suites: `crdt`, `occ`,
//! `coord`, `adapt`.

mod adapt;
mod coord;
mod crdt;
mod harness;
mod occ;
mod rng;

fn main() {
    let suite = std::env::args().nth(1).unwrap_or_else(|| "crdt".into());
    let rows = match suite.as_str() {
        "crdt" => crdt::run(),
        "occ" => occ::run(),
        "coord" => coord::run(),
        "adapt" => adapt::run(),
        other => {
            eprintln!("unknown suite {other:?}; suites: crdt, occ, coord, adapt");
            std::process::exit(2);
        }
    };
    print!("{}", harness::markdown(&rows));
}
