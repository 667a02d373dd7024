//! Synthetic editing traces (`calm-bench text synthetic`): shapes of
//! editing the five real traces do not have, generated from a fixed seed
//! and measured as the traces are, against diamond-types and jumprope.
//! Not part of the report: a check on text calm was not tuned on.
//!
//! Each trace is [`EDITS`] edits from an empty document:
//!
//! - **pastes and cuts**: pastes of 1-300 characters at random places,
//!   and (half the time, once the text is 2,000 characters long) cuts of
//!   1-200;
//! - **typing, all replaced**: typing at the end, the whole text replaced
//!   by a word every 500 edits;
//! - **five places in turn**: typing and backspacing at five places, a
//!   random one each edit (code edited in several spots at once);
//! - **multi-byte text at random places**: 1-4 characters of 1-4 UTF-8
//!   bytes inserted, or 1-5 deleted, at random places;
//! - **words replaced at random places**: 1-8 characters replaced by 1-8
//!   others, or one typed, at random places;
//! - **typing and backspacing**: typing at the end, and one edit in ten
//!   backspacing over 1-30 characters.

use crate::rng::Rng;
use crate::text::Trace;

/// Edits per synthetic trace.
const EDITS: usize = 20_000;

/// The characters of ASCII text (with spaces and line breaks).
const ASCII: &[char] = &[
    'a', 'e', 'i', 'o', 'u', 't', 'n', 's', 'r', 'h', 'l', 'd', 'c', ' ', ' ', '\n',
];

/// Characters of 1 to 4 UTF-8 bytes.
const MIXED: &[char] = &['a', ' ', 'é', 'ñ', '中', '字', '😀', '\n'];

/// Every synthetic trace.
pub fn traces() -> Vec<Trace> {
    let shapes: [(&str, Shape); 6] = [
        ("synthetic: pastes and cuts", pastes_and_cuts),
        ("synthetic: typing, all replaced", all_replaced),
        ("synthetic: five places in turn", five_places),
        ("synthetic: multi-byte text at random places", multi_byte),
        ("synthetic: words replaced at random places", words_replaced),
        ("synthetic: typing and backspacing", backspacing),
    ];
    shapes
        .into_iter()
        .map(|(name, shape)| {
            let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
            let mut state = State::default();
            let mut len = 0;
            let edits = (0..EDITS).map(|i| {
                let (pos, del, ins) = shape(&mut rng, &mut state, len, i);
                len = len - del + ins.chars().count();
                (pos, del, ins)
            });
            Trace::new(name.to_owned(), edits.collect::<Vec<_>>())
        })
        .collect()
}

/// The next edit (position, characters deleted, text inserted) of a
/// trace: from the generator, the shape's own state, the text's length
/// in characters and the edit's number.
type Shape = fn(&mut Rng, &mut State, usize, usize) -> (usize, usize, String);

/// What a shape remembers between edits.
#[derive(Default)]
struct State {
    /// The five places of [`five_places`].
    places: [usize; 5],
}

/// `n` characters drawn from `from`.
fn word(rng: &mut Rng, n: usize, from: &[char]) -> String {
    (0..n)
        .map(|_| from[rng.below(from.len() as u64) as usize])
        .collect()
}

/// A number in `1..=n`.
fn one_to(rng: &mut Rng, n: usize) -> usize {
    1 + rng.below(n as u64) as usize
}

/// A random place for a range of `n` of `len` characters.
fn place(rng: &mut Rng, len: usize, n: usize) -> usize {
    rng.below((len - n + 1) as u64) as usize
}

fn pastes_and_cuts(rng: &mut Rng, _: &mut State, len: usize, _: usize) -> (usize, usize, String) {
    if len > 2_000 && rng.below(2) == 0 {
        let n = one_to(rng, 200);
        (place(rng, len, n), n, String::new())
    } else {
        let n = one_to(rng, 300);
        (place(rng, len, 0), 0, word(rng, n, ASCII))
    }
}

fn all_replaced(rng: &mut Rng, _: &mut State, len: usize, i: usize) -> (usize, usize, String) {
    if i % 500 == 499 {
        (0, len, word(rng, 10, ASCII))
    } else {
        (len, 0, word(rng, 1, ASCII))
    }
}

fn five_places(rng: &mut Rng, state: &mut State, len: usize, _: usize) -> (usize, usize, String) {
    let h = rng.below(5) as usize;
    if rng.below(200) == 0 {
        state.places[h] = place(rng, len, 0);
    }
    let at = state.places[h].min(len);
    let (pos, del, ins) = if at > 0 && rng.below(4) == 0 {
        (at - 1, 1, String::new())
    } else {
        (at, 0, word(rng, 1, ASCII))
    };
    // Every place after the edit moves with the text.
    for p in &mut state.places {
        if *p > pos {
            *p = if del > 0 { *p - 1 } else { *p + 1 };
        }
    }
    state.places[h] = if del > 0 { pos } else { pos + 1 };
    (pos, del, ins)
}

fn multi_byte(rng: &mut Rng, _: &mut State, len: usize, _: usize) -> (usize, usize, String) {
    if len > 0 && rng.below(3) == 0 {
        let n = one_to(rng, 5).min(len);
        (place(rng, len, n), n, String::new())
    } else {
        let n = one_to(rng, 4);
        (place(rng, len, 0), 0, word(rng, n, MIXED))
    }
}

fn words_replaced(rng: &mut Rng, _: &mut State, len: usize, _: usize) -> (usize, usize, String) {
    if len > 10 && rng.below(2) == 0 {
        let n = one_to(rng, 8);
        let at = place(rng, len, n);
        let m = one_to(rng, 8);
        (at, n, word(rng, m, ASCII))
    } else {
        (place(rng, len, 0), 0, word(rng, 1, ASCII))
    }
}

fn backspacing(rng: &mut Rng, _: &mut State, len: usize, _: usize) -> (usize, usize, String) {
    if len > 30 && rng.below(10) == 0 {
        let n = one_to(rng, 30);
        (len - n, n, String::new())
    } else {
        (len, 0, word(rng, 1, ASCII))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_keeps_its_edits_in_range_and_differs() {
        // Trace::new replays each edit on a rope, which panics on an
        // edit out of range; the shapes must also produce distinct text.
        let traces = traces();
        assert_eq!(traces.len(), 6);
        for t in &traces {
            assert_eq!(t.patches.len(), EDITS, "{}", t.name);
        }
        let mut ends: Vec<&str> = traces.iter().map(|t| t.end.as_str()).collect();
        ends.sort_unstable();
        ends.dedup();
        assert_eq!(ends.len(), traces.len());
    }
}
