//! Helpers shared by the CLI's tests: running the binary as a user would, and making
//! the ONNX models and NumPy files the tests feed it (in code, so the tests need no
//! Python).
#![allow(dead_code)]
use anyshape_graph::onnx::proto;
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary under test: this build's, or `ANYSHAPE_TEST_BIN` (to show a test fail
/// on an older build).
pub fn bin() -> PathBuf {
    std::env::var_os("ANYSHAPE_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_anyshape")))
}

/// A kernel cache shared by the tests of this binary (kernels are built once).
pub fn cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("anyshape-test-cache")
}

/// `anyshape ARGS` in `dir`.
pub fn command(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .current_dir(dir)
        .env("RUST_BACKTRACE", "0")
        .env("ANYSHAPE_CACHE", cache());
    cmd
}

/// Run `anyshape ARGS` in `dir`.
pub fn anyshape(dir: &Path, args: &[&str]) -> Output {
    command(dir, args).output().unwrap()
}

/// Run `anyshape ARGS` from the test's own directory (the crate's), with `cache` as its
/// kernel cache.
pub fn anyshape_cached(args: &[&str], cache: &Path) -> Output {
    Command::new(bin())
        .args(args)
        .env("ANYSHAPE_CACHE", cache)
        .output()
        .unwrap()
}

/// `anyshape compile ONNX --dim D... --out OUT --quiet` with `cache` as its kernel
/// cache (see [`anyshape_cached`]).
pub fn compile(onnx: &Path, dims: &[&str], out: &Path, cache: &Path) -> Output {
    let mut args = vec!["compile", onnx.to_str().unwrap()];
    for d in dims {
        args.extend(["--dim", d]);
    }
    args.extend(["--out", out.to_str().unwrap(), "--quiet"]);
    anyshape_cached(&args, cache)
}

/// Standard output and error together.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The repository's test models.
pub fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

/// Names of the entries of `dir`, sorted.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// An ONNX model made in code: float inputs and outputs with fixed or named dims,
/// nodes, float initializers.
pub struct Onnx {
    opset: i64,
    graph: proto::GraphProto,
}

