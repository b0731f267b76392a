//! The systems a model module races against in `anyshape bench --model`, behind one
//! interface: anyshape's own runtime, onnxruntime and OpenVINO (their Python packages,
//! each in a long-lived child process, 2 threads by default; onnxruntime at FP32 and on
//! the model quantized by its own dynamic quantization; OpenVINO at FP32 and at its
//! default precision), PyTorch eager (the model the `.onnx` was exported from,
//! rebuilt by the repository's export script, in a Python that has torch) and tract
//! (`tract-onnx`, in process, when built with the `tract` feature). Each runs the same
//! model on the same inputs.
use crate::error::{io, BenchError, Result};
use anyshape_tensor::{Tensor, TensorRef};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

#[cfg(feature = "tract")]
mod tract;
#[cfg(feature = "tract")]
pub(crate) use tract::Tract;

/// A peer `anyshape bench --model` can race (`--peers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerKind {
    /// onnxruntime (Python package, CPU execution provider, FP32).
    Onnxruntime,
    /// onnxruntime on the model quantized by its `quantize_dynamic` (8-bit weights per
    /// output channel, activations quantized at run time): the peer of a `--precision
    /// i8` module, raced by default only against one.
    OnnxruntimeInt8,
    /// OpenVINO (Python package) with FP32 forced.
    OpenvinoF32,
    /// OpenVINO at its default precision (BF16 where the CPU has it); raced only where
    /// that is not FP32 when `OpenvinoF32` is raced too.
    Openvino,
    /// PyTorch eager (FP32): the model the ONNX was exported from, rebuilt by the
    /// repository's `models/export.py` with its seeded weights.
    Pytorch,
    /// tract, in process (a `--features tract` build).
    Tract,
}

impl PeerKind {
    /// Every peer, in the order they are raced.
    pub const ALL: [PeerKind; 6] = [
        PeerKind::Onnxruntime,
        PeerKind::OnnxruntimeInt8,
        PeerKind::OpenvinoF32,
        PeerKind::Openvino,
        PeerKind::Pytorch,
        PeerKind::Tract,
    ];

    /// Its name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerKind::Onnxruntime => "onnxruntime",
            PeerKind::OnnxruntimeInt8 => "onnxruntime-int8",
            PeerKind::OpenvinoF32 => "openvino-f32",
            PeerKind::Openvino => "openvino",
            PeerKind::Pytorch => "pytorch",
            PeerKind::Tract => "tract",
        }
    }
}

impl std::str::FromStr for PeerKind {
    type Err = BenchError;

    fn from_str(s: &str) -> Result<PeerKind> {
        PeerKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = PeerKind::ALL.iter().map(|k| k.as_str()).collect();
                BenchError::Options(format!("no peer {s:?} (the peers: {})", names.join(", ")))
            })
    }
}

/// How the peers of a model race run, shared by `bench --model --compare` and
/// `--generate`.
pub struct PeerOptions<'a> {
    /// The peers' threads (onnxruntime's intra-op threads, OpenVINO's inference
    /// threads).
    pub threads: usize,
    /// The Python that has onnxruntime and OpenVINO.
    pub python: &'a str,
    /// The Python that has torch and transformers (PyTorch's peer); by default
    /// `python`.
    pub torch_python: Option<&'a str>,
    /// The peers to race; `None`: every one at hand (those missing are noted, not
    /// errors). A peer named here that cannot start is an error.
    pub peers: Option<&'a [PeerKind]>,
    /// The ONNX model the peers run (the one the module was compiled from); by default
    /// where it was when the module was compiled.
    pub onnx: Option<&'a Path>,
}

/// Where and how Python peers start: the interpreters, the source model, their threads,
/// the graph's output names, a directory for their outputs.
pub(crate) struct PeerStart<'a> {
    pub python: &'a str,
    pub torch_python: Option<&'a str>,
    pub model: &'a Path,
    pub threads: usize,
    pub outputs: &'a [String],
    pub scratch: &'a Path,
}

/// What starting a Python peer came to.
pub(crate) enum Started {
    /// It runs.
    Peer(PythonPeer),
    /// Not raced: OpenVINO's default precision is FP32 here and FP32 is raced already.
    Skipped,
    /// Missing or refusing the model, and not asked for by name: why, to note.
    Unavailable(String),
}

