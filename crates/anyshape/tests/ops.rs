//! Operators through the path users take (an ONNX file, `compile`, `run` with recorded
//! outputs): small graphs of one op each (unary math, `CumSum`, pooling, `Clip`,
//! `Trilu`, `BatchNormalization`, `ArgMax`/`ArgMin`, `Mod`, and ops whose shapes
//! only their run-time inputs tell), compiled for a symbolic dim `n` and run in its
//! range and past it, checked against the ops' definitions computed here in f64.
mod support;

use std::path::Path;
use support::{anyshape, compile_n, f32_bytes, failed_with, npy, npz, run_on, text, Dim, Onnx};

/// Write `members` (the inputs and the expected outputs, named `y_…`) to `c.npz` in `d`,
/// run the module `m.module` on it, and assert that the run passed and compared every
/// expected output.
fn run_checked<S: AsRef<str>>(d: &Path, n: usize, members: &[(S, Vec<u8>)]) {
    let refs: Vec<(&str, Vec<u8>)> = members
        .iter()
        .map(|(k, v)| (k.as_ref(), v.clone()))
        .collect();
    npz(&d.join("c.npz"), &refs);
    let o = run_on(d, "m.module", "c.npz");
    let out = text(&o);
    assert!(o.status.success(), "n={n}: {out}");
    for (name, _) in refs.iter().filter(|(k, _)| k.starts_with("y_")) {
        assert!(
            out.contains(&format!("check        {name}:")),
            "n={n}: {name} not checked in {out}"
        );
    }
}

/// A unary op, the input it reads and its definition.
type Unary = (&'static str, &'static str, fn(f64) -> f64);

/// The unary math of rotary embeddings, activations and rounding. `x` lies in (-1, 1)
/// (the inverse trigonometric and hyperbolic functions' domain), `z` at or above 1
/// (`Acosh`), `w` is wide: halves, zeros, large magnitudes.
const UNARY: &[Unary] = &[
    ("Sin", "w", f64::sin),
    ("Cos", "w", f64::cos),
    ("Tan", "x", f64::tan),
    ("Asin", "x", f64::asin),
    ("Acos", "x", f64::acos),
    ("Atan", "w", f64::atan),
    ("Sinh", "x", f64::sinh),
    ("Cosh", "x", f64::cosh),
    ("Asinh", "w", f64::asinh),
    ("Acosh", "z", f64::acosh),
    ("Atanh", "x", f64::atanh),
    ("Softplus", "w", |v| (1.0 + v.exp()).ln()),
    ("Softsign", "w", |v| v / (1.0 + v.abs())),
    ("HardSigmoid", "w", |v| (0.2 * v + 0.5).clamp(0.0, 1.0)),
    ("HardSwish", "w", |v| v * (v / 6.0 + 0.5).clamp(0.0, 1.0)),
    ("Sign", "w", |v| if v == 0.0 { 0.0 } else { v.signum() }),
    ("Floor", "w", f64::floor),
    ("Ceil", "w", f64::ceil),
    ("Round", "w", f64::round_ties_even),
];

/// Values of input `name` for `n` rows of 6.
fn values(name: &str, n: usize) -> Vec<f32> {
    let wide = [
        -30.0, -2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, 3.7, -4.2, 20.0, 0.49,
    ];
    (0..n * 6)
        .map(|i| {
            let t = ((i * 7919) % 997) as f32 / 997.0; // [0, 1), scattered
            match name {
                "x" => (t * 2.0 - 1.0) * 0.95,
                "z" => 1.0 + t * 5.0,
                _ => wide[i % wide.len()] + if i >= wide.len() { t - 0.5 } else { 0.0 },
            }
        })
        .collect()
}

