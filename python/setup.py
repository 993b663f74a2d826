"""Builds the accalloc Python package from a checkout of accalloc.

    python3 -m pip install --no-build-isolation ./python

- libaccalloc: `cargo build --release` in the checkout (incremental: about a second when up to date),
  copied into the package as accalloc/lib/libaccalloc.so.<ABI> (its SONAME), with accalloc.h.
  ACCALLOC_LIB_DIR=folder takes libaccalloc.so from there instead of building it.
- accalloc.torch's C++ extensions, when torch is importable in this environment (hence
  --no-build-isolation): _torch_host (the PrivateUse1 host accelerator) always, _torch_cuda (accalloc
  as PyTorch's CUDA allocator) when this torch is a CUDA build. Neither needs CUDA headers. Both are
  built with -O2 against this torch; its version is recorded and checked at import. Both are
  optional: one that cannot be built is left out with one line saying why, the install goes on, and
  the feature's call raises that reason (accalloc/torch/_build_info.py records it).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import setuptools
from setuptools import setup
from setuptools.command.build_py import build_py

# Installs use the environment's own setuptools (--no-build-isolation), whatever its version: the
# oldest that reads this pyproject.toml (project metadata, a dynamic license) is 61.2.
SETUPTOOLS = tuple(int(part) for part in re.findall(r"\d+", setuptools.__version__)[:2])
if SETUPTOOLS < (61, 2):
    raise SystemExit(f"accalloc setup: setuptools 61.2 or later is needed (this environment has "
                     f"{setuptools.__version__}): python3 -m pip install -U setuptools")

# The license as that setuptools takes it: an SPDX expression (License-Expression) from 77 on, which
# deprecates the older License field and is to refuse it; the License field before 77, which does
# not know the expression.
LICENSE = "Apache-2.0"
LICENSE_METADATA = {"license_expression": LICENSE} if SETUPTOOLS >= (77, 0) else {"license": LICENSE}

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent
PACKAGE = HERE / "accalloc"


def abi_version(header: Path) -> str:
    match = re.search(r"^#define ACCALLOC_ABI_VERSION (\d+)$", header.read_text(), flags=re.M)
    if not match:
        raise SystemExit(f"accalloc setup: {header} has no ACCALLOC_ABI_VERSION")
    return match.group(1)


def workspace_version() -> str:
    """accalloc's version: the workspace Cargo.toml's `package.version`, its one place."""
    cargo = CHECKOUT / "Cargo.toml"
    if not cargo.exists():
        raise SystemExit("accalloc setup: no Cargo.toml above python/: install from a checkout of accalloc")
    match = re.search(r'^package\.version = "([^"]+)"$', cargo.read_text(), flags=re.M)
    if not match:
        raise SystemExit(f"accalloc setup: {cargo} has no `package.version = \"...\"` line under [workspace]")
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


# What each optional extension gives the user, for the one line said when it is left out.
FEATURES = {"accalloc._torch_host": "accalloc.torch.register_host_device",
            "accalloc._torch_cuda": "accalloc.torch.use_for_cuda"}


def write_build_info(folders, torch_version: str, built: list, left_out: dict):
    """Record what this install built, for accalloc.torch to check at import and explain at use."""
    text = (f'"""Written by setup.py: the torch these extensions were built against, and what was left out."""\n'
            f"TORCH_VERSION = {torch_version!r}\n"
            f"HOST_EXTENSION = {'accalloc._torch_host' in built!r}\n"
            f"CUDA_EXTENSION = {'accalloc._torch_cuda' in built!r}\n"
            f"LEFT_OUT = {left_out!r}\n")
    for folder in folders:
        if folder.is_dir():
            (folder / "_build_info.py").write_text(text)


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
        + [str(p) for p in sorted((PACKAGE / "csrc").rglob("*.h"))],
    )
    host_sources = ["accalloc/csrc/host_device.cpp", "accalloc/csrc/host_cpu_call.cpp",
                    "accalloc/csrc/host_routes.cpp", "accalloc/csrc/host_generator.cpp",
                    "accalloc/csrc/host_autocast.cpp", "accalloc/csrc/host_graph.cpp",
                    "accalloc/csrc/host_rnn_cells.cpp", "accalloc/csrc/host_ddp_timer.cpp",
                    "accalloc/csrc/host_memory_history.cpp", "accalloc/csrc/host_sparse.cpp"]
    extensions = [CppExtension("accalloc._torch_host", host_sources, **common)]
    left_out = {}
    torch_lib = Path(torch.__file__).parent / "lib"
    if torch.version.cuda and (torch_lib / "libtorch_cuda.so").exists():
        # No CUDA toolkit or runtime headers: csrc/cuda_types declares the few CUDA names that
        # PyTorch's c10/cuda headers use, so every CUDA build of torch gets use_for_cuda.
        cuda = dict(common)
        cuda["include_dirs"] = [str(PACKAGE / "csrc" / "cuda_types")] + common["include_dirs"]
        cuda["libraries"] = common["libraries"] + ["c10_cuda", "torch_cuda"]
        cuda["define_macros"] = [("USE_CUDA", "1")]
        extensions.append(CppExtension("accalloc._torch_cuda", ["accalloc/csrc/cuda_allocator.cpp"], **cuda))
    else:
        left_out["accalloc._torch_cuda"] = ("this torch is not a CUDA build (install a CUDA build of torch, "
                                            "then reinstall accalloc)")
        print(f"accalloc setup: {FEATURES['accalloc._torch_cuda']} is left out: "
              f"{left_out['accalloc._torch_cuda']}", file=sys.stderr)
    base = BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)

    class BuildOptionalExtensions(base):
        """Builds what it can: an extension that fails to build is left out, said in one line, and
        recorded, so that the install succeeds and the feature's call says why it is missing."""

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as error:  # a compiler or linker failure, whatever its type
                reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
                left_out[ext.name] = (f"building {ext.name} failed: {reason} (the compiler's output is shown by "
                                      "pip install -v; fix what it says and reinstall accalloc)")
                print(f"accalloc setup: {FEATURES.get(ext.name, ext.name)} is left out: {left_out[ext.name]}",
                      file=sys.stderr)

        def run(self):
            super().run()
            built = [ext.name for ext in self.extensions if ext.name not in left_out]
            write_build_info([PACKAGE / "torch", Path(self.build_lib) / "accalloc" / "torch"],
                             torch.__version__, built, left_out)

    # Written before the build too, so that build_py copies a module that exists; run() rewrites it
    # with what was built.
    write_build_info([PACKAGE / "torch"], torch.__version__, [], left_out)
    return extensions, {"build_ext": BuildOptionalExtensions}


lib_dir, soname = stage_library()
ext_modules, cmdclass = torch_extensions(lib_dir, soname)
setup(version=workspace_version(), ext_modules=ext_modules, cmdclass={"build_py": build_py, **cmdclass},
      **LICENSE_METADATA)
