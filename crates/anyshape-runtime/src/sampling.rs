//! Choosing the next token from a row of logits ([`Sampling`]): the most likely one, or
//! a seeded draw from the softmax at a temperature over the top k.
use rand::RngExt;
use rand_chacha::ChaCha8Rng;

/// How the next token is chosen from the logits.
#[derive(Clone, Debug, PartialEq)]
pub enum Sampling {
    /// The most likely token (the first of equals).
    Greedy,
    /// A draw from the softmax of the logits divided by `temperature`, over the `top_k`
    /// most likely tokens (all where `None`), by a generator seeded with `seed`: the
    /// same seed draws the same tokens.
    Sample {
        /// Above 0; below 1 sharpens, above 1 flattens.
        temperature: f32,
        /// Keep only this many of the most likely tokens (at least 1).
        top_k: Option<usize>,
        /// The generator's seed.
        seed: u64,
    },
}

/// The index of the largest value, the first of equals; NaN never wins.
pub(crate) fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] || row[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    best
}

/// A draw from the softmax of `row / temperature` over its `top_k` largest values.
pub(crate) fn sample(row: &[f32], temperature: f32, top_k: usize, rng: &mut ChaCha8Rng) -> usize {
    let mut order: Vec<usize> = (0..row.len()).filter(|&i| !row[i].is_nan()).collect();
    if order.is_empty() {
        return 0;
    }
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    order.truncate(top_k.max(1));
    let top = f64::from(row[order[0]]);
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| ((f64::from(row[i]) - top) / f64::from(temperature)).exp())
        .collect();
    let mut x = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (&i, w) in order.iter().zip(&weights) {
        if x < *w {
            return i;
        }
        x -= w;
    }
    order[order.len() - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn argmax_takes_the_first_of_equals_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, -2.0]), 1);
    }

    #[test]
    fn sampling_is_seeded_and_keeps_to_the_top_k() {
        let row = [0.0, 2.0, 1.0, 2.5, -1.0];
        let draw = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..200)
                .map(|_| sample(&row, 1.0, 2, &mut rng))
                .collect::<Vec<_>>()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        assert!(a.iter().all(|&i| i == 1 || i == 3), "{a:?}");
        assert!(a.contains(&1) && a.contains(&3), "{a:?}");
        // A low temperature is greedy.
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert!((0..50).all(|_| sample(&row, 1e-3, 5, &mut rng) == 3));
    }
}
