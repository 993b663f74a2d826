//! accalloc's own trace format, its one owner: one JSON object a line, written by the library's
//! ACCALLOC_TRACE log (the `accalloc` crate's runtime/trace_log.rs) and by the tools, read by the
//! tools' replay.
//!
//! `{"op":"alloc","id":7,"size":4096,"stream":0}` (optional "device"), `{"op":"free","id":7}`,
//! `{"op":"empty_cache"}`, `{"op":"record_stream","id":7,"stream":2}`, and the private pools' calls:
//! `{"op":"pool_create","pool":[0,1],"use_on_oom":false,"no_split":false}`,
//! `{"op":"pool_begin","pool":[0,1]}` (every later allocation: a replay has one thread) or with
//! `"stream":3` (a capture's), `{"op":"pool_end","pool":[0,1]}`, `{"op":"pool_release","pool":[0,1]}`,
//! `{"op":"pool_empty","pool":[0,1],"live":false}` (each with an optional "device"). Blank lines are
//! skipped.

use crate::backend::MAX_DEVICES;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fmt::Write;

/// One operation of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceOp {
    /// Ask for `size` bytes on `device` for `stream`; `id` names the allocation in later ops.
    Alloc {
        id: u64,
        size: usize,
        stream: usize,
        device: usize,
    },
    /// Free the allocation `id`.
    Free { id: u64 },
    /// Release every unused cached segment of every device.
    EmptyCache,
    /// `stream` uses the allocation `id` (PyTorch's record_stream).
    RecordStream { id: u64, stream: usize },
    /// A call on private pool `pool` of `device`.
    Pool {
        pool: (u64, u64),
        device: usize,
        call: PoolCall,
    },
}

/// A call on a private pool (accalloc_core::caching::pools has the rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolCall {
    /// MemPool(use_on_oom, no_split): made with one use (or one use more).
    Create { use_on_oom: bool, no_split: bool },
    /// beginAllocateToPool: every later allocation (None) or those on a stream go to the pool.
    Begin { stream: Option<usize> },
    /// endAllocateToPool.
    End,
    /// releasePool.
    Release,
    /// emptyCache(pool) (`live` false), or accalloc's empty of a live pool too.
    Empty { live: bool },
}

impl PoolCall {
    fn name(self) -> &'static str {
        match self {
            PoolCall::Create { .. } => "pool_create",
            PoolCall::Begin { .. } => "pool_begin",
            PoolCall::End => "pool_end",
            PoolCall::Release => "pool_release",
            PoolCall::Empty { .. } => "pool_empty",
        }
    }
}

/// The op as one line of the trace format (no newline): the one writer of the format, used by the
/// tools (`convert`, snapshots as traces) and by the library's ACCALLOC_TRACE log alike. Device 0 is
/// left out, as readers default to it.
impl std::fmt::Display for TraceOp {
    fn fmt(&self, out: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            TraceOp::Alloc {
                id,
                size,
                stream,
                device: 0,
            } => write!(out, "{{\"op\":\"alloc\",\"id\":{id},\"size\":{size},\"stream\":{stream}}}"),
            TraceOp::Alloc {
                id,
                size,
                stream,
                device,
            } => write!(
                out,
                "{{\"op\":\"alloc\",\"id\":{id},\"size\":{size},\"stream\":{stream},\"device\":{device}}}"
            ),
            TraceOp::Free { id } => write!(out, "{{\"op\":\"free\",\"id\":{id}}}"),
            TraceOp::EmptyCache => out.write_str("{\"op\":\"empty_cache\"}"),
            TraceOp::RecordStream { id, stream } => {
                write!(out, "{{\"op\":\"record_stream\",\"id\":{id},\"stream\":{stream}}}")
            }
            TraceOp::Pool { pool, device, call } => {
                write!(out, "{{\"op\":\"{}\",\"pool\":[{},{}]", call.name(), pool.0, pool.1)?;
                match call {
                    PoolCall::Create {
                        use_on_oom,
                        no_split,
                    } => write!(out, ",\"use_on_oom\":{use_on_oom},\"no_split\":{no_split}")?,
                    PoolCall::Begin {
                        stream: Some(stream),
                    } => write!(out, ",\"stream\":{stream}")?,
                    PoolCall::Empty { live } => write!(out, ",\"live\":{live}")?,
                    PoolCall::Begin { stream: None } | PoolCall::End | PoolCall::Release => {}
                }
                if device != 0 {
                    write!(out, ",\"device\":{device}")?;
                }
                out.write_str("}")
            }
        }
    }
}

