"""Which device is this? Jetson (device tree + L4T release), NVIDIA GPUs (NVML, else nvidia-smi),
the CPU.

Every source path is a parameter, so tests feed recorded outputs of real machines
(tests/data/devices/).

>>> found = detect()                     # doctest: +SKIP
>>> found.profile.name, found.evidence   # doctest: +SKIP
('cpu', {'cpu': 'AMD EPYC', ...})
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .profiles import DeviceProfile, load_profiles

JETSON_MODEL = Path("/proc/device-tree/model")
TEGRA_RELEASE = Path("/etc/nv_tegra_release")
CPUINFO = Path("/proc/cpuinfo")
MEMINFO = Path("/proc/meminfo")
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "asimd",
    "asimddp",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
)
SUPER_L4T = (36, 4, 3)  # JetPack 6.2: the first release with the Orin Nano "Super" clocks


@dataclass
class Detected:
    profile: DeviceProfile  # the matched profile (the cpu one filled with measured figures)
    evidence: dict = field(default_factory=dict)


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").replace("\x00", "").strip()
    except OSError:
        return None


def parse_tegra_release(text: str) -> tuple[int, ...] | None:
    """(36, 4, 3) from '# R36 (release), REVISION: 4.3, GCID: ...'."""
    m = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text or "")
    return (int(m.group(1)), *(int(x) for x in m.group(2).split(".") if x)) if m else None


def parse_meminfo_gb(text: str) -> float | None:
    m = re.search(r"^MemTotal:\s+(\d+)\s+kB", text or "", re.M)
    return int(m.group(1)) * 1024 / 1e9 if m else None


def match_jetson(
    model: str, release: tuple | None, memory_gb: float | None, profiles: dict[str, DeviceProfile]
) -> DeviceProfile | None:
    """The Jetson profile whose device-tree name matches; memory picks the variant (32 vs 64 GB,
    ...)."""
    cands = [
        p
        for p in profiles.values()
        if p.device_class == "jetson"
        and any(key in model for key in p.detect.get("device_tree_model", ()))
    ]
    if memory_gb:
        cands = [
            p
            for p in cands
            if memory_gb <= p.detect.get("memory_gb_max", 1e9) and memory_gb <= p.memory_gb * 1.05
        ] or cands
    super_clocks = bool(release and release >= SUPER_L4T)
    cands = [p for p in cands if p.detect.get("super", False) == super_clocks] or cands
    return min(cands, key=lambda p: p.memory_gb) if cands else None


def detect_jetson(
    model_path: Path = JETSON_MODEL,
    release_path: Path = TEGRA_RELEASE,
    meminfo: Path = MEMINFO,
    profiles: dict | None = None,
) -> Detected | None:
    model = read_text(model_path)
    if not model or "Jetson" not in model and "NVIDIA" not in model:
        return None
    release = parse_tegra_release(read_text(release_path) or "")
    memory = parse_meminfo_gb(read_text(meminfo) or "")
    profile = match_jetson(model, release, memory, profiles or load_profiles())
    if profile is None:
        return None
    return Detected(
        profile,
        {
            "device_tree_model": model,
            "l4t": ".".join(map(str, release)) if release else None,
            "memory_gb": round(memory, 2) if memory else None,
        },
    )


def parse_nvidia_smi(text: str) -> list[dict]:
    """Rows of `nvidia-smi --query-gpu=name,memory.total,driver_version
    --format=csv,noheader,nounits`."""
    gpus = []
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[1].replace(".", "").isdigit():
            gpus.append(
                {
                    "name": parts[0],
                    "memory_gb": float(parts[1]) * 2**20 / 1e9,
                    "driver": parts[2] if len(parts) > 2 else None,
                }
            )
    return gpus


def query_gpus(nvml=None, smi_output: str | None = None) -> list[dict]:
    """NVIDIA GPUs via NVML (nvidia-ml-py) when importable, else `nvidia-smi`; [] when neither
    answers."""
    try:
        if nvml is None:
            import pynvml as nvml  # nvidia-ml-py
        nvml.nvmlInit()
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(h)
            out.append(
                {
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_gb": nvml.nvmlDeviceGetMemoryInfo(h).total / 1e9,
                    "driver": None,
                }
            )
        return out
    except Exception:  # no library, no driver, no GPU: try nvidia-smi
        pass
    if smi_output is None:
        if not shutil.which("nvidia-smi"):
            return []
        try:
            smi_output = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,memory.total,driver_version",
                    "--format=csv,noheader,nounits",
                ],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return []
    return parse_nvidia_smi(smi_output)


def match_gpu(gpu: dict, profiles: dict[str, DeviceProfile]) -> DeviceProfile | None:
    for p in profiles.values():
        if p.device_class == "gpu" and any(k in gpu["name"] for k in p.detect.get("gpu_name", ())):
            if gpu["memory_gb"] <= p.detect.get("memory_gb_max", 1e9):
                return p
    return None


def parse_cpuinfo(text: str) -> dict:
    """Model name, logical cores and the ISA flags that matter for matmuls, from /proc/cpuinfo."""
    model = re.search(r"^(?:model name|Model|Hardware)\s*:\s*(.+)$", text or "", re.M)
    flags = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text or "", re.M)
    have = set(flags.group(1).split()) if flags else set()
    return {
        "model": model.group(1).strip() if model else "unknown CPU",
        "cores": len(re.findall(r"^processor\s*:", text or "", re.M)) or None,
        "isa": [f for f in ISA_FLAGS if f in have],
    }


def measure_cpu(seconds: float = 0.3, clock=time.perf_counter) -> dict:
    """Memory bandwidth (numpy copy, read + write bytes) and fp32 matmul rate, best of a few short
    repeats.

    `clock` (seconds, monotonic) times the repeats; tests pass a scripted one.
    """
    import numpy as np

    a = np.ones(32 << 20, dtype=np.float32)  # 128 MiB: well past any cache
    b = a.copy()  # touched, so no page faults are timed
    m = np.random.default_rng(0).random((1024, 1024), dtype=np.float32)

    def best(fn) -> float:
        times, end = [], clock() + seconds / 2
        while len(times) < 3 or clock() < end:
            t0 = clock()
            fn()
            times.append(clock() - t0)
        return min(times)

    copy, mm = best(lambda: np.copyto(b, a)), best(lambda: m @ m)
    return {
        "bandwidth_gb_s": round(2 * a.nbytes / copy / 1e9, 2),
        "fp32_tflops": round(2 * 1024**3 / mm / 1e12, 4),
    }


def detect_cpu(
    cpuinfo: Path = CPUINFO,
    meminfo: Path = MEMINFO,
    profiles: dict | None = None,
    measured: dict | None = None,
) -> Detected:
    """The generic cpu profile filled with this machine's memory, bandwidth and fp32 rate."""
    info = parse_cpuinfo(read_text(cpuinfo) or "")
    measured = measured or measure_cpu()
    base = (profiles or load_profiles())["cpu"]
    profile = base.filled(
        title=(
            f"{info['model']} ({info['cores']} cores; {' '.join(info['isa']) or 'no SIMD flags'})"
        ),
        memory_gb=round(parse_meminfo_gb(read_text(meminfo) or "") or 0.0, 2),
        bandwidth_gb_s=measured["bandwidth_gb_s"],
        compute_tflops={**base.compute_tflops, "fp32": measured["fp32_tflops"]},
    )
    return Detected(
        profile, {"cpu": info["model"], "cores": info["cores"], "isa": info["isa"], **measured}
    )


def detect(profiles: dict | None = None, measured: dict | None = None) -> Detected:
    """Jetson first (its GPU shares memory with the OS), then a discrete NVIDIA GPU, else the
    CPU."""
    profiles = profiles or load_profiles()
    jetson = detect_jetson(profiles=profiles)
    if jetson:
        return jetson
    for gpu in query_gpus():
        profile = match_gpu(gpu, profiles)
        if profile:
            return Detected(profile, {"gpu": gpu["name"], "memory_gb": round(gpu["memory_gb"], 2)})
    return detect_cpu(profiles=profiles, measured=measured)
