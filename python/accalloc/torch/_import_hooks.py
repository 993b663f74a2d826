"""Run a function once a module of PyTorch's has been imported, without importing it ourselves.

Parts of PyTorch that the device adapts (Inductor, FlexAttention) cost a fraction of a second to
several seconds to import, and most programs never use them. when_imported(name, run) calls run()
at once when the module `name` is already imported; otherwise a finder on sys.meta_path waits for
its import and calls run() after the module's code has executed (so everything it imports is whole;
an earlier trigger inside its own chain of imports would meet half-made modules), then leaves.
"""
import importlib.abc
import importlib.util
import sys
import threading

_lock = threading.Lock()
_waiting = {}  # module name -> functions to run once it is imported, in order


def when_imported(name, run):
    """Call run() once the module `name` is imported: now, if it already is."""
    with _lock:
        if name not in sys.modules:
            first = not _waiting
            _waiting.setdefault(name, []).append(run)
            if first:
                sys.meta_path.insert(0, _finder)
            return
    run()


def _take(name):
    with _lock:
        runs = _waiting.pop(name, [])
        if not _waiting and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        return runs


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of each awaited module so that its functions run after its code."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _waiting:
            return None
        runs = _take(fullname)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            for run in runs:
                run()

        spec.loader.exec_module = exec_module
        return spec


_finder = _Finder()
