"""How much memory this process and its devices may use, which limit says so, and the
peaks a run reached.

The machine's memory is not what a process may use: its cgroup (v2
``memory.max``, v1 ``memory.limit_in_bytes``; its own or a parent's) or an
address-space limit (``ulimit -v``, RLIMIT_AS) can allow less, and a run past
them is killed (cgroup) or fails to allocate (RLIMIT_AS). A check that compares
an estimate with memory takes the least of these and names it.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Limit:
    bytes: int
    source: str  # which limit: "set by {source}" in a message


def host_limit(proc_cgroup: Path = Path("/proc/self/cgroup"),
               mountinfo: Path = Path("/proc/self/mountinfo")) -> Limit:
    """The least of the machine's memory, this process's cgroup limits and its
    address-space limit (the paths are parameters so a test can fake them)."""
    limits = [physical(), *cgroup_limits(proc_cgroup, mountinfo), *address_space()]
    return min(limits, key=lambda limit: limit.bytes)


def physical() -> Limit:
    return Limit(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
                 "the machine's memory")


#: address space a run maps after its checks, beside its arrays: compiler and
#: thread-pool stacks, malloc's per-thread arenas (measured on a tiny Wan run: 2.8
#: GiB mapped at its checks, 3.1 GiB when it ended; its peak, 6.9 GiB, is transient
#: and not foreseen: a limit that close fails the run, exit 2, instead)
MAPPED_LATER = 2**30


def address_space() -> list[Limit]:
    """RLIMIT_AS counts every byte the process maps, not only what it holds: what it
    mapped before anything was loaded (the interpreter, torch, JAX: about 2.5 GiB;
    read once, at the first check, so that later checks and the out-of-memory
    message do not count the loaded model against itself) and what a run maps beside
    its arrays (``MAPPED_LATER``) are not there for them."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return []
    mapped = mapped_at_start()
    left = max(0, soft - mapped - MAPPED_LATER)
    return [Limit(left, f"the address-space limit RLIMIT_AS, `ulimit -v`: {soft / 2**30:.2f}"
                        f" GiB, less the {mapped / 2**30:.2f} GiB this process mapped "
                        f"before loading and {MAPPED_LATER / 2**30:.0f} GiB a run maps "
                        "beside its arrays")]


@functools.cache
def mapped_at_start() -> int:
    """The address space this process mapped when first asked (its checks run before
    any weight is loaded)."""
    return _status_bytes("VmSize:") or 0


