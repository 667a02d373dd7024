//! The suite: starts the servers, runs the comparisons and turns them into
//! rows and the points of the scaling plot.

use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use calm::backend::etcd::EtcdStore;
use calm::backend::postgres::{PostgresOptions, PostgresStore};
use calm::testing::servers::{EtcdServer, PostgresServer};
use tokio::runtime::Runtime;

use super::load::{
    CalmProbe, CalmWorker, MAX_TASKS, TASKS, WATCH_SAMPLES, interleaved, preload, watch_latency,
};
use super::{Op, Probe, Worker, etcd, fence, postgres};
use crate::harness::{Figure, Row, Summary, throughput_row_of, time_row};

/// One point of the scaling plot: median throughputs of one operation at
/// one task count.
#[derive(Debug, Clone)]
pub struct ScalePoint {
    /// `"PostgreSQL"` or `"etcd"`.
    pub backend: &'static str,
    /// The operation's name.
    pub op: &'static str,
    /// Concurrent tasks.
    pub tasks: usize,
    /// calm's operations per second.
    pub calm: f64,
    /// The raw client's operations per second.
    pub raw: f64,
}

/// The scaled operations, in row order.
const OPS: [Op; 3] = [Op::Get, Op::Put, Op::Cas];

/// How to read the backend rows, with the pool size calm ran with.
pub fn note() -> String {
    let pool = PostgresOptions::new("").pool_size;
    format!(
        "Each task count's rows come from 1, 4, 16 or 64 Tokio tasks on a 2-worker runtime, each \
         doing one operation after another on 16 keys of its own (64-byte values), for five \
         0.6 s rounds per side with calm and raw rounds alternating. A `1/throughput` row shows \
         the median round's wall time per operation, so its last column is raw ops/s ÷ calm \
         ops/s and below 1 favours calm as in every other table; the brackets give the ops/s and \
         the latency p50 and p99 of one operation over all five rounds. The one-key row is 64 \
         tasks looping read-then-compare-and-set on one key, timed per successful write. The \
         watch rows time {WATCH_SAMPLES} changes per side from the writer's acknowledgement to \
         the watcher's event, counted as zero when the event arrives first (a bare `NOTIFY` often \
         reaches its listener before the notifier reads its own reply; the last column is then \
         a dash); a third row times from sending the write, which includes the write itself. \
         calm runs one `PostgresStore` with its default pool ({pool} \
         connections) or one `EtcdStore` cloned per task; raw PostgreSQL is one `tokio-postgres` \
         connection per task with prepared statements on a plain table (no revision, no history, \
         no notification), raw etcd one shared `etcd-client`. The raw side is the floor, not an \
         equivalent: a calm write on PostgreSQL also takes the store-wide revision, which \
         serialises writers as etcd's are, appends a watch event and notifies watchers. etcd's \
         model is calm's, so there the ratio is calm's own overhead. On a 2-core VM the servers, \
         the clients and the bench share both cores. The PostgreSQL server of these rows runs \
         without `fsync` (as the tests' server does), which leaves each side's CPU cost bare; the \
         rows \"PostgreSQL with fsync on\" run on a second server configured as production ones \
         are, every commit waiting for the disk."
    )
}

/// Runs the suite alone: the rows, a summary of the scaling on stderr, and
/// the scaling plot under `target/calm-bench/` (the report draws it into
/// `bench/plots/`).
pub fn run(only: Option<&str>) -> Vec<Row> {
    let (rows, points) = run_with_scaling(only);
    eprintln!("{}", scaling_table(&points));
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/calm-bench");
    let path = dir.join("scaling-backend.svg");
    let drawn = std::fs::create_dir_all(&dir)
        .map_err(Into::into)
        .and_then(|()| crate::report::scaling_plot(&points, &path));
    match drawn {
        Ok(()) => eprintln!("backend: drew {}", path.display()),
        Err(e) => eprintln!("backend: could not draw {}: {e}", path.display()),
    }
    rows
}

/// The runtime every comparison runs on: two workers, the machine's two
/// cores, which the servers share.
pub(crate) fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}

/// Only the fenced-transaction rows (they are also part of [`run`]).
pub fn run_fence() -> Vec<Row> {
    let rt = runtime();
    match PostgresServer::start() {
        Ok(server) => fence::rows(&rt, server.url()),
        Err(e) => {
            eprintln!("backend: SKIPPED PostgreSQL: {e}");
            Vec::new()
        }
    }
}

