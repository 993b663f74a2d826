"""accalloc.torch._import_hooks: what the device adapts in PyTorch (Inductor, FlexAttention) is adapted
once the module is imported, whatever happened to earlier tries to import it."""
import importlib
import importlib.util
import sys

import pytest

from accalloc.torch._import_hooks import when_imported


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("accalloc_hook_probe")]:
        del sys.modules[name]


def test_a_function_runs_after_the_module_and_at_once_when_it_is_there(module_dir):
    (module_dir / "accalloc_hook_probe_a.py").write_text("VALUE = 1\n")
    seen = []
    when_imported("accalloc_hook_probe_a", lambda: seen.append(sys.modules["accalloc_hook_probe_a"].VALUE))
    assert seen == [] and "accalloc_hook_probe_a" not in sys.modules
    import accalloc_hook_probe_a  # noqa: F401
    assert seen == [1]
    when_imported("accalloc_hook_probe_a", lambda: seen.append("now"))
    assert seen == [1, "now"]


def test_a_failed_import_or_a_probe_keeps_the_function_waiting(module_dir):
    path = module_dir / "accalloc_hook_probe_b.py"
    path.write_text("raise ImportError('not yet')\n")
    seen = []
    when_imported("accalloc_hook_probe_b", lambda: seen.append("ran"))
    with pytest.raises(ImportError, match="not yet"):
        importlib.import_module("accalloc_hook_probe_b")
    assert seen == []
    path.write_text("VALUE = 2\n")
    importlib.invalidate_caches()
    assert importlib.util.find_spec("accalloc_hook_probe_b") is not None  # a probe loads nothing
    assert seen == []
    importlib.import_module("accalloc_hook_probe_b")
    assert seen == ["ran"]


def test_a_module_that_appears_later_still_runs_the_function(module_dir):
    seen = []
    when_imported("accalloc_hook_probe_c", lambda: seen.append("ran"))
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("accalloc_hook_probe_c")
    (module_dir / "accalloc_hook_probe_c.py").write_text("")
    importlib.invalidate_caches()
    importlib.import_module("accalloc_hook_probe_c")
    assert seen == ["ran"]


def test_a_function_that_fails_warns_and_the_import_goes_on(module_dir):
    (module_dir / "accalloc_hook_probe_d.py").write_text("VALUE = 4\n")
    seen = []

    def broken():
        raise ValueError("broken adaptation")

    when_imported("accalloc_hook_probe_d", broken)
    when_imported("accalloc_hook_probe_d", lambda: seen.append("after"))
    with pytest.warns(RuntimeWarning, match="could not adapt accalloc_hook_probe_d.*broken adaptation"):
        module = importlib.import_module("accalloc_hook_probe_d")
    assert module.VALUE == 4 and seen == ["after"]
