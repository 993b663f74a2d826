"""accalloc's trace format in Python: the one reader and writer every script shares.

The format's owner is the Rust core (crates/core/src/trace.rs), which the library's ACCALLOC_TRACE
log and the `accalloc` tool write and read: one JSON object a line,

    {"op":"alloc","id":7,"size":4096,"stream":0}      ("device" too, where it is not 0)
    {"op":"free","id":7}
    {"op":"empty_cache"}
    {"op":"record_stream","id":7,"stream":2}
    {"op":"pool_create","pool":[0,1],"use_on_oom":false,"no_split":false}
    {"op":"pool_begin","pool":[0,1]}                  ("stream":3 for a capture's)
    {"op":"pool_end","pool":[0,1]}, {"op":"pool_release","pool":[0,1]}
    {"op":"pool_empty","pool":[0,1],"live":false}     (pool ops take an optional "device" too)

and blank lines are skipped. `read_trace` takes what the Rust reader takes and refuses what it refuses,
with the same "trace line N: why" messages; `format_op` writes a line byte for byte as the Rust writer
does. python/tests/test_traces.py checks both against the committed traces, which the Rust writer wrote.

Stdlib only, so the scripts that run without accalloc's package (the reference model, the research and
GPU scripts) can import it: from scripts/ directly, from a subfolder after putting scripts/ on sys.path.
"""
from __future__ import annotations

import json
from typing import Iterable, Iterator, NamedTuple

# Mirrors accalloc_core::backend::MAX_DEVICES.
MAX_DEVICES = 1024
POOL_OPS = ("pool_create", "pool_begin", "pool_end", "pool_release", "pool_empty")
OPS = ("alloc", "free", "empty_cache", "record_stream") + POOL_OPS


class TraceOp(NamedTuple):
    """One operation. `id` is None for empty_cache and the pool ops; `size` means something for alloc
    only, `device` for alloc and the pool ops; `pool` (a pair) and the flags for the pool ops, whose
    `stream` is None for pool_begin without one (the thread's pool)."""
    op: str
    id: int | None = None
    size: int = 0
    stream: int | None = 0
    device: int = 0
    pool: tuple[int, int] | None = None
    use_on_oom: bool = False
    no_split: bool = False
    live: bool = False


def alloc(ident: int, size: int, stream: int = 0, device: int = 0) -> TraceOp:
    return TraceOp("alloc", ident, size, stream, device)


def free(ident: int) -> TraceOp:
    return TraceOp("free", ident)


def empty_cache() -> TraceOp:
    return TraceOp("empty_cache")


def record_stream(ident: int, stream: int) -> TraceOp:
    return TraceOp("record_stream", ident, 0, stream)


def pool_op(op: str, pool: tuple[int, int], device: int = 0, **fields) -> TraceOp:
    """A pool op: pool_create (use_on_oom, no_split), pool_begin (stream), pool_end, pool_release,
    pool_empty (live)."""
    if op not in POOL_OPS:
        raise ValueError(f"unknown pool op {op!r}")
    stream = fields.pop("stream", None)
    return TraceOp(op, None, 0, stream, device, tuple(pool), **fields)


def format_op(op: TraceOp) -> str:
    """The op as one line of the format, without its newline (the Rust writer's bytes)."""
    if op.op == "alloc":
        device = f',"device":{op.device}' if op.device else ""
        return f'{{"op":"alloc","id":{op.id},"size":{op.size},"stream":{op.stream}{device}}}'
    if op.op == "free":
        return f'{{"op":"free","id":{op.id}}}'
    if op.op == "empty_cache":
        return '{"op":"empty_cache"}'
    if op.op == "record_stream":
        return f'{{"op":"record_stream","id":{op.id},"stream":{op.stream}}}'
    if op.op in POOL_OPS:
        text = f'{{"op":"{op.op}","pool":[{op.pool[0]},{op.pool[1]}]'
        if op.op == "pool_create":
            text += f',"use_on_oom":{_json_bool(op.use_on_oom)},"no_split":{_json_bool(op.no_split)}'
        elif op.op == "pool_begin" and op.stream is not None:
            text += f',"stream":{op.stream}'
        elif op.op == "pool_empty":
            text += f',"live":{_json_bool(op.live)}'
        if op.device:
            text += f',"device":{op.device}'
        return text + "}"
    raise ValueError(f"unknown op {op.op!r}")


