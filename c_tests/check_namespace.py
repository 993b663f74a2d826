#!/usr/bin/env python3
"""accalloc stays out of OpenACC's namespace.

    check_namespace.py HEADER SHARED_LIB [LIBGOMP]

Fails (exit 1) when
- any identifier in the header begins with acc_, ACC_ or Acc followed by a capital (OpenACC's
  prefixes, and our old ones);
- a name the header declares at file scope (macro, function, typedef, struct, enum, enum constant)
  does not begin with accalloc_, ACCALLOC_ or Accalloc;
- a symbol the shared library exports does not begin with accalloc_, or begins with acc_;
- the shared library exports a symbol that libgomp (GCC's OpenMP/OpenACC runtime, which
  `import torch` loads with RTLD_GLOBAL) also exports.
Exit 77 (skipped) when nm is missing; a missing libgomp skips only that last check, with a message.
"""
import re
import shutil
import subprocess
import sys

FORBIDDEN = re.compile(r"^(acc_|ACC_|Acc[A-Z])")
OURS = re.compile(r"^(accalloc_|ACCALLOC_|Accalloc)")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def strip_comments_and_strings(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def declared_names(code: str) -> set[str]:
    """Names the header introduces at file scope."""
    names = set(re.findall(r"^\s*#\s*define\s+([A-Za-z_]\w*)", code, flags=re.M))
    names |= set(re.findall(r"\b(?:struct|enum|union)\s+([A-Za-z_]\w*)", code))
    names |= set(re.findall(r"}\s*([A-Za-z_]\w*)\s*;", code))  # typedef struct {...} Name;
    names |= set(re.findall(r"\btypedef\b[^;{}]*?\b([A-Za-z_]\w*)\s*;", code))
    names |= set(re.findall(r"\btypedef\b[^;{}]*?\(\s*\*\s*([A-Za-z_]\w*)\s*\)", code))
    # Function declarations at file scope: an identifier directly before "(" that follows a type,
    # outside any braces (struct bodies hold function-pointer fields, which are not file-scope names).
    # extern "C" { ... } (for C++) is not a scope: drop its braces first.
    unwrapped = re.sub(r'extern\s*""\s*\{', " ", code)
    unwrapped = re.sub(r"#\s*ifdef\s+__cplusplus\s*\}\s*#\s*endif", " ", unwrapped)
    depth = 0
    flat = []
    for ch in unwrapped:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif depth == 0:
            flat.append(ch)
    file_scope = "".join(flat)
    file_scope = re.sub(r"^\s*#.*$", " ", file_scope, flags=re.M)
    names |= set(re.findall(r"\b([A-Za-z_]\w*)\s*\([^()]*\)\s*;", file_scope))
    # Enum constants.
    for body in re.findall(r"\benum\b[^{;]*\{([^}]*)\}", code):
        names |= set(re.findall(r"(?:^|,)\s*([A-Za-z_]\w*)", body))
    return names


def exported(nm: str, lib: str) -> set[str]:
    out = subprocess.run([nm, "-D", "--defined-only", lib], check=True, capture_output=True, text=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if len(line.split()) >= 3}


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    header, lib = sys.argv[1], sys.argv[2]
    libgomp = sys.argv[3] if len(sys.argv) > 3 else ""
    nm = shutil.which("nm")
    if nm is None:
        print("SKIPPED: nm not found (install binutils)")
        return 77
    failures = []
    with open(header) as f:
        code = strip_comments_and_strings(f.read())
    if "#include" not in code:
        failures.append(f"{header} does not look like a C header")
    for ident in sorted(set(IDENT.findall(code))):
        if FORBIDDEN.match(ident):
            failures.append(f"header uses {ident}: acc_/ACC_/Acc* belong to OpenACC")
    declared = declared_names(code) - {"stddef", "stdint", "h", "__cplusplus"}
    if len(declared) < 20:
        failures.append(f"found only {len(declared)} declared names in {header}: the parser is broken")
    for name in sorted(declared):
        if not OURS.match(name):
            failures.append(f"header declares {name}, which is not in accalloc's namespace")
    ours = exported(nm, lib)
    if not ours:
        failures.append(f"{lib} exports nothing")
    for symbol in sorted(ours):
        if not OURS.match(symbol) or FORBIDDEN.match(symbol):
            failures.append(f"{lib} exports {symbol}, outside accalloc_")
    if libgomp:
        clash = sorted(ours & exported(nm, libgomp))
        for symbol in clash:
            failures.append(f"{lib} and {libgomp} both export {symbol}")
        gomp_note = f"none shared with {libgomp}"
    else:
        gomp_note = "libgomp not found: the clash check with OpenACC's runtime was skipped"
    for failure in failures:
        print("FAIL:", failure)
    if failures:
        return 1
    print(f"ok: {len(declared)} declared names and {len(ours)} exports in accalloc's namespace; {gomp_note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