impl PeerStart<'_> {
    /// Start the Python peer `kind` (any but tract) among the peers `asked`; where
    /// `named` (the user listed the peers) a peer that cannot start is an error.
    pub fn python_peer(
        &self,
        kind: PeerKind,
        asked: &[PeerKind],
        named: bool,
        progress: &mut dyn anyshape_measure::Progress,
    ) -> Result<Started> {
        let engine = match kind {
            PeerKind::Onnxruntime => Engine::Onnxruntime { int8: false },
            PeerKind::OnnxruntimeInt8 => Engine::Onnxruntime { int8: true },
            PeerKind::OpenvinoF32 => Engine::Openvino { f32: true },
            PeerKind::Openvino => Engine::Openvino { f32: false },
            PeerKind::Pytorch => Engine::Pytorch,
            // In process, not in Python: its caller starts it.
            PeerKind::Tract => return Ok(Started::Skipped),
        };
        let python = match engine {
            Engine::Pytorch => self.torch_python.unwrap_or(self.python),
            _ => self.python,
        };
        match PythonPeer::start(
            engine,
            python,
            self.model,
            self.threads,
            self.outputs.to_vec(),
            self.scratch,
        ) {
            Ok(p)
                if kind == PeerKind::Openvino
                    && p.precision == "f32"
                    && asked.contains(&PeerKind::OpenvinoF32) =>
            {
                progress.note("OpenVINO's default precision on this CPU is FP32: raced once");
                Ok(Started::Skipped)
            }
            Ok(p) => Ok(Started::Peer(p)),
            Err(e) if named => Err(e),
            Err(e) => Ok(Started::Unavailable(format!(
                "{e} (pip install {}, or {} a Python that has it)",
                engine.package(),
                match engine {
                    Engine::Pytorch => "--torch-python",
                    _ => "--python",
                }
            ))),
        }
    }
}

/// One instance's inputs: the tensors by input name, and the `.npz` file holding them.
pub(crate) struct Case {
    pub tensors: Vec<(String, Tensor)>,
    pub npz: PathBuf,
}

/// A system that runs a model.
pub(crate) trait Peer {
    /// Its name and version, with its threads.
    fn name(&self) -> String;
    /// Run `case` at least once and until `seconds` have passed: the seconds of each
    /// run, and the first run's outputs (by the graph's output names) when asked.
    fn time(
        &mut self,
        case: &Case,
        seconds: f64,
        outputs: bool,
    ) -> Result<(Vec<f64>, Option<Vec<Tensor>>)>;
}

/// `f` timed at least once and until `seconds` have passed; the first result kept.
pub(crate) fn time_loop<T>(
    seconds: f64,
    mut f: impl FnMut() -> Result<T>,
) -> Result<(Vec<f64>, T)> {
    let start = Instant::now();
    let mut times = Vec::new();
    let mut first = None;
    while first.is_none() || start.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        let out = f()?;
        times.push(t.elapsed().as_secs_f64());
        first.get_or_insert(out);
    }
    Ok((times, first.expect("ran once")))
}

/// anyshape's runtime on a model module, and its outputs kept from run to run
/// ([`anyshape_runtime::Model::run_into`]: as OpenVINO's request shares its output
/// tensors and onnxruntime's arena reuses its blocks, no run pays for fresh outputs).
/// Its name in reports is `anyshape` (see [`anyshape_name`]), followed by its module's
/// directory name where modules race each other (`bench --model --against`).
pub(crate) struct Anyshape {
    model: anyshape_runtime::Model,
    outputs: Vec<Option<Tensor>>,
    name: String,
}

impl Anyshape {
    /// The model, its outputs not yet made; `labelled`: its module's directory name in
    /// its name.
    pub(crate) fn new(model: anyshape_runtime::Model, labelled: bool) -> Anyshape {
        let outputs = vec![None; model.plan().outputs.len()];
        let mut name = anyshape_name(&model);
        if labelled {
            let dir = model.dir();
            let label = dir.file_name().unwrap_or(dir.as_os_str()).to_string_lossy();
            name = format!("{name} ({label})");
        }
        Anyshape {
            model,
            outputs,
            name,
        }
    }
}