def _json_bool(value: bool) -> str:
    return "true" if value else "false"


def write_trace(path, ops: Iterable[TraceOp]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for op in ops:
            f.write(format_op(op) + "\n")


def _abbreviate(line: str) -> str:
    return line if len(line) <= 80 else line[:77] + "..."


def _parse_line(line: str) -> TraceOp:
    try:
        value = json.loads(line)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")

    def uint(key: str, default: int | None = None) -> int | None:
        if key not in value:
            return default
        v = value[key]
        # JSON's integers only: true/false and 1.0 are refused, as serde_json's as_u64 refuses them.
        if type(v) is not int or v < 0 or v >= 1 << 64:
            raise ValueError(f'"{key}" must be a non-negative integer')
        return v

    def required(key: str) -> int:
        v = uint(key)
        if v is None:
            raise ValueError(f'missing "{key}"')
        return v

    def device() -> int:
        d = uint("device", 0)
        if d >= MAX_DEVICES:
            raise ValueError(f'"device" is {d}; a backend has at most {MAX_DEVICES} devices')
        return d

    def flag(key: str) -> bool:
        v = value.get(key, False)
        if type(v) is not bool:
            raise ValueError(f'"{key}" must be true or false')
        return v

    def pool() -> tuple[int, int]:
        pair = value.get("pool")
        if (not isinstance(pair, list) or len(pair) != 2
                or any(type(x) is not int or x < 0 or x >= 1 << 64 for x in pair)):
            raise ValueError('"pool" must be a pair of non-negative integers, as [0,1]')
        if pair == [0, 0]:
            raise ValueError('"pool" [0,0] is the default pools: a private pool needs another id')
        return (pair[0], pair[1])

    kind = value.get("op")
    if not isinstance(kind, str):
        raise ValueError('missing "op"')
    if kind == "alloc":
        ident, size, stream = required("id"), required("size"), uint("stream", 0)
        return alloc(ident, size, stream, device())
    if kind == "free":
        return free(required("id"))
    if kind == "empty_cache":
        return empty_cache()
    if kind == "record_stream":
        return record_stream(required("id"), required("stream"))
    if kind in POOL_OPS:
        # Checked in the Rust reader's order: the flags, the stream, then the pool and the device.
        fields = {}
        if kind == "pool_create":
            fields = {"use_on_oom": flag("use_on_oom"), "no_split": flag("no_split")}
        elif kind == "pool_begin":
            fields = {"stream": uint("stream")}
        elif kind == "pool_empty":
            fields = {"live": flag("live")}
        return pool_op(kind, pool(), device(), **fields)
    raise ValueError(f'unknown op "{kind}" (expected alloc, free, empty_cache, record_stream or pool_create, '
                     'pool_begin, pool_end, pool_release, pool_empty)')


def iter_trace(path) -> Iterator[TraceOp]:
    """The ops of the trace at `path`, one at a time; ValueError("trace line N: why: line") on the first
    malformed line or broken lifetime (an id allocated again while live, a free or record_stream of an id
    that is not live), as the Rust reader."""
    live: dict[int, int] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            try:
                op = _parse_line(line)
            except ValueError as e:
                raise ValueError(f"trace line {number}: {e}: {_abbreviate(line)}") from None
            if op.op == "alloc":
                if op.id in live:
                    raise ValueError(f"trace line {number}: id {op.id} is allocated again while live "
                                     f"(allocated on line {live[op.id]})")
                live[op.id] = number
            elif op.op == "free":
                if live.pop(op.id, None) is None:
                    raise ValueError(f"trace line {number}: free of id {op.id}, which is not live")
            elif op.op == "record_stream" and op.id not in live:
                raise ValueError(f"trace line {number}: record_stream of id {op.id}, which is not live")
            yield op


def read_trace(path) -> list[TraceOp]:
    """The whole trace at `path` (see iter_trace)."""
    return list(iter_trace(path))
