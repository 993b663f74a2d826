//! What `accalloc replay FILE` reads, chosen by content: accalloc's JSON-lines trace, a PyTorch
//! snapshot pickled by torch.cuda.memory._dump_snapshot, or the same snapshot as JSON.

use super::snapshot::{read_snapshot, SnapshotImport, SnapshotOptions};
use super::trace::{parse_trace, TraceOp};
use crate::error::{Error, Result};
use serde_json::{Map, Number, Value};

/// The kinds of input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputFormat {
    /// accalloc's trace: one JSON op a line.
    Trace,
    /// A snapshot dict as JSON (also what `accalloc replay --snapshot` and accalloc_memory_snapshot_json
    /// write).
    SnapshotJson,
    /// A snapshot dict as a Python pickle (torch.cuda.memory._dump_snapshot).
    SnapshotPickle,
}

impl InputFormat {
    pub fn name(self) -> &'static str {
        match self {
            InputFormat::Trace => "accalloc trace",
            InputFormat::SnapshotJson => "PyTorch snapshot (JSON)",
            InputFormat::SnapshotPickle => "PyTorch snapshot (pickle)",
        }
    }
}

/// A file read as a trace.
#[derive(Clone, Debug)]
pub struct Workload {
    pub format: InputFormat,
    pub ops: Vec<TraceOp>,
    /// What reading a snapshot found (None for a trace).
    pub import: Option<SnapshotImport>,
}

/// Which kind `bytes` hold: a pickle begins with its PROTO opcode (0x80, protocols 2 to 5) or, in
/// protocols 0 and 1, with an opcode no JSON text begins with; JSON whose first value is an object
/// with "op" is a trace, any other object a snapshot.
pub fn detect(bytes: &[u8]) -> InputFormat {
    match bytes.first() {
        Some(0x80) | Some(b'}') | Some(b'(') | Some(b']') => return InputFormat::SnapshotPickle,
        _ => {}
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return InputFormat::Trace;
    };
    let first = serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .next();
    match first {
        Some(Ok(Value::Object(object))) if !object.contains_key("op") => InputFormat::SnapshotJson,
        _ => InputFormat::Trace,
    }
}

/// Read a trace or snapshot from its bytes.
pub fn read_workload(bytes: &[u8], options: &SnapshotOptions) -> Result<Workload> {
    let format = detect(bytes);
    let snapshot = match format {
        InputFormat::Trace => {
            let text = std::str::from_utf8(bytes).map_err(|e| {
                Error::invalid_argument(format!(
                    "neither a pickle nor UTF-8 text (invalid byte at offset {})",
                    e.valid_up_to()
                ))
            })?;
            return Ok(Workload {
                format,
                ops: parse_trace(text)?,
                import: None,
            });
        }
        InputFormat::SnapshotJson => serde_json::from_slice(bytes)
            .map_err(|e| Error::invalid_argument(format!("not a JSON snapshot: {e}")))?,
        InputFormat::SnapshotPickle => pickle_to_json(bytes)?,
    };
    let import = read_snapshot(&snapshot, options)?;
    Ok(Workload {
        format,
        ops: import.ops.clone(),
        import: Some(import),
    })
}

/// Deepest nesting a snapshot has (a dict of lists of dicts of lists of frame dicts), with room.
const MAX_DEPTH: usize = 32;

/// Decode a pickle of plain Python data into JSON values. Tuples and sets become lists, keys become
/// strings; the `frames` of segments, blocks and entries (Python stacks) are dropped, as replay does
/// not use them and they are most of a snapshot's size.
///
/// PyTorch shares one dict per distinct stack frame between all the entries that show it, so the
/// pickle refers back to them; serde-pickle (1.2) resolves a reference inside an object that is
/// itself shared only once and calls the others recursive. Replacing those by None loses nothing
/// here: only frames are shared that way, and they are dropped.
pub fn pickle_to_json(bytes: &[u8]) -> Result<Value> {
    let options = serde_pickle::DeOptions::new()
        .decode_strings()
        .replace_recursive_structures();
    let value = serde_pickle::value_from_slice(bytes, options)
        .map_err(|e| Error::invalid_argument(format!("not a readable pickle: {e}")))?;
    to_json(value, 0)
}