/// anyshape's name in reports: with the precision of its dense layers where it is not
/// f32 (`anyshape BF16`).
pub(crate) fn anyshape_name(model: &anyshape_runtime::Model) -> String {
    match model.manifest().precision {
        anyshape_ir::Precision::F32 => "anyshape".into(),
        p => format!("anyshape {}", p.name().to_uppercase()),
    }
}

impl Peer for Anyshape {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn time(
        &mut self,
        case: &Case,
        seconds: f64,
        outputs: bool,
    ) -> Result<(Vec<f64>, Option<Vec<Tensor>>)> {
        let given: Vec<(&str, TensorRef)> = case
            .tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t.view()))
            .collect();
        let Anyshape {
            model,
            outputs: outs,
            ..
        } = self;
        // The first run's outputs are taken before the next run writes over them.
        let mut first = None;
        let (times, ()) = time_loop(seconds, || {
            model.run_into(&given, outs)?;
            if outputs && first.is_none() {
                first = Some(outs.iter().flatten().cloned().collect());
            }
            Ok(())
        })?;
        Ok((times, first))
    }
}

/// A peer that lives in Python: which runtime, and for OpenVINO the precision asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    /// onnxruntime's CPU execution provider: FP32, or `int8` on the model its dynamic
    /// quantization makes (in a temporary directory).
    Onnxruntime { int8: bool },
    /// OpenVINO on the CPU: `f32` forces FP32 (`INFERENCE_PRECISION_HINT`); without it,
    /// its default (BF16 where the CPU has it).
    Openvino { f32: bool },
    /// PyTorch eager (FP32) with transformers.
    Pytorch,
}

impl Engine {
    /// The package's name, as `pip install` takes it and messages say it.
    pub fn package(self) -> &'static str {
        match self {
            Engine::Onnxruntime { int8: false } => "onnxruntime",
            Engine::Onnxruntime { int8: true } => "onnxruntime onnx",
            Engine::Openvino { .. } => "openvino",
            Engine::Pytorch => "torch transformers",
        }
    }

    /// Its name to the peer script.
    fn script_name(self) -> &'static str {
        match self {
            Engine::Pytorch => "pytorch",
            Engine::Onnxruntime { .. } => "onnxruntime",
            Engine::Openvino { .. } => "openvino",
        }
    }
}

/// onnxruntime or OpenVINO through its Python package: a child process running
/// `python_peer.py` (one JSON request and reply per line).
pub(crate) struct PythonPeer {
    engine: Engine,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    version: String,
    /// The precision it runs at, as it reports it (`f32`, `bf16`).
    pub precision: String,
    threads: usize,
    outputs: Vec<String>,
    scratch: PathBuf,
}

const PYTHON_PEER: &str = include_str!("python_peer.py");

impl PythonPeer {
    /// Start `python` with the peer script for `engine` on `model`; `Err` (environment)
    /// when Python or the package is missing or refuses the model. `outputs` are the
    /// graph's output names, `scratch` a directory for the outputs it writes.
    pub fn start(
        engine: Engine,
        python: &str,
        model: &Path,
        threads: usize,
        outputs: Vec<String>,
        scratch: &Path,
    ) -> Result<PythonPeer> {
        let what = engine.script_name();
        let env = |e: String| BenchError::Environment(format!("{what}: {e}"));
        let mut command = Command::new(python);
        command
            .arg("-c")
            .arg(PYTHON_PEER)
            .arg(engine.script_name())
            .arg(model)
            .arg(threads.to_string());
        match engine {
            Engine::Openvino { f32: true } => _ = command.arg("f32"),
            Engine::Onnxruntime { int8: true } => _ = command.arg("int8"),
            _ => {}
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| env(format!("cannot start {python}: {e}")))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut peer = PythonPeer {
            engine,
            child,
            stdin,
            stdout,
            version: String::new(),
            precision: String::new(),
            threads,
            outputs,
            scratch: scratch.to_path_buf(),
        };
        let hello = peer.reply()?;
        peer.version = hello["version"].as_str().unwrap_or("?").to_string();
        peer.precision = hello["precision"].as_str().unwrap_or("?").to_string();
        Ok(peer)
    }

