//! Reading ONNX files into the graph IR: the protobuf (`prost` types generated from
//! `proto/onnx.proto`), tensors in every encoding exporters use (raw little-endian
//! bytes, typed fields, external data files next to the model), attributes, the
//! inputs' symbolic dims, and checks that the graph is well formed (every value defined
//! once, before its use). Anything else is a clear error naming what and where.
use crate::graph::{Graph, Input};
use crate::{GraphError, Result};
use anyshape_ir::Expr;
use anyshape_tensor::{Attr, DType, Data, Node, Tensor};
use prost::Message;
use std::collections::BTreeMap;
use std::path::{Component, Path};

/// The protobuf types of `onnx.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

/// Models larger than this are refused before reading (2 GiB: protobuf's own limit).
pub const MAX_MODEL_BYTES: u64 = 2 << 30;

/// The ONNX IR versions anyshape reads. The versions after 10 add element types (11:
/// FLOAT4E2M1, 12: FLOAT8E8M0, 13: UINT2/INT2, 14: FLOAT6E2M3/FLOAT6E3M2), which are
/// refused by name like every type the runtime does not have, (11) multi-device
/// placement annotations, which do not change what the graph computes and are ignored
/// on one CPU, and (14) opaque types, refused as values that are not tensors.
pub const IR_VERSIONS: std::ops::RangeInclusive<i64> = 3..=14;

/// The largest external data file anyshape reads.
pub const MAX_EXTERNAL_BYTES: u64 = 64 << 30;

/// Read the model at `path` (a regular file of at most [`MAX_MODEL_BYTES`]; external
/// data relative to its directory).
pub fn load(path: &Path) -> Result<Graph> {
    let bytes = anyshape_files::read(
        path,
        MAX_MODEL_BYTES,
        "an ONNX model (models over 2 GiB keep their weights in external data files)",
    )?;
    decode(&bytes, path.parent())
}

/// Decode a model from its bytes; external data files are looked up in `dir`. Its
/// control flow is inlined and its repeated computations merged (`cse.rs`).
pub fn decode(bytes: &[u8], dir: Option<&Path>) -> Result<Graph> {
    let model = proto::ModelProto::decode(bytes).map_err(|e| GraphError::Format(e.to_string()))?;
    let ir = model.ir_version.unwrap_or(0);
    if !IR_VERSIONS.contains(&ir) {
        return Err(GraphError::Unsupported(format!(
            "ONNX IR version {ir} (anyshape reads {} to {})",
            IR_VERSIONS.start(),
            IR_VERSIONS.end()
        )));
    }
    let version = |domains: &[&str]| {
        model
            .opset_import
            .iter()
            .find(|o| domains.contains(&o.domain.as_deref().unwrap_or_default()))
            .and_then(|o| o.version)
    };
    let ml_opset = version(&[ML_DOMAIN]);
    // A model of the ML domain's ops alone may import no default opset.
    let opset = match (version(&["", "ai.onnx"]), ml_opset) {
        (Some(v), _) => v,
        (None, Some(_)) => 0,
        (None, None) => return Err(GraphError::Format("no opset of the default domain".into())),
    };
    let graph = model
        .graph
        .ok_or_else(|| GraphError::Format("the model has no graph".into()))?;
    let g = Reader {
        dir,
        g: Graph {
            opset,
            ml_opset,
            ..Graph::default()
        },
        names: BTreeMap::new(),
        scopes: Vec::new(),
        unnamed_dims: 0,
    }
    .read(graph)?;
    let mut all = Vec::new();
    crate::branches::nodes_within(&g.nodes, &mut all);
    anyshape_tensor::ops::check_opset(g.opset, g.ml_opset, all)?;
    let mut g = g;
    crate::branches::inline(&mut g)?;
    crate::cse::merge_repeated(&mut g);
    Ok(g)
}