impl TraceOp {
    /// The op as one line of the trace format (no newline).
    pub fn to_json_line(&self) -> String {
        self.to_string()
    }
}

/// The ops as a trace file: one line each.
pub fn trace_to_jsonl(ops: &[TraceOp]) -> String {
    let mut text = String::with_capacity(ops.len() * 48);
    for op in ops {
        let _ = writeln!(text, "{}", op.to_json_line());
    }
    text
}

/// How many devices `ops` use: one more than the highest device an allocation names (1 for none).
pub fn devices_used(ops: &[TraceOp]) -> usize {
    ops.iter()
        .filter_map(|op| match op {
            TraceOp::Alloc { device, .. } | TraceOp::Pool { device, .. } => {
                Some(device.saturating_add(1))
            }
            _ => None,
        })
        .max()
        .unwrap_or(1)
}

/// Read a whole trace; a malformed line is an error naming its number (from 1).
pub fn parse_trace(text: &str) -> Result<Vec<TraceOp>> {
    let mut ops = Vec::new();
    let mut live: HashMap<u64, usize> = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let op = parse_line(line).map_err(|why| {
            Error::invalid_argument(format!("trace line {number}: {why}: {}", abbreviate(line)))
        })?;
        match &op {
            TraceOp::Alloc { id, .. } => {
                if let Some(first) = live.insert(*id, number) {
                    return Err(Error::invalid_argument(format!(
                        "trace line {number}: id {id} is allocated again while live (allocated on line {first})"
                    )));
                }
            }
            TraceOp::Free { id } => {
                if live.remove(id).is_none() {
                    return Err(Error::invalid_argument(format!(
                        "trace line {number}: free of id {id}, which is not live"
                    )));
                }
            }
            TraceOp::RecordStream { id, .. } => {
                if !live.contains_key(id) {
                    return Err(Error::invalid_argument(format!(
                        "trace line {number}: record_stream of id {id}, which is not live"
                    )));
                }
            }
            TraceOp::EmptyCache | TraceOp::Pool { .. } => {}
        }
        ops.push(op);
    }
    Ok(ops)
}

/// A line of input as error messages quote it: whole up to 80 characters, else its first 77 and "...".
pub fn abbreviate(line: &str) -> String {
    if line.len() <= 80 {
        line.to_string()
    } else {
        format!(
            "{}...",
            &line[..line.char_indices().nth(77).map_or(line.len(), |(i, _)| i)]
        )
    }
}

