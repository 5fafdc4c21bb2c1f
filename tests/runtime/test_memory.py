"""How much memory a process may use: the least of the machine's, its cgroup's and its
address-space limit."""

import pytest

pytestmark = pytest.mark.slow


def test_the_memory_limit_is_the_least_of_machine_cgroup_and_address_space(tmp_path,
                                                                          monkeypatch):
    """This process's own cgroup (from /proc/self/cgroup, below its mount's root) and
    its parents, cgroup v2 and v1; "max" and v1's 2**63 are no limit."""
    from porter.runtime import memory
    monkeypatch.setattr(memory, "physical",
                        lambda: memory.Limit(64 << 30, "the machine's memory"))
    monkeypatch.setattr(memory, "address_space", lambda: [])
    v2, v1 = tmp_path / "unified", tmp_path / "memory"
    (v2 / "job" / "step").mkdir(parents=True)
    (v2 / "job" / "memory.max").write_text("8589934592\n")  # 8 GiB: the parent's
    (v2 / "job" / "step" / "memory.max").write_text("max\n")
    (v1 / "step").mkdir(parents=True)
    (v1 / "step" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    cgroup, mountinfo = tmp_path / "cgroup", tmp_path / "mountinfo"
    cgroup.write_text("4:memory:/outer/step\n1:cpu:/elsewhere\n0::/host/job/step\n")
    mountinfo.write_text(
        f"40 31 0:38 /host {v2} rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
        f"35 31 0:32 /outer {v1} rw,relatime - cgroup cgroup rw,memory\n"
        f"32 31 0:29 / {tmp_path / 'cpu'} rw,relatime - cgroup cgroup rw,cpu\n")
    limit = memory.host_limit(cgroup, mountinfo)
    assert limit == memory.Limit(8 << 30, f"the cgroup limit in {v2 / 'job' / 'memory.max'}")
    (v1 / "step" / "memory.limit_in_bytes").write_text("2147483648\n")  # v1: 2 GiB
    assert memory.host_limit(cgroup, mountinfo).bytes == 2 << 30
    monkeypatch.setattr(memory, "address_space", lambda: [memory.Limit(1 << 30, "as")])
    assert memory.host_limit(cgroup, mountinfo) == memory.Limit(1 << 30, "as")
    assert memory.host_limit(tmp_path / "none", mountinfo).bytes == 1 << 30  # no cgroup file


def test_free_memory_is_the_least_of_available_and_each_cgroups_room(tmp_path):
    """What other processes hold is not free: the machine's MemAvailable, and each
    cgroup's limit less what it uses now (v2 memory.current, v1 memory.usage_in_bytes,
    less the page cache it can drop), the least of them."""
    from porter.runtime import memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24576000 kB\nMemAvailable:   10485760 kB\n")
    v2 = tmp_path / "unified"
    (v2 / "job").mkdir(parents=True)
    (v2 / "job" / "memory.max").write_text(str(16 << 30))
    (v2 / "job" / "memory.current").write_text(str(13 << 30))
    # a GiB of it page cache it can drop (weights read once): 4 GiB left
    (v2 / "job" / "memory.stat").write_text(f"anon {12 << 30}\ninactive_file {1 << 30}\n")
    cgroup, mountinfo = tmp_path / "cgroup", tmp_path / "mountinfo"
    cgroup.write_text("0::/host/job\n")
    mountinfo.write_text(f"40 31 0:38 /host {v2} rw - cgroup2 cgroup2 rw\n")
    free = memory.host_free(cgroup, mountinfo, meminfo)
    assert free.bytes == 4 << 30 and "memory.max less what the cgroup uses" in free.source
    (v2 / "job" / "memory.max").write_text("max\n")  # no limit: the machine's says
    assert memory.host_free(cgroup, mountinfo, meminfo) == memory.Limit(
        10 << 30, "the machine's available memory (MemAvailable)")
    assert memory.host_free(tmp_path / "none", tmp_path / "none", tmp_path / "none") is None
