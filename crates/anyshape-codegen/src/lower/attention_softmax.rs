//! The fused attention's softmax of one row of a block of scores, in place in the
//! scratch `S` (see `attention.rs`): the mask added, the maximum, the exponentials
//! summed, the NaN guard under `nan_to_zero`, and `1 / Σ` into `rsum[r]` for the
//! context to scale by. Both variants (vector and AMX) run it.
use super::{c, v};
use crate::loop_ir::{for_, let_, store, BinaryOp, LoopKind, Stmt, UnaryOp, Value};
use anyshape_ir::Expr;

/// Accumulators of the row's maximum: one chained every vector through a compare and a
/// select (~5 cycles each), which bound the pass (14 % of a bf16 attention at sequence
/// 512). The maximum of finite scores is the same in any order; a row with a NaN score
/// sums to NaN whichever maximum it gets.
const MAX_CHAINS: usize = 4;

/// The softmax of block row `r` in place (the mask added first), its `1 / Σ` into
/// `rsum[r]`: each pass over whole vectors, then the row's tail element by element.
pub(super) fn softmax_row(lanes: usize, masked: bool, nan_to_zero: bool) -> Vec<Stmt> {
    let at = |j: Expr| v("r") * v("np") + j;
    let load = |buf: &str, index: Expr, lanes: usize| Value::Load {
        buf: buf.into(),
        index,
        lanes,
        count: None,
    };
    // A pass: `body(j, lanes, part)` over the row's whole vectors (part 0, `j` a vector's
    // first element), then over its tail (part 1, `j` one element).
    let pass = |body: &dyn Fn(Expr, usize, usize) -> Vec<Stmt>| -> Vec<Stmt> {
        [
            ("q", v("nfull"), v("q") * c(lanes), lanes),
            (
                "e",
                v("e_n") - v("nfull") * c(lanes),
                v("nfull") * c(lanes) + v("e"),
                1,
            ),
        ]
        .into_iter()
        .enumerate()
        .map(|(part, (var, extent, j, n))| for_(var, extent, LoopKind::Serial, body(j, n, part)))
        .collect()
    };
    let reg = |name: &str, lanes: usize, init: Value| Stmt::Reg {
        name: name.into(),
        lanes,
        init,
    };
    let neg_inf = |lanes: usize| Value::Const {
        value: f64::NEG_INFINITY,
        lanes,
    };
    let mut s = Vec::new();
    if masked {
        // mask[b, m0 + r, 0].
        s.push(let_(
            "mb",
            v("bi") * v("smk_b") + (v("m0") + v("r")) * v("smk_m"),
        ));
    }
    // The maximum (the mask added and stored back first): `MAX_CHAINS` vectors in turn
    // into as many accumulators, then the vectors left into the first, then the tail.
    let step = |acc: &str, j: Expr, n: usize| {
        let mut body = Vec::new();
        if masked {
            let sum = Value::sum(
                load("S", at(j.clone()), n),
                load("in3", v("mb") + j.clone(), n),
            );
            body.push(store("S", at(j.clone()), sum));
        }
        body.push(Stmt::Assign {
            reg: acc.into(),
            value: Value::binary(BinaryOp::Max, Value::reg(acc, n), load("S", at(j), n)),
        });
        body
    };
    let chains: Vec<String> = (0..MAX_CHAINS).map(|i| format!("mx_v{i}")).collect();
    for acc in &chains {
        s.push(reg(acc, lanes, neg_inf(lanes)));
    }
    s.push(reg("mx_s", 1, neg_inf(1)));
    let unrolled = (0..MAX_CHAINS)
        .flat_map(|i| {
            step(
                &chains[i],
                (v("qc") * c(MAX_CHAINS) + c(i)) * c(lanes),
                lanes,
            )
        })
        .collect();
    s.push(for_(
        "qc",
        v("nfull") / c(MAX_CHAINS),
        LoopKind::Serial,
        unrolled,
    ));
    let left = (v("nfull") / c(MAX_CHAINS)) * c(MAX_CHAINS);
    s.push(for_(
        "q",
        v("nfull") - left.clone(),
        LoopKind::Serial,
        step(&chains[0], (left + v("q")) * c(lanes), lanes),
    ));
    s.push(for_(
        "e",
        v("e_n") - v("nfull") * c(lanes),
        LoopKind::Serial,
        step("mx_s", v("nfull") * c(lanes) + v("e"), 1),
    ));
    let max = |a: Value, b: Value| Value::binary(BinaryOp::Max, a, b);
    let vectors = chains
        .iter()
        .map(|acc| Value::reg(acc, lanes))
        .reduce(max)
        .expect("accumulators");
    s.push(reg(
        "mx",
        1,
        max(
            Value::Horizontal(BinaryOp::Max, Box::new(vectors)),
            Value::reg("mx_s", 1),
        ),
    ));
    // The exponentials, summed.
    s.push(reg("sm_v", lanes, Value::Zero { lanes }));
    s.push(reg("sm_s", 1, Value::Zero { lanes: 1 }));
    s.extend(pass(&|j, n, part| {
        let acc = ["sm_v", "sm_s"][part];
        let name = format!("p_{n}");
        let p = Value::unary(
            UnaryOp::Exp,
            Value::binary(
                BinaryOp::Sub,
                load("S", at(j.clone()), n),
                Value::reg("mx", 1),
            ),
        );
        vec![
            reg(&name, n, p),
            store("S", at(j), Value::reg(&name, n)),
            Stmt::Assign {
                reg: acc.into(),
                value: Value::sum(Value::reg(acc, n), Value::reg(&name, n)),
            },
        ]
    }));
    let sum = Value::sum(
        Value::Horizontal(BinaryOp::Add, Box::new(Value::reg("sm_v", lanes))),
        Value::reg("sm_s", 1),
    );
    let one = Value::Const {
        value: 1.0,
        lanes: 1,
    };
    if nan_to_zero {
        // A row whose sum is NaN (a score NaN, +inf, or -inf everywhere) is all NaN in
        // the softmax, hence zeros: its probabilities times `keep` (1, or 0 where the
        // sum is NaN), NaN counted as 0; its context then sums zeros, and `1 / max(0,
        // tiny)` keeps them zero (NaN values stay NaN, as 0 · NaN is).
        s.push(reg("sum", 1, sum));
        let keep = Value::unary(
            UnaryOp::NanToZero,
            Value::binary(
                BinaryOp::Add,
                Value::binary(BinaryOp::Sub, Value::reg("sum", 1), Value::reg("sum", 1)),
                one.clone(),
            ),
        );
        s.push(reg("keep", 1, keep));
        s.extend(pass(&|j, n, _| {
            let p = Value::binary(
                BinaryOp::Mul,
                Value::unary(UnaryOp::NanToZero, load("S", at(j.clone()), n)),
                Value::reg("keep", 1),
            );
            vec![store("S", at(j), p)]
        }));
        let tiny = Value::Const {
            value: 1e-30,
            lanes: 1,
        };
        let sum = Value::binary(
            BinaryOp::Max,
            Value::unary(UnaryOp::NanToZero, Value::reg("sum", 1)),
            tiny,
        );
        s.push(store(
            "rsum",
            v("r"),
            Value::binary(BinaryOp::Div, one, sum),
        ));
    } else {
        s.push(store(
            "rsum",
            v("r"),
            Value::binary(BinaryOp::Div, one, sum),
        ));
    }
    s
}