#[test]
fn unary_math_matches_its_definition_at_every_n() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let dims = [Dim::Named("n"), Dim::Fixed(6)];
    let mut onnx = Onnx::new(17)
        .input("x", &dims)
        .input("z", &dims)
        .input("w", &dims);
    for (op, input, _) in UNARY {
        onnx = onnx
            .node(op, &[input], &[&format!("y_{op}")], &[])
            .output(&format!("y_{op}"), &dims);
    }
    onnx.write(&d.join("m.onnx"));
    let o = compile_n(d, "m.onnx", "m.module");
    assert!(o.status.success(), "{}", text(&o));
    // 1, a prime, the range's end (4) and past it.
    for n in [1usize, 3, 4, 7] {
        let array = |v: &[f32]| npy("<f4", false, &[n, 6], &f32_bytes(v));
        let mut members: Vec<(String, Vec<u8>)> = ["x", "z", "w"]
            .iter()
            .map(|i| (i.to_string(), array(&values(i, n))))
            .collect();
        for (op, input, f) in UNARY {
            let want: Vec<f32> = values(input, n)
                .iter()
                .map(|&v| f(v as f64) as f32)
                .collect();
            members.push((format!("y_{op}"), array(&want)));
        }
        run_checked(d, n, &members);
    }
}

/// `CumSum` of `v` (`[n, 6]`) along `axis`, as the op defines it, in f64.
fn cumsum(v: &[f64], n: usize, axis: usize, exclusive: bool, reverse: bool) -> Vec<f64> {
    let (lines, len) = if axis == 0 { (6, n) } else { (n, 6) };
    let at = |line: usize, k: usize| {
        if axis == 0 {
            k * 6 + line
        } else {
            line * 6 + k
        }
    };
    let mut out = vec![0.0; v.len()];
    for line in 0..lines {
        let mut sum = 0.0;
        for k in 0..len {
            let j = if reverse { len - 1 - k } else { k };
            let before = sum;
            sum += v[at(line, j)];
            out[at(line, j)] = if exclusive { before } else { sum };
        }
    }
    out
}

/// `CumSum` along the symbolic axis and the fixed one, inclusive and exclusive,
/// forwards and in reverse, on floats and (cast) on integers.
#[test]
fn cumsum_matches_its_definition_at_every_n() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let dims = [Dim::Named("n"), Dim::Fixed(6)];
    // (output, axis input, exclusive, reverse, on integers)
    let cases: &[(&str, &str, bool, bool, bool)] = &[
        ("y_rows", "zero", false, false, false),
        ("y_cols_exclusive_reverse", "minus_one", true, true, false),
        ("y_rows_reverse", "zero", false, true, false),
        ("y_ints_exclusive", "one", true, false, true),
    ];
    let mut onnx = Onnx::new(17)
        .input("x", &dims)
        .int_weight("zero", &[], &[0])
        .int_weight("one", &[1], &[1])
        .int_weight("minus_one", &[], &[-1])
        .node("Cast", &["x"], &["xi"], &[("to", 7)]);
    for &(out, axis, exclusive, reverse, ints) in cases {
        let attrs = [("exclusive", exclusive as i64), ("reverse", reverse as i64)];
        onnx = if ints {
            let mid = format!("{out}_i64");
            onnx.node("CumSum", &["xi", axis], &[&mid], &attrs).node(
                "Cast",
                &[&mid],
                &[out],
                &[("to", 1)],
            )
        } else {
            onnx.node("CumSum", &["x", axis], &[out], &attrs)
        }
        .output(out, &dims);
    }
    onnx.write(&d.join("m.onnx"));
    let o = compile_n(d, "m.onnx", "m.module");
    assert!(o.status.success(), "{}", text(&o));
    for n in [1usize, 3, 4, 7] {
        // Whole numbers, so that the cast to integers keeps them.
        let x: Vec<f32> = (0..n * 6).map(|i| ((i * 37) % 23) as f32 - 11.0).collect();
        let array = |v: &[f32]| npy("<f4", false, &[n, 6], &f32_bytes(v));
        let mut members = vec![("x", array(&x))];
        for &(out, axis, exclusive, reverse, _) in cases {
            let axis = if axis == "zero" { 0 } else { 1 };
            let wide: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let want: Vec<f32> = cumsum(&wide, n, axis, exclusive, reverse)
                .iter()
                .map(|&v| v as f32)
                .collect();
            members.push((out, array(&want)));
        }
        run_checked(d, n, &members);
    }
}

