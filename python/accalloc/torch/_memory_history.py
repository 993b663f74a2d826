"""torch.<device>.memory for the host accelerator: torch.cuda.memory's names, and the memory history
that PyTorch's memory viewer (pytorch.org/memory_viz) reads, with the Python stack of each event: accalloc
keeps the events (accalloc_record_memory_history), the extension keeps the stacks
(python/accalloc/csrc/host_memory_history.cpp), and a snapshot joins the two here."""
import collections
import ctypes
import json
import sys
import types

import accalloc


def memory_module(device_module, name, extension):
    """torch.<name>.memory, with torch.cuda.memory's names: the device module's memory functions, and
    the memory history a snapshot file for PyTorch's memory viewer (pytorch.org/memory_viz) is made of:
    _record_memory_history, _snapshot, _dump_snapshot. The extension (csrc/host_memory_history.cpp)
    keeps the Python stacks."""
    module = types.ModuleType(f"{device_module.__name__}.memory")
    for function in ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
                     "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
                     "memory_summary", "empty_cache", "mem_get_info", "set_per_process_memory_fraction",
                     "memory_snapshot", "host_memory_stats", "reset_peak_host_memory_stats",
                     "reset_accumulated_host_memory_stats"):
        setattr(module, function, getattr(device_module, function))
    extension.accalloc_torch_record_stacks.argtypes = [ctypes.c_int, ctypes.c_size_t]
    extension.accalloc_torch_stacks_json.argtypes = []
    extension.accalloc_torch_stacks_json.restype = ctypes.c_void_p
    extension.accalloc_torch_free_text.argtypes = [ctypes.c_void_p]
    # Which stacks the history keeps: "all" (allocations and frees), "alloc", or None.
    recording = {"stacks": None}

    def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                               device=None, clear_history=False, **ignored):
        """As torch.cuda.memory._record_memory_history: "all" records every allocator event of every
        device (the newest max_entries each) for _snapshot()'s "device_traces"; None stops; "state"
        keeps only the blocks' state, which a snapshot has anyway (the history stops). True and False
        are "all" and None, as in PyTorch's older form. Stopping clears the history, as in PyTorch;
        so does starting while recording (PyTorch's clear_history=True). `context` says whose Python
        stacks are kept ("all": allocations and frees, "alloc": allocations, "state": the live
        blocks', None: none; `stacks` "python" or "all": Python frames either way, no C++ ones): each
        event and each live block of the snapshot then has its "frames", innermost first."""
        if enabled is True:
            enabled = "all"
        elif enabled is False:
            enabled = None
        if enabled not in (None, "state", "all"):
            raise ValueError(f'enabled must be None, "state" or "all", not {enabled!r}')
        if context not in (None, "state", "alloc", "all"):
            raise ValueError(f'context must be None, "state", "alloc" or "all", not {context!r}')
        if stacks not in ("python", "all"):
            raise ValueError(f'stacks must be "python" or "all", not {stacks!r}')
        if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 0:
            raise TypeError(f"max_entries must be an int of 0 or more, not {max_entries!r}")
        max_entries = min(max(max_entries, 1), ctypes.c_size_t(-1).value)  # 0 keeps one, as in PyTorch
        accalloc.record_memory_history(enabled == "all", max_entries, name)
        keep = enabled is not None and context is not None
        extension.accalloc_torch_record_stacks(int(keep), max_entries)
        recording["stacks"] = context if keep else None

    def stacks():
        text = extension.accalloc_torch_stacks_json()
        if not text:
            raise MemoryError("no memory for the memory history's stacks")
        try:
            return json.loads(ctypes.string_at(text).decode())
        finally:
            extension.accalloc_torch_free_text(text)

    def with_frames(snapshot):
        kept = recording["stacks"]
        if kept is None:
            return snapshot
        recorded = stacks()
        frames = [{"filename": f, "line": line, "name": n} for f, line, n in recorded["frames"]]
        for device, trace in enumerate(snapshot["device_traces"]):
            history = recorded["devices"].get(str(device), {"events": [], "live": []})
            live = {address: [frames[i] for i in stack] for address, stack in history["live"]}
            if kept in ("all", "alloc"):
                join_stacks(trace, history["events"], frames, kept == "all")
            for segment in snapshot["segments"]:
                if segment["device"] != device:
                    continue
                for block in segment["blocks"]:
                    if block["state"] == "active_allocated" and block["address"] in live:
                        block["frames"] = live[block["address"]]
        return snapshot

    def _snapshot(device=None):
        """As torch.cuda.memory._snapshot(): every device's "segments" (with their blocks), the
        "device_traces" recorded (_record_memory_history) and the "allocator_settings"; with the
        Python stacks where they were recorded."""
        return with_frames(accalloc.memory_snapshot(name))

    def _dump_snapshot(filename="dump_snapshot.pickle"):
        """_snapshot() pickled to `filename`, the file PyTorch's memory viewer opens."""
        import pickle

        with open(filename, "wb") as f:
            pickle.dump(_snapshot(), f)

    module._record_memory_history = _record_memory_history
    module._snapshot = _snapshot
    module._dump_snapshot = _dump_snapshot
    return module


def join_stacks(trace, events, frames, frees):
    """Give the entries of one device's history (accalloc's, in order) the stacks the extension recorded
    for the same allocations and frees (in the same order): an allocation the next stack recorded for an
    allocation at its address, a free that of a free (an address is one live block's at a time, so
    the two orders agree address by address); a free completed the stack of its request; a segment's
    mapping or allocation the stack of the allocation that made it (the next allocation after it).
    An entry with no such stack (an allocation made past PyTorch's face, through the C API) keeps
    none."""
    pending = {}
    for allocated, address, stack in events:
        pending.setdefault((allocated, address), collections.deque()).append(stack)
    requested = {}
    for entry in trace:
        action, address = entry["action"], entry["addr"]
        if action == "alloc":
            stack = pending.get((True, address))
            entry["frames"] = [frames[i] for i in stack.popleft()] if stack else []
        elif action == "free_requested" and frees:
            stack = pending.get((False, address))
            entry["frames"] = [frames[i] for i in stack.popleft()] if stack else []
            requested[address] = entry["frames"]
        elif action == "free_completed" and frees:
            entry["frames"] = requested.pop(address, [])
    made_by = []
    for entry in reversed(trace):
        if entry["action"] == "alloc":
            made_by = entry["frames"]
        elif entry["action"] in ("segment_alloc", "segment_map"):
            entry["frames"] = made_by
