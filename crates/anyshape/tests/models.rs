//! Imported models run with compiled kernels: every task of a tiny model built as a
//! symbolic kernel with its sketch's default micro-kernel (what `--trials 0` gives),
//! the fused steps run through them, and the outputs compared with onnxruntime's.
use anyshape_abi::{load_library, KernelFn, STATUS_OK};
use anyshape_codegen::{cpu_sketch, CpuTarget, PaddingStrategy, Program, Sketch};
use anyshape_graph::{exec, onnx, GraphError, Tensor};
use anyshape_ir::{Bindings, Workload};
use anyshape_measure::Builder;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

fn npz(path: &Path) -> Vec<(String, Tensor)> {
    anyshape_graph::npz::read(path).unwrap()
}

/// Build `w`'s symbolic kernel with its sketch's default micro-kernel; returns the
/// library and the symbol.
fn build<K: Sketch<Target = CpuTarget>>(
    w: &Workload,
    target: &CpuTarget,
    builder: &Builder,
) -> (PathBuf, String) {
    let p = Program::symbolic(w, K::default_for(target), PaddingStrategy::LocalPad);
    let lib = builder
        .build_programs(target, std::slice::from_ref(&p))
        .unwrap();
    lib.require_all().unwrap();
    (lib.path, p.symbol(target))
}

fn check(model: &str, cases: &[&str]) {
    let g = onnx::load(&models().join(format!("{model}.onnx"))).unwrap();
    let plan = exec::Plan::new(g.clone()).unwrap();
    let fusion = plan.fusion();
    let target = CpuTarget::detect();
    let dir = tempfile::tempdir().unwrap();
    let builder = Builder::new(dir.path());
    let mut kernels: HashMap<String, (libloading::Library, String)> = HashMap::new();
    for t in fusion.tasks() {
        let w = Workload::parse(&t.workload).unwrap();
        let (path, symbol) = cpu_sketch!(w.class, build(&w, &target, &builder));
        // SAFETY: a library the builder just made from generated kernels.
        let lib = unsafe { load_library(&path) }.unwrap();
        kernels.insert(w.to_string(), (lib, symbol));
    }
    for case in cases {
        let arrays = npz(&models().join(format!("{model}.{case}.npz")));
        let inputs: Vec<(&str, Tensor)> = g
            .inputs
            .iter()
            .map(|i| {
                let name = g.values[i.value].as_str();
                (
                    name,
                    arrays.iter().find(|(n, _)| n == name).unwrap().1.clone(),
                )
            })
            .collect();
        let mut run = |_: usize,
                       w: &Workload,
                       b: &Bindings,
                       _: &anyshape_ir::BoundWorkload,
                       ins: &[&[f32]],
                       out: &mut [f32]| {
            let (lib, symbol) = &kernels[&w.to_string()];
            // SAFETY: generated kernels have the KernelFn signature.
            let f = unsafe { lib.get::<KernelFn>(symbol.as_bytes()) }.unwrap();
            let vars: Vec<i64> = w
                .shape_vars()
                .iter()
                .map(|v| b.get(v).unwrap_or(0))
                .collect();
            let ptrs: Vec<*const f32> = ins.iter().map(|x| x.as_ptr()).collect();
            let outs = [out.as_mut_ptr()];
            // SAFETY: Plan::run checked every buffer against the bound workload.
            let status = unsafe { f(vars.as_ptr(), ptrs.as_ptr(), outs.as_ptr()) };
            if status == STATUS_OK {
                Ok(())
            } else {
                Err(GraphError::Shape(format!("{w}: kernel status {status}")))
            }
        };
        let got = plan.run(&inputs, &mut run).unwrap();
        for (&o, got) in g.outputs.iter().zip(&got) {
            let name = &g.values[o];
            let (_, want) = arrays.iter().find(|(n, _)| n == name).unwrap();
            let (a, b) = (got.as_f32().unwrap(), want.as_f32().unwrap());
            let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
            let e = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
            eprintln!("{model} {case} {name}: compiled, relative error {e:.1e}");
            assert!(e <= 1e-4, "{model} {case} {name}: relative error {e:e}");
        }
    }
}

#[test]
fn bert_runs_compiled() {
    check("bert_tiny.ts", &["s1", "s37", "b3s17"]);
}

#[test]
fn gpt2_runs_compiled() {
    check("gpt2_tiny.dynamo18", &["s1", "s37", "b3s17"]);
}

#[test]
fn vit_runs_compiled() {
    check("vit_tiny.dynamo", &["i224", "i160x256"]);
}