/// A pool as the ops define it, in f64: `x` is `[n, c, h, w]`; the window's kernel,
/// strides, pads (top, left, bottom, right) and dilations; `op` `MaxPool`,
/// `AveragePool` (with `param` 1: counting the padding) or `LpPool` (the `param`-norm).
/// Returns the output and its spatial extents.
#[allow(clippy::too_many_arguments)]
fn pool(
    x: &[f32],
    [n, c, h, w]: [usize; 4],
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 4],
    d: [usize; 2],
    op: &str,
    param: i64,
) -> (Vec<f32>, [usize; 2]) {
    let (max, include_pad) = (op == "MaxPool", op == "AveragePool" && param == 1);
    let lp = (op == "LpPool").then_some(param as f64);
    let oh = (h + p[0] + p[2] - d[0] * (k[0] - 1) - 1) / s[0] + 1;
    let ow = (w + p[1] + p[3] - d[1] * (k[1] - 1) - 1) / s[1] + 1;
    let mut out = vec![];
    for img in 0..n * c {
        for y in 0..oh {
            for xo in 0..ow {
                let (mut best, mut sum, mut count, mut norm) = (f64::NEG_INFINITY, 0.0, 0.0, 0.0);
                for u in 0..k[0] {
                    for q in 0..k[1] {
                        let r = (y * s[0] + u * d[0]) as i64 - p[0] as i64;
                        let col = (xo * s[1] + q * d[1]) as i64 - p[1] as i64;
                        if (0..h as i64).contains(&r) && (0..w as i64).contains(&col) {
                            let e = x[img * h * w + r as usize * w + col as usize] as f64;
                            best = best.max(e);
                            sum += e;
                            count += 1.0;
                            norm += e.abs().powf(lp.unwrap_or(1.0));
                        } else if include_pad {
                            count += 1.0;
                        }
                    }
                }
                out.push(match lp {
                    Some(p) => norm.powf(1.0 / p),
                    None if max => best,
                    None => sum / count,
                } as f32);
            }
        }
    }
    (out, [oh, ow])
}

/// `MaxPool`, `AveragePool` and `LpPool` (strided, padded, dilated; the average with and
/// without the padding counted; the 3-norm) and the global pools, over a symbolic batch.
#[test]
fn pools_match_their_definition_at_every_n() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (c, h, w) = (3usize, 9usize, 7usize);
    type Case = (
        &'static str,
        &'static str,
        [i64; 2],
        [i64; 2],
        [i64; 4],
        [i64; 2],
        i64,
    );
    // (output, op, kernel, strides, pads, dilations, count_include_pad or p)
    let cases: &[Case] = &[
        (
            "y_max_s2_p1",
            "MaxPool",
            [3, 3],
            [2, 2],
            [1, 1, 1, 1],
            [1, 1],
            0,
        ),
        (
            "y_max_dilated",
            "MaxPool",
            [2, 3],
            [1, 2],
            [0, 1, 0, 0],
            [2, 1],
            0,
        ),
        (
            "y_avg_s2_p1",
            "AveragePool",
            [3, 3],
            [2, 2],
            [1, 1, 1, 1],
            [1, 1],
            0,
        ),
        (
            "y_avg_with_pad",
            "AveragePool",
            [3, 2],
            [2, 1],
            [1, 0, 2, 1],
            [1, 1],
            1,
        ),
        (
            "y_lp3_dilated",
            "LpPool",
            [2, 3],
            [2, 1],
            [1, 1, 0, 1],
            [2, 1],
            3,
        ),
    ];
    let us = |v: &[i64]| -> Vec<usize> { v.iter().map(|&x| x as usize).collect() };
    let extents = |case: &Case| {
        let (_, _, k, s, p, dl, _) = *case;
        let (k, s, p, dl) = (us(&k), us(&s), us(&p), us(&dl));
        let oh = (h + p[0] + p[2] - dl[0] * (k[0] - 1) - 1) / s[0] + 1;
        let ow = (w + p[1] + p[3] - dl[1] * (k[1] - 1) - 1) / s[1] + 1;
        (oh, ow)
    };
    let image = [
        Dim::Named("n"),
        Dim::Fixed(c as i64),
        Dim::Fixed(h as i64),
        Dim::Fixed(w as i64),
    ];
    let mut onnx = Onnx::new(19).input("x", &image);
    for case in cases {
        let (out, op, k, s, p, dl, include) = *case;
        let (oh, ow) = extents(case);
        let lists: [(&str, &[i64]); 4] = [
            ("kernel_shape", &k),
            ("strides", &s),
            ("pads", &p),
            ("dilations", &dl),
        ];
        let ints: &[(&str, i64)] = match op {
            "AveragePool" => &[("count_include_pad", include)],
            "LpPool" => &[("p", include)],
            _ => &[],
        };
        onnx = onnx.node_lists(op, &["x"], &[out], ints, &lists).output(
            out,
            &[
                Dim::Named("n"),
                Dim::Fixed(c as i64),
                Dim::Fixed(oh as i64),
                Dim::Fixed(ow as i64),
            ],
        );
    }
    let global = [
        Dim::Named("n"),
        Dim::Fixed(c as i64),
        Dim::Fixed(1),
        Dim::Fixed(1),
    ];
    onnx = onnx
        .node("GlobalAveragePool", &["x"], &["y_global_avg"], &[])
        .output("y_global_avg", &global)
        .node("GlobalMaxPool", &["x"], &["y_global_max"], &[])
        .output("y_global_max", &global);
    onnx.write(&d.join("m.onnx"));
    let o = compile_n(d, "m.onnx", "m.module");
    assert!(o.status.success(), "{}", text(&o));
    for n in [1usize, 3, 4, 7] {
        let x: Vec<f32> = (0..n * c * h * w)
            .map(|i| (((i * 7919) % 1009) as f32 / 1009.0 - 0.5) * 4.0)
            .collect();
        let shape = [n, c, h, w];
        let mut members = vec![("x".to_string(), npy("<f4", false, &shape, &f32_bytes(&x)))];
        for case in cases {
            let (out, op, k, s, p, dl, include) = *case;
            let (k, s, p, dl) = (us(&k), us(&s), us(&p), us(&dl));
            let (want, [oh, ow]) = pool(
                &x,
                shape,
                [k[0], k[1]],
                [s[0], s[1]],
                [p[0], p[1], p[2], p[3]],
                [dl[0], dl[1]],
                op,
                include,
            );
            members.push((
                out.to_string(),
                npy("<f4", false, &[n, c, oh, ow], &f32_bytes(&want)),
            ));
        }
        for (out, op) in [("y_global_avg", "AveragePool"), ("y_global_max", "MaxPool")] {
            let (want, _) = pool(&x, shape, [h, w], [1, 1], [0; 4], [1, 1], op, 0);
            members.push((
                out.to_string(),
                npy("<f4", false, &[n, c, 1, 1], &f32_bytes(&want)),
            ));
        }
        run_checked(d, n, &members);
    }
}

