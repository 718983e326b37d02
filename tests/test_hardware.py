"""Hardware detection and thread planning against fake /proc and cgroup trees."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
from dataclasses import FrozenInstanceError, dataclass, replace
from pathlib import Path

import pytest

from tts_bridge.config import load_settings
from tts_bridge.system.hardware import Hardware, detect_hardware
from tts_bridge.system.threads import (
    OnnxSessionPlan,
    ThreadPlan,
    choose_spinning,
    plan_for_settings,
    plan_threads,
)

DATA = Path(__file__).parent / "data" / "hw"
MIB = 1024 * 1024
GIB = 1024 * MIB
KB = 1024


@dataclass(frozen=True)
class Case:
    """One fake machine: what must be detected and what the automatic plan must be."""

    tree: str
    architecture: str
    hardware: Hardware
    intra: int
    torch: int
    concurrency: int
    budget_mb: int
    spinning: bool


CASES = [
    Case(
        tree="pi4",
        architecture="aarch64",
        hardware=Hardware(
            architecture="aarch64",
            logical_cpus=4,
            usable_cpus=4,
            cpu_quota=None,
            memory_total_bytes=3884328 * KB,
            memory_limit_bytes=None,  # "max" in the service's cgroup
            memory_available_bytes=3302112 * KB,
            board_model="Raspberry Pi 4 Model B Rev 1.4",
            cpu_model="Cortex-A72",
        ),
        intra=2,
        torch=2,
        concurrency=1,
        budget_mb=2275,  # 60% of 3793 MB RAM
        spinning=True,
    ),
    Case(
        tree="pi5",
        architecture="aarch64",
        hardware=Hardware(
            architecture="aarch64",
            logical_cpus=4,
            usable_cpus=4,
            cpu_quota=None,
            memory_total_bytes=8245328 * KB,
            memory_limit_bytes=3 * GIB,  # MemoryMax=3G on the unit, not on its slice
            memory_available_bytes=3 * GIB - 100 * MIB,  # the unit's headroom, not MemAvailable
            board_model="Raspberry Pi 5 Model B Rev 1.0",
            cpu_model="Cortex-A76",
        ),
        intra=2,
        torch=2,
        concurrency=1,
        budget_mb=1843,  # 60% of the 3072 MB limit
        spinning=True,
    ),
    Case(
        tree="pi3",
        architecture="armv7l",
        hardware=Hardware(
            architecture="armv7l",
            logical_cpus=4,
            usable_cpus=4,
            cpu_quota=None,
            memory_total_bytes=948280 * KB,
            memory_limit_bytes=None,
            memory_available_bytes=600000 * KB,
            board_model="Raspberry Pi 3 Model B Rev 1.2",  # from cpuinfo: no device tree
            cpu_model="Cortex-A53",  # the core, not "ARMv7 Processor rev 4 (v7l)"
        ),
        intra=2,
        torch=2,
        concurrency=1,
        budget_mb=468,  # 80% of the 585 MB available, below 60% of RAM (555)
        spinning=True,
    ),
    Case(
        tree="container_x86",
        architecture="x86_64",
        hardware=Hardware(
            architecture="x86_64",
            logical_cpus=2,
            usable_cpus=1,  # quota 1.5 rounds down
            cpu_quota=1.5,
            memory_total_bytes=16393916 * KB,
            memory_limit_bytes=2 * GIB,
            # limit - (current 768 MB - inactive file 128 MB)
            memory_available_bytes=2 * GIB - 640 * MIB,
            board_model=None,
            cpu_model="AMD EPYC 7B13",
        ),
        intra=1,
        torch=1,
        concurrency=1,
        budget_mb=1126,  # 80% of 1408 MB headroom, below 60% of the 2048 MB limit (1228)
        spinning=False,  # the 1.5-CPU quota is smaller than the 2 CPUs: shared,
    ),
    Case(
        tree="desktop16",
        architecture="x86_64",
        hardware=Hardware(
            architecture="x86_64",
            logical_cpus=16,
            usable_cpus=16,
            cpu_quota=None,
            memory_total_bytes=65776012 * KB,
            memory_limit_bytes=None,
            memory_available_bytes=58000000 * KB,
            board_model=None,
            cpu_model="AMD Ryzen 7 5800X 8-Core Processor",
        ),
        intra=4,
        torch=4,
        concurrency=4,
        budget_mb=38540,  # 60% of 64234 MB
        spinning=True,  # 4 jobs x 4 threads fill 16 CPUs exactly,
    ),
]

PI4 = CASES[0].hardware
DESKTOP = CASES[4].hardware


@pytest.mark.parametrize("case", CASES, ids=[case.tree for case in CASES])
def test_detects_hardware(case: Case) -> None:
    assert detect_hardware(DATA / case.tree, architecture=case.architecture) == case.hardware


@pytest.mark.parametrize("case", CASES, ids=[case.tree for case in CASES])
def test_plans_for_hardware(case: Case) -> None:
    plan = plan_threads(case.hardware)

    assert plan.onnx_intra_op_threads == case.intra
    assert plan.onnx_inter_op_threads == 1
    assert plan.torch_threads == case.torch
    assert plan.synthesis_concurrency == case.concurrency
    assert plan.idle_nice == 10
    assert plan.memory_budget_mb == case.budget_mb
    # The hard rule: never more busy threads than usable CPUs.
    assert plan.synthesis_concurrency * plan.onnx_intra_op_threads <= case.hardware.usable_cpus
    assert plan.synthesis_concurrency * plan.torch_threads <= case.hardware.usable_cpus
    # One reason per value, each naming the value it explains; no warnings on automatic plans.
    assert [reason.split(":", 1)[0] for reason in plan.reasons] == [
        f"onnx_intra_op_threads={case.intra}",
        "onnx_inter_op_threads=1",
        f"onnx_spinning={'on' if case.spinning else 'off'}",
        "onnx_arena=on",
        f"torch_threads={case.torch}",
        f"synthesis_concurrency={case.concurrency}",
        "idle_nice=10",
        f"memory_budget_mb={case.budget_mb}",
    ]
    assert (plan.onnx_spinning, plan.onnx_arena) == (case.spinning, True)
    assert plan.onnx_session() == OnnxSessionPlan(
        intra_op_threads=case.intra, inter_op_threads=1, spinning=case.spinning, arena=True
    )


def test_hardware_properties() -> None:
    pi4, pi5, pi3, container, desktop = (case.hardware for case in CASES)
    assert [hw.is_arm for hw in (pi4, pi3, desktop)] == [True, True, False]
    assert [hw.is_x86 for hw in (pi4, pi3, desktop)] == [False, False, True]
    assert [hw.is_raspberry_pi for hw in (pi4, pi3, container)] == [True, True, False]
    assert pi5.usable_memory_bytes == 3 * GIB  # the limit, below 8 GB of RAM
    assert pi4.usable_memory_bytes == 3884328 * KB
    with pytest.raises(FrozenInstanceError):
        pi4.usable_cpus = 8  # type: ignore[misc]


def test_small_board_reasons_explain_the_choices() -> None:
    pi4, pi5, pi3 = (case.hardware for case in CASES[:3])
    pi4_reasons = "\n".join(plan_threads(pi4).reasons)
    assert "memory bandwidth" in pi4_reasons
    # With 2 GB or more of budget a 4-core board could take a second 2-thread job: offered, not
    # chosen, because only a measurement on the board can say whether it helps.
    assert "2 fit (set synthesis_concurrency: 2)" in pi4_reasons
    assert "2 fit" in "\n".join(plan_threads(pi5).reasons)
    pi3_reasons = "\n".join(plan_threads(pi3).reasons)
    assert "2 fit" not in pi3_reasons  # 468 MB cannot hold two jobs
    assert "available now" in pi3_reasons


def test_reasons_name_the_limits_that_applied() -> None:
    container, desktop = CASES[3].hardware, CASES[4].hardware
    assert plan_threads(container).reasons[0] == (
        "onnx_intra_op_threads=1: all 1 usable CPU(s) for the job "
        "(the cgroup CPU quota of 1.5 is rounded down to whole CPUs)"
    )
    assert plan_threads(desktop).reasons[0] == (
        "onnx_intra_op_threads=4: 4 of 16 usable CPUs per job: one request gains little beyond "
        "4 threads, so the other cores serve more jobs"
    )
    four_jobs = plan_threads(PI4, {"synthesis_concurrency": 4})
    assert four_jobs.reasons[0] == (
        "onnx_intra_op_threads=1: fewer per job so that 4 jobs fit in 4 usable CPUs"
    )


def test_plan_describe_lists_values_and_reasons() -> None:
    plan = plan_threads(CASES[0].hardware)
    lines = plan.describe()
    assert lines[:4] == [
        "synthesis: 1 job(s) at a time, onnxruntime 2 intra-op / 1 inter-op thread(s) per job, "
        "torch 2 thread(s)",
        "onnxruntime sessions: sequential execution, spinning on, CPU memory arena on",
        "background work: niceness +10",
        "memory budget: 2275 MB",
    ]
    assert lines[4:] == [f"- {reason}" for reason in plan.reasons]


def test_hardware_describe() -> None:
    assert CASES[3].hardware.describe() == [
        "cpu: AMD EPYC 7B13 (x86_64), 2 logical, 1 usable",
        "cgroup cpu quota: 1.5 CPUs",
        "memory: 16009 MB total, 1408 MB available, cgroup limit 2048 MB",
    ]
    assert CASES[0].hardware.describe()[:2] == [
        "board: Raspberry Pi 4 Model B Rev 1.4",
        "cpu: Cortex-A72 (aarch64), 4 logical, 4 usable",
    ]
    assert CASES[0].hardware.describe()[2].endswith("cgroup limit none")


# --- overrides ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hw", "overrides", "expected"),
    [
        # None means automatic: identical to no overrides.
        (
            PI4,
            {"onnx_intra_op_threads": None, "synthesis_concurrency": None},
            {"onnx_intra_op_threads": 2, "synthesis_concurrency": 1, "torch_threads": 2},
        ),
        # Two jobs on a Pi 4 after measuring: 2 x 2 threads still fit in 4 CPUs.
        (
            PI4,
            {"synthesis_concurrency": 2},
            {"onnx_intra_op_threads": 2, "synthesis_concurrency": 2, "torch_threads": 2},
        ),
        # Four jobs: the automatic thread counts shrink so that 4 x 1 fits.
        (
            PI4,
            {"synthesis_concurrency": 4},
            {"onnx_intra_op_threads": 1, "synthesis_concurrency": 4, "torch_threads": 1},
        ),
        # More threads per job on the desktop: fewer jobs fit.
        (
            DESKTOP,
            {"onnx_intra_op_threads": 8},
            {"onnx_intra_op_threads": 8, "synthesis_concurrency": 2, "torch_threads": 8},
        ),
        # torch apart from ONNX.
        (
            DESKTOP,
            {"torch_threads": 2},
            {"onnx_intra_op_threads": 4, "synthesis_concurrency": 4, "torch_threads": 2},
        ),
        # A smaller memory budget caps the desktop's concurrency at 512 MB per job.
        (
            DESKTOP,
            {"memory_budget_mb": 1024},
            {"memory_budget_mb": 1024, "synthesis_concurrency": 2, "onnx_intra_op_threads": 4},
        ),
        (
            PI4,
            {"idle_nice": 0, "onnx_inter_op_threads": 2},
            {"idle_nice": 0, "onnx_inter_op_threads": 2, "synthesis_concurrency": 1},
        ),
    ],
    ids=[
        "none-is-auto",
        "pi4-two-jobs",
        "pi4-four-jobs",
        "desktop-8-threads",
        "torch",
        "memory",
        "nice-and-inter-op",
    ],
)
def test_overrides(
    hw: Hardware, overrides: dict[str, int | None], expected: dict[str, int]
) -> None:
    plan = plan_threads(hw, overrides)
    assert {name: getattr(plan, name) for name in expected} == expected
    assert not any(reason.startswith("warning") for reason in plan.reasons)
    for name, value in overrides.items():
        if value is not None:
            assert f"{name}={value}: set by configuration" in plan.reasons


def test_oversubscribing_overrides_are_kept_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="tts_bridge.system.threads"):
        plan = plan_threads(PI4, {"synthesis_concurrency": 2, "onnx_intra_op_threads": 4})

    assert (plan.synthesis_concurrency, plan.onnx_intra_op_threads, plan.torch_threads) == (2, 4, 4)
    warnings = [reason for reason in plan.reasons if reason.startswith("warning")]
    assert warnings == [
        "warning: 2 jobs x 4 ONNX intra-op threads = 8 busy threads on 4 usable CPUs; "
        "expect every job to be slower",
        "warning: 2 jobs x 4 torch threads = 8 busy threads on 4 usable CPUs; "
        "expect every job to be slower",
    ]
    assert "oversubscribes" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"threads": 2}, "unknown tuning override 'threads'"),
        ({"reasons": 1}, "unknown tuning override 'reasons'"),
        ({"onnx_intra_op_threads": 0}, "onnx_intra_op_threads must be an integer from 1 to 256"),
        ({"synthesis_concurrency": True}, "synthesis_concurrency must be an integer"),
        ({"idle_nice": 20}, "idle_nice must be an integer from 0 to 19"),
        ({"memory_budget_mb": "512"}, "memory_budget_mb must be an integer"),
    ],
)
def test_bad_overrides_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_threads(PI4, overrides)  # type: ignore[arg-type]


# --- more trees, built here -----------------------------------------------------------------


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def x86_cpuinfo(count: int) -> str:
    return "".join(
        f"processor\t: {n}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU\n\n"
        for n in range(count)
    )


MEMINFO_32G = "MemTotal:       33554432 kB\nMemAvailable:   20971520 kB\n"


def test_cgroup_v1_quota_and_memory_limit(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "proc/cpuinfo": x86_cpuinfo(8),
            "proc/meminfo": MEMINFO_32G,
            # Without a cgroup namespace the host's path shows, but only the container's own
            # cgroup is mounted: the mount root must be read.
            "proc/self/cgroup": "12:memory:/docker/abc123\n4:cpu,cpuacct:/docker/abc123\n"
            "1:name=systemd:/docker/abc123\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{3 * GIB}\n",
            "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{1536 * MIB}\n",
            "sys/fs/cgroup/memory/memory.stat": f"cache 300000000\ntotal_inactive_file "
            f"{256 * MIB}\n",
        },
    )
    hw = detect_hardware(root, architecture="x86_64")

    assert (hw.logical_cpus, hw.usable_cpus, hw.cpu_quota) == (8, 2, 2.0)  # from cpuinfo
    assert hw.memory_limit_bytes == 3 * GIB
    assert hw.memory_available_bytes == 3 * GIB - 1280 * MIB
    plan = plan_threads(hw)
    assert (plan.onnx_intra_op_threads, plan.synthesis_concurrency) == (2, 1)
    assert plan.memory_budget_mb == 1433  # 80% of the 1792 MB headroom


def test_cgroup_v1_unlimited_sentinels_are_ignored(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "proc/cpuinfo": x86_cpuinfo(4),
            "proc/meminfo": MEMINFO_32G,
            "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n",
            "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
            "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
            "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{GIB}\n",
        },
    )
    hw = detect_hardware(root, architecture="x86_64")

    assert (hw.usable_cpus, hw.cpu_quota, hw.memory_limit_bytes) == (4, None, None)
    assert hw.memory_available_bytes == 20971520 * KB
    assert plan_threads(hw).memory_budget_mb == 16384  # 80% of the 20 GB available


def test_tightest_nested_v2_limit_wins(tmp_path: Path) -> None:
    unit = "sys/fs/cgroup/system.slice/tts-bridge.service"
    root = write_tree(
        tmp_path,
        {
            "proc/cpuinfo": x86_cpuinfo(8),
            "proc/meminfo": MEMINFO_32G,
            "proc/self/cgroup": "0::/system.slice/tts-bridge.service\n",
            "sys/fs/cgroup/system.slice/cpu.max": "300000 100000\n",
            "sys/fs/cgroup/system.slice/memory.max": f"{GIB}\n",
            f"{unit}/cpu.max": "max 100000\n",
            f"{unit}/memory.max": f"{4 * GIB}\n",
            f"{unit}/memory.current": f"{256 * MIB}\n",
        },
    )
    hw = detect_hardware(root, architecture="x86_64")

    assert (hw.cpu_quota, hw.usable_cpus) == (3.0, 3)
    assert hw.memory_limit_bytes == GIB
    # The slice's usage is unknown, so only the unit's own headroom is counted.
    assert hw.memory_available_bytes == 4 * GIB - 256 * MIB


def test_cgroup_outside_namespace_reads_only_the_mount_root(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "proc/cpuinfo": x86_cpuinfo(4),
            "proc/self/cgroup": "0::/../../system.slice\n",
            "sys/fs/cgroup/cpu.max": "250000 100000\n",
            # Where "/../../system.slice" would lead from the mount: never read.
            "sys/system.slice/cpu.max": "100000 100000\n",
        },
    )
    hw = detect_hardware(root, architecture="x86_64")
    assert (hw.cpu_quota, hw.usable_cpus) == (2.5, 2)


def test_quota_below_one_cpu_still_leaves_one(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {"proc/cpuinfo": x86_cpuinfo(4), "sys/fs/cgroup/cpu.max": "50000 100000\n"},
    )
    hw = detect_hardware(root, architecture="x86_64")
    assert (hw.cpu_quota, hw.usable_cpus) == (0.5, 1)
    plan = plan_threads(hw)
    assert (plan.onnx_intra_op_threads, plan.torch_threads, plan.synthesis_concurrency) == (
        1,
        1,
        1,
    )


def test_online_cpu_list_wins_over_cpuinfo(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {"proc/cpuinfo": x86_cpuinfo(2), "sys/devices/system/cpu/online": "0-3,6,8-9\n"},
    )
    assert detect_hardware(root, architecture="x86_64").logical_cpus == 7


def test_big_little_board_names_both_cores(tmp_path: Path) -> None:
    cores = "".join(
        f"processor\t: {n}\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
        f"CPU part\t: {'0xd05' if n < 4 else '0xd0b'}\n\n"
        for n in range(8)
    )
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "proc/device-tree/model").write_bytes(b"Radxa ROCK 5B\x00")
    write_tree(tmp_path, {"proc/cpuinfo": cores, "proc/meminfo": "MemTotal: 16777216 kB\n"})
    hw = detect_hardware(tmp_path, architecture="aarch64")

    assert hw.cpu_model == "Cortex-A55 + Cortex-A76"
    assert (hw.board_model, hw.is_raspberry_pi) == ("Radxa ROCK 5B", False)
    # Still a small board: 2 threads per job, and with 8 CPUs 4 jobs fit.
    plan = plan_threads(hw)
    assert (plan.onnx_intra_op_threads, plan.synthesis_concurrency) == (2, 4)


def test_memory_budget_caps_concurrency_on_a_big_cpu_small_memory_container(
    tmp_path: Path,
) -> None:
    root = write_tree(
        tmp_path,
        {
            "proc/cpuinfo": x86_cpuinfo(16),
            "proc/meminfo": MEMINFO_32G,
            "sys/fs/cgroup/memory.max": f"{GIB}\n",
        },
    )
    hw = detect_hardware(root, architecture="x86_64")
    plan = plan_threads(hw)

    assert (plan.memory_budget_mb, plan.onnx_intra_op_threads) == (614, 4)
    assert plan.synthesis_concurrency == 1
    assert "memory budget allows 512 MB per job, though the CPUs would allow 4" in "\n".join(
        plan.reasons
    )


def test_empty_tree_gives_safe_defaults(tmp_path: Path) -> None:
    hw = detect_hardware(tmp_path, architecture="riscv64")
    assert hw == Hardware(
        architecture="riscv64",
        logical_cpus=1,
        usable_cpus=1,
        cpu_quota=None,
        memory_total_bytes=None,
        memory_limit_bytes=None,
        memory_available_bytes=None,
        board_model=None,
        cpu_model=None,
    )
    plan = plan_threads(hw)
    assert (plan.onnx_intra_op_threads, plan.synthesis_concurrency) == (1, 1)
    assert plan.memory_budget_mb == 512
    assert "RAM could not be read" in plan.reasons[-1]


def test_real_machine() -> None:
    hw = detect_hardware()

    assert hw.architecture == platform.machine()
    assert hw.logical_cpus == os.cpu_count()
    assert 1 <= hw.usable_cpus <= len(os.sched_getaffinity(0))
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert hw.memory_total_bytes is not None
    assert abs(hw.memory_total_bytes - physical) < 0.01 * physical
    assert hw.memory_available_bytes is not None
    assert 0 < hw.memory_available_bytes <= hw.memory_total_bytes
    plan = plan_threads(hw)
    assert plan.synthesis_concurrency * plan.onnx_intra_op_threads <= hw.usable_cpus


# --- the plan ------------------------------------------------------------------------------


def test_thread_plan_is_frozen() -> None:
    plan: ThreadPlan = plan_threads(PI4)
    with pytest.raises(FrozenInstanceError):
        plan.idle_nice = 0  # type: ignore[misc]


# --- onnxruntime spinning -------------------------------------------------------------------


def _machine(logical: int, usable: int, quota: float | None = None) -> Hardware:
    return replace(DESKTOP, logical_cpus=logical, usable_cpus=usable, cpu_quota=quota)


@pytest.mark.parametrize(
    ("hw", "overrides", "spinning", "why"),
    [
        # The cores are the bridge's: one 2-thread job on 2 CPUs, no quota.
        (_machine(2, 2), {}, True, "fit in 2 usable CPUs without a quota"),
        # A container quota below the visible CPUs: shared cores, even though 1 x 1 fits.
        (_machine(2, 1, 1.5), {}, False, "cgroup CPU quota (1.5 CPUs) is smaller than the 2"),
        (_machine(8, 4, 4.0), {}, False, "cgroup CPU quota (4 CPUs) is smaller than the 8"),
        # A quota as large as the machine takes nothing away.
        (_machine(4, 4, 4.0), {}, True, "fit in 4 usable CPUs"),
        # Configured jobs x threads beyond the CPUs: the jobs compete for cores.
        (
            _machine(4, 4),
            {"synthesis_concurrency": 2, "onnx_intra_op_threads": 4},
            False,
            "2 job(s) x 4 thread(s) exceed 4 usable CPUs",
        ),
        # torch threads count too: they run in the same jobs.
        (
            _machine(4, 4),
            {"synthesis_concurrency": 2, "onnx_intra_op_threads": 2, "torch_threads": 3},
            False,
            "2 job(s) x 3 thread(s) exceed 4 usable CPUs",
        ),
        # Exactly full is not shared.
        (_machine(16, 16), {}, True, "4 job(s) x 4 thread(s) fit in 16 usable CPUs"),
    ],
    ids=["own-cores", "quota-1.5", "quota-4-of-8", "quota-whole", "jobs-exceed", "torch", "full"],
)
def test_auto_spinning_rule(
    hw: Hardware, overrides: dict[str, int], spinning: bool, why: str
) -> None:
    plan = plan_threads(hw, overrides)
    assert plan.onnx_spinning is spinning
    reason = next(r for r in plan.reasons if r.startswith("onnx_spinning="))
    assert reason.startswith(f"onnx_spinning={'on' if spinning else 'off'}: ")
    assert why in reason
    # The measurements behind the rule are in the reason the log shows.
    assert ("+37 %" if spinning else "10 tokens/s") in reason


def test_spinning_and_arena_set_by_configuration_win() -> None:
    shared = _machine(2, 1, 1.5)
    on = plan_threads(shared, spinning="on", arena=False)
    assert (on.onnx_spinning, on.onnx_arena) == (True, False)
    assert "onnx_spinning=on: set by configuration" in on.reasons
    assert any(r.startswith("onnx_arena=off: set by configuration") for r in on.reasons)
    assert "spinning on, CPU memory arena off" in on.describe()[1]
    off = plan_threads(_machine(2, 2), spinning="off")
    assert off.onnx_spinning is False
    assert choose_spinning("off", _machine(2, 2), threads=1, concurrency=1) == (
        False,
        "set by configuration",
    )
    with pytest.raises(ValueError, match="auto, on or off"):
        plan_threads(shared, spinning="sometimes")  # type: ignore[arg-type]


def test_plan_for_settings_passes_the_onnx_settings() -> None:
    settings = load_settings(
        None,
        {
            "synthesis": {
                "onnx_threads": 2,
                "onnx_inter_op_threads": 2,
                "onnx_arena": False,
                "onnx_spinning": "auto",
                "workers": 2,
            }
        },
        environ={},
    )
    plan = plan_for_settings(settings, _machine(4, 4))
    assert plan.onnx_session() == OnnxSessionPlan(
        intra_op_threads=2, inter_op_threads=2, spinning=True, arena=False
    )
    assert plan.synthesis_concurrency == 2
    assert "onnx_inter_op_threads=2: set by configuration" in plan.reasons
    # A third job would make 6 busy threads on 4 CPUs: auto turns spinning off.
    crowded = load_settings(None, {"synthesis": {"onnx_threads": 2, "workers": 3}}, environ={})
    assert plan_for_settings(crowded, _machine(4, 4)).onnx_spinning is False
    forced = load_settings(None, {"synthesis": {"onnx_spinning": "off"}}, environ={})
    assert plan_for_settings(forced, _machine(4, 4)).onnx_spinning is False


def test_the_synthesizer_runs_numpy_s_blas_on_one_thread(tmp_path: Path) -> None:
    # In a child: the limit is process-wide, and the pool's size is what is read.
    script = f"""
import json
from pathlib import Path
from threadpoolctl import threadpool_info
from tests.support.fake import settings_for
from tts_bridge.app import build_synthesizer

def numpy_blas():
    return [i["num_threads"] for i in threadpool_info() if "numpy" in i["filepath"]]

before = numpy_blas()
synth = build_synthesizer(settings_for(Path({str(tmp_path)!r})))
synth.cache.close()
print(json.dumps([before, numpy_blas()]))
"""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}  # a pool to limit on any machine
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).parent.parent,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    before, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert before == [2] and after == [1], done.stderr
    # Called before anything imported numpy: its BLAS is loaded to be found.
    early = "from tts_bridge.system.threads import numpy_blas_on_one_thread as f; print(f())"
    done = subprocess.run(
        [sys.executable, "-c", early], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "1", done.stderr
