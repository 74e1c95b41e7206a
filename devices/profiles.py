"""Device profiles: one JSON file per device in `devices/profiles/`, every figure with its source.

>>> get_profile("jetson-orin-nx-16gb").bandwidth_gb_s      # doctest: +SKIP
102.4
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import DeviceError

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
CLASSES_FILE = Path(__file__).resolve().parent / "classes.json"
DEVICE_CLASSES = ("cpu", "jetson", "gpu")
REQUIRED = (
    "name",
    "title",
    "class",
    "memory_gb",
    "memory_shared_with_os",
    "os_reserve_gb",
    "bandwidth_gb_s",
    "compute_tflops",
    "precisions",
    "power_modes",
    "notes",
    "sources",
    "detect",
)
SOURCED = ("memory_gb", "bandwidth_gb_s", "compute_tflops", "power_modes", "os_reserve_gb")
CLASS_FACTORS = (
    "bandwidth_efficiency",
    "compute_efficiency",
    "layer_overhead_ms",
    "runtime_overhead_gb",
    "weights_residency",
    "sources",
)


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    title: str
    device_class: str  # "cpu" | "jetson" | "gpu"
    memory_gb: float | None  # None until detection fills the generic cpu profile
    memory_shared_with_os: bool
    os_reserve_gb: float
    bandwidth_gb_s: float | None
    compute_tflops: dict  # precision -> dense TFLOPS (TOPS for integer types)
    precisions: tuple
    power_modes: tuple
    notes: str
    sources: dict  # field -> datasheet / vendor page / measurement
    detect: dict = field(default_factory=dict)
    # GB/s a batch-1 decode streams at, fit to published runs (devices/published.json); None: the
    # nominal figure times the class's bandwidth efficiency
    decode_bandwidth_gb_s: float | None = None

    @property
    def usable_memory_gb(self) -> float:
        """Memory a model may use: all of it on a discrete GPU, minus the OS reserve where the OS
        shares it."""
        return (self.memory_gb or 0.0) - (self.os_reserve_gb if self.memory_shared_with_os else 0.0)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "title": self.title,
            "class": self.device_class,
            "memory_gb": self.memory_gb,
            "memory_shared_with_os": self.memory_shared_with_os,
            "os_reserve_gb": self.os_reserve_gb,
            "bandwidth_gb_s": self.bandwidth_gb_s,
            "compute_tflops": dict(self.compute_tflops),
            "precisions": list(self.precisions),
            "power_modes": list(self.power_modes),
            "notes": self.notes,
            "sources": dict(self.sources),
            "decode_bandwidth_gb_s": self.decode_bandwidth_gb_s,
        }

    def filled(self, **figures) -> "DeviceProfile":
        """A copy with detected figures (memory_gb, bandwidth_gb_s, compute_tflops, title, sources)
        filled in."""
        return replace(self, **figures)


def parse_profile(data: dict, where: str) -> DeviceProfile:
    """Check one profile's fields (every one required, every figure sourced) and build it."""
    if not isinstance(data, dict):
        raise DeviceError(f"{where}: a profile must be a JSON object")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise DeviceError(
            f"{where}: missing field(s) {missing}; every profile needs {', '.join(REQUIRED)} "
            f"(see devices/profiles/jetson-orin-nx-16gb.json for a complete one)"
        )
    unsourced = [k for k in SOURCED if not data["sources"].get(k)]
    if unsourced:
        raise DeviceError(
            f"{where}: sources lacks {unsourced}; name the datasheet, vendor page or measurement "
            f"each figure comes from"
        )
    if data.get("decode_bandwidth_gb_s") and not data["sources"].get("decode_bandwidth_gb_s"):
        raise DeviceError(
            f"{where}: decode_bandwidth_gb_s needs sources.decode_bandwidth_gb_s (the published "
            "runs it is fit to)"
        )
    if data["class"] not in DEVICE_CLASSES:
        raise DeviceError(
            f"{where}: class {data['class']!r} is not one of {', '.join(DEVICE_CLASSES)}"
        )
    return DeviceProfile(
        name=data["name"],
        title=data["title"],
        device_class=data["class"],
        memory_gb=data["memory_gb"],
        memory_shared_with_os=bool(data["memory_shared_with_os"]),
        os_reserve_gb=float(data["os_reserve_gb"]),
        bandwidth_gb_s=data["bandwidth_gb_s"],
        compute_tflops=dict(data["compute_tflops"]),
        precisions=tuple(data["precisions"]),
        power_modes=tuple(data["power_modes"]),
        notes=data["notes"],
        sources=dict(data["sources"]),
        detect=dict(data["detect"]),
        decode_bandwidth_gb_s=data.get("decode_bandwidth_gb_s"),
    )


def load_profile_file(path: str | Path) -> DeviceProfile:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DeviceError(
            f"device profile {path} cannot be read ({err}); fix or remove the file"
        ) from err
    return parse_profile(data, str(path))


def load_profiles(directory: str | Path = PROFILE_DIR) -> dict[str, DeviceProfile]:
    """name -> profile for every `*.json` in `directory`, sorted by name."""
    profiles = [load_profile_file(p) for p in sorted(Path(directory).glob("*.json"))]
    return {p.name: p for p in profiles}


def get_profile(name: str, directory: str | Path = PROFILE_DIR) -> DeviceProfile:
    profiles = load_profiles(directory)
    if name not in profiles:
        raise DeviceError(f"unknown device {name!r}; known devices: {', '.join(profiles)}")
    return profiles[name]


@functools.lru_cache(maxsize=None)
def class_factors(device_class: str, path: str | Path = CLASSES_FILE) -> dict:
    """The roofline / memory factors of one device class (devices/classes.json), every one
    sourced."""
    data = json.loads(Path(path).read_text())
    if device_class not in data:
        raise DeviceError(f"{path}: no factors for device class {device_class!r}")
    factors = data[device_class]
    missing = [k for k in CLASS_FACTORS if k not in factors]
    if missing:
        raise DeviceError(f"{path} [{device_class}]: missing factor(s) {missing}")
    return factors
