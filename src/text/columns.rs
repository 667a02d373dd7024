//! The numbers of a document's layout ([`super::snapshot`]) in columns:
//! each kind of number in a stream of its own, Huffman-coded on its own,
//! because each has its own distribution (run lengths are small, local
//! versions jump, most origins are guessed).
//!
//! ```text
//!   counts     runs, insert entries, then per replica its delete entries
//!              (varints)
//!   columns    nine blocks (`codec::huffman`), in this order:
//!     run_starts    each run's first local version (zig-zag delta)
//!     run_lens      each run's length and deleted flag
//!     replicas      the replica index of each stretch of consecutive
//!                   insert entries of one replica (empty with one)
//!     stretches     each such stretch's length - 1
//!     gaps          each insert entry's counter gap
//!     lens          each insert entry's length and origin code
//!     origins       the origins given in full, left before right
//!     backs         each delete entry's target (zig-zag distance)
//!     delete_lens   each delete entry's length and reversed flag
//! ```
//!
//! Insert entries come in local-version order, in which a replica's edits
//! mostly arrive together (a merge brings each replica's history in
//! turn), so their replicas are written as stretches: a document merged
//! from 63 users' histories writes 63 numbers there, not one per entry.
//!
//! Format version 2 wrote the same numbers interleaved, entry by entry
//! and uncoded, with a replica index per entry;
//! [`Decoded::split_version_2`] sorts them into columns (joining the
//! replica indices into stretches), so one reader serves both.

use crate::codec::{self, DecodeError, Decoder, Encoder};

/// How many runs and entries the columns hold.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) runs: usize,
    pub(super) inserts: usize,
    /// Per replica (in the document's order), its delete entries.
    pub(super) deletes: Vec<usize>,
}

/// How many columns there are.
const COLUMNS: usize = 9;

/// Declares [`Columns`] with one field per column, in the order they are
/// written, and its conversions to and from an array in that order.
macro_rules! columns {
    ($($name:ident),* $(,)?) => {
        /// One value per column (an [`Encoder`] to write, a [`Decoder`] to
        /// read); the module docs say what each holds.
        #[derive(Debug, Default)]
        pub(super) struct Columns<T> {
            $(pub(super) $name: T,)*
        }

        impl<T> Columns<T> {
            fn from_array([$($name),*]: [T; COLUMNS]) -> Self {
                Self { $($name),* }
            }

            fn into_array(self) -> [T; COLUMNS] {
                [$(self.$name),*]
            }
        }
    };
}

columns!(
    run_starts,
    run_lens,
    replicas,
    stretches,
    gaps,
    lens,
    origins,
    backs,
    delete_lens,
);

/// Insert entries' replica indices joined into stretches as they come,
/// for the `replicas` and `stretches` columns.
#[derive(Default)]
pub(super) struct Stretches {
    /// The current stretch's replica index and length, if one is open.
    open: Option<(u64, u64)>,
}

impl Stretches {
    /// The next entry's replica index.
    pub(super) fn push(&mut self, c: &mut Columns<Encoder>, replica: u64) {
        match &mut self.open {
            Some((r, len)) if *r == replica => *len += 1,
            _ => {
                self.end(c);
                self.open = Some((replica, 1));
            }
        }
    }

    /// Writes the open stretch, if any.
    pub(super) fn end(&mut self, c: &mut Columns<Encoder>) {
        if let Some((r, len)) = self.open.take() {
            c.replicas.varint(r);
            c.stretches.varint(len - 1);
        }
    }
}

impl Columns<Encoder> {
    /// Writes `counts` and the columns, coded.
    pub(super) fn write(self, counts: &Counts, enc: &mut Encoder) {
        enc.length(counts.runs);
        enc.length(counts.inserts);
        for &d in &counts.deletes {
            enc.length(d);
        }
        for column in self.into_array() {
            codec::huffman::write(enc, &column.into_bytes());
        }
    }
}

/// The columns as read, decoded into one buffer, in order.
#[derive(Default)]
pub(super) struct Decoded {
    bytes: Vec<u8>,
    /// Where each column ends in `bytes`.
    ends: [usize; COLUMNS],
}

