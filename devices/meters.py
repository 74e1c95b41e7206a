"""Energy meters: Linux powercap/RAPL, NVML energy counters, Jetson INA3221 rails and tegrastats.

Every meter exposes `read_j()`: joules since it was opened (counters are differenced, with
wraparound; power-only sources are sampled by a thread and integrated). A source that cannot be read
raises `MeterError` with the reason, so callers can say why a figure is null instead of estimating
one.

>>> meter = open_meter()          # doctest: +SKIP
>>> meter.name, meter.read_j()    # doctest: +SKIP
('rapl', 0.0)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

from .errors import MeterError

POWERCAP = Path("/sys/class/powercap")
HWMON = Path("/sys/class/hwmon")
INA_NAMES = ("ina3221",)
TOTAL_RAILS = ("VDD_IN",)  # module input rail on Orin Nano / NX (AGX: no single rail: sum)


class Meter:
    name = "meter"
    scope = ""  # what the joules cover (package, board, GPU)

    def read_j(self) -> float:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except PermissionError as err:
        raise MeterError(
            f"{path}: permission denied (RAPL counters are root-only since Linux 5.10; "
            f"run as root or `chmod a+r` it)"
        ) from err
    except (OSError, ValueError) as err:
        raise MeterError(f"{path}: cannot be read ({err})") from err


class CounterDelta:
    """Accumulates a monotonically increasing counter that wraps at `max_value` (RAPL's
    energy_uj)."""

    def __init__(self, first: int, max_value: int | None):
        self.last, self.max_value, self.total = first, max_value, 0

    def update(self, raw: int) -> int:
        delta = raw - self.last
        if delta < 0:  # wrapped: the counter restarted from 0 after max_value
            if not self.max_value:
                raise MeterError("energy counter went backwards and its range is unknown")
            delta += self.max_value + 1
        self.last, self.total = raw, self.total + delta
        return self.total


class RaplMeter(Meter):
    """Sum of the top-level powercap zones (`intel-rapl:N`: CPU packages; AMD Zen uses the same
    interface)."""

    name, scope = "rapl", "CPU package(s): every process on the machine, not only this one"

    def __init__(self, root: Path = POWERCAP):
        zones = sorted(p for p in Path(root).glob("intel-rapl:*") if p.name.count(":") == 1)
        if not zones:
            raise MeterError(f"no RAPL zones under {root} (no powercap driver, or not an x86 host)")
        self.zones = zones
        self.counters = [CounterDelta(_read_int(z / "energy_uj"), _max_range(z)) for z in zones]

    def read_j(self) -> float:
        return (
            sum(c.update(_read_int(z / "energy_uj")) for z, c in zip(self.zones, self.counters))
            / 1e6
        )


def _max_range(zone: Path) -> int | None:
    try:
        return _read_int(zone / "max_energy_range_uj")
    except MeterError:
        return None


class NvmlMeter(Meter):
    """NVML's total-energy counter (mJ since driver load; Volta and newer), summed over GPUs."""

    name, scope = "nvml", "NVIDIA GPU board(s)"

    def __init__(self, nvml=None):
        try:
            if nvml is None:
                import pynvml as nvml  # nvidia-ml-py
            nvml.nvmlInit()
            self.nvml = nvml
            self.handles = [
                nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
            ]
            if not self.handles:
                raise MeterError("NVML reports no GPU")
            self.start = self._raw_mj()
        except MeterError:
            raise
        except Exception as err:  # ImportError, NVMLError_*: say which
            raise MeterError(
                f"NVML energy counter unavailable ({type(err).__name__}: {err})"
            ) from err

    def _raw_mj(self) -> int:
        try:
            return sum(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles)
        except Exception as err:
            raise MeterError(
                f"NVML energy counter stopped reading ({type(err).__name__}: {err})"
            ) from err

    def read_j(self) -> float:
        return (self._raw_mj() - self.start) / 1e3


class SampledMeter(Meter):
    """Integrates a power source (watts) sampled every `interval_s` by a daemon thread (trapezoid
    rule).

    `clock` (seconds, monotonic) times the samples; tests pass a scripted one.
    """

    def __init__(self, interval_s: float = 0.05, clock=time.perf_counter):
        self.interval_s, self.energy, self.error, self.clock = interval_s, 0.0, None, clock
        self.last = (clock(), self.power_w())
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def power_w(self) -> float:
        raise NotImplementedError

    def _sample(self) -> None:
        watts, now = self.power_w(), self.clock()
        with self.lock:
            t0, w0 = self.last
            self.energy += (now - t0) * (w0 + watts) / 2
            self.last = (now, watts)

    def _run(self) -> None:
        while not self.stop.wait(self.interval_s):
            try:
                self._sample()
            except MeterError as err:
                self.error = err
                return

    def read_j(self) -> float:
        if self.error:
            raise self.error
        self._sample()
        return self.energy

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=1)