/// A dim of an input or output: fixed or named.
pub enum Dim {
    /// A fixed extent.
    Fixed(i64),
    /// A symbolic dim (`dim_param`).
    Named(&'static str),
}

fn value(name: &str, dims: &[Dim]) -> proto::ValueInfoProto {
    typed_value(name, dims, 1)
}

/// A value of ONNX element type `elem_type` (1: float, 7: int64).
fn typed_value(name: &str, dims: &[Dim], elem_type: i32) -> proto::ValueInfoProto {
    use proto::tensor_shape_proto::{dimension::Value, Dimension};
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Fixed(v) => Value::DimValue(*v),
                Dim::Named(n) => Value::DimParam(n.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(proto::TypeProto {
            value: Some(proto::type_proto::Value::TensorType(
                proto::type_proto::Tensor {
                    elem_type: Some(elem_type),
                    shape: Some(proto::TensorShapeProto { dim }),
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

impl Onnx {
    /// An empty graph of default-domain `opset`.
    pub fn new(opset: i64) -> Onnx {
        Onnx {
            opset,
            graph: proto::GraphProto {
                name: Some("test".into()),
                ..Default::default()
            },
        }
    }

    /// A float input.
    pub fn input(mut self, name: &str, dims: &[Dim]) -> Onnx {
        self.graph.input.push(value(name, dims));
        self
    }

    /// An int64 input (axes, counts, shapes given at run time).
    pub fn int_input(mut self, name: &str, dims: &[Dim]) -> Onnx {
        self.graph.input.push(typed_value(name, dims, 7));
        self
    }

    /// A float output.
    pub fn output(mut self, name: &str, dims: &[Dim]) -> Onnx {
        self.graph.output.push(value(name, dims));
        self
    }

    /// A node with integer attributes.
    pub fn node(self, op: &str, ins: &[&str], outs: &[&str], ints: &[(&str, i64)]) -> Onnx {
        self.node_lists(op, ins, outs, ints, &[])
    }

    /// A node with integer and integer-list attributes (`kernel_shape`, `pads`, …).
    pub fn node_lists(
        mut self,
        op: &str,
        ins: &[&str],
        outs: &[&str],
        ints: &[(&str, i64)],
        lists: &[(&str, &[i64])],
    ) -> Onnx {
        let n = self.graph.node.len();
        let int = ints.iter().map(|(k, v)| proto::AttributeProto {
            name: Some(k.to_string()),
            r#type: Some(2), // INT
            i: Some(*v),
            ..Default::default()
        });
        let list = lists.iter().map(|(k, v)| proto::AttributeProto {
            name: Some(k.to_string()),
            r#type: Some(7), // INTS
            ints: v.to_vec(),
            ..Default::default()
        });
        self.graph.node.push(proto::NodeProto {
            name: Some(format!("{op}_{n}")),
            op_type: Some(op.into()),
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: outs.iter().map(|s| s.to_string()).collect(),
            attribute: int.chain(list).collect(),
            ..Default::default()
        });
        self
    }

    /// A float initializer, inline.
    pub fn weight(mut self, name: &str, shape: &[i64], data: &[f32]) -> Onnx {
        self.graph.initializer.push(proto::TensorProto {
            name: Some(name.into()),
            dims: shape.to_vec(),
            data_type: Some(1),
            raw_data: Some(data.iter().flat_map(|x| x.to_le_bytes()).collect()),
            ..Default::default()
        });
        self
    }

    /// An int64 initializer, inline (axes, shapes).
    pub fn int_weight(mut self, name: &str, shape: &[i64], data: &[i64]) -> Onnx {
        self.graph.initializer.push(proto::TensorProto {
            name: Some(name.into()),
            dims: shape.to_vec(),
            data_type: Some(7),
            raw_data: Some(data.iter().flat_map(|x| x.to_le_bytes()).collect()),
            ..Default::default()
        });
        self
    }

    /// A float initializer whose data is in the external file `location` (relative to
    /// the model), written there by [`Onnx::write`].
    pub fn external_weight(mut self, name: &str, shape: &[i64], location: &str) -> Onnx {
        let entry = |k: &str, v: String| proto::StringStringEntryProto {
            key: Some(k.into()),
            value: Some(v),
        };
        self.graph.initializer.push(proto::TensorProto {
            name: Some(name.into()),
            dims: shape.to_vec(),
            data_type: Some(1),
            data_location: Some(1),
            external_data: vec![entry("location", location.into())],
            ..Default::default()
        });
        self
    }

    /// The model's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        proto::ModelProto {
            ir_version: Some(8),
            opset_import: vec![proto::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(self.opset),
            }],
            graph: Some(self.graph.clone()),
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// Write the model to `path`.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.bytes()).unwrap();
    }
}

/// A `.npy` file's bytes as NumPy writes them (header version 1.0), Fortran order if
/// asked: `data` is already in that order.
pub fn npy(descr: &str, fortran: bool, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
        if fortran { "True" } else { "False" }
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

/// Little-endian bytes of floats.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A `.npz` file of `.npy` members (name, bytes), stored uncompressed as NumPy does.
pub fn npz(path: &Path, members: &[(&str, Vec<u8>)]) {
    let file = std::fs::File::create(path).unwrap();
    let mut npz = npyz::npz::NpzWriter::new(std::io::BufWriter::new(file));
    let zip = npz.zip_writer();
    for (name, bytes) in members {
        zip.start_file(format!("{name}.npy"), Default::default())
            .unwrap();
        std::io::Write::write_all(zip, bytes).unwrap();
    }
    zip.finish().unwrap();
}

/// `compile` of tiny BERT (TorchScript export), untuned, into `dir/bert.module` for batch
/// 1..4 and sequence 1..128.
pub fn compile_bert(dir: &Path) -> Output {
    let onnx = models().join("bert_tiny.ts.onnx");
    anyshape(
        dir,
        &[
            "compile",
            onnx.to_str().unwrap(),
            "--dim",
            "batch=1..4",
            "--dim",
            "sequence=1..128",
            "--out",
            "bert.module",
            "--quiet",
        ],
    )
}

/// Tiny BERT (TorchScript export) compiled untuned into `dir/bert.module` for batch
/// 1..4 and sequence 1..128, and its recorded case at sequence 37 as `dir/case.npz`.
pub fn bert(dir: &Path) -> PathBuf {
    let o = compile_bert(dir);
    assert!(o.status.success(), "{}", text(&o));
    std::fs::copy(models().join("bert_tiny.ts.s37.npz"), dir.join("case.npz")).unwrap();
    dir.join("bert.module")
}

/// `run --module bert.module --seconds 0 ARGS` in `dir` (the module of [`bert`]).
pub fn run(dir: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["run", "--module", "bert.module", "--seconds", "0"];
    all.extend_from_slice(args);
    anyshape(dir, &all)
}

/// `run --module MODULE --inputs NPZ --seconds 0` in `d`.
pub fn run_on(d: &Path, module: &str, inputs: &str) -> std::process::Output {
    anyshape(
        d,
        &[
            "run",
            "--module",
            module,
            "--inputs",
            inputs,
            "--seconds",
            "0",
        ],
    )
}

/// `compile MODEL --dim n=1..4 --out OUT` in `d` (the small models of these tests).
pub fn compile_n(d: &Path, model: &str, out: &str) -> std::process::Output {
    anyshape(d, &["compile", model, "--dim", "n=1..4", "--out", out])
}

/// Assert that `o` failed and says each of `words`.
pub fn failed_with(o: &std::process::Output, words: &[&str]) {
    let t = text(o);
    assert!(!o.status.success(), "should fail: {t}");
    for w in words {
        assert!(t.contains(w), "expected `{w}` in: {t}");
    }
}
