"""Run a function once a module of PyTorch's has been imported, without importing it ourselves.

Parts of PyTorch that the device adapts (Inductor, FlexAttention) cost a fraction of a second to
several seconds to import, and most programs never use them. when_imported(name, run) calls run()
at once when the module `name` is already imported; otherwise a finder on sys.meta_path wraps the
module's loader, and run() is called after the module's code has executed (so everything it imports
is whole; an earlier trigger inside its own chain of imports would meet half-made modules).

A function waits until an import of the module succeeds: a failed import, or a spec asked for and
never loaded (importlib.util.find_spec), keeps it waiting. A function that raises is reported as a
warning and does not fail the import (PyTorch's own use of the module must not break for the
device's sake). The finder stays on sys.meta_path once put there (its check is a dictionary
lookup): taking it off while another thread's import walks the list could make that import skip a
finder. A module reloaded with importlib.reload runs its code again and loses what run() changed.
"""
import importlib.abc
import sys
import threading
import warnings

_lock = threading.Lock()
_waiting = {}  # module name -> functions to run once it is imported, in order


def when_imported(name, run):
    """Call run() once the module `name` is imported: now, if it already is."""
    with _lock:
        if name not in sys.modules:
            _waiting.setdefault(name, []).append(run)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    run()


def _run_waiting(name):
    with _lock:
        runs = _waiting.pop(name, [])
    for run in runs:
        try:
            run()
        except Exception as error:  # noqa: BLE001 - reported, and the import goes on
            warnings.warn(f"accalloc could not adapt {name} to its device: {error!r}", RuntimeWarning,
                          stacklevel=2)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds an awaited module with the finders after it and wraps its loader's exec_module."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _waiting:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _run_waiting(fullname)

        spec.loader.exec_module = exec_module
        return spec


_finder = _Finder()
