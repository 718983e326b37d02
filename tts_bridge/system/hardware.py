"""Hardware detection: what the machine offers this process, as far as tuning is concerned.

The bridge mostly runs on small home servers (a Raspberry Pi next to Home Assistant, a NAS, a
container with a CPU quota), where the runtimes' defaults are wrong: onnxruntime and torch start
one thread per logical CPU and ignore cgroup quotas. ``detect_hardware()`` reads the facts
(everything under a ``root`` so tests can use a fake tree); threads.py turns them into a plan.
"""

from __future__ import annotations

import logging
import math
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_LOGGER = logging.getLogger(__name__)

_MIB = 1024 * 1024

# cgroup v1 reports "no limit" as LONG_MAX rounded down to a page (9223372036854771712); some
# kernels and runtimes use other huge sentinels. No home machine has 4 EiB of RAM.
_ABSURD_MEMORY_BYTES = 1 << 62

# ``CPU part`` of ARM Ltd. cores (implementer 0x41) seen on single-board computers and ARM hosts.
_ARM_IMPLEMENTER = "0x41"
_ARM_CORE_NAMES = {
    "0xb76": "ARM1176",  # Pi 1, Pi Zero
    "0xc07": "Cortex-A7",  # Pi 2
    "0xd03": "Cortex-A53",  # Pi 3, Pi Zero 2
    "0xd04": "Cortex-A35",
    "0xd05": "Cortex-A55",
    "0xd07": "Cortex-A57",
    "0xd08": "Cortex-A72",  # Pi 4
    "0xd09": "Cortex-A73",
    "0xd0a": "Cortex-A75",
    "0xd0b": "Cortex-A76",  # Pi 5
    "0xd0c": "Neoverse-N1",
    "0xd0d": "Cortex-A77",
    "0xd40": "Neoverse-V1",
    "0xd41": "Cortex-A78",
    "0xd44": "Cortex-X1",
    "0xd46": "Cortex-A510",
    "0xd47": "Cortex-A710",
    "0xd48": "Cortex-X2",
    "0xd49": "Neoverse-N2",
    "0xd4f": "Neoverse-V2",
}


@dataclass(frozen=True)
class Hardware:
    """What the machine offers this process, as far as tuning is concerned."""

    architecture: str
    """CPU architecture as ``platform.machine()`` says: ``aarch64``, ``armv7l``, ``x86_64``."""
    logical_cpus: int
    """CPUs the kernel has online, hyper-threads included."""
    usable_cpus: int
    """Whole CPUs this process can keep busy: the logical count reduced to the process's CPU
    affinity and to a cgroup CPU quota rounded down; at least 1."""
    cpu_quota: float | None
    """Tightest cgroup CPU quota in CPUs (``1.5`` for ``cpu.max = 150000 100000``); None when
    there is no quota."""
    memory_total_bytes: int | None
    """Physical RAM (``MemTotal`` of ``/proc/meminfo``); None when it cannot be read."""
    memory_limit_bytes: int | None
    """Tightest cgroup memory limit on the way from this process's cgroup to the root; None when
    unlimited (``max``, or a sentinel too large to be real)."""
    memory_available_bytes: int | None
    """Memory that can be had now without swapping: ``MemAvailable``, reduced to the cgroup's
    headroom (limit minus usage that cannot be reclaimed); None when unknown."""
    board_model: str | None
    """Board name from the device tree (or a Raspberry Pi kernel's ``/proc/cpuinfo``), e.g.
    ``Raspberry Pi 4 Model B Rev 1.4``; None on machines without one, such as PCs."""
    cpu_model: str | None
    """CPU name: the ARM core from ``CPU part`` (``Cortex-A72``, ``Cortex-A55 + Cortex-A76`` on
    big.LITTLE), else ``model name`` (x86) or ``Model``; None when nothing says."""

    @property
    def is_x86(self) -> bool:
        """True on 32- and 64-bit x86."""
        return self.architecture.lower() in {"x86_64", "amd64", "i386", "i486", "i586", "i686"}

    @property
    def is_arm(self) -> bool:
        """True on 32- and 64-bit ARM."""
        machine = self.architecture.lower()
        return machine.startswith("arm") or machine == "aarch64"

    @property
    def is_raspberry_pi(self) -> bool:
        """True when the board says it is a Raspberry Pi."""
        return self.board_model is not None and self.board_model.startswith("Raspberry Pi")

    @property
    def usable_memory_bytes(self) -> int | None:
        """RAM this process can ever use: the smaller of physical RAM and the cgroup limit."""
        known = [b for b in (self.memory_total_bytes, self.memory_limit_bytes) if b is not None]
        return min(known) if known else None

    def describe(self) -> list[str]:
        """Human-readable lines for logs and ``doctor``."""
        lines = []
        if self.board_model:
            lines.append(f"board: {self.board_model}")
        cpu = self.cpu_model or "unknown CPU"
        lines.append(
            f"cpu: {cpu} ({self.architecture}), {self.logical_cpus} logical, "
            f"{self.usable_cpus} usable"
        )
        if self.cpu_quota is not None:
            lines.append(f"cgroup cpu quota: {self.cpu_quota:g} CPUs")
        lines.append(
            f"memory: {_mb_text(self.memory_total_bytes)} total, "
            f"{_mb_text(self.memory_available_bytes)} available, "
            f"cgroup limit {_mb_text(self.memory_limit_bytes, none='none')}"
        )
        return lines