fn to_json(value: serde_pickle::Value, depth: usize) -> Result<Value> {
    use serde_pickle::Value as P;
    if depth > MAX_DEPTH {
        return Err(Error::invalid_argument(format!(
            "the pickle nests deeper than a snapshot does ({MAX_DEPTH} levels)"
        )));
    }
    Ok(match value {
        P::None => Value::Null,
        P::Bool(b) => Value::Bool(b),
        P::I64(i) => Value::from(i),
        P::Int(big) => match u64::try_from(&big) {
            Ok(u) => Value::from(u),
            Err(_) => {
                return Err(Error::invalid_argument(format!(
                    "the pickle holds the integer {big}, beyond 64 bits"
                )))
            }
        },
        P::F64(f) => Number::from_f64(f).map_or(Value::Null, Value::Number),
        P::Bytes(bytes) => Value::String(String::from_utf8_lossy(&bytes).into_owned()),
        P::String(s) => Value::String(s),
        P::List(items) | P::Tuple(items) => Value::Array(
            items
                .into_iter()
                .map(|v| to_json(v, depth + 1))
                .collect::<Result<_>>()?,
        ),
        P::Set(items) | P::FrozenSet(items) => Value::Array(
            items
                .into_iter()
                .map(|v| to_json(v.into_value(), depth + 1))
                .collect::<Result<_>>()?,
        ),
        P::Dict(entries) => {
            let mut object = Map::new();
            for (key, value) in entries {
                let key = match key.into_value() {
                    P::String(s) => s,
                    other => to_json(other, depth + 1)?.to_string(),
                };
                if key == "frames" {
                    continue;
                }
                object.insert(key, to_json(value, depth + 1)?);
            }
            Value::Object(object)
        }
    })
}

/// A JSON snapshot as a pickle, as PyTorch's _dump_snapshot would write it (`segment_pool_id` is a
/// tuple there).
pub fn json_to_pickle(snapshot: &Value) -> Result<Vec<u8>> {
    serde_pickle::value_to_vec(&to_pickle(snapshot, ""), serde_pickle::SerOptions::new())
        .map_err(|e| Error::invalid_argument(format!("cannot write the pickle: {e}")))
}

fn to_pickle(value: &Value, key: &str) -> serde_pickle::Value {
    use serde_pickle::{HashableValue as H, Value as P};
    match value {
        Value::Null => P::None,
        Value::Bool(b) => P::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => P::I64(i),
            (None, Some(u)) => P::Int(u.into()),
            _ => P::F64(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => P::String(s.clone()),
        Value::Array(items) if key == "segment_pool_id" => {
            P::Tuple(items.iter().map(|v| to_pickle(v, "")).collect())
        }
        Value::Array(items) => P::List(items.iter().map(|v| to_pickle(v, "")).collect()),
        Value::Object(object) => P::Dict(
            object
                .iter()
                .map(|(k, v)| (H::String(k.clone()), to_pickle(v, k)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_kind_is_chosen_by_content() {
        assert_eq!(
            detect(b"{\"op\":\"empty_cache\"}\n{\"op\":\"empty_cache\"}"),
            InputFormat::Trace
        );
        assert_eq!(
            detect(b"\n  {\"segments\": [], \"device_traces\": []}"),
            InputFormat::SnapshotJson
        );
        assert_eq!(detect(b"\x80\x04\x95"), InputFormat::SnapshotPickle);
        assert_eq!(detect(b""), InputFormat::Trace);
        assert_eq!(detect(b"garbage"), InputFormat::Trace);
    }

    #[test]
    fn a_snapshot_survives_pickling() {
        let snapshot = json!({
            "segments": [{"device": 0, "address": 140_000_000_000_000u64, "segment_pool_id": [0, 0],
                "blocks": [], "frames": [{"filename": "x.py", "line": 3, "name": "f"}], "ratio": 0.5,
                "is_expandable": false, "none": null}],
            "device_traces": [[{"action": "alloc", "addr": 18_446_744_073_709_551_000u64, "size": 512,
                "stream": 0, "time_us": 1}]],
        });
        let bytes = json_to_pickle(&snapshot).unwrap();
        assert_eq!(detect(&bytes), InputFormat::SnapshotPickle);
        let mut expected = snapshot.clone();
        expected["segments"][0]
            .as_object_mut()
            .unwrap()
            .remove("frames");
        assert_eq!(
            pickle_to_json(&bytes).unwrap(),
            expected,
            "frames dropped, the rest kept"
        );
    }

    #[test]
    fn bad_pickles_are_errors() {
        let bytes = json_to_pickle(&json!({"device_traces": [[]]})).unwrap();
        let truncated = pickle_to_json(&bytes[..bytes.len() - 3]).unwrap_err();
        assert!(
            truncated.message.starts_with("not a readable pickle"),
            "{}",
            truncated.message
        );
        let list =
            serde_pickle::value_to_vec(&serde_pickle::Value::List(vec![]), Default::default())
                .unwrap();
        let err = read_workload(&list, &SnapshotOptions::default()).unwrap_err();
        assert!(
            err.message.starts_with("not a memory snapshot"),
            "{}",
            err.message
        );
    }
}
