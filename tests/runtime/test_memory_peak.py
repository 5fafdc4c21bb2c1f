"""A process's own peak memory, not its parent's."""



def test_peak_memory_is_the_process_own_not_its_parents():
    """ru_maxrss survives exec: a run started by a large process (a test worker that
    ran pipelines in-process) reported the worker's size as its own peak."""
    import subprocess
    import sys

    big = bytearray(1 << 30)
    big[::4096] = b"\1" * len(big[::4096])  # resident
    code = "from porter.runtime.memory import own_peak_rss; print(own_peak_rss())"
    peak = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout)
    assert peak < len(big) // 2
