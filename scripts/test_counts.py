#!/usr/bin/env python3
"""The README's test counts, from the closing lines the runners printed in this run of test-all.sh.

    test_counts.py LOG_DIR README.md
    test_counts.py --ran-all CARGO_LOG     (fails unless every test of that cargo run ran and passed)

LOG_DIR holds cargo-test.log (cargo test), model.log (scripts/check_model.py), ctest.log (ctest of
c_tests without sanitizers), cargo-test-cuda-model.log and ctest-cuda-model.log (the same runners on
the CUDA driver model), pytest.log (scripts/test-python.sh) and ort.log (scripts/test-ort.sh). The README's block between the `<!-- test-counts:begin -->` and
`<!-- test-counts:end -->` lines is compared with the figures: when they differ it is rewritten, except
under CI (CI set), where a stale block fails the run, as a stale header does.

Only tests that ran count. A plain `cargo test` reports the tests that need ONNX Runtime or a CUDA
driver as ignored, which is not passed; the runs that have what they need (cargo-test-cuda-model.log,
ort.log) pass --include-ignored, and their figures are taken only when none was ignored.
"""
import os
import re
import sys
from pathlib import Path

BEGIN, END = "<!-- test-counts:begin -->", "<!-- test-counts:end -->"


def cargo_counts(log: str) -> tuple[int, int]:
    """(tests in all binaries, of which unit tests of the library), from 'test result:' lines. Only
    tests that ran and passed count: an ignored test (one that needs ORT or a CUDA driver, in a
    plain `cargo test`) is not a passed one.

    >>> cargo_counts('''
    ...      Running unittests src/lib.rs (target/debug/deps/accalloc-0123)
    ... test result: ok. 100 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.02s
    ...      Running tests/ort.rs (target/debug/deps/ort-4567)
    ... test result: ok. 1 passed; 0 failed; 7 ignored; 0 measured; 0 filtered out; finished in 0.00s
    ... ''')
    (101, 100)
    """
    total = unit = 0
    current = ""
    for line in log.splitlines():
        running = re.match(r"\s*Running (unittests )?(\S+)", line)
        if running:
            current = running.group(2)
        result = re.match(r"test result: \w+\. (\d+) passed; (\d+) failed", line)
        if result:
            passed = int(result.group(1))
            total += passed
            if current.startswith("src/lib.rs"):
                unit += passed
    return total, unit


def cargo_ran_all(log: str) -> int:
    """The tests of a cargo run that had to run every test it built (`-- --include-ignored`, where
    the dependency the ignored ones need is present): each binary's closing line must report some
    passed, none failed and none ignored or filtered out. Exits otherwise, so that tests that did not
    run cannot pass as run.

    >>> cargo_ran_all("test result: ok. 8 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 2.10s")
    8
    >>> cargo_ran_all("test result: ok. 1 passed; 0 failed; 7 ignored; 0 measured; 0 filtered out; finished in 0.00s")
    Traceback (most recent call last):
    SystemExit: test_counts: 7 tests ignored where every test must run (was --include-ignored passed?)
    >>> cargo_ran_all("test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 4 filtered out; finished in 0.00s")
    Traceback (most recent call last):
    SystemExit: test_counts: 4 tests filtered out where every test must run
    >>> cargo_ran_all("error: no test target named `ort`")
    Traceback (most recent call last):
    SystemExit: test_counts: no cargo 'test result:' line with a test that ran
    """
    total = 0
    results = re.findall(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored; \d+ measured; "
                         r"(\d+) filtered out", log, flags=re.M)
    for passed, failed, ignored, filtered in results:
        if int(failed):
            raise SystemExit(f"test_counts: {failed} tests failed")
        if int(ignored):
            raise SystemExit(f"test_counts: {ignored} tests ignored where every test must run "
                             "(was --include-ignored passed?)")
        if int(filtered):
            raise SystemExit(f"test_counts: {filtered} tests filtered out where every test must run")
        total += int(passed)
    if total == 0:
        raise SystemExit("test_counts: no cargo 'test result:' line with a test that ran")
    return total


def last_match(pattern: str, log: str) -> int:
    found = re.findall(pattern, log, flags=re.M)
    if not found:
        raise SystemExit(f"test_counts: no line matching {pattern!r}")
    return int(found[-1])