fn parse_line(line: &str) -> std::result::Result<TraceOp, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("not JSON ({e})"))?;
    let object = value.as_object().ok_or("not a JSON object")?;
    let uint = |key: &str| -> std::result::Result<Option<u64>, String> {
        match object.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or(format!("\"{key}\" must be a non-negative integer")),
        }
    };
    let required = |key: &str| uint(key)?.ok_or(format!("missing \"{key}\""));
    let index = |key: &str| -> std::result::Result<usize, String> {
        usize::try_from(uint(key)?.unwrap_or(0)).map_err(|_| format!("\"{key}\" is too large"))
    };
    let flag = |key: &str| -> std::result::Result<bool, String> {
        match object.get(key) {
            None => Ok(false),
            Some(v) => v
                .as_bool()
                .ok_or(format!("\"{key}\" must be true or false")),
        }
    };
    let device = || -> std::result::Result<usize, String> {
        match index("device")? {
            device if device < MAX_DEVICES => Ok(device),
            device => Err(format!(
                "\"device\" is {device}; a backend has at most {MAX_DEVICES} devices"
            )),
        }
    };
    let pool = |call: PoolCall| -> std::result::Result<TraceOp, String> {
        let pair = object
            .get("pool")
            .and_then(|v| v.as_array())
            .filter(|a| a.len() == 2)
            .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
            .ok_or("\"pool\" must be a pair of non-negative integers, as [0,1]")?;
        if pair == (0, 0) {
            return Err(
                "\"pool\" [0,0] is the default pools: a private pool needs another id".into(),
            );
        }
        Ok(TraceOp::Pool {
            pool: pair,
            device: device()?,
            call,
        })
    };
    match object.get("op").and_then(|v| v.as_str()) {
        Some("alloc") => Ok(TraceOp::Alloc {
            id: required("id")?,
            size: usize::try_from(required("size")?).map_err(|_| "\"size\" is too large")?,
            stream: index("stream")?,
            device: device()?,
        }),
        Some("free") => Ok(TraceOp::Free {
            id: required("id")?,
        }),
        Some("empty_cache") => Ok(TraceOp::EmptyCache),
        Some("record_stream") => Ok(TraceOp::RecordStream {
            id: required("id")?,
            stream: usize::try_from(required("stream")?).map_err(|_| "\"stream\" is too large")?,
        }),
        Some("pool_create") => pool(PoolCall::Create {
            use_on_oom: flag("use_on_oom")?,
            no_split: flag("no_split")?,
        }),
        Some("pool_begin") => pool(PoolCall::Begin {
            stream: uint("stream")?
                .map(|s| usize::try_from(s).map_err(|_| "\"stream\" is too large"))
                .transpose()?,
        }),
        Some("pool_end") => pool(PoolCall::End),
        Some("pool_release") => pool(PoolCall::Release),
        Some("pool_empty") => pool(PoolCall::Empty {
            live: flag("live")?,
        }),
        Some(other) => Err(format!(
            "unknown op \"{other}\" (expected alloc, free, empty_cache, record_stream or pool_create, \
             pool_begin, pool_end, pool_release, pool_empty)"
        )),
        None => Err("missing \"op\"".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_calls_are_written_and_read_back() {
        let ops = vec![
            TraceOp::Pool {
                pool: (0, 1),
                device: 0,
                call: PoolCall::Create {
                    use_on_oom: true,
                    no_split: false,
                },
            },
            TraceOp::Pool {
                pool: (0, 1),
                device: 0,
                call: PoolCall::Begin { stream: None },
            },
            TraceOp::Pool {
                pool: (2, 0),
                device: 1,
                call: PoolCall::Begin { stream: Some(3) },
            },
            TraceOp::Pool {
                pool: (2, 0),
                device: 1,
                call: PoolCall::End,
            },
            TraceOp::Pool {
                pool: (0, 1),
                device: 0,
                call: PoolCall::Release,
            },
            TraceOp::Pool {
                pool: (0, 1),
                device: 0,
                call: PoolCall::Empty { live: true },
            },
        ];
        let text = trace_to_jsonl(&ops);
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            [
                "{\"op\":\"pool_create\",\"pool\":[0,1],\"use_on_oom\":true,\"no_split\":false}",
                "{\"op\":\"pool_begin\",\"pool\":[0,1]}",
                "{\"op\":\"pool_begin\",\"pool\":[2,0],\"stream\":3,\"device\":1}",
                "{\"op\":\"pool_end\",\"pool\":[2,0],\"device\":1}",
                "{\"op\":\"pool_release\",\"pool\":[0,1]}",
                "{\"op\":\"pool_empty\",\"pool\":[0,1],\"live\":true}",
            ]
        );
        assert_eq!(parse_trace(&text).unwrap(), ops);
        assert_eq!(devices_used(&ops), 2);
        for (line, why) in [
            ("{\"op\":\"pool_end\"}", "\"pool\" must be a pair"),
            ("{\"op\":\"pool_end\",\"pool\":[0,0]}", "the default pools"),
            (
                "{\"op\":\"pool_end\",\"pool\":[1,-1]}",
                "\"pool\" must be a pair",
            ),
            (
                "{\"op\":\"pool_empty\",\"pool\":[0,1],\"live\":1}",
                "\"live\" must be true or false",
            ),
        ] {
            let error = parse_trace(line).unwrap_err();
            assert!(error.message.contains(why), "{line}: {}", error.message);
        }
    }

    #[test]
    fn parses_the_four_ops() {
        let ops = parse_trace(
            "{\"op\":\"alloc\",\"id\":7,\"size\":4096,\"stream\":0}\n\n{\"op\":\"alloc\",\"id\":8,\"size\":1,\"stream\":2,\"device\":1}\n{\"op\":\"record_stream\",\"id\":8,\"stream\":3}\n{\"op\":\"free\",\"id\":7}\n{\"op\":\"empty_cache\"}\n",
        )
        .unwrap();
        assert_eq!(
            ops,
            vec![
                TraceOp::Alloc {
                    id: 7,
                    size: 4096,
                    stream: 0,
                    device: 0
                },
                TraceOp::Alloc {
                    id: 8,
                    size: 1,
                    stream: 2,
                    device: 1
                },
                TraceOp::RecordStream { id: 8, stream: 3 },
                TraceOp::Free { id: 7 },
                TraceOp::EmptyCache,
            ]
        );
    }

    #[test]
    fn writes_lines_that_parse_back() {
        let ops = vec![
            TraceOp::Alloc {
                id: 1,
                size: 512,
                stream: 0,
                device: 0,
            },
            TraceOp::Alloc {
                id: 2,
                size: 3,
                stream: 1,
                device: 2,
            },
            TraceOp::RecordStream { id: 2, stream: 5 },
            TraceOp::Free { id: 1 },
            TraceOp::EmptyCache,
        ];
        let text = trace_to_jsonl(&ops);
        assert!(text.starts_with("{\"op\":\"alloc\",\"id\":1,\"size\":512,\"stream\":0}\n"));
        assert_eq!(parse_trace(&text).unwrap(), ops);
    }

    #[test]
    fn malformed_lines_are_named_by_number() {
        let cases = [
            (
                "{\"op\":\"alloc\",\"id\":1,\"size\":8}\nnot json",
                "trace line 2: not JSON",
            ),
            (
                "{\"op\":\"alloc\",\"id\":1}",
                "trace line 1: missing \"size\"",
            ),
            (
                "{\"op\":\"alloc\",\"id\":1,\"size\":-3}",
                "trace line 1: \"size\" must be a non-negative integer",
            ),
            ("{\"op\":\"resize\"}", "trace line 1: unknown op \"resize\""),
            ("[1,2]", "trace line 1: not a JSON object"),
            ("{\"id\":1}", "trace line 1: missing \"op\""),
            (
                "{\"op\":\"free\",\"id\":3}",
                "trace line 1: free of id 3, which is not live",
            ),
            (
                "{\"op\":\"record_stream\",\"id\":3,\"stream\":1}",
                "trace line 1: record_stream of id 3, which is not live",
            ),
            (
                "{\"op\":\"alloc\",\"id\":1,\"size\":8}\n{\"op\":\"alloc\",\"id\":1,\"size\":8}",
                "trace line 2: id 1 is allocated again while live (allocated on line 1)",
            ),
            (
                "{\"op\":\"alloc\",\"id\":1,\"size\":0,\"device\":18446744073709551615}",
                "trace line 1: \"device\" is 18446744073709551615; a backend has at most 1024 devices",
            ),
            (
                "{\"op\":\"alloc\",\"id\":1,\"size\":8}\n{\"op\":\"alloc\",\"id\":2,\"size\":8,\"device\":1024}",
                "trace line 2: \"device\" is 1024",
            ),
        ];
        for (text, expected) in cases {
            let err = parse_trace(text).unwrap_err();
            assert!(
                err.message.starts_with(expected),
                "{} / {}",
                err.message,
                expected
            );
        }
    }
}
