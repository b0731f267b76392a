//! `anyshape run --module M` of a model module: its inputs from `.npz`/`.npy` files
//! (a recorded [`anyshape_runtime::Case`], read strictly: every array must be one the
//! model takes or gives), its outputs
//! printed and compared with those the `.npz` records (shapes and element types first,
//! a NaN or an infinity only matching itself, the worst element named), written with
//! `--output` (atomically, never over a file the command reads), and the latency of a
//! run.
use anyhow::{bail, Context, Result};
use anyshape_files::Reads;
use anyshape_tensor::Data;
use std::path::Path;
use std::time::Instant;

/// What `anyshape run --module M` does with a model module.
pub struct ModelRun<'a> {
    /// A `.npz` of inputs by name (outputs of the same names are compared).
    pub inputs: Option<&'a Path>,
    /// `NAME=FILE.npy` inputs (they win over the `.npz`'s arrays of the same name).
    pub input: &'a [String],
    /// Where to write the outputs (`.npz`).
    pub output: Option<&'a Path>,
    /// Keep timing for this many seconds.
    pub seconds: f64,
    /// The largest relative error from recorded outputs that passes (the module's
    /// precision's expected error when `None`).
    pub max_error: Option<f64>,
    /// Print where a run spends its time.
    pub profile: bool,
}

/// `--input NAME=FILE.npy` options, split.
fn input_files(specs: &[String]) -> Result<Vec<(&str, &Path)>> {
    let mut out: Vec<(&str, &Path)> = Vec::new();
    for spec in specs {
        let (name, file) = spec
            .split_once('=')
            .with_context(|| format!("--input {spec}: expected NAME=FILE.npy"))?;
        if out.iter().any(|(n, _)| *n == name) {
            bail!("--input {name} is given twice");
        }
        out.push((name, Path::new(file)));
    }
    Ok(out)
}

/// Run the model module in `dir` as `r` says; an error where a recorded output differs
/// by more than `r.max_error`.
pub fn run_model(dir: &Path, r: &ModelRun) -> Result<()> {
    let ModelRun {
        inputs,
        output,
        seconds,
        max_error,
        profile,
        ..
    } = *r;
    let files = input_files(r.input)?;
    // What this command reads; `--output` may be none of it (checked before the run).
    let mut reads = Reads::new();
    reads.dir(dir);
    if let Some(p) = inputs {
        reads.file(p);
    }
    for (_, f) in &files {
        reads.file(f);
    }
    if let Some(out) = output {
        reads.check("--output", out)?;
    }
    let loading = Instant::now();
    let model = anyshape_runtime::Model::load(dir)?;
    let loaded = loading.elapsed().as_secs_f64();
    let max_error = max_error.unwrap_or(model.manifest().precision.expected_error());
    let input_names: Vec<&str> = model.inputs().iter().map(|s| s.name.as_str()).collect();
    for (name, _) in &files {
        if !input_names.contains(name) {
            bail!(
                "--input {name}: the model has no input of that name (its inputs: {})",
                input_names.join(", ")
            );
        }
    }
    let mut case = match inputs {
        Some(p) => model.read_case(p)?,
        None => model.case(Vec::new(), "--input")?,
    };
    for (name, file) in &files {
        case.set_input(name, anyshape_tensor::npz::read_npy(file)?);
    }
    if let (Some(p), false) = (inputs, files.is_empty()) {
        case.source = format!("{} and --input", p.display());
    }
    let given = case.given(&model)?;
    let t0 = Instant::now();
    let outs = model.run(&given)?;
    let first = t0.elapsed().as_secs_f64();
    let mut best = first;
    let mut runs = 1;
    let start = Instant::now();
    // The timed runs write over the last run's outputs (as a serving loop would; fresh
    // outputs of a large model cost their page faults on every run).
    let mut reused: Vec<Option<_>> = outs.iter().cloned().map(Some).collect();
    while start.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        model.run_into(&given, &mut reused)?;
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    println!(
        "model        {}  (loaded in {:.1} ms; first run {:.3} ms; {} runs, min latency {:.3} ms)",
        dir.display(),
        loaded * 1e3,
        first * 1e3,
        runs,
        best * 1e3
    );
    if profile {
        let steps = model.profile(&given)?;
        let total: f64 = steps.iter().map(|s| s.2).sum();
        println!("profile      one run, {:.3} ms in steps:", total * 1e3);
        for (label, n, s) in steps.iter().filter(|s| s.2 >= total * 1e-3) {
            println!(
                "  {:>9.3} ms {:>5.1}%  {n:>3}x  {label}",
                s * 1e3,
                100.0 * s / total.max(1e-30)
            );
        }
    }
    let output_names: Vec<&str> = model.outputs().iter().map(|s| s.name.as_str()).collect();
    let sources = &case.source;
    let mut named = Vec::new();
    let mut mismatched = Vec::new();
    for (name, t) in output_names.iter().zip(outs) {
        let preview: Vec<String> = match &t.data {
            Data::F32(v) => v.iter().take(4).map(|x| format!("{x:.5}")).collect(),
            Data::I64(v) => v.iter().take(4).map(|x| x.to_string()).collect(),
            Data::Bool(v) => v.iter().take(4).map(|x| x.to_string()).collect(),
        };
        println!(
            "output       {name} {:?} [{} ...]",
            t.shape,
            preview.join(", ")
        );
        // Where the inputs file also holds this output (a recorded case), compare.
        if let Some(want) = case.recorded(name) {
            match anyshape_tensor::compare(&t, want) {
                Ok(c) => {
                    println!("check        {name}: {c} against {sources}");
                    if !c.passes(max_error) {
                        mismatched.push(format!("{name} ({:.2e})", c.error()));
                    }
                }
                Err(why) => {
                    println!("check        {name}: {why}");
                    mismatched.push(format!("{name} ({why})"));
                }
            }
        }
        named.push((name.to_string(), t));
    }
    if let Some(path) = output {
        anyshape_tensor::npz::write(path, &named, &reads, "--output")?;
        println!("outputs written to {}", path.display());
    }
    if !mismatched.is_empty() {
        bail!(
            "outputs differ from those recorded in {sources} by more than {max_error:e}: {}",
            mismatched.join(", ")
        );
    }
    Ok(())
}
