"""Progress where stderr is a log, not a terminal: status lines, never a silent run."""

import io
import sys


def test_a_log_gets_a_progress_line_every_so_often_not_a_bar(monkeypatch):
    from porter.runtime import notices

    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", log)
    clock = iter([0.0, 1.0, 11.0, 12.0, 25.0, 26.0, 27.0])
    monkeypatch.setattr(notices.time, "monotonic", lambda: next(clock))
    with notices.progress_bar(6, 0, "denoise", "step", shown=True) as bar:
        for seconds in ("1.00", "10.00", "1.00", "13.00", "1.00"):
            bar.set_postfix_str(f"{seconds} s/step")
            bar.update()
    assert log.getvalue().splitlines() == [
        "porter: denoise: 2/6 steps (10.00 s/step)",  # 11 s after the start
        "porter: denoise: 4/6 steps (13.00 s/step)",  # 14 s after the line before
        "porter: denoise: 5/6 steps (1.00 s/step)"]  # at the end: where the loop stopped
    log.truncate(0)
    log.seek(0)
    clock = iter([0.0, 1.0, 2.0])  # a loop shorter than a line's wait says nothing
    with notices.progress_bar(2, 0, "denoise", "step", shown=True) as bar:
        bar.update()
        bar.update()
    assert log.getvalue() == ""


def test_no_progress_says_nothing_in_a_log(monkeypatch):
    from porter.runtime import notices

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(notices, "LOG_EVERY_S", 0.0)
    with notices.progress_bar(2, 0, "denoise", "step", shown=False) as bar:
        bar.update()
        bar.update()
    assert log.getvalue() == ""