struct Reader<'a> {
    dir: Option<&'a Path>,
    g: Graph,
    names: BTreeMap<String, usize>,
    /// The values of the `If` branches being read, innermost last, by their names
    /// there (a branch's own values are new ones, named under its node's name).
    scopes: Vec<(String, BTreeMap<String, usize>)>,
    unnamed_dims: usize,
}

impl Reader<'_> {
    fn id(&mut self, name: &str) -> usize {
        if let Some(&i) = self.scopes.iter().rev().find_map(|(_, s)| s.get(name)) {
            return i;
        }
        if let Some(&i) = self.names.get(name) {
            return i;
        }
        self.g.values.push(name.to_string());
        self.names.insert(name.to_string(), self.g.values.len() - 1);
        self.g.values.len() - 1
    }

    fn read(mut self, graph: proto::GraphProto) -> Result<Graph> {
        let mut defined = std::collections::BTreeSet::new();
        for t in &graph.initializer {
            let name = t.name.clone().unwrap_or_default();
            let tensor = self.tensor(t).map_err(|e| match e {
                GraphError::Unsupported(m) | GraphError::Format(m) => {
                    GraphError::Format(format!("initializer `{name}`: {m}"))
                }
                other => other,
            })?;
            let id = self.id(&name);
            self.g.initializers.insert(id, tensor);
            defined.insert(id);
        }
        for vi in &graph.input {
            let name = vi.name.clone().unwrap_or_default();
            let id = self.id(&name);
            if self.g.initializers.contains_key(&id) {
                continue; // older exporters list weights among the inputs
            }
            let (dtype, dims) = self.value_type(vi)?;
            self.g.inputs.push(Input {
                value: id,
                dtype,
                dims,
            });
            defined.insert(id);
        }
        for (index, n) in graph.node.iter().enumerate() {
            let node = self.node(n, index, &mut defined)?;
            self.g.nodes.push(node);
        }
        for vi in &graph.output {
            let name = vi.name.clone().unwrap_or_default();
            let id = self.id(&name);
            if !defined.contains(&id) {
                return Err(GraphError::Format(format!(
                    "graph output `{name}` is made by no node"
                )));
            }
            self.g.outputs.push(id);
        }
        if self.g.outputs.is_empty() {
            return Err(GraphError::Format("the graph has no outputs".into()));
        }
        Ok(self.g)
    }

    /// A node of the graph or of a branch, its inputs among the values `defined` so far
    /// (its outputs added).
    fn node(
        &mut self,
        n: &proto::NodeProto,
        index: usize,
        defined: &mut std::collections::BTreeSet<usize>,
    ) -> Result<Node> {
        let name = match n.name.as_deref() {
            Some(s) if !s.is_empty() => s.to_string(),
            _ => format!("#{index}"),
        };
        let name = match self.scopes.last() {
            Some((prefix, _)) => format!("{prefix}/{name}"),
            None => name,
        };
        let op = n.op_type.clone().unwrap_or_default();
        // The preview domain's FlexAttention is expanded into default-domain ops; the ML
        // domain's ops are named with their domain.
        let preview = n.domain.as_deref() == Some("ai.onnx.preview") && op == "FlexAttention";
        let op = match n.domain.as_deref() {
            Some(ML_DOMAIN) => format!("{ML_DOMAIN}.{op}"),
            _ => op,
        };
        let ml = n.domain.as_deref() == Some(ML_DOMAIN);
        if !preview && !ml && !matches!(n.domain.as_deref(), None | Some("") | Some("ai.onnx")) {
            return Err(GraphError::Unsupported(format!(
                "node `{name}`: op {op} of domain `{}`",
                n.domain.as_deref().unwrap_or_default()
            )));
        }
        let mut node = Node {
            name,
            op,
            inputs: Vec::new(),
            outputs: Vec::new(),
            attrs: BTreeMap::new(),
        };
        for i in &n.input {
            if i.is_empty() {
                node.inputs.push(None);
                continue;
            }
            let id = self.id(i);
            if !defined.contains(&id) {
                return Err(GraphError::from(node.error(format!(
                    "input `{i}` is used before any node makes it (the graph is not in topological order, or the value does not exist)"
                ))));
            }
            node.inputs.push(Some(id));
        }
        for a in &n.attribute {
            let key = a.name.clone().unwrap_or_default();
            let value = match (&a.g, node.op.as_str()) {
                (Some(g), "If" | "Scan" | "Loop" | "FlexAttention") => {
                    self.branch(g, &format!("{}/{key}", node.name), defined)
                }
                _ => self.attr(a),
            }
            .map_err(|e| node.error(format!("attribute `{key}`: {e}")))?;
            node.attrs.insert(key, value);
        }
        // An optional output left out is an empty name: one before a given output
        // keeps its place as a value nothing reads (outputs are positional); those
        // after the last given one are not asked for.
        let given = n
            .output
            .iter()
            .rposition(|o| !o.is_empty())
            .map_or(0, |i| i + 1);
        for (i, o) in n.output[..given].iter().enumerate() {
            if o.is_empty() {
                self.g
                    .values
                    .push(format!("{} output {i} (left out)", node.name));
                node.outputs.push(self.g.values.len() - 1);
                continue;
            }
            let id = self.output_id(o);
            if !defined.insert(id) {
                return Err(GraphError::from(
                    node.error(format!("output `{o}` is defined twice")),
                ));
            }
            node.outputs.push(id);
        }
        Ok(node)
    }

    /// The value a node makes, named `name`: in a branch a new one, named under it.
    fn output_id(&mut self, name: &str) -> usize {
        let Some((prefix, scope)) = self.scopes.last_mut() else {
            return self.id(name);
        };
        self.g.values.push(format!("{prefix}/{name}"));
        let id = self.g.values.len() - 1;
        scope.insert(name.to_string(), id);
        id
    }

    /// An `If` branch, a `Scan` body or a `FlexAttention` modifier: its inputs, constants and nodes read into the
    /// model's values as new ones (what it names of the model's values read from them),
    /// its outputs resolved.
    fn branch(
        &mut self,
        graph: &proto::GraphProto,
        prefix: &str,
        defined: &mut std::collections::BTreeSet<usize>,
    ) -> Result<Attr> {
        self.scopes.push((prefix.to_string(), BTreeMap::new()));
        let read = (|| {
            let mut inputs = Vec::new();
            for vi in &graph.input {
                let id = self.output_id(vi.name.as_deref().unwrap_or_default());
                defined.insert(id);
                inputs.push(id);
            }
            for t in &graph.initializer {
                let tensor = self.tensor(t)?;
                let id = self.output_id(t.name.as_deref().unwrap_or_default());
                self.g.initializers.insert(id, tensor);
                defined.insert(id);
            }
            let mut nodes = Vec::new();
            for (index, n) in graph.node.iter().enumerate() {
                nodes.push(self.node(n, index, defined)?);
            }
            let outputs = graph
                .output
                .iter()
                .map(|vi| {
                    let name = vi.name.clone().unwrap_or_default();
                    let id = self.id(&name);
                    match defined.contains(&id) {
                        true => Ok(id),
                        false => Err(GraphError::Format(format!(
                            "branch output `{name}` is made by no node"
                        ))),
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Attr::Branch(Box::new(anyshape_tensor::Branch {
                inputs,
                nodes,
                outputs,
            })))
        })();
        self.scopes.pop();
        read
    }

    /// An input's element type and dims.
    fn value_type(&mut self, vi: &proto::ValueInfoProto) -> Result<(DType, Vec<Expr>)> {
        use proto::tensor_shape_proto::dimension::Value as D;
        use proto::type_proto::Value as T;
        let name = vi.name.clone().unwrap_or_default();
        let Some(T::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
            return Err(GraphError::Unsupported(format!(
                "input `{name}` is not a tensor"
            )));
        };
        let code = t.elem_type.unwrap_or(0);
        let dtype = DType::from_onnx(code).ok_or_else(|| {
            GraphError::Unsupported(format!("input `{name}` has element type {code}"))
        })?;
        let Some(shape) = &t.shape else {
            return Err(GraphError::Unsupported(format!(
                "input `{name}` has no shape (its rank must be known)"
            )));
        };
        let mut dims = Vec::new();
        for d in &shape.dim {
            dims.push(match &d.value {
                Some(D::DimValue(v)) if *v >= 0 => Expr::Const(*v),
                Some(D::DimParam(p)) if !p.is_empty() => dim_expr(p),
                _ => {
                    self.unnamed_dims += 1;
                    Expr::var(format!("unk_in{}", self.unnamed_dims))
                }
            });
        }
        Ok((dtype, dims))
    }

    fn attr(&mut self, a: &proto::AttributeProto) -> Result<Attr> {
        use proto::attribute_proto::AttributeType as A;
        let ty = a.r#type.unwrap_or(0);
        Ok(match A::try_from(ty).unwrap_or(A::Undefined) {
            A::Int => Attr::Int(a.i.unwrap_or(0)),
            A::Float => Attr::Float(a.f.unwrap_or(0.0)),
            A::Ints => Attr::Ints(a.ints.clone()),
            A::Floats => Attr::Floats(a.floats.clone()),
            A::String => {
                Attr::Str(String::from_utf8_lossy(a.s.as_deref().unwrap_or_default()).into_owned())
            }
            A::Strings => Attr::Strs(
                a.strings
                    .iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect(),
            ),
            A::Tensor => {
                let t = a.t.as_ref().ok_or_else(|| {
                    GraphError::Format("a tensor attribute without its tensor".into())
                })?;
                Attr::Tensor(match t.data_type {
                    // A tree ensemble's modes: small integers, read as int64.
                    Some(UINT8) => bytes_as_i64(t)?,
                    _ => self.tensor(t)?,
                })
            }
            _ => Attr::Unsupported,
        })
    }

    /// A tensor in any of its encodings.
    fn tensor(&mut self, t: &proto::TensorProto) -> Result<Tensor> {
        let code = t.data_type.unwrap_or(0);
        let dtype = DType::from_onnx(code)
            .ok_or_else(|| GraphError::Unsupported(format!("tensors of element type {code}")))?;
        let shape = dims(t)?;
        let n = anyshape_tensor::numel(&shape)?;
        let external = t.data_location == Some(1);
        let raw: Option<Vec<u8>> = if external {
            Some(self.external(t)?)
        } else {
            t.raw_data.clone()
        };
        let width = |c: i32| match c {
            1 | 6 => 4,
            7 | 11 => 8,
            9 => 1,
            _ => 0,
        };
        let data = if let Some(raw) = raw {
            let w = width(code);
            if raw.len() != n * w {
                return Err(GraphError::Format(format!(
                    "{} bytes of data for {n} elements of {w} bytes",
                    raw.len()
                )));
            }
            match code {
                1 => Data::F32(
                    raw.chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                ),
                11 => Data::F32(
                    raw.chunks_exact(8)
                        .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
                        .collect(),
                ),
                6 => Data::I64(
                    raw.chunks_exact(4)
                        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
                        .collect(),
                ),
                7 => Data::I64(
                    raw.chunks_exact(8)
                        .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                        .collect(),
                ),
                _ => Data::Bool(raw.iter().map(|&b| b != 0).collect()),
            }
        } else {
            match code {
                1 => Data::F32(t.float_data.clone()),
                11 => Data::F32(t.double_data.iter().map(|&x| x as f32).collect()),
                6 => Data::I64(t.int32_data.iter().map(|&x| x as i64).collect()),
                7 => Data::I64(t.int64_data.clone()),
                _ => Data::Bool(t.int32_data.iter().map(|&x| x != 0).collect()),
            }
        };
        let _ = dtype;
        Tensor::new(shape, data).map_err(|e| GraphError::Format(e.to_string()))
    }

    /// The bytes of an external-data tensor: a regular file beside the model, whose
    /// real path (links followed) lies inside the model's directory, an offset and a
    /// length within it. The file is recorded in [`Graph::external`].
    fn external(&mut self, t: &proto::TensorProto) -> Result<Vec<u8>> {
        let get = |k: &str| {
            t.external_data
                .iter()
                .find(|e| e.key.as_deref() == Some(k))
                .and_then(|e| e.value.clone())
        };
        let location = get("location")
            .ok_or_else(|| GraphError::Format("external data without a location".into()))?;
        let rel = Path::new(&location);
        if location.is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(GraphError::Format(format!(
                "external data location `{location}` leaves the model's directory"
            )));
        }
        let dir = self.dir.ok_or_else(|| {
            GraphError::Format(format!(
                "external data `{location}` needs the model's directory (load the model from a file)"
            ))
        })?;
        let path = dir.join(rel);
        // The path as written stays inside; its real path must too (a link out of the
        // directory is refused, as onnxruntime refuses it).
        let real_dir = anyshape_files::normalized(dir);
        if !anyshape_files::normalized(&path).starts_with(&real_dir) {
            return Err(GraphError::Format(format!(
                "external data `{location}` is a link to a file outside the model's directory {}",
                dir.display()
            )));
        }
        let num = |k: &str| -> Result<Option<u64>> {
            get(k)
                .map(|v| {
                    v.parse::<u64>().map_err(|_| {
                        GraphError::Format(format!("external data {k} `{v}` is not a number"))
                    })
                })
                .transpose()
        };
        let (mut file, len) =
            anyshape_files::open(&path, MAX_EXTERNAL_BYTES, "an ONNX model's external data")?;
        let offset = num("offset")?.unwrap_or(0);
        let length = num("length")?.unwrap_or(len.saturating_sub(offset));
        if offset.checked_add(length).is_none_or(|end| end > len) {
            return Err(GraphError::Format(format!(
                "external data `{location}`: bytes {offset}..+{length} past its end ({len} bytes)"
            )));
        }
        use std::io::{Read, Seek};
        let mut bytes = vec![0u8; length as usize];
        file.seek(std::io::SeekFrom::Start(offset))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(anyshape_files::FileError::io(&path))?;
        self.g.external.insert(location);
        Ok(bytes)
    }
}