/// `Clip` (both bounds, one absent), `Trilu` (upper above the first diagonal, lower
/// on and below the main one; the rows are the symbolic axis) and
/// `BatchNormalization` from running statistics.
#[test]
fn clip_trilu_and_batch_norm_match_their_definitions_at_every_n() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let rows = [Dim::Named("n"), Dim::Fixed(6)];
    let image = [Dim::Named("n"), Dim::Fixed(3), Dim::Fixed(2), Dim::Fixed(5)];
    let (scale, bias, mean, var) = (
        [0.5, -2.0, 1.5],
        [0.1, 0.0, -3.0],
        [1.0, -0.5, 0.25],
        [0.5, 2.0, 0.01],
    );
    Onnx::new(17)
        .input("x", &rows)
        .input("img", &image)
        .weight("lo", &[], &[-1.5])
        .weight("hi", &[], &[2.0])
        .int_weight("one", &[], &[1])
        .weight("scale", &[3], &scale)
        .weight("bias", &[3], &bias)
        .weight("mean", &[3], &mean)
        .weight("var", &[3], &var)
        .node("Clip", &["x", "lo", "hi"], &["y_clip"], &[])
        .output("y_clip", &rows)
        .node("Clip", &["x", "", "hi"], &["y_clip_max"], &[])
        .output("y_clip_max", &rows)
        .node("Trilu", &["x", "one"], &["y_upper"], &[])
        .output("y_upper", &rows)
        .node("Trilu", &["x"], &["y_lower"], &[("upper", 0)])
        .output("y_lower", &rows)
        .node(
            "BatchNormalization",
            &["img", "scale", "bias", "mean", "var"],
            &["y_bn"],
            &[],
        )
        .output("y_bn", &image)
        .write(&d.join("m.onnx"));
    let o = compile_n(d, "m.onnx", "m.module");
    assert!(o.status.success(), "{}", text(&o));
    for n in [1usize, 3, 4, 7] {
        let x: Vec<f32> = (0..n * 6)
            .map(|i| ((i * 7919) % 101) as f32 / 10.0 - 5.0)
            .collect();
        let img: Vec<f32> = (0..n * 30)
            .map(|i| ((i * 31) % 17) as f32 / 4.0 - 2.0)
            .collect();
        let keep = |upper: bool, k: i64| -> Vec<f32> {
            x.iter()
                .enumerate()
                .map(|(i, &v)| {
                    let (r, c) = ((i / 6) as i64, (i % 6) as i64);
                    let on = if upper { c - r >= k } else { c - r <= k };
                    if on {
                        v
                    } else {
                        0.0
                    }
                })
                .collect()
        };
        let bn: Vec<f32> = img
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let ch = (i / 10) % 3;
                ((v as f64 - mean[ch] as f64) / (var[ch] as f64 + 1e-5).sqrt() * scale[ch] as f64
                    + bias[ch] as f64) as f32
            })
            .collect();
        let at = |v: &[f32], shape: &[usize]| npy("<f4", false, shape, &f32_bytes(v));
        let members = [
            ("x", at(&x, &[n, 6])),
            ("img", at(&img, &[n, 3, 2, 5])),
            (
                "y_clip",
                at(
                    &x.iter().map(|v| v.clamp(-1.5, 2.0)).collect::<Vec<_>>(),
                    &[n, 6],
                ),
            ),
            (
                "y_clip_max",
                at(&x.iter().map(|v| v.min(2.0)).collect::<Vec<_>>(), &[n, 6]),
            ),
            ("y_upper", at(&keep(true, 1), &[n, 6])),
            ("y_lower", at(&keep(false, 0), &[n, 6])),
            ("y_bn", at(&bn, &[n, 3, 2, 5])),
        ];
        run_checked(d, n, &members);
    }
}