/// Runs every comparison on the servers that can be started (only those
/// whose name, `postgres`, `durable postgres` or `etcd`, contains `only`); returns the rows and
/// the scaling points.
pub fn run_with_scaling(only: Option<&str>) -> (Vec<Row>, Vec<ScalePoint>) {
    let rt = runtime();
    let mut out = (Vec::new(), Vec::new());
    let wanted = |name: &str| only.is_none_or(|o| name.contains(o));
    if wanted("postgres") {
        match PostgresServer::start() {
            Ok(server) => on_postgres(&rt, &server, &mut out),
            Err(e) => eprintln!("backend: SKIPPED PostgreSQL: {e}"),
        }
        // On servers of their own: the store's load above leaves the
        // first one vacuuming and checkpointing for a while.
        out.0.extend(run_fence());
    }
    if wanted("durable postgres") {
        match PostgresServer::start_durable() {
            Ok(server) => on_durable_postgres(&rt, &server, &mut out.0),
            Err(e) => eprintln!("backend: SKIPPED durable PostgreSQL: {e}"),
        }
    }
    if wanted("etcd") {
        match EtcdServer::start() {
            Ok(server) => on_etcd(&rt, &server, &mut out),
            Err(e) => eprintln!("backend: SKIPPED etcd: {e}"),
        }
    }
    out
}

/// A markdown table of the scaling points in throughput terms.
pub fn scaling_table(points: &[ScalePoint]) -> String {
    let mut md = String::from(
        "| backend | operation | tasks | calm ops/s | raw ops/s | throughput, calm / raw (higher favours calm) |\n\
         | --- | --- | ---: | ---: | ---: | ---: |\n",
    );
    for p in points {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} | {:.0} | **{:.2}** |",
            p.backend,
            p.op,
            p.tasks,
            p.calm,
            p.raw,
            p.calm / p.raw
        );
    }
    md
}

