"""Check that every package of a requirements file is installed in this Python (and, for torch, that its
version is the one asked for), so that a missing package stops scripts/test-python.sh at once, named,
and not at pytest's collection minutes later. Standard library only.

    python scripts/lib/check_requirements.py REQUIREMENTS TORCH_VERSION
"""
import importlib.metadata
import re
import sys

requirements, torch_version = sys.argv[1], sys.argv[2]
missing = []
with open(requirements) as f:
    for line in f:
        name = re.split(r"[\s<>=!~\[;#]", line.strip(), maxsplit=1)[0]
        if not name:
            continue
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if name == "torch" and version.split("+")[0] != torch_version:
            missing.append(f"torch=={torch_version} (found {version})")
if missing:
    sys.exit(f"test-python: the test environment lacks {', '.join(missing)} from {requirements}")