/// A model with ops anyshape does not import is refused, by `inspect` and `compile`,
/// naming every such op at once (with a node and how many), not only the first — the
/// ops compiling makes for itself (`anyshape.Im2Col`) among them.
#[test]
fn every_op_not_imported_is_named_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let rows = [Dim::Named("n"), Dim::Fixed(6)];
    Onnx::new(17)
        .input("x", &rows)
        .node("NoSuchOp", &["x", "x"], &["a"], &[])
        .node("Relu", &["a"], &["b"], &[])
        .node("FancyOp", &["b"], &["c"], &[])
        .node("anyshape.Im2Col", &["c"], &["e"], &[])
        .node("NoSuchOp", &["e", "x"], &["y"], &[])
        .output("y", &rows)
        .write(&d.join("m.onnx"));
    let words = [
        "does not import yet",
        "FancyOp (node `FancyOp_2`)",
        "NoSuchOp (2 nodes, the first `NoSuchOp_0`)",
        "anyshape.Im2Col (node `anyshape.Im2Col_3`)",
    ];
    failed_with(&anyshape(d, &["inspect", "m.onnx"]), &words);
    failed_with(&compile_n(d, "m.onnx", "m.module"), &words);
}

/// `ArgMax` / `ArgMin` (along the symbolic axis and the fixed one, ties broken to the
/// first or the last index) and `Mod` (integers with the divisor's or the dividend's
/// sign, floats with the dividend's); integer results cast to float to be recorded.
#[test]
fn arg_extremes_and_mod_match_their_definitions_at_every_n() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let rows = [Dim::Named("n"), Dim::Fixed(6)];
    let per_row = [Dim::Named("n"), Dim::Fixed(1)];
    let per_col = [Dim::Fixed(1), Dim::Fixed(6)];
    Onnx::new(17)
        .input("x", &rows)
        .input("m", &rows)
        .node("ArgMax", &["x"], &["i_max"], &[("axis", 1)])
        .node("Cast", &["i_max"], &["y_argmax_rows"], &[("to", 1)])
        .output("y_argmax_rows", &per_row)
        .node(
            "ArgMin",
            &["x"],
            &["i_min"],
            &[("axis", 0), ("select_last_index", 1)],
        )
        .node("Cast", &["i_min"], &["y_argmin_last"], &[("to", 1)])
        .output("y_argmin_last", &per_col)
        .node("Cast", &["x"], &["xi"], &[("to", 7)])
        .node("Cast", &["m"], &["mi"], &[("to", 7)])
        .node("Mod", &["xi", "mi"], &["r_py"], &[])
        .node("Cast", &["r_py"], &["y_mod_int"], &[("to", 1)])
        .output("y_mod_int", &rows)
        .node("Mod", &["xi", "mi"], &["r_c"], &[("fmod", 1)])
        .node("Cast", &["r_c"], &["y_fmod_int"], &[("to", 1)])
        .output("y_fmod_int", &rows)
        .node("Mod", &["x", "m"], &["y_fmod_float"], &[("fmod", 1)])
        .output("y_fmod_float", &rows)
        .write(&d.join("m.onnx"));
    let o = compile_n(d, "m.onnx", "m.module");
    assert!(o.status.success(), "{}", text(&o));
    for n in [1usize, 3, 4, 7] {
        // Whole numbers with ties, both signs; divisors never zero.
        let x: Vec<f32> = (0..n * 6).map(|i| ((i * 7) % 9) as f32 - 4.0).collect();
        let m: Vec<f32> = (0..n * 6)
            .map(|i| if i % 2 == 0 { 3.0 } else { -2.0 } * (1 + i % 2) as f32)
            .collect();
        let at = |v: &[f32], shape: &[usize]| npy("<f4", false, shape, &f32_bytes(v));
        let argmax: Vec<f32> = (0..n)
            .map(|r| {
                let row = &x[r * 6..][..6];
                let best = row.iter().copied().fold(f32::MIN, f32::max);
                row.iter().position(|&v| v == best).unwrap() as f32
            })
            .collect();
        let argmin_last: Vec<f32> = (0..6)
            .map(|c| {
                let col: Vec<f32> = (0..n).map(|r| x[r * 6 + c]).collect();
                let best = col.iter().copied().fold(f32::MAX, f32::min);
                col.iter().rposition(|&v| v == best).unwrap() as f32
            })
            .collect();
        let python: Vec<f32> = x
            .iter()
            .zip(&m)
            .map(|(&a, &b)| a - b * (a / b).floor())
            .collect();
        let c: Vec<f32> = x.iter().zip(&m).map(|(&a, &b)| a % b).collect();
        let members = [
            ("x", at(&x, &[n, 6])),
            ("m", at(&m, &[n, 6])),
            ("y_argmax_rows", at(&argmax, &[n, 1])),
            ("y_argmin_last", at(&argmin_last, &[1, 6])),
            ("y_mod_int", at(&python, &[n, 6])),
            ("y_fmod_int", at(&c, &[n, 6])),
            ("y_fmod_float", at(&c, &[n, 6])),
        ];
        run_checked(d, n, &members);
    }
}

