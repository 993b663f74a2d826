#!/usr/bin/env python3
"""The test counts of a run of test-all.sh, from the closing lines its runners printed, as a table.

    test_counts.py LOG_DIR                 (prints how many tests each runner passed)
    test_counts.py --ran-all CARGO_LOG     (fails unless every test of that cargo run ran and passed)

LOG_DIR holds cargo-test.log (cargo test), model.log (scripts/check_model.py), ctest.log (ctest of
c_tests without sanitizers), cargo-test-cuda-model.log and ctest-cuda-model.log (the same runners on
the CUDA driver model), pytest.log (scripts/test-python.sh) and ort.log (scripts/test-ort.sh). The
table is printed at the end of the run; no file is written (docs/TESTING.md says what each runner
covers).

Only tests that ran count. A plain `cargo test` reports the tests that need ONNX Runtime or a CUDA
driver as ignored, which is not passed; the runs that have what they need (cargo-test-cuda-model.log,
ort.log) pass --include-ignored, and their figures are taken only when none was ignored.
"""
import re
import sys
from pathlib import Path


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


def counts(logs: Path) -> dict[str, int]:
    """Each runner's passed tests (and the pytest run's skipped ones), from the logs in `logs`."""
    cargo = (logs / "cargo-test.log").read_text()
    total, unit = cargo_counts(cargo)
    pytest_log = (logs / "pytest.log").read_text()
    skipped = re.findall(r"^\d+ passed, (\d+) skipped", pytest_log, flags=re.M)
    return {
        "cargo": total,
        "unit": unit,
        "model": last_match(r"^(\d+) passed, 0 failed$", (logs / "model.log").read_text()),
        "ctest": ctest_passed((logs / "ctest.log").read_text()),
        "cargo_model": cargo_ran_all((logs / "cargo-test-cuda-model.log").read_text()),
        "ctest_model": ctest_passed((logs / "ctest-cuda-model.log").read_text()),
        "ort": cargo_ran_all((logs / "ort.log").read_text()),
        "pytest": last_match(r"^(\d+) passed", pytest_log),
        "pytest_skipped": int(skipped[-1]) if skipped else 0,
    }


def table(c: dict[str, int]) -> str:
    """The counts as a Markdown table, one row a runner.

    >>> print(table({"cargo": 185, "unit": 104, "model": 96, "ctest": 27, "cargo_model": 14,
    ...              "ctest_model": 21, "ort": 8, "pytest": 126, "pytest_skipped": 2}))
    | runner | tests that passed |
    |---|---:|
    | `cargo test` (104 of them the library's unit tests) | 185 |
    | `scripts/check_model.py` | 96 |
    | `ctest` (c_tests) | 27 |
    | `cargo test` on the CUDA driver model | 14 |
    | `ctest` on the CUDA driver model | 21 |
    | `cargo test --test ort` | 8 |
    | `pytest` (python/tests; 2 skipped without a GPU: use_for_cuda) | 126 |
    """
    rows = [
        (f"`cargo test` ({c['unit']} of them the library's unit tests)", c["cargo"]),
        ("`scripts/check_model.py`", c["model"]),
        ("`ctest` (c_tests)", c["ctest"]),
        ("`cargo test` on the CUDA driver model", c["cargo_model"]),
        ("`ctest` on the CUDA driver model", c["ctest_model"]),
        ("`cargo test --test ort`", c["ort"]),
        (f"`pytest` (python/tests; {c['pytest_skipped']} skipped without a GPU: use_for_cuda)", c["pytest"]),
    ]
    return "\n".join(["| runner | tests that passed |", "|---|---:|"]
                     + [f"| {runner} | {passed} |" for runner, passed in rows])


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--ran-all":
        # test-all.sh and test-ort.sh, right after a run with --include-ignored.
        print(f"test_counts: all {cargo_ran_all(Path(sys.argv[2]).read_text())} tests ran and passed")
        return 0
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(table(counts(Path(sys.argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