def detect_hardware(root: Path = Path("/"), *, architecture: str | None = None) -> Hardware:
    """Read CPU, memory, cgroup and board facts from ``/proc`` and ``/sys`` under ``root``.

    ``architecture`` replaces ``platform.machine()`` (tests use it with a fake tree). The
    process's CPU affinity is only consulted when ``root`` is the real ``/``: a fake tree says
    nothing about the process running the test.
    """
    is_real_root = root.resolve() == Path("/").resolve()
    cpuinfo = _parse_colon_pairs(_read_text(root / "proc/cpuinfo") or "")
    cgroups = _process_cgroups(root)

    logical = _logical_cpus(root, cpuinfo, is_real_root)
    usable = logical
    if is_real_root and hasattr(os, "sched_getaffinity"):
        # Docker's --cpuset-cpus and taskset both show up here; the kernel already applied them.
        usable = min(usable, len(os.sched_getaffinity(0)))
    quota = _cpu_quota(root, cgroups)
    if quota is not None:
        # Rounded down: with a 1.5-CPU quota two busy threads use it up 75 ms into every 100 ms
        # period and both stall for the rest, adding jitter to every operator; one never stalls.
        usable = min(usable, max(1, math.floor(quota)))

    meminfo = _parse_meminfo(_read_text(root / "proc/meminfo") or "")
    limit, headroom = _memory_limit(root, cgroups)
    available = meminfo.get("MemAvailable")
    if headroom is not None:
        available = headroom if available is None else min(available, headroom)

    hardware = Hardware(
        architecture=architecture if architecture is not None else platform.machine(),
        logical_cpus=logical,
        usable_cpus=max(1, usable),
        cpu_quota=quota,
        memory_total_bytes=meminfo.get("MemTotal"),
        memory_limit_bytes=limit,
        memory_available_bytes=available,
        board_model=_board_model(root, cpuinfo),
        cpu_model=_cpu_model(cpuinfo),
    )
    _LOGGER.debug("Detected hardware: %s", hardware)
    return hardware


def _read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None


def _parse_colon_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            pairs.append((key.strip(), value.strip()))
    return pairs


def _parse_meminfo(text: str) -> dict[str, int]:
    values = {}
    for key, value in _parse_colon_pairs(text):
        number, _, unit = value.partition(" ")
        if not number.isdigit():
            continue
        values[key] = int(number) * (1024 if unit.strip() == "kB" else 1)
    return values


def _count_cpu_list(text: str) -> int | None:
    """Count the CPUs in a kernel CPU list such as ``0-3,6,8-9``."""
    total = 0
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            return None
        total += (int(last) - int(first) + 1) if last else 1
    return total or None


def _logical_cpus(root: Path, cpuinfo: list[tuple[str, str]], is_real_root: bool) -> int:
    online = _count_cpu_list(_read_text(root / "sys/devices/system/cpu/online") or "")
    if online:
        return online
    # Old 32-bit ARM kernels also print "Processor : ARMv7 ..." (capital P): not a CPU entry.
    listed = sum(1 for key, value in cpuinfo if key == "processor" and value.isdigit())
    if listed:
        return listed
    return (os.cpu_count() or 1) if is_real_root else 1


def _board_model(root: Path, cpuinfo: list[tuple[str, str]]) -> str | None:
    for path in ("proc/device-tree/model", "sys/firmware/devicetree/base/model"):
        text = _read_text(root / path)
        if text is not None:
            model = text.split("\x00", 1)[0].strip()
            if model:
                return model
    # Docker masks /sys/firmware, but Raspberry Pi kernels repeat the board in /proc/cpuinfo.
    return next((value for key, value in cpuinfo if key == "Model" and value), None)