/// A pooling window far larger than its input (over equally large pads) is refused at
/// run time with a message, not looped over for hours.
#[test]
fn a_huge_pooling_window_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A 2^24-wide window over a 2x2 image padded to exactly its width: a 1x1 output.
    let (big, pad) = (1i64 << 24, (1i64 << 23) - 1);
    let image = [Dim::Named("n"), Dim::Fixed(1), Dim::Fixed(2), Dim::Fixed(2)];
    let one = [Dim::Named("n"), Dim::Fixed(1), Dim::Fixed(1), Dim::Fixed(1)];
    Onnx::new(17)
        .input("x", &image)
        .node_lists(
            "MaxPool",
            &["x"],
            &["y"],
            &[],
            &[
                ("kernel_shape", &[big, big]),
                ("pads", &[pad, pad, pad, pad]),
            ],
        )
        .output("y", &one)
        .write(&d.join("m.onnx"));
    let compiled = compile_n(d, "m.onnx", "m.module");
    if compiled.status.success() {
        let x = npy("<f4", false, &[1, 1, 2, 2], &f32_bytes(&[1.0; 4]));
        npz(&d.join("c.npz"), &[("x", x)]);
        failed_with(
            &run_on(d, "m.module", "c.npz"),
            &["more work than one op may do"],
        );
    } else {
        failed_with(&compiled, &["more work than one op may do"]);
    }
}

