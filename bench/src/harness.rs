//! A small side-by-side timing harness.
//!
//! These machines are noisy, so calm and its peer are measured in
//! alternating rounds of the same length, and what is reported is the
//! ratio of the two medians: a slow spell hits both sides alike.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// How long one round of one side should take, at least.
const ROUND: Duration = Duration::from_millis(30);
/// Rounds per side; the median is reported.
const ROUNDS: usize = 11;

/// One side of a comparison: given `n`, runs the routine `n` times and
/// returns the time those runs took (any setup excluded).
pub struct Side<'a> {
    /// Runs `n` times, returns the timed part.
    run: Box<dyn FnMut(usize) -> Duration + 'a>,
}

impl<'a> Side<'a> {
    /// A routine that needs a fresh input per run: `setup` makes one (not
    /// timed), `routine` consumes it (timed).
    pub fn batched<I: 'a, O>(
        mut setup: impl FnMut() -> I + 'a,
        routine: impl Fn(I) -> O + 'a,
    ) -> Self {
        Self {
            run: Box::new(move |n| {
                let inputs: Vec<I> = (0..n).map(|_| setup()).collect();
                let start = Instant::now();
                for input in inputs {
                    black_box(routine(black_box(input)));
                }
                start.elapsed()
            }),
        }
    }

    /// A cheap routine timed in a tight loop, for operations of
    /// nanoseconds.
    pub fn looped<O>(mut routine: impl FnMut() -> O + 'a) -> Self {
        Self {
            run: Box::new(move |n| {
                let start = Instant::now();
                for _ in 0..n {
                    black_box(routine());
                }
                start.elapsed()
            }),
        }
    }

    /// A routine that times itself: given `n`, it does `n` units of work
    /// (across threads, say) and returns how long they took.
    pub fn custom(run: impl FnMut(usize) -> Duration + 'a) -> Self {
        Self { run: Box::new(run) }
    }

    /// Runs `n` times and returns the seconds per run.
    fn round(&mut self, n: usize) -> f64 {
        (self.run)(n).as_secs_f64() / n as f64
    }

    /// How many runs fill one round.
    fn calibrate(&mut self) -> usize {
        let mut n = 1;
        loop {
            let total = (self.run)(n);
            if total >= ROUND / 4 || n >= 1 << 24 {
                let per = total.as_secs_f64().max(1e-9) / n as f64;
                return ((ROUND.as_secs_f64() / per) as usize).clamp(1, 1 << 26);
            }
            n *= 4;
        }
    }
}

/// The median seconds per run of one side alone.
pub fn measure(mut side: Side<'_>) -> f64 {
    let n = side.calibrate();
    let mut xs: Vec<f64> = (0..ROUNDS).map(|_| side.round(n)).collect();
    median(&mut xs)
}

/// The medians (seconds per run) of two sides measured in alternating
/// rounds.
pub fn compare(ours: Side<'_>, theirs: Side<'_>) -> (f64, f64) {
    compare_rounds(ours, theirs, ROUNDS)
}

/// As [`compare`] with `rounds` rounds per side (fewer for workloads
/// whose single run takes seconds).
pub fn compare_rounds(ours: Side<'_>, theirs: Side<'_>, rounds: usize) -> (f64, f64) {
    compare_uneven(ours, theirs, [rounds, rounds])
}

/// As [`compare_rounds`] with a number of rounds for each side (more for
/// a side whose runs are short, where this machine's speed moves most):
/// the side with fewer rounds has them spread evenly among the other's.
pub fn compare_uneven(mut ours: Side<'_>, mut theirs: Side<'_>, rounds: [usize; 2]) -> (f64, f64) {
    let (n_ours, n_theirs) = (ours.calibrate(), theirs.calibrate());
    let mut a: Vec<f64> = Vec::with_capacity(rounds[0]);
    let mut b: Vec<f64> = Vec::with_capacity(rounds[1]);
    let steps = rounds[0].max(rounds[1]).max(1);
    // Side `k` runs at step `i` when `i * rounds[k] / steps` moves on.
    let due = |k: usize, i: usize| (i * rounds[k]) / steps != ((i + 1) * rounds[k]) / steps;
    for i in 0..steps {
        if due(0, i) {
            a.push(ours.round(n_ours));
        }
        if due(1, i) {
            b.push(theirs.round(n_theirs));
        }
    }
    (median(&mut a), median(&mut b))
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// One row of a results table.
#[derive(Debug, Clone)]
pub struct Row {
    /// The workload.
    pub workload: String,
    /// What was measured.
    pub metric: String,
    /// The peer.
    pub peer: String,
    /// calm's figure.
    pub ours: Figure,
    /// The peer's figure.
    pub theirs: Figure,
}

/// A measured figure.
#[derive(Debug, Clone, Copy)]
pub enum Figure {
    /// A time per operation, in seconds.
    Time(f64),
    /// A size in bytes.
    Bytes(usize),
    /// A dimensionless factor.
    Factor(f64),
    /// A count per operation (server requests per acquisition, say).
    PerOp(f64),
    /// A throughput, as the wall time per operation (1 / throughput, in
    /// seconds, so a smaller figure is better as with [`Figure::Time`]);
    /// shown with the operations per second and, when measured, the
    /// per-operation latency p50 and p99 (seconds).
    Throughput {
        /// Wall seconds per operation over all tasks.
        per_op: f64,
        /// Latency p50 and p99 of one operation.
        latency: Option<(f64, f64)>,
    },
}

impl Figure {
    /// The figure as a number (seconds or bytes; a throughput's seconds
    /// per operation).
    pub fn value(self) -> f64 {
        match self {
            Figure::Time(secs) => secs,
            Figure::Bytes(b) => b as f64,
            Figure::Factor(x) | Figure::PerOp(x) => x,
            Figure::Throughput { per_op, .. } => per_op,
        }
    }
}

impl std::fmt::Display for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Figure::Time(s) if s >= 1e-3 => write!(f, "{:.2} ms", s * 1e3),
            Figure::Time(s) if s >= 1e-6 => write!(f, "{:.2} µs", s * 1e6),
            Figure::Time(s) => write!(f, "{:.1} ns", s * 1e9),
            Figure::Bytes(b) if b >= 10_000 => write!(f, "{:.1} KiB", b as f64 / 1024.0),
            Figure::Bytes(b) => write!(f, "{b} B"),
            Figure::Factor(x) => write!(f, "{x:.2}×"),
            Figure::PerOp(x) => write!(f, "{x:.2}"),
            Figure::Throughput { per_op, latency } => {
                let rate = 1.0 / per_op;
                write!(f, "{} (", Figure::Time(per_op))?;
                if rate >= 1e4 {
                    write!(f, "{:.1} k/s", rate / 1e3)?;
                } else {
                    write!(f, "{rate:.0}/s")?;
                }
                if let Some((p50, p99)) = latency {
                    write!(f, "; p50 {}, p99 {}", Figure::Time(p50), Figure::Time(p99))?;
                }
                write!(f, ")")
            }
        }
    }
}

