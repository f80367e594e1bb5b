"""The suite's profile reads a JUnit report as pytest writes it: time per module (a test class's cases count for its
file) and the longest tests."""

from __future__ import annotations

from scripts.suite_profile import render, times_of

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_docs" name="test_a" time="1.5" />
<testcase classname="tests.test_docs" name="test_b" time="2.5" />
<testcase classname="tests.phases.storage.test_tables.TestSomething" name="test_c" time="10.0" />
</testsuite></testsuites>"""


def test_the_profile_sums_each_module_and_lists_the_longest_tests(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(REPORT)
    times = times_of(report)
    assert times == [
        ("tests/test_docs.py", "test_a", 1.5),
        ("tests/test_docs.py", "test_b", 2.5),
        ("tests/phases/storage/test_tables.py", "test_c", 10.0),
    ]
    text = render(times, 2)
    assert "3 tests, 14 s of test time" in text
    assert text.index("tests/phases/storage/test_tables.py") < text.index("     4  tests/test_docs.py")
    assert "   10.0  tests/phases/storage/test_tables.py::test_c" in text and "test_a" not in text
