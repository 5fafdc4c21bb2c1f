"""``porter compile`` runs its work in a child process (porter/cli/child.py): what the
child prints passes through, and a child that native code kills (libtpu's segmentation
fault, a failed check) ends in a message saying what Porter was doing, with the crash
report in a file, instead of a page of C++ frames."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from porter.cli import child
from support import RECIPES
from support.aot import needs_libtpu
from support.processes import user_porter

CRASHING = textwrap.dedent("""\
    import os, signal, sys
    print("the report on stdout")
    sys.stderr.write("porter: [1/3] text_encoder.forward: compiled\\n")
    sys.stderr.write("porter: [2/3] transformer.forward: tracing, then the v7x-8 compile\\n")
    sys.stderr.write("*** SIGSEGV STACK OVERFLOW (@0x7f00) received by PID 1 ***\\n")
    sys.stderr.write("    @ 0x7f01  xla::SpatialMajorConvolution::EstimateFusionCost()\\n")
    sys.stderr.write("porter: not a status line once the report started\\n")
    sys.stdout.flush(); sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSEGV)
    """)


def run_child(code: str, capfd, **options):
    returned = child.run([sys.executable, "-c", code], what="porter compile", **options)
    out, err = capfd.readouterr()
    return returned, out, err


def test_a_crash_names_what_porter_was_doing_and_keeps_its_report_in_a_file(capfd):
    returned, out, err = run_child(CRASHING, capfd)
    assert returned == 1
    assert out == "the report on stdout\n"
    assert "porter: [2/3] transformer.forward: tracing" in err  # passed on as it came
    assert ("error: porter compile died of SIGSEGV in native code (libtpu, the TPU "
            "compiler, or a library beneath it) while [2/3] transformer.forward: tracing, "
            "then the v7x-8 compile") in err
    assert "SpatialMajorConvolution" not in err  # the frames are not the message
    report = Path(err.split("the crash report is in ")[1].split(";")[0])
    kept = report.read_text()
    assert kept.startswith("*** SIGSEGV STACK OVERFLOW") and "EstimateFusionCost" in kept
    assert "not a status line" in kept
    report.unlink()


def test_with_debug_the_report_is_shown_as_it_comes(capfd):
    returned, _, err = run_child(CRASHING, capfd, debug=True)
    assert returned == 1 and "EstimateFusionCost" in err
    assert "crash report is in" not in err and "died of SIGSEGV" in err


@pytest.mark.parametrize("code,expected", [
    ("import sys; print('fits'); sys.exit(0)", 0),
    ("import sys; sys.stderr.write('error: does not fit\\n'); sys.exit(2)", 2),
    # a line that looks like a report's start, from a child that ends normally
    ("import sys; sys.stderr.write('F1201 00:00:00 a log line\\nthen more\\n')", 0),
])
def test_a_child_that_ends_by_itself_answers_its_own_code_and_output(code, expected, capfd):
    returned, out, err = run_child(code, capfd)
    assert returned == expected and "died of" not in err
    if "F1201" in code:
        assert err == "F1201 00:00:00 a log line\nthen more\n"


def test_a_child_the_out_of_memory_killer_ends_is_said_to_be_killed(capfd):
    code = ("import os, signal, sys\n"
            "sys.stderr.write('porter: warning: a cache it stopped using\\n')\n"
            "sys.stderr.write('porter: [1/2] vae.decode: tracing\\n')\n"
            "sys.stderr.write('porter: warning: another\\n'); sys.stderr.flush()\n"
            "os.kill(os.getpid(), signal.SIGKILL)")
    returned, _, err = run_child(code, capfd)
    assert returned == 1
    assert "error: porter compile was killed by SIGKILL while [1/2] vae.decode: " \
        "tracing" in err  # its last status line, not a warning after it
    assert "out-of-memory killer" in err and "native code" not in err


def parent_of_a_sleeping_child(tmp_path: Path) -> subprocess.Popen:
    """A process running ``child.run`` on a child that writes its pid and sleeps."""
    pid = tmp_path / "child.pid"
    script = textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(Path(child.__file__).parents[2])!r})
        from porter.cli import child
        code = ("import os, time; open({str(pid)!r}, 'w').write(str(os.getpid())); "
                "print('started', flush=True); time.sleep(60)")
        sys.exit(child.run([sys.executable, "-c", code], what="porter compile"))
        """)
    # a session of its own: no terminal, as under a scheduler (a terminal's Ctrl-C the
    # child would get by itself)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert parent.stdout.readline() == "started\n"
    parent.child_pid = int(pid.read_text())
    return parent


def test_a_killed_porter_leaves_no_child_behind(tmp_path):
    """A timeout's SIGKILL reaches the porter process only: the system stops its child."""
    parent = parent_of_a_sleeping_child(tmp_path)
    parent.kill()
    parent.communicate(timeout=30)
    for _ in range(100):
        try:
            os.kill(parent.child_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail("the child outlived its killed parent")


def test_an_interrupt_sent_to_porter_alone_reaches_the_child(tmp_path):
    """SIGINT from a scheduler, not a terminal's Ctrl-C (which the child gets itself)."""
    parent = parent_of_a_sleeping_child(tmp_path)
    parent.send_signal(signal.SIGINT)
    _, err = parent.communicate(timeout=30)
    assert parent.returncode == 130, err


def test_a_terminate_sent_to_porter_reaches_the_child():
    """SIGTERM (a scheduler's stop) sent to the porter command stops its child too,
    and the command answers as a stopped one does (143), not as a crash."""
    script = textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(Path(child.__file__).parents[2])!r})
        from porter.cli import child
        code = "import time; print('started', flush=True); time.sleep(60)"
        sys.exit(child.run([sys.executable, "-c", code], what="porter compile"))
        """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert parent.stdout.readline() == "started\n"
    parent.send_signal(signal.SIGTERM)
    _, err = parent.communicate(timeout=30)
    assert parent.returncode == 143 and err == "interrupted by SIGTERM\n"


def test_porter_compile_runs_in_a_child_and_says_what_it_says():
    """The command as a user runs it: bad input still answers 2 with its message (the
    child's), and nothing of the child path shows."""
    out = user_porter("compile", "no-such-recipe.yaml", "--target", "v6e-8")
    assert out.returncode == 2 and "no-such-recipe.yaml" in out.stderr
    assert "died of" not in out.stderr


@needs_libtpu
def test_a_libtpu_crash_ends_porter_compile_with_a_message():
    """A real one: libtpu's fibers given a 16 KiB stack overflow it while lowering the
    tiny text encoder for v7x (seconds)."""
    out = user_porter("compile", RECIPES / "wan-tiny.yaml", "--target", "v7x-8",
                      "--program", "text_encoder.forward",
                      env={"LIBTPU_INIT_ARGS": "--fibers_default_thread_stack_size=16384"})
    assert out.returncode == 1, out.stderr
    assert "error: porter compile died of SIGSEGV in native code" in out.stderr
    assert "while [1/1] text_encoder.forward" in out.stderr
    assert "FailureSignalHandler" not in out.stderr and "symbolize" not in out.stderr
    report = Path(out.stderr.split("the crash report is in ")[1].split(";")[0])
    assert "SIGSEGV" in report.read_text()
    report.unlink()