/// A 2-D convolution of `x` (`[n, ci, h, w]`) by `w` (`[co, ci, kh, kw]`) as its
/// definition's loop nest, in f64: strides, pads (top, left, bottom, right),
/// dilations, a bias or none.
#[allow(clippy::too_many_arguments)]
fn conv_nest(
    x: &[f32],
    [n, ci, h, wd]: [usize; 4],
    w: &[f32],
    [co, kh, kw]: [usize; 3],
    bias: Option<&[f32]>,
    [sy, sx]: [usize; 2],
    [pt, pl, pb, pr]: [usize; 4],
    [dy, dx]: [usize; 2],
) -> (Vec<f32>, [usize; 4]) {
    let oh = (h + pt + pb - dy * (kh - 1) - 1) / sy + 1;
    let ow = (wd + pl + pr - dx * (kw - 1) - 1) / sx + 1;
    let mut out = Vec::with_capacity(n * co * oh * ow);
    for b in 0..n {
        for o in 0..co {
            for y in 0..oh {
                for xo in 0..ow {
                    let mut acc = bias.map_or(0.0, |v| v[o] as f64);
                    for i in 0..ci {
                        for u in 0..kh {
                            for q in 0..kw {
                                let iy = (y * sy + u * dy) as isize - pt as isize;
                                let ix = (xo * sx + q * dx) as isize - pl as isize;
                                if (0..h as isize).contains(&iy) && (0..wd as isize).contains(&ix) {
                                    acc += x[((b * ci + i) * h + iy as usize) * wd + ix as usize]
                                        as f64
                                        * w[((o * ci + i) * kh + u) * kw + q] as f64;
                                }
                            }
                        }
                    }
                    out.push(acc as f32);
                }
            }
        }
    }
    (out, [n, co, oh, ow])
}

/// Convolutions over constant filters run as `conv_packed` kernels (filters in panels,
/// 4 and 2 output channels: rows padded to a panel): a pointwise one
/// (its input read in place), a padded 3x3 one with its bias, a residual input and
/// ReLU fused, and a strided, dilated, unevenly padded one without a bias (its input's
/// columns laid out by a host step) — at batch 1, a prime, the range's end and past it.
#[test]
fn convolutions_match_their_loop_nest_at_every_n() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ci, h, wd) = (3usize, 7usize, 9usize);
    let img = [Dim::Named("n"), Dim::Fixed(3), Dim::Fixed(7), Dim::Fixed(9)];
    let filters = |co: usize, kh: usize, kw: usize, seed: usize| -> Vec<f32> {
        (0..co * ci * kh * kw)
            .map(|i| (((i + seed) * 53 % 89) as f32 - 44.0) / 40.0)
            .collect()
    };
    let (w1, w3, w5) = (
        filters(4, 1, 1, 1),
        filters(4, 3, 3, 2),
        filters(2, 3, 2, 3),
    );
    let bias: Vec<f32> = (0..4).map(|o| o as f32 * 0.5 - 1.0).collect();
    let shape = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
    let out4 = [Dim::Named("n"), Dim::Fixed(4), Dim::Fixed(7), Dim::Fixed(9)];
    Onnx::new(17)
        .input("x", &img)
        .input("res", &out4)
        .weight("w1", &shape(&[4, ci, 1, 1]), &w1)
        .weight("w3", &shape(&[4, ci, 3, 3]), &w3)
        .weight("w5", &shape(&[2, ci, 3, 2]), &w5)
        .weight("b", &[4], &bias)
        .node("Conv", &["x", "w1", "b"], &["y_pointwise"], &[])
        .output("y_pointwise", &out4)
        .node_lists(
            "Conv",
            &["x", "w3", "b"],
            &["c3"],
            &[],
            &[("pads", &[1, 1, 1, 1])],
        )
        .node("Add", &["c3", "res"], &["s3"], &[])
        .node("Relu", &["s3"], &["y_block"], &[])
        .output("y_block", &out4)
        .node_lists(
            "Conv",
            &["x", "w5"],
            &["y_strided"],
            &[],
            &[
                ("strides", &[2, 3]),
                ("pads", &[2, 0, 1, 3]),
                ("dilations", &[2, 1]),
            ],
        )
        .output(
            "y_strided",
            &[Dim::Named("n"), Dim::Fixed(2), Dim::Fixed(3), Dim::Fixed(4)],
        )
        .write(&d.join("m.onnx"));
    let o = compile_n(d, "m.onnx", "m.module");
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    // The 3 x 3 one by Winograd's transforms (its residual add and ReLU in the output
    // transform), the others over their patches.
    assert_eq!(t.matches("conv_packed(").count(), 2, "{t}");
    assert_eq!(t.matches("batch_matmul_packed(B=16,").count(), 1, "{t}");
    for n in [1usize, 3, 4, 7] {
        let x: Vec<f32> = (0..n * ci * h * wd)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let res: Vec<f32> = (0..n * 4 * h * wd)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0)
            .collect();
        let xs = [n, ci, h, wd];
        let (pointwise, s1) =
            conv_nest(&x, xs, &w1, [4, 1, 1], Some(&bias), [1, 1], [0; 4], [1, 1]);
        let (c3, s3) = conv_nest(&x, xs, &w3, [4, 3, 3], Some(&bias), [1, 1], [1; 4], [1, 1]);
        let block: Vec<f32> = c3.iter().zip(&res).map(|(a, r)| (a + r).max(0.0)).collect();
        let (strided, s5) = conv_nest(&x, xs, &w5, [2, 3, 2], None, [2, 3], [2, 0, 1, 3], [2, 1]);
        assert_eq!(s5, [n, 2, 3, 4]);
        let at = |v: &[f32], shape: &[usize]| npy("<f4", false, shape, &f32_bytes(v));
        let members = [
            ("x", at(&x, &xs)),
            ("res", at(&res, &[n, 4, h, wd])),
            ("y_pointwise", at(&pointwise, &s1)),
            ("y_block", at(&block, &s3)),
            ("y_strided", at(&strided, &s5)),
        ];
        run_checked(d, n, &members);
    }
}

