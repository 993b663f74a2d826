"""Write snapshot_protocol{2,3,4,5}.pickle: a small snapshot as Python's pickle writes it in each protocol,
with the frame dicts shared between entries as in PyTorch's snapshots. Standard library only:

    python3 tests/data/make_pickles.py
"""
import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = 139637976727552
FRAMES = [{"filename": "train.py", "line": 42, "name": "forward"}]


def entry(action, addr, size, time):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1700000000000000 + time,
            "frames": FRAMES}


SNAPSHOT = {
    "segments": [{
        "device": 0, "address": BASE, "total_size": 2097152, "stream": 0, "segment_type": "small",
        "segment_pool_id": (0, 0), "allocated_size": 512, "active_size": 512, "requested_size": 100,
        "is_expandable": False, "frames": FRAMES,
        "blocks": [
            {"address": BASE, "size": 512, "requested_size": 100, "state": "active_allocated", "frames": FRAMES},
            {"address": BASE + 512, "size": 2096640, "requested_size": 0, "state": "inactive", "frames": []},
        ],
    }],
    "device_traces": [[
        entry("segment_alloc", BASE, 2097152, 0),
        entry("alloc", BASE, 100, 1),
        dict(entry("alloc", BASE + 512, 1000, 2), compile_context="N/A", user_metadata=""),
        entry("free_requested", BASE + 512, 1000, 3),
        entry("free_completed", BASE + 512, 1000, 4),
        entry("snapshot", 0, 0, 5),
    ]],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                           "garbage_collection_threshold": 0.0, "expandable_segments": False},
}

for protocol in (2, 3, 4, 5):
    with open(os.path.join(HERE, f"snapshot_protocol{protocol}.pickle"), "wb") as f:
        pickle.dump(SNAPSHOT, f, protocol=protocol)