impl Row {
    /// calm's figure divided by the peer's: below 1 means calm is faster or
    /// smaller.
    pub fn ratio(&self) -> f64 {
        self.ours.value() / self.theirs.value()
    }
}

/// A row of two times (seconds per operation).
pub fn time_row(workload: &str, metric: &str, peer: &str, (ours, theirs): (f64, f64)) -> Row {
    Row {
        workload: workload.into(),
        metric: metric.into(),
        peer: peer.into(),
        ours: Figure::Time(ours),
        theirs: Figure::Time(theirs),
    }
}

/// Prints rows as a Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "| workload | metric | peer | calm | peer's | calm / peer |\n| --- | --- | --- | ---: | ---: | ---: |\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | **{}** |\n",
            r.workload,
            r.metric,
            r.peer,
            r.ours,
            r.theirs,
            format_ratio(r.ratio())
        ));
    }
    out
}

/// A ratio with two decimals, or three significant digits when small; a
/// dash when the peer's figure was zero.
pub fn format_ratio(r: f64) -> String {
    if !r.is_finite() {
        "—".into()
    } else if r >= 0.1 {
        format!("{r:.2}")
    } else {
        format!("{r:.1e}")
    }
}

/// Polls a future that completes at once (every `MemoryStore` call but a
/// watch) without an executor, so the store is measured, not a runtime.
///
/// # Panics
///
/// If the future is not ready at its first poll.
pub fn now<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("expected a future that completes at its first poll"),
    }
}

/// Runs `n` operations split over `threads` threads; returns the elapsed
/// time.
pub fn on_threads(threads: usize, n: usize, op: impl Fn() + Sync) -> Duration {
    let per = n.div_ceil(threads);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..per {
                    op();
                }
            });
        }
    });
    start.elapsed()
}

/// What one side measured over its rounds of one throughput comparison.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// Counted operations per second, median over the rounds.
    pub rate: f64,
    /// Per-operation latency in seconds, p50 over every round's samples.
    pub p50: f64,
    /// Per-operation latency in seconds, p99 over every round's samples.
    pub p99: f64,
    /// Counted operations over every measured round.
    pub counted: u64,
}

/// What one round of a throughput comparison measured.
pub struct Round {
    /// Counted operations per second of wall time.
    pub rate: f64,
    /// Counted operations.
    pub counted: u64,
    /// Every operation's latency, in nanoseconds.
    pub latencies: Vec<u32>,
}

/// The median rate of `rounds` and the latency quantiles over all their
/// samples.
pub fn summarise(rounds: Vec<Round>) -> Summary {
    let mut rates: Vec<f64> = rounds.iter().map(|r| r.rate).collect();
    rates.sort_by(f64::total_cmp);
    let counted = rounds.iter().map(|r| r.counted).sum();
    let mut lat: Vec<u32> = rounds.into_iter().flat_map(|r| r.latencies).collect();
    lat.sort_unstable();
    Summary {
        rate: rates[rates.len() / 2],
        p50: percentile(&lat, 0.50),
        p99: percentile(&lat, 0.99),
        counted,
    }
}

/// The `q` quantile of sorted nanoseconds, in seconds (0 when empty).
pub fn percentile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    f64::from(sorted[i]) * 1e-9
}

/// A throughput row with the latency p50 and p99 of each side.
pub fn throughput_row_of(
    workload: &str,
    metric: String,
    peer: &str,
    a: Summary,
    b: Summary,
) -> Row {
    let figure = |s: Summary| Figure::Throughput {
        per_op: 1.0 / s.rate,
        latency: Some((s.p50, s.p99)),
    };
    Row {
        workload: workload.into(),
        metric,
        peer: peer.into(),
        ours: figure(a),
        theirs: figure(b),
    }
}