impl Decoded {
    /// Reads what [`Columns::write`] wrote, for `replicas` replicas. The
    /// counts are checked against the columns (every run and entry takes
    /// at least one byte of its first column), so allocating by them is
    /// bounded by the input.
    pub(super) fn read(
        dec: &mut Decoder<'_>,
        replicas: usize,
    ) -> Result<(Counts, Self), DecodeError> {
        let offset = dec.offset();
        let mut count = || {
            dec.varint()
                .map(|c| usize::try_from(c).unwrap_or(usize::MAX))
        };
        let runs = count()?;
        let inserts = count()?;
        let deletes = (0..replicas).map(|_| count()).collect::<Result<_, _>>()?;
        let mut read = Decoded::default();
        for end in &mut read.ends {
            codec::huffman::read_into(dec, &mut read.bytes)?;
            *end = read.bytes.len();
        }
        read.counted(runs, inserts, deletes, offset)
    }

    /// The counts of runs, insert entries and each replica's delete
    /// entries beside the columns they count, checked: every run and
    /// entry takes at least one byte of its first column.
    fn counted(
        self,
        runs: usize,
        inserts: usize,
        deletes: Vec<usize>,
        offset: usize,
    ) -> Result<(Counts, Self), DecodeError> {
        let counts = Counts {
            runs,
            inserts,
            deletes,
        };
        let c = self.decoders();
        let held = |d: &Decoder<'_>, n: usize| n <= d.remaining();
        let deletes = counts
            .deletes
            .iter()
            .fold(0usize, |t, &d| t.saturating_add(d));
        if held(&c.run_starts, counts.runs)
            && held(&c.gaps, counts.inserts)
            && held(&c.backs, deletes)
        {
            Ok((counts, self))
        } else {
            Err(DecodeError::Invalid {
                offset,
                what: "more runs or entries than their columns hold",
            })
        }
    }

    /// Reads the interleaved numbers of format version 2 into columns.
    pub(super) fn split_version_2(
        dec: &mut Decoder<'_>,
        replicas: usize,
    ) -> Result<(Counts, Self), DecodeError> {
        let offset = dec.offset();
        let mut c = Columns::<Encoder>::default();
        let copy =
            |dec: &mut Decoder<'_>, to: &mut Encoder| dec.varint().inspect(|&v| to.varint(v));
        let runs = dec.length()?;
        for _ in 0..runs {
            copy(dec, &mut c.run_starts)?;
            copy(dec, &mut c.run_lens)?;
        }
        let inserts = dec.length()?;
        let mut stretches = Stretches::default();
        for _ in 0..inserts {
            if replicas != 1 {
                stretches.push(&mut c, dec.varint()?);
            }
            copy(dec, &mut c.gaps)?;
            let code = copy(dec, &mut c.lens)? & 7;
            if code % 3 == 2 {
                copy(dec, &mut c.origins)?;
            }
            if code / 3 == 1 {
                copy(dec, &mut c.origins)?;
            }
        }
        stretches.end(&mut c);
        let mut deletes = Vec::with_capacity(replicas);
        for _ in 0..replicas {
            let d = dec.length()?;
            for _ in 0..d {
                copy(dec, &mut c.backs)?;
                copy(dec, &mut c.delete_lens)?;
            }
            deletes.push(d);
        }
        let mut read = Decoded::default();
        for (column, end) in c.into_array().into_iter().zip(&mut read.ends) {
            read.bytes.extend_from_slice(&column.into_bytes());
            *end = read.bytes.len();
        }
        read.counted(runs, inserts, deletes, offset)
    }

    /// A decoder over each column.
    pub(super) fn decoders(&self) -> Columns<Decoder<'_>> {
        Columns::from_array(std::array::from_fn(|i| {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            Decoder::new(&self.bytes[start..self.ends[i]])
        }))
    }
}

impl Columns<Decoder<'_>> {
    /// Checks that every column was read to its end.
    pub(super) fn finish(self) -> Result<(), DecodeError> {
        self.into_array().iter().try_for_each(Decoder::finish)
    }
}
