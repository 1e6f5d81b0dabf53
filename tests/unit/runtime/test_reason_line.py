"""The reason a failed pool gives: the line that names the error, not a warning printed after it
(an adversarial helper found "Last log line:   warnings.warn('resource_tracker: ..." there)."""

from tideserve.runtime.local import reason_line


def test_the_error_record_is_the_reason_not_the_warning_printed_after_it():
    tail = [
        "2026-12-07 12:00:00 INFO tideserve.worker ready on port 40001",
        "2026-12-07 12:00:05 ERROR tideserve.worker the engine process exited (code -9); the replica stops",
        "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: "
        "There appear to be 1 leaked semaphore objects to clean up at shutdown",
        "  warnings.warn('resource_tracker: There appear to be %d '",
    ]
    assert reason_line(tail) == tail[1]


def test_an_exception_line_in_any_case_counts():
    assert reason_line(["loading", "AttributeError: 'NoneType' object has no attribute 'x'", "bye"]) == \
        "AttributeError: 'NoneType' object has no attribute 'x'"
    assert reason_line(["pool gpu cannot start: no CUDA device", "exiting"]) == "pool gpu cannot start: no CUDA device"


def test_without_an_error_the_last_line_and_without_output_a_placeholder():
    assert reason_line(["starting", "stopped"]) == "stopped"
    assert reason_line([]) == "(no output)"
    assert reason_line(["x" * 500 + " error"]) == ("x" * 500 + " error")[-400:]