/// Axes and counts given as inputs at run time (`ReduceSum`'s axes, `TopK`'s `K`) make
/// run-time dims: the same module runs each value given, a chain after them (`Relu`,
/// `Shape`) reads the shapes their steps made, and a count out of range is an error.
#[test]
fn shapes_given_at_run_time_are_bound_by_their_steps() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    Onnx::new(17)
        .input("x", &[Dim::Named("n"), Dim::Fixed(6)])
        .int_input("axes", &[Dim::Fixed(1)])
        .int_input("k", &[Dim::Fixed(1)])
        .node("ReduceSum", &["x", "axes"], &["y_sum"], &[("keepdims", 0)])
        .output("y_sum", &[Dim::Named("a")])
        .node("TopK", &["x", "k"], &["t", "ti"], &[("axis", 1)])
        .node("Relu", &["t"], &["y_top"], &[])
        .output("y_top", &[Dim::Named("n"), Dim::Named("k")])
        .node("Shape", &["t"], &["s"], &[])
        .node("Cast", &["s"], &["y_shape"], &[("to", 1)])
        .output("y_shape", &[Dim::Fixed(2)])
        .write(&d.join("m.onnx"));
    let o = compile_n(d, "m.onnx", "m.module");
    assert!(o.status.success(), "{}", text(&o));
    let at = |v: &[f32], shape: &[usize]| npy("<f4", false, shape, &f32_bytes(v));
    let int = |v: i64| npy("<i8", false, &[1], &v.to_le_bytes());
    for n in [1usize, 3, 7] {
        let x: Vec<f32> = (0..n * 6).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        for (axis, k) in [(0i64, 1usize), (1, 6), (-1, 3)] {
            let sum: Vec<f32> = match axis {
                0 => (0..6).map(|c| (0..n).map(|r| x[r * 6 + c]).sum()).collect(),
                _ => (0..n).map(|r| x[r * 6..][..6].iter().sum()).collect(),
            };
            let top: Vec<f32> = (0..n)
                .flat_map(|r| {
                    let mut row = x[r * 6..][..6].to_vec();
                    row.sort_by(|a, b| b.total_cmp(a));
                    row.into_iter().take(k).map(|v| v.max(0.0))
                })
                .collect();
            let members = [
                ("x", at(&x, &[n, 6])),
                ("axes", int(axis)),
                ("k", int(k as i64)),
                ("y_sum", at(&sum, &[sum.len()])),
                ("y_top", at(&top, &[n, k])),
                ("y_shape", at(&[n as f32, k as f32], &[2])),
            ];
            run_checked(d, n, &members);
        }
        npz(
            &d.join("bad.npz"),
            &[("x", at(&x, &[n, 6])), ("axes", int(1)), ("k", int(9))],
        );
        failed_with(&run_on(d, "m.module", "bad.npz"), &["TopK", "K must be"]);
    }
}
