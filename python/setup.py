"""Builds the accalloc Python package from a checkout of accalloc.

    python3 -m pip install --no-build-isolation ./python

- libaccalloc: `cargo build --release` in the checkout (incremental: about a second when up to date),
  copied into the package as accalloc/lib/libaccalloc.so.<ABI> (its SONAME), with accalloc.h.
  ACCALLOC_LIB_DIR=folder takes libaccalloc.so from there instead of building it.
- accalloc.torch's C++ extensions, when torch is importable in this environment (hence
  --no-build-isolation): _torch_host (the PrivateUse1 host accelerator) always, _torch_cuda (accalloc
  as PyTorch's CUDA allocator) when this torch is a CUDA build and the CUDA runtime headers are found.
  Both are built with -O2 against this torch; its version is recorded and checked at import.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent
PACKAGE = HERE / "accalloc"


def abi_version(header: Path) -> str:
    match = re.search(r"^#define ACCALLOC_ABI_VERSION (\d+)$", header.read_text(), flags=re.M)
    if not match:
        raise SystemExit(f"accalloc setup: {header} has no ACCALLOC_ABI_VERSION")
    return match.group(1)


def library_dir() -> Path:
    given = os.environ.get("ACCALLOC_LIB_DIR")
    if given:
        return Path(given).resolve()
    if not (CHECKOUT / "Cargo.toml").exists():
        raise SystemExit("accalloc setup: no Cargo.toml above python/: install from a checkout of accalloc, "
                         "or set ACCALLOC_LIB_DIR to a folder holding libaccalloc.so")
    if shutil.which("cargo") is None:
        raise SystemExit("accalloc setup: cargo is needed to build libaccalloc (install the Rust toolchain), "
                         "or set ACCALLOC_LIB_DIR to a folder holding libaccalloc.so")
    subprocess.run(["cargo", "build", "--release", "--lib"], cwd=CHECKOUT, check=True)
    return CHECKOUT / "target" / "release"


def stage_library() -> tuple[Path, str]:
    """Copy libaccalloc.so and accalloc.h into the package sources; (folder, file name)."""
    lib_dir = library_dir()
    header = CHECKOUT / "include" / "accalloc.h"
    soname = f"libaccalloc.so.{abi_version(header)}"
    target = PACKAGE / "lib"
    target.mkdir(exist_ok=True)
    for stale in target.glob("libaccalloc.so*"):
        stale.unlink()
    shutil.copy2(lib_dir / "libaccalloc.so", target / soname)
    shutil.copy2(header, PACKAGE / "include" / "accalloc.h")
    return target, soname


def torch_extensions(lib_dir: Path, soname: str):
    try:
        import torch
        from torch.utils.cpp_extension import CppExtension, BuildExtension
    except ImportError:
        print("accalloc setup: torch is not importable here: accalloc.torch is not built", file=sys.stderr)
        return [], {}
    common = dict(
        include_dirs=[str(PACKAGE / "include")],
        library_dirs=[str(lib_dir)],
        libraries=[f":{soname}"],
        # The extensions find libaccalloc beside them, in the package, whatever the install prefix.
        extra_link_args=["-Wl,-rpath,$ORIGIN/lib"],
        extra_compile_args=["-O2"],
        # The headers too: an extension older than any of its files is built again (setuptools
        # otherwise compares the .cpp files only, and a changed header would keep a stale build).
        depends=[str(p) for p in sorted((PACKAGE / "include").rglob("*.h"))]
        + [str(p) for p in sorted((PACKAGE / "csrc").glob("*.h"))],
    )
    host_sources = ["accalloc/csrc/host_device.cpp", "accalloc/csrc/host_cpu_call.cpp",
                    "accalloc/csrc/host_routes.cpp"]
    extensions = [CppExtension("accalloc._torch_host", host_sources, **common)]
    cuda_include = find_cuda_runtime_include()
    torch_lib = Path(torch.__file__).parent / "lib"
    if torch.version.cuda and (torch_lib / "libtorch_cuda.so").exists() and cuda_include:
        cuda = dict(common)
        cuda["include_dirs"] = common["include_dirs"] + [cuda_include]
        cuda["libraries"] = common["libraries"] + ["c10_cuda", "torch_cuda"]
        cuda["define_macros"] = [("USE_CUDA", "1")]
        extensions.append(CppExtension("accalloc._torch_cuda", ["accalloc/csrc/cuda_allocator.cpp"], **cuda))
    else:
        why = ("this torch is not a CUDA build" if not torch.version.cuda else
               "the CUDA runtime headers (cuda_runtime_api.h) were not found")
        print(f"accalloc setup: accalloc.torch.use_for_cuda is not built: {why}", file=sys.stderr)
    (PACKAGE / "torch" / "_build_info.py").write_text(
        f'"""Written by setup.py: the torch these extensions were built against."""\n'
        f"TORCH_VERSION = {torch.__version__!r}\n"
        f"CUDA_EXTENSION = {len(extensions) > 1!r}\n")
    return extensions, {"build_ext": BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)}


def find_cuda_runtime_include():
    candidates = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    try:
        import nvidia  # the nvidia-* wheels that the CUDA build of torch depends on
        for root in getattr(nvidia, "__path__", []):
            candidates += [str(p.parent.parent) for p in Path(root).glob("*/include/cuda_runtime_api.h")]
    except ImportError:
        pass
    for root in candidates:
        if root and (Path(root) / "include" / "cuda_runtime_api.h").exists():
            return str(Path(root) / "include")
    return None


lib_dir, soname = stage_library()
ext_modules, cmdclass = torch_extensions(lib_dir, soname)
setup(ext_modules=ext_modules, cmdclass={"build_py": build_py, **cmdclass})
