"""Assert tests on a program run as written (no sanitising), in the sandbox."""

from __future__ import annotations

import os

from elfreg.eval.code.execute import run_assert_tests

TESTS = ["assert add_three(2) == 5", "assert add_three(-3) == 0"]
RIGHT = "def add_three(x):\n    return x + 3"


def test_passing_program_and_failure_reasons() -> None:
    ok = run_assert_tests(RIGHT, TESTS)
    assert ok.passed and ok.reason == "" and ok.extracted == RIGHT and ok.details == {"sandbox": "ok"}
    wrong = run_assert_tests("def add_three(x):\n    return x + 4", TESTS)
    assert not wrong.passed and wrong.reason == "AssertionError at test line 1: assert add_three(2) == 5"
    second = run_assert_tests("def add_three(x):\n    return 5", "\n".join(TESTS))
    assert second.reason == "AssertionError at test line 2: assert add_three(-3) == 0"
    renamed = run_assert_tests("def add_3(x):\n    return x + 3", TESTS)
    assert renamed.reason.startswith("NameError: name 'add_three' is not defined at test line 1")
    broken = run_assert_tests("def add_three(x:\n", TESTS)
    assert not broken.passed and broken.reason.startswith("SyntaxError")


def test_program_is_not_sanitised() -> None:
    # check_program would keep only the function; here the stray line runs and breaks the program
    assert not run_assert_tests(RIGHT + "\nprint(undefined_name)", TESTS).passed
    fenced = run_assert_tests("```python\n" + RIGHT + "\n```", TESTS)
    assert not fenced.passed and fenced.reason.startswith("SyntaxError")


def test_programs_ending_early_or_running_long_fail() -> None:
    exits = run_assert_tests(RIGHT + "\nimport sys\nsys.exit(0)", TESTS)
    assert not exits.passed and exits.reason == "SystemExit: 0"
    vanishes = run_assert_tests(RIGHT + "\nimport os\nos._exit(0)", TESTS)
    assert not vanishes.passed and vanishes.reason == "the program exited before its tests finished"
    # right after 30 s: failing at 1 s is the time limit's doing
    sleeps = run_assert_tests("import time\ntime.sleep(30)\n" + RIGHT, TESTS, timeout=1)
    assert not sleeps.passed and sleeps.reason == "time limit exceeded"


def test_runs_in_the_sandbox(monkeypatch) -> None:
    monkeypatch.setenv("ELFREG_TEST_SECRET", "leak")
    probe = f"import os\nassert 'ELFREG_TEST_SECRET' not in os.environ\nassert os.getcwd() != {os.getcwd()!r}"
    assert run_assert_tests(probe, []).passed