def _status_bytes(field: str) -> int | None:
    """A size field of Linux's /proc/self/status in bytes (None where unknown)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cgroup_limits(proc_cgroup: Path, mountinfo: Path) -> list[Limit]:
    """The memory limits of this process's cgroup and of its parents (a parent's
    limit holds for its children), cgroup v2 and v1."""
    try:
        memberships = proc_cgroup.read_text()
        mounts = mountinfo.read_text()
    except OSError:
        return []
    found = []
    for directory, mount, name in _cgroup_directories(memberships, mounts):
        while True:
            found += _read_limit(directory / name)
            if directory == mount or mount not in directory.parents:
                break
            directory = directory.parent
    return found


def _read_limit(path: Path) -> list[Limit]:
    try:
        text = path.read_text().strip()
    except OSError:  # the root cgroup has no limit file
        return []
    # v2 says "max" for no limit; v1 a number near 2**63, larger than any machine
    return [Limit(int(text), f"the cgroup limit in {path}")] if text.isdigit() else []


#: a cgroup's limit file -> the file of what it uses now, and the key of memory.stat
#: that counts the page cache it can drop (files read and not touched since: a
#: checkpoint's weights once placed), which its usage includes
USAGE = {"memory.max": ("memory.current", "inactive_file"),
         "memory.limit_in_bytes": ("memory.usage_in_bytes", "total_inactive_file")}


def host_free(proc_cgroup: Path = Path("/proc/self/cgroup"),
              mountinfo: Path = Path("/proc/self/mountinfo"),
              meminfo: Path = Path("/proc/meminfo")) -> Limit | None:
    """What the host can still give this process now: the least of the machine's
    available memory (``MemAvailable``: what other processes hold is not) and, for each
    cgroup with a limit (its own or a parent's), that limit less what the cgroup uses
    (less the page cache it can drop); None where none can be read (not Linux)."""
    found = []
    try:
        text = meminfo.read_text()
        kib = next(int(line.split()[1]) for line in text.splitlines()
                   if line.startswith("MemAvailable:"))
        found.append(Limit(kib * 1024, "the machine's available memory (MemAvailable)"))
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    try:
        memberships, mounts = proc_cgroup.read_text(), mountinfo.read_text()
    except OSError:
        memberships = mounts = ""
    for directory, mount, name in _cgroup_directories(memberships, mounts):
        while True:
            for limit in _read_limit(directory / name):
                try:
                    used = int((directory / USAGE[name][0]).read_text().strip())
                except (OSError, ValueError):
                    continue
                used -= _stat(directory / "memory.stat", USAGE[name][1])
                found.append(Limit(max(0, limit.bytes - used),
                                   f"{limit.source} less what the cgroup uses"))
            if directory == mount or mount not in directory.parents:
                break
            directory = directory.parent
    return min(found, key=lambda limit: limit.bytes) if found else None


def _cgroup_directories(memberships: str, mounts: str) -> list[tuple[Path, Path, str]]:
    """(this process's cgroup directory, its mount point, the limit file's name) for the
    cgroup v2 hierarchy and the v1 memory hierarchy, where mounted."""
    paths = {}
    for line in memberships.splitlines():
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and not controllers:
            paths["cgroup2"] = path
        elif "memory" in controllers.split(","):
            paths["cgroup"] = path
    found = []
    for line in mounts.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        tail = fields[fields.index("-", 6) + 1:]
        fstype, options = tail[0], (tail[2] if len(tail) > 2 else "")
        if fstype not in paths or (fstype == "cgroup" and "memory" not in options.split(",")):
            continue
        root, mount = _unescape(fields[3]), Path(_unescape(fields[4]))
        name = "memory.max" if fstype == "cgroup2" else "memory.limit_in_bytes"
        found.append((mount / _below(paths[fstype], root), mount, name))
    return found


def _below(path: str, root: str) -> str:
    """``path`` (as /proc/self/cgroup names it) relative to the mount's root; "" when
    the mount does not show it (a cgroup namespace: the mount is the process's own)."""
    root = root.rstrip("/")
    if path == root or path.startswith(root + "/"):
        return path[len(root):].lstrip("/")
    return ""


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash in a path as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def device_memory(mesh_devices: int) -> Limit | None:
    """What one device of a ``mesh_devices`` mesh can hold, where known, and which
    limit says so: an accelerator's own limit; on CPU, what this process may use
    (``host_limit``: the machine's, its cgroup's or its address-space limit)
    shared by the virtual devices it runs (each holds its own copy of what it holds)."""
    import jax

    device = jax.local_devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if not (stats and stats.get("bytes_limit")):
            return None
        return Limit(int(stats["bytes_limit"]), f"the {device.device_kind}'s memory")
    host = host_limit()
    shared = max(1, min(mesh_devices, jax.local_device_count()))
    if shared == 1:
        return host
    return Limit(host.bytes // shared,
                 f"{host.source}, shared by {shared} virtual CPU devices")


def _stat(path: Path, key: str) -> int:
    """One counter of a cgroup's memory.stat (0 where it cannot be read)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def device_free(mesh_devices: int) -> Limit | None:
    """What one device of a ``mesh_devices`` mesh can still take now, where known: an
    accelerator's limit less what this process's allocator holds there; on CPU, what the
    host can still give this process (``host_free``: other processes' use counted)
    shared by the virtual devices it runs."""
    import jax

    device = jax.local_devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if not (stats and stats.get("bytes_limit")):
            return None
        return Limit(int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)),
                     f"the {device.device_kind}'s memory less what it holds")
    host = host_free()
    shared = max(1, min(mesh_devices, jax.local_device_count()))
    if host is None or shared == 1:
        return host
    return Limit(host.bytes // shared, f"{host.source}, shared by {shared} virtual CPU "
                                       "devices")


def own_peak_rss() -> int:
    """This process's peak resident memory. On Linux the kernel's high-water mark of
    this address space (VmHWM): ``ru_maxrss`` is kept across exec, so a process started
    by a large one (a test worker, a notebook) would report its parent's size."""
    import resource

    found = _status_bytes("VmHWM:")
    if found is not None:
        return found
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def peak_memory(platform: str) -> dict:
    """Peak memory so far: the host process's (what the kernel counts), and on an
    accelerator (``platform``: where the run's programs run) the first device's own
    peak."""
    import jax

    found = {"host_peak_rss_bytes": own_peak_rss()}
    device = jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if platform != "cpu" and stats:
        found["device_peak_bytes"] = int(stats.get("peak_bytes_in_use", 0))
    return found
