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

/// One prepared run: its input is built, calling it does the timed work.
type Run<'a> = Box<dyn FnOnce() + 'a>;

/// One side's routine: builds its inputs (untimed) and runs on them.
pub struct Side<'a> {
    /// Prepares `n` runs for one round; not timed.
    setup: Box<dyn FnMut(usize) -> Vec<Run<'a>> + 'a>,
}

impl<'a> Side<'a> {
    /// A routine that needs a fresh input per run: `setup` makes one (not
    /// timed), `routine` consumes it (timed).
    pub fn batched<I: 'a, O>(
        mut setup: impl FnMut() -> I + 'a,
        routine: impl Fn(I) -> O + Copy + 'a,
    ) -> Self {
        Self {
            setup: Box::new(move |n| {
                (0..n)
                    .map(|_| {
                        let input = setup();
                        Box::new(move || {
                            black_box(routine(black_box(input)));
                        }) as Run<'a>
                    })
                    .collect()
            }),
        }
    }

    /// Runs `n` times and returns the time per run.
    fn round(&mut self, n: usize) -> Duration {
        let runs = (self.setup)(n);
        let start = Instant::now();
        for run in runs {
            run();
        }
        start.elapsed() / n as u32
    }

    /// How many runs fill one round.
    fn calibrate(&mut self) -> usize {
        let mut n = 1;
        loop {
            let t = self.round(n) * n as u32;
            if t >= ROUND / 4 || n >= 1 << 20 {
                let per = (t / n as u32).max(Duration::from_nanos(1));
                return ((ROUND.as_nanos() / per.as_nanos()) as usize).clamp(1, 1 << 22);
            }
            n *= 4;
        }
    }
}

/// The medians of two sides measured in alternating rounds.
pub fn compare(ours: Side<'_>, theirs: Side<'_>) -> (Duration, Duration) {
    compare_rounds(ours, theirs, ROUNDS)
}

/// As [`compare`] with `rounds` rounds per side (fewer for workloads
/// whose single run takes seconds).
pub fn compare_rounds(
    mut ours: Side<'_>,
    mut theirs: Side<'_>,
    rounds: usize,
) -> (Duration, Duration) {
    let (n_ours, n_theirs) = (ours.calibrate(), theirs.calibrate());
    let mut a = Vec::with_capacity(rounds);
    let mut b = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        a.push(ours.round(n_ours));
        b.push(theirs.round(n_theirs));
    }
    (median(&mut a), median(&mut b))
}

fn median(xs: &mut [Duration]) -> Duration {
    xs.sort();
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
    /// A time per operation.
    Time(Duration),
    /// A size in bytes.
    Bytes(usize),
}

impl Figure {
    fn value(self) -> f64 {
        match self {
            Figure::Time(d) => d.as_secs_f64(),
            Figure::Bytes(b) => b as f64,
        }
    }
}

impl std::fmt::Display for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Figure::Time(d) if d >= Duration::from_millis(1) => {
                write!(f, "{:.2} ms", d.as_secs_f64() * 1e3)
            }
            Figure::Time(d) if d >= Duration::from_micros(1) => {
                write!(f, "{:.2} µs", d.as_secs_f64() * 1e6)
            }
            Figure::Time(d) => write!(f, "{} ns", d.as_nanos()),
            Figure::Bytes(b) if b >= 10_000 => write!(f, "{:.1} KiB", b as f64 / 1024.0),
            Figure::Bytes(b) => write!(f, "{b} B"),
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

/// A ratio with two decimals, or three significant digits when small.
pub fn format_ratio(r: f64) -> String {
    if r >= 0.1 {
        format!("{r:.2}")
    } else {
        format!("{r:.1e}")
    }
}