/// A dim name as an expression: a plain name is a shape var; exporters also write
/// expressions (`batch*sequence`, `((height//16))*((width//16)) + 1`), read with `//` as
/// floor division; anything else becomes a shape var named after its characters.
/// The domain of the ONNX ML ops.
const ML_DOMAIN: &str = "ai.onnx.ml";

/// ONNX's code of `uint8`.
const UINT8: i32 = 2;

/// A tensor's dims.
fn dims(t: &proto::TensorProto) -> Result<Vec<usize>> {
    t.dims
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| GraphError::Format(format!("negative dims {:?}", t.dims)))
}

/// A `uint8` attribute tensor as `int64`s.
fn bytes_as_i64(t: &proto::TensorProto) -> Result<Tensor> {
    let shape = dims(t)?;
    let values: Vec<i64> = match &t.raw_data {
        Some(raw) => raw.iter().map(|&b| b as i64).collect(),
        None => t.int32_data.iter().map(|&v| v as i64).collect(),
    };
    Tensor::i64(shape, values).map_err(|e| GraphError::Format(e.to_string()))
}

fn dim_expr(name: &str) -> Expr {
    let text = name.replace("//", "/");
    match anyshape_ir::parse_expr(&text) {
        // No dim of an input is a run-time dim (`?…`, which only steps make).
        Ok(e) if !e.has_runtime_dims() => e,
        _ => Expr::var(
            name.chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect::<String>(),
        ),
    }
}
