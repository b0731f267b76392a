//! The systems a model module races against in `anyshape bench --model`, behind one
//! interface: anyshape's own runtime, onnxruntime (its Python package in a long-lived
//! child process, 2 intra-op threads by default) and tract (`tract-onnx`, in process,
//! when built with the `tract` feature). Each runs the same `.onnx` on the same inputs.
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

/// anyshape's runtime on a model module.
pub(crate) struct Anyshape(pub anyshape_runtime::Model);

impl Peer for Anyshape {
    fn name(&self) -> String {
        "anyshape".into()
    }

    fn time(
        &mut self,
        case: &Case,
        seconds: f64,
        _: bool,
    ) -> Result<(Vec<f64>, Option<Vec<Tensor>>)> {
        let given: Vec<(&str, TensorRef)> = case
            .tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t.view()))
            .collect();
        let (times, outs) = time_loop(seconds, || Ok(self.0.run(&given)?))?;
        Ok((times, Some(outs)))
    }
}

/// onnxruntime through its Python package: a child process running
/// `onnxruntime_peer.py` (one JSON request and reply per line).
pub(crate) struct Onnxruntime {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    version: String,
    threads: usize,
    outputs: Vec<String>,
    scratch: PathBuf,
}

const ORT_PEER: &str = include_str!("onnxruntime_peer.py");

impl Onnxruntime {
    /// Start `python` with the peer script on `model`; `Err` (environment) when Python
    /// or its onnxruntime is missing or refuses the model. `outputs` are the graph's
    /// output names, `scratch` a directory for the outputs it writes.
    pub fn start(
        python: &str,
        model: &Path,
        threads: usize,
        outputs: Vec<String>,
        scratch: &Path,
    ) -> Result<Onnxruntime> {
        let env = |what: String| BenchError::Environment(format!("onnxruntime: {what}"));
        let mut child = Command::new(python)
            .arg("-c")
            .arg(ORT_PEER)
            .arg(model)
            .arg(threads.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| env(format!("cannot start {python}: {e}")))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut peer = Onnxruntime {
            child,
            stdin,
            stdout,
            version: String::new(),
            threads,
            outputs,
            scratch: scratch.to_path_buf(),
        };
        let hello = peer.reply()?;
        peer.version = hello["version"].as_str().unwrap_or("?").to_string();
        Ok(peer)
    }

    fn reply(&mut self) -> Result<serde_json::Value> {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .map_err(|e| BenchError::Environment(format!("onnxruntime: {e}")))?;
        if n == 0 {
            return Err(BenchError::Environment(
                "onnxruntime: the Python process exited".into(),
            ));
        }
        let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| {
            BenchError::Environment(format!("onnxruntime: unreadable reply {line:?}: {e}"))
        })?;
        match v.get("error").and_then(|e| e.as_str()) {
            Some(e) => Err(BenchError::Environment(format!("onnxruntime: {e}"))),
            None => Ok(v),
        }
    }
}

impl Peer for Onnxruntime {
    fn name(&self) -> String {
        format!("onnxruntime {} ({} threads)", self.version, self.threads)
    }

    fn time(
        &mut self,
        case: &Case,
        seconds: f64,
        outputs: bool,
    ) -> Result<(Vec<f64>, Option<Vec<Tensor>>)> {
        let out_path = self.scratch.join("onnxruntime-outputs.npz");
        let request = serde_json::json!({
            "inputs": case.npz,
            "seconds": seconds,
            "outputs": outputs.then_some(&out_path),
        });
        writeln!(self.stdin, "{request}")
            .and_then(|_| self.stdin.flush())
            .map_err(|e| BenchError::Environment(format!("onnxruntime: {e}")))?;
        let v = self.reply()?;
        let times: Vec<f64> = v["times"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default();
        if times.is_empty() {
            return Err(BenchError::Environment(format!(
                "onnxruntime: no times in {v}"
            )));
        }
        if !outputs {
            return Ok((times, None));
        }
        let arrays = anyshape_tensor::npz::read(&out_path)
            .map_err(|e| BenchError::Environment(format!("onnxruntime's outputs: {e}")))?;
        std::fs::remove_file(&out_path).map_err(io(&out_path))?;
        let outs = self
            .outputs
            .iter()
            .map(|name| {
                arrays
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, t)| t.clone())
                    .ok_or_else(|| {
                        BenchError::Environment(format!("onnxruntime: no output {name}"))
                    })
            })
            .collect::<Result<_>>()?;
        Ok((times, Some(outs)))
    }
}

impl Drop for Onnxruntime {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