/// Retries `connect` while a just-started server warms up.
fn connect<T, F: Future<Output = Result<T, E>>, E: std::fmt::Debug>(
    rt: &Runtime,
    mut connect: impl FnMut() -> F,
) -> T {
    let mut last = None;
    for _ in 0..50 {
        match rt.block_on(connect()) {
            Ok(t) => return t,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("cannot connect: {last:?}");
}

/// What the rows of one backend are called.
struct Labels {
    backend: &'static str,
    workload: &'static str,
    peer: &'static str,
    watch_peer: &'static str,
}

/// calm's store on `server`, and the labels of its rows against raw
/// tokio-postgres.
fn postgres_side(
    rt: &Runtime,
    server: &PostgresServer,
    backend: &'static str,
    workload: &'static str,
) -> (PostgresStore, Labels) {
    let store = connect(rt, || {
        PostgresStore::connect_with(PostgresOptions::new(server.url()).with_schema("bench"))
    });
    let labels = Labels {
        backend,
        workload,
        peer: "raw tokio-postgres",
        watch_peer: "bare LISTEN/NOTIFY",
    };
    (store, labels)
}

fn on_postgres(rt: &Runtime, server: &PostgresServer, out: &mut (Vec<Row>, Vec<ScalePoint>)) {
    let (store, labels) = postgres_side(rt, server, "PostgreSQL", "PostgreSQL, 64 B values");
    let calm = CalmWorker::many(&store, MAX_TASKS);
    let raw = postgres::RawWorker::many(rt, server.url(), MAX_TASKS);
    scaling(rt, &labels, calm, raw, out);
    let mut calm = CalmProbe::start(rt, &store);
    let mut raw = postgres::RawProbe::start(rt, server.url());
    watch(rt, &labels, &mut calm, &mut raw, &mut out.0);
}

/// Writes on a server whose commits wait for the disk, as production
/// servers' do (the scaling rows run without `fsync`, which leaves the
/// CPU cost of each side bare): one task's latency, and 16 tasks.
fn on_durable_postgres(rt: &Runtime, server: &PostgresServer, rows: &mut Vec<Row>) {
    let (store, labels) = postgres_side(
        rt,
        server,
        "PostgreSQL (fsync on)",
        "PostgreSQL with fsync on, 64 B values",
    );
    let mut calm = preload(rt, CalmWorker::many(&store, DURABLE_TASKS));
    let mut raw = preload(
        rt,
        postgres::RawWorker::many(rt, server.url(), DURABLE_TASKS),
    );
    for op in [Op::Put, Op::Cas] {
        for tasks in [1, DURABLE_TASKS] {
            let (a, b) = interleaved(rt, &mut calm, &mut raw, tasks, op);
            eprintln!(
                "backend: {} {} × {tasks}: calm {:.0}/s p50 {}, raw {:.0}/s p50 {}",
                labels.backend,
                op.name(),
                a.rate,
                Figure::Time(a.p50),
                b.rate,
                Figure::Time(b.p50)
            );
            rows.push(tasks_row(&labels, op, tasks, a, b));
            if tasks == 1 {
                rows.push(latency_row(&labels, op, a, b));
            }
        }
    }
}

/// Tasks of the durable server's concurrent rows.
const DURABLE_TASKS: usize = 16;

fn on_etcd(rt: &Runtime, server: &EtcdServer, out: &mut (Vec<Row>, Vec<ScalePoint>)) {
    let store = connect(rt, || EtcdStore::connect(server.endpoints()));
    let client = connect(rt, || {
        etcd_client::Client::connect(server.endpoints(), None)
    });
    let labels = Labels {
        backend: "etcd",
        workload: "etcd, 64 B values",
        peer: "raw etcd-client",
        watch_peer: "raw etcd-client watch",
    };
    let calm = CalmWorker::many(&store, MAX_TASKS);
    let raw = etcd::RawWorker::many(&client, MAX_TASKS);
    scaling(rt, &labels, calm, raw, out);
    let mut calm = CalmProbe::start(rt, &store);
    let mut raw = etcd::RawProbe::start(rt, &client);
    watch(rt, &labels, &mut calm, &mut raw, &mut out.0);
}

/// The `1/throughput` row of `op` at `tasks` tasks.
fn tasks_row(labels: &Labels, op: Op, tasks: usize, a: Summary, b: Summary) -> Row {
    let plural = if tasks == 1 { "" } else { "s" };
    let metric = format!("{}, {tasks} task{plural}, 1/throughput", op.name());
    throughput_row(labels, metric, a, b, true)
}

/// The latency row of `op` at one task.
fn latency_row(labels: &Labels, op: Op, a: Summary, b: Summary) -> Row {
    let metric = format!("{}, 1 task: latency p50", op.name());
    time_row(labels.workload, &metric, labels.peer, (a.p50, b.p50))
}

/// A throughput row: wall time per counted operation of each side.
fn throughput_row(labels: &Labels, metric: String, a: Summary, b: Summary, latency: bool) -> Row {
    let mut row = throughput_row_of(labels.workload, metric, labels.peer, a, b);
    if !latency {
        for f in [&mut row.ours, &mut row.theirs] {
            if let Figure::Throughput { latency, .. } = f {
                *latency = None;
            }
        }
    }
    row
}

/// The throughput of every operation at every task count, the one-task
/// latency, and the one-key contended case.
fn scaling<A: Worker, B: Worker>(
    rt: &Runtime,
    labels: &Labels,
    calm: Vec<A>,
    raw: Vec<B>,
    (rows, points): &mut (Vec<Row>, Vec<ScalePoint>),
) {
    let mut calm = preload(rt, calm);
    let mut raw = preload(rt, raw);
    // Measured task count by task count (each count's operations close
    // together in time), reported operation by operation.
    let mut results = Vec::new();
    for tasks in TASKS {
        for op in OPS {
            let (a, b) = interleaved(rt, &mut calm, &mut raw, tasks, op);
            eprintln!(
                "backend: {} {} × {tasks}: calm {:.0}/s, raw {:.0}/s",
                labels.backend,
                op.name(),
                a.rate,
                b.rate
            );
            points.push(ScalePoint {
                backend: labels.backend,
                op: op.name(),
                tasks,
                calm: a.rate,
                raw: b.rate,
            });
            results.push((op, tasks, a, b));
        }
    }
    for op in OPS {
        for &(_, tasks, a, b) in results.iter().filter(|r| r.0 == op) {
            rows.push(tasks_row(labels, op, tasks, a, b));
        }
        if let Some(&(_, _, a, b)) = results.iter().find(|r| r.0 == op && r.1 == 1) {
            rows.push(latency_row(labels, op, a, b));
        }
    }
    let (a, b) = interleaved(rt, &mut calm, &mut raw, MAX_TASKS, Op::ContendedCas);
    eprintln!(
        "backend: {} one key × {MAX_TASKS}: calm {:.0} successful CAS/s, raw {:.0}/s",
        labels.backend, a.rate, b.rate
    );
    let metric = format!("one key, {MAX_TASKS} tasks: 1/successful CAS");
    rows.push(throughput_row(labels, metric, a, b, false));
}

/// The watch latency rows.
fn watch<A: Probe, B: Probe>(
    rt: &Runtime,
    labels: &Labels,
    calm: &mut A,
    raw: &mut B,
    rows: &mut Vec<Row>,
) {
    let (a, b) = watch_latency(rt, calm, raw);
    eprintln!(
        "backend: {} watch, ack to event: calm p50 {} p99 {}, raw p50 {} p99 {}",
        labels.backend,
        Figure::Time(a.ack_p50),
        Figure::Time(a.ack_p99),
        Figure::Time(b.ack_p50),
        Figure::Time(b.ack_p99)
    );
    for (metric, a, b) in [
        ("watch, write ack to event: p50", a.ack_p50, b.ack_p50),
        ("watch, write ack to event: p99", a.ack_p99, b.ack_p99),
        ("watch, write sent to event: p50", a.call_p50, b.call_p50),
    ] {
        rows.push(time_row(labels.workload, metric, labels.watch_peer, (a, b)));
    }
}