def _cpu_model(cpuinfo: list[tuple[str, str]]) -> str | None:
    cores: list[str] = []
    implementer = None
    for key, value in cpuinfo:
        if key == "CPU implementer":
            implementer = value.lower()
        elif key == "CPU part" and implementer == _ARM_IMPLEMENTER:
            name = _ARM_CORE_NAMES.get(value.lower())
            if name and name not in cores:
                cores.append(name)
    if cores:
        # big.LITTLE chips (RK3588: 4x A55 + 4x A76) list each kind of core once.
        return " + ".join(cores)
    for wanted in ("model name", "Model", "CPU part"):
        for key, value in cpuinfo:
            if key == wanted and value:
                return f"ARM CPU part {value}" if wanted == "CPU part" else value
    return None


def _process_cgroups(root: Path) -> dict[str, str]:
    """Map each cgroup controller (``""`` for the v2 hierarchy) to this process's cgroup path."""
    paths: dict[str, str] = {}
    for line in (_read_text(root / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _cgroup_dirs(mount: Path, path: str | None) -> list[Path]:
    """The mount's root and every existing directory down to the process's own cgroup.

    Limits nest, so the tightest one anywhere on the way applies: a systemd unit's
    ``MemoryMax=`` sits in ``system.slice/<unit>``, a container's in the namespace root.
    """
    dirs = [mount]
    parts = [part for part in (path or "").split("/") if part]
    # "/../.." means the process sits outside this cgroup namespace; its own limits are not
    # visible from here, so only the mount's root is read.
    if ".." not in parts:
        for depth in range(1, len(parts) + 1):
            directory = mount.joinpath(*parts[:depth])
            if directory.is_dir():
                dirs.append(directory)
    return dirs


def _v1_mounts(root: Path, controller: str) -> list[Path]:
    # Distributions mount cpu and cpuacct together under either order, plus "cpu" symlinks.
    names = ("cpu", "cpu,cpuacct", "cpuacct,cpu") if controller == "cpu" else (controller,)
    return [root / "sys/fs/cgroup" / name for name in names]


def _read_int(path: Path) -> int | None:
    text = (_read_text(path) or "").strip()
    try:
        return int(text)
    except ValueError:
        return None


def _cpu_quota(root: Path, cgroups: Mapping[str, str]) -> float | None:
    quotas = []
    for directory in _cgroup_dirs(root / "sys/fs/cgroup", cgroups.get("")):
        fields_ = (_read_text(directory / "cpu.max") or "").split()
        if len(fields_) == 2 and fields_[0].isdigit() and fields_[1].isdigit():
            quota, period = int(fields_[0]), int(fields_[1])
            if quota > 0 and period > 0:
                quotas.append(quota / period)
    for mount in _v1_mounts(root, "cpu"):
        for directory in _cgroup_dirs(mount, cgroups.get("cpu")):
            quota_us = _read_int(directory / "cpu.cfs_quota_us")
            period_us = _read_int(directory / "cpu.cfs_period_us")
            # -1 is v1's "no quota".
            if quota_us is not None and period_us and quota_us > 0 and period_us > 0:
                quotas.append(quota_us / period_us)
    return min(quotas) if quotas else None


def _memory_limit(root: Path, cgroups: Mapping[str, str]) -> tuple[int | None, int | None]:
    """The tightest cgroup memory limit and the headroom left under it (both None if none)."""
    limits: list[int] = []
    headrooms: list[int] = []
    candidates = [
        (directory, "memory.max", "memory.current", "inactive_file")
        for directory in _cgroup_dirs(root / "sys/fs/cgroup", cgroups.get(""))
    ]
    candidates += [
        (directory, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        for mount in _v1_mounts(root, "memory")
        for directory in _cgroup_dirs(mount, cgroups.get("memory"))
    ]
    for directory, limit_file, usage_file, inactive_key in candidates:
        limit = _read_int(directory / limit_file)  # "max" does not parse: no limit
        if limit is None or not 0 < limit < _ABSURD_MEMORY_BYTES:
            continue
        limits.append(limit)
        usage = _read_int(directory / usage_file)
        if usage is not None:
            # Usage counts the page cache, which the kernel reclaims before it hits the limit;
            # `docker stats` subtracts the inactive file pages for the same reason.
            stat = dict(_parse_stat(_read_text(directory / "memory.stat") or ""))
            usage = max(0, usage - stat.get(inactive_key, 0))
            headrooms.append(max(0, limit - usage))
    return (min(limits) if limits else None, min(headrooms) if headrooms else None)


def _parse_stat(text: str) -> list[tuple[str, int]]:
    pairs = []
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            pairs.append((key, int(value)))
    return pairs


def _mb_text(value: int | None, none: str = "unknown") -> str:
    return none if value is None else f"{value // _MIB} MB"