    fn env(&self, e: impl std::fmt::Display) -> BenchError {
        BenchError::Environment(format!("{}: {e}", self.engine.script_name()))
    }

    fn reply(&mut self) -> Result<serde_json::Value> {
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).map_err(|e| self.env(e))?;
        if n == 0 {
            return Err(self.env("the Python process exited"));
        }
        let v: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| self.env(format!("unreadable reply {line:?}: {e}")))?;
        match v.get("error").and_then(|e| e.as_str()) {
            Some(e) => Err(self.env(e)),
            None => Ok(v),
        }
    }
}

impl Peer for PythonPeer {
    fn name(&self) -> String {
        let precision = match self.precision.as_str() {
            "f32" => "FP32".to_string(),
            "f16" => "FP16".to_string(),
            p => p.to_uppercase(),
        };
        let (name, how) = match self.engine {
            Engine::Onnxruntime { int8: false } => ("onnxruntime", ""),
            Engine::Onnxruntime { int8: true } => ("onnxruntime", "dynamic quantization; "),
            Engine::Openvino { f32: true } => ("OpenVINO", "forced; "),
            Engine::Openvino { f32: false } => ("OpenVINO", "default precision; "),
            Engine::Pytorch => ("PyTorch", "eager; "),
        };
        // No commas: the name is a field of the CSV report.
        format!(
            "{name} {} {precision} ({how}{} threads)",
            self.version, self.threads
        )
    }

    fn time(
        &mut self,
        case: &Case,
        seconds: f64,
        outputs: bool,
    ) -> Result<(Vec<f64>, Option<Vec<Tensor>>)> {
        let out_path = self.scratch.join("peer-outputs.npz");
        let request = serde_json::json!({
            "inputs": case.npz,
            "seconds": seconds,
            "outputs": outputs.then_some(&out_path),
        });
        writeln!(self.stdin, "{request}")
            .and_then(|_| self.stdin.flush())
            .map_err(|e| self.env(e))?;
        let v = self.reply()?;
        let times: Vec<f64> = v["times"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default();
        if times.is_empty() {
            return Err(self.env(format!("no times in {v}")));
        }
        if !outputs {
            return Ok((times, None));
        }
        let arrays = anyshape_tensor::npz::read(&out_path)
            .map_err(|e| self.env(format!("its outputs: {e}")))?;
        std::fs::remove_file(&out_path).map_err(io(&out_path))?;
        let outs = self
            .outputs
            .iter()
            .map(|name| {
                arrays
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, t)| t.clone())
                    .ok_or_else(|| self.env(format!("no output {name}")))
            })
            .collect::<Result<_>>()?;
        Ok((times, Some(outs)))
    }
}

impl PythonPeer {
    /// Generate `new_tokens` greedily from the `prompt_ids` in `prompt` (a `.npz`) with
    /// the engine's own decoder loop (onnxruntime: IO binding; OpenVINO: the model
    /// made stateful; PyTorch: transformers' cache): each row's tokens and the seconds
    /// of each step.
    pub fn generate(
        &mut self,
        prompt: &Path,
        new_tokens: usize,
    ) -> Result<(Vec<Vec<i64>>, Vec<f64>)> {
        let request = serde_json::json!({"generate": prompt, "new_tokens": new_tokens});
        writeln!(self.stdin, "{request}")
            .and_then(|_| self.stdin.flush())
            .map_err(|e| self.env(e))?;
        let v = self.reply()?;
        let tokens: Option<Vec<Vec<i64>>> = v["tokens"].as_array().and_then(|rows| {
            rows.iter()
                .map(|r| r.as_array()?.iter().map(|t| t.as_i64()).collect())
                .collect()
        });
        let times: Vec<f64> = v["times"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default();
        match tokens {
            Some(t) if times.len() == new_tokens => Ok((t, times)),
            _ => Err(self.env(format!("no tokens or times in {v}"))),
        }
    }
}

impl Drop for PythonPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