def ctest_closing(log: str) -> int:
    """How many tests ctest ran, from its closing line, which must report no failure. ctest 3 writes
    "100% tests passed, 0 tests failed out of 26"; ctest 4 (the PyPI wheel) leaves the failed count
    out when it is 0, "100% tests passed out of 26", and writes "92% tests passed, 2 tests failed
    out of 26" otherwise.

    >>> ctest_closing("100% tests passed, 0 tests failed out of 26")
    26
    >>> ctest_closing("100% tests passed out of 26")
    26
    >>> ctest_closing("96% tests passed, 1 test failed out of 26")
    Traceback (most recent call last):
    SystemExit: test_counts: ctest reports 1 of 26 tests failed
    >>> ctest_closing("Total Test time (real) =   2.04 sec")
    Traceback (most recent call last):
    SystemExit: test_counts: no ctest closing line ('N% tests passed[, N tests failed] out of N')
    """
    closing = re.findall(r"^\d+% tests passed(?:, (\d+) tests? failed)? out of (\d+)$", log, flags=re.M)
    if not closing:
        raise SystemExit("test_counts: no ctest closing line ('N% tests passed[, N tests failed] out of N')")
    failed, total = closing[-1]
    if failed and int(failed) != 0:
        raise SystemExit(f"test_counts: ctest reports {failed} of {total} tests failed")
    return int(total)


def ctest_passed(log: str) -> int:
    """The tests ctest passed, its closing line reporting no failure. The same programs again under
    valgrind (ACCALLOC_VALGRIND=ON) are not more tests: left out, so the figure is the same with and
    without it."""
    ctest_closing(log)
    passed = re.findall(r"Test +#\d+: (\S+) \.+ +Passed", log)
    return len([name for name in passed if not name.startswith("valgrind_")])


def block(logs: Path) -> str:
    cargo = (logs / "cargo-test.log").read_text()
    total, unit = cargo_counts(cargo)
    model = last_match(r"^(\d+) passed, 0 failed$", (logs / "model.log").read_text())
    ctest = ctest_passed((logs / "ctest.log").read_text())
    on_model = cargo_ran_all((logs / "cargo-test-cuda-model.log").read_text())
    ctest_model = ctest_passed((logs / "ctest-cuda-model.log").read_text())
    ort = cargo_ran_all((logs / "ort.log").read_text())
    pytest_log = (logs / "pytest.log").read_text()
    pytest_passed = last_match(r"^(\d+) passed", pytest_log)
    skipped = re.findall(r"^\d+ passed, (\d+) skipped", pytest_log, flags=re.M)
    pytest_skipped = int(skipped[-1]) if skipped else 0
    return "\n".join([
        BEGIN,
        "| runner | tests that passed | what |",
        "|---|---:|---|",
        f"| `cargo test` | {total} | Rust: {unit} unit tests of the library with hand-worked figures, the rest"
        " integration tests (C ABI from Rust, CLI, model, faults, threads, header, the docs' paths); those"
        " that need a CUDA driver or ORT are ignored here and run in their rows below |",
        f"| `scripts/check_model.py` | {model} | cases compared key by key with the Python model of PyTorch |",
        f"| `ctest` (c_tests) | {ctest} | C, C++, dlopen, Python ctypes, OpenACC side by side, install and"
        " consumers, exports (run again under ASan and valgrind in CI) |",
        f"| `cargo test` on the CUDA driver model | {on_model} | the CUDA backend through libcuda's strict model"
        " (cuda_model/): the sample traces' 122 statistics equal the host's, VMM, 8 devices, record_stream"
        " against asynchronous streams, driver faults on every call kind |",
        f"| `ctest` on the CUDA driver model | {ctest_model} | the C ABI suites again with ACCALLOC_DEVICE=cuda"
        " (all but the host's own configuration tests) |",
        f"| `cargo test --test ort` | {ort} | ONNX Runtime 1.32 from the package registry allocating through"
        " accalloc: real models, statistics, errors, a backend registered from C |",
        f"| `pytest` (python/tests) | {pytest_passed} | the Python package inside PyTorch: the host accelerator,"
        " a backend registered from ctypes, device-generic torch.accelerator tests, PyTorch's whole OpInfo"
        " database, real transformers models and a CNN, the real-workload traces"
        f" ({pytest_skipped} skipped"
        " without a GPU: use_for_cuda) |",
        END,
    ])


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--ran-all":
        # test-all.sh and test-ort.sh, right after a run with --include-ignored.
        print(f"test_counts: all {cargo_ran_all(Path(sys.argv[2]).read_text())} tests ran and passed")
        return 0
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    logs, readme = Path(sys.argv[1]), Path(sys.argv[2])
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        print(f"test_counts: {readme} has no {BEGIN} ... {END} block", file=sys.stderr)
        return 1
    start, end = text.index(BEGIN), text.index(END) + len(END)
    fresh = block(logs)
    print("\n".join(fresh.splitlines()[3:-1]))
    if text[start:end] == fresh:
        return 0
    if os.environ.get("CI"):
        print(f"test_counts: the test counts in {readme} are stale: run scripts/test-all.sh and commit "
              f"{readme}", file=sys.stderr)
        return 1
    readme.write_text(text[:start] + fresh + text[end:])
    print(f"test_counts: {readme} updated: commit it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