def read_ina3221(hwmon: Path) -> dict[str, float]:
    """rail label -> watts from one INA3221 hwmon directory (in*_label, in*_input mV, curr*_input
    mA)."""
    rails = {}
    for label in sorted(hwmon.glob("in*_label")):
        n = re.match(r"in(\d+)_label", label.name).group(1)
        name = label.read_text().strip()
        if (hwmon / f"curr{n}_input").exists() and not name.lower().startswith("sum"):
            rails[name] = (
                _read_int(hwmon / f"in{n}_input") * _read_int(hwmon / f"curr{n}_input") / 1e6
            )
    return rails


def total_power_w(rails: dict[str, float]) -> float:
    """The module input rail when the board has one (Orin Nano / NX: VDD_IN), else the sum of the
    rails."""
    for name in TOTAL_RAILS:
        if name in rails:
            return rails[name]
    return sum(rails.values())


class InaMeter(SampledMeter):
    """Jetson on-module INA3221 power monitors through hwmon sysfs."""

    name, scope = "ina3221", "Jetson module rails (VDD_IN where present, else the sum of the rails)"

    def __init__(self, root: Path = HWMON, interval_s: float = 0.05, clock=time.perf_counter):
        self.dirs = [
            d
            for d in sorted(Path(root).glob("hwmon*"))
            if (d / "name").exists() and (d / "name").read_text().strip() in INA_NAMES
        ]
        if not self.dirs:
            raise MeterError(
                f"no INA3221 hwmon device under {root} (not a Jetson, or an L4T without the driver)"
            )
        super().__init__(interval_s, clock)

    def power_w(self) -> float:
        rails = {}
        for d in self.dirs:
            rails.update(read_ina3221(d))
        if not rails:
            raise MeterError(f"INA3221 under {self.dirs[0]} has no readable rails")
        return total_power_w(rails)


RAIL_RE = re.compile(r"\b([A-Z][A-Z0-9_]+) (\d+)mW/(\d+)mW")


def parse_tegrastats(line: str) -> dict[str, float]:
    """rail -> current watts from one tegrastats line ('... VDD_IN 4775mW/4775mW VDD_SOC
    1433mW/1433mW')."""
    return {m.group(1): int(m.group(2)) / 1e3 for m in RAIL_RE.finditer(line)}


class TegrastatsMeter(SampledMeter):
    """Runs `tegrastats --interval MS` and integrates its total power (lines from `lines`, for
    tests)."""

    name, scope = (
        "tegrastats",
        "Jetson module rails (VDD_IN where present, else the sum of the rails)",
    )

    def __init__(self, lines=None, interval_s: float = 0.1, clock=time.perf_counter):
        self.proc = None
        if lines is None:
            try:
                self.proc = subprocess.Popen(
                    ["tegrastats", "--interval", str(int(interval_s * 1000))],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            except OSError as err:
                raise MeterError(
                    f"tegrastats cannot run ({err}); not a Jetson, or L4T tools are not on PATH"
                ) from err
            lines = self.proc.stdout
        self.lines = iter(lines)
        # tegrastats paces itself: the sampler reads lines as they come
        super().__init__(interval_s=0, clock=clock)

    def power_w(self) -> float:
        for line in self.lines:
            rails = parse_tegrastats(line)
            if rails:
                return total_power_w(rails)
        raise MeterError("tegrastats stopped producing power readings")

    def read_j(self) -> float:
        if self.error:
            raise self.error
        with self.lock:
            return self.energy

    def close(self) -> None:
        self.stop.set()
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=5)


METERS = (
    ("ina3221", InaMeter),
    ("tegrastats", TegrastatsMeter),
    ("nvml", NvmlMeter),
    ("rapl", RaplMeter),
)


def open_meter() -> Meter:
    """The first meter that reads on this machine; MeterError listing why each one did not."""
    reasons = []
    for name, cls in METERS:
        if cls is TegrastatsMeter and not shutil.which("tegrastats"):
            reasons.append("tegrastats: not on PATH")
            continue
        try:
            meter = cls()
            meter.read_j()
            return meter
        except MeterError as err:
            reasons.append(f"{name}: {err}")
    raise MeterError("no energy meter on this machine (" + "; ".join(reasons) + ")")
