"""Tier 1: energy meters on recorded sysfs trees / tool output, the metered generator, a vanishing meter."""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dflash_edge.devices import meters as m
from dflash_edge.devices.errors import MeterError
from dflash_edge.runtime.power import MeteredGenerator, open_power_meter

DATA = Path(__file__).parent / "data" / "devices"


def test_rapl_sums_packages_and_handles_wraparound(tmp_path):
    root = tmp_path / "powercap"
    shutil.copytree(DATA / "powercap", root)
    meter = m.RaplMeter(root)
    assert [z.name for z in meter.zones] == ["intel-rapl:0"]             # the core subzone is not double counted
    (root / "intel-rapl:0" / "energy_uj").write_text("262143000000\n")    # +300 J
    assert meter.read_j() == pytest.approx(300.0)
    (root / "intel-rapl:0" / "energy_uj").write_text("971150\n")          # wrapped past 262143328850
    assert meter.read_j() == pytest.approx(300.0 + (262143328850 - 262143000000 + 1 + 971150) / 1e6)


def test_rapl_permission_and_absence_say_why(tmp_path):
    with pytest.raises(MeterError, match="no RAPL zones"):
        m.RaplMeter(tmp_path)
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    with pytest.raises(MeterError, match="energy_uj: cannot be read"):
        m.RaplMeter(tmp_path)


def test_counter_without_range_refuses_to_guess():
    c = m.CounterDelta(100, None)
    assert c.update(150) == 50
    with pytest.raises(MeterError, match="went backwards"):
        c.update(10)


def test_ina3221_rails_from_hwmon_fixture():
    rails = m.read_ina3221(DATA / "ina3221" / "orin-nx-hwmon" / "hwmon1")
    assert rails == pytest.approx({"VDD_IN": 5.072 * 0.944, "VDD_CPU_GPU_CV": 5.064 * 0.128, "VDD_SOC": 5.064 * 0.284})
    assert m.total_power_w(rails) == pytest.approx(5.072 * 0.944)          # the input rail, not the sum


def test_ina_meter_integrates_power(tmp_path):
    meter = m.InaMeter(DATA / "ina3221" / "orin-nx-hwmon", interval_s=0.01)
    try:
        t0, e0 = time.perf_counter(), meter.read_j()
        time.sleep(0.1)
        e1, t1 = meter.read_j(), time.perf_counter()
    finally:
        meter.close()
    assert (e1 - e0) / (t1 - t0) == pytest.approx(5.072 * 0.944, rel=0.02)   # constant rails: energy = P x t


def test_ina_meter_absent(tmp_path):
    with pytest.raises(MeterError, match="no INA3221 hwmon"):
        m.InaMeter(tmp_path)


def test_tegrastats_parser_on_recorded_lines():
    nx = (DATA / "tegrastats" / "orin-nx-jp6.log").read_text().splitlines()
    rails = m.parse_tegrastats(nx[1])
    assert rails == {"VDD_IN": 14.962, "VDD_CPU_GPU_CV": 8.125, "VDD_SOC": 3.017}
    assert m.total_power_w(rails) == 14.962
    agx = m.parse_tegrastats((DATA / "tegrastats" / "agx-orin-jp5.log").read_text())
    assert m.total_power_w(agx) == pytest.approx(2.389 + 0.398 + 2.916 + 0.502)     # no VDD_IN: sum of rails
    assert m.parse_tegrastats("RAM 2956/30536MB CPU [1%@729]") == {}


def test_tegrastats_meter_reads_lines_then_reports_the_end():
    lines = (DATA / "tegrastats" / "orin-nx-jp6.log").read_text().splitlines()
    meter = m.TegrastatsMeter(lines=iter(lines))
    meter.thread.join(timeout=2)                                  # three lines, then the stream ends
    with pytest.raises(MeterError, match="stopped producing"):
        meter.read_j()
    meter.close()


class FakeNvml:
    """Records a real NVML counter sequence (mJ) and can fail like a GPU that fell off the bus."""

    def __init__(self, readings):
        self.readings, self.calls = list(readings), 0

    def nvmlInit(self): pass
    def nvmlDeviceGetCount(self): return 1
    def nvmlDeviceGetHandleByIndex(self, i): return i

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.calls += 1
        value = self.readings.pop(0)
        if isinstance(value, Exception):
            raise value
        return value


def test_nvml_counter_and_its_failure():
    meter = m.NvmlMeter(FakeNvml([91_233_004, 91_245_604, RuntimeError("NVML_ERROR_GPU_IS_LOST")]))
    assert meter.read_j() == pytest.approx(12.6)
    with pytest.raises(MeterError, match="GPU_IS_LOST"):
        meter.read_j()


def test_no_meter_on_this_machine_is_a_clean_reason(monkeypatch):
    def absent(*_a, **_k):
        raise MeterError("absent")

    monkeypatch.setattr(m, "METERS", (("rapl", absent), ("nvml", absent)))
    meter, reason = open_power_meter(True)
    assert meter is None and reason.startswith("no energy meter on this machine (rapl: absent; nvml: absent)")
    assert open_power_meter(False) == (None, "disabled by --no-power")


class ScriptedMeter(m.Meter):
    name, scope = "scripted", "test"

    def __init__(self, fail_after: int | None = None):
        self.reads, self.fail_after, self.closed = 0, fail_after, False

    def read_j(self):
        self.reads += 1
        if self.fail_after is not None and self.reads > self.fail_after:
            raise MeterError("energy_uj vanished")
        return 2.0 * self.reads                                   # 2 J between consecutive reads

    def close(self):
        self.closed = True


class FakeGen:
    bundle = "b"

    def generate(self, prompt, max_new_tokens=8, use_draft=True):
        time.sleep(0.001)
        return SimpleNamespace(stats=SimpleNamespace(new_tokens=4), use_draft=use_draft)


def test_metered_generator_charges_each_arm():
    gen = MeteredGenerator(FakeGen(), ScriptedMeter())
    assert gen.bundle == "b"                                      # everything else passes through
    gen.generate("warm", use_draft="auto")
    gen.reset()
    for use in ("auto", False, False):                            # "auto" (the default) is the speculative arm
        gen.generate("p", use_draft=use)
    rep = gen.energy_report()
    assert rep["meter"] == "scripted" and rep["reason"] is None
    assert rep["speculative"]["energy_j"] == 2.0 and rep["speculative"]["tokens"] == 4
    assert rep["plain"]["energy_j_per_token"] == pytest.approx(4.0 / 8) and rep["plain"]["avg_power_w"] > 0


def test_vanishing_meter_nulls_the_fields_with_the_reason():
    meter = ScriptedMeter(fail_after=3)
    gen = MeteredGenerator(FakeGen(), meter)
    results = [gen.generate("p", use_draft=use) for use in ("auto", False, "auto", False)]
    assert len(results) == 4                                      # every call still generated
    rep = gen.energy_report()
    assert meter.closed and rep["meter"] is None
    for arm in ("plain", "speculative"):
        assert rep[arm]["energy_j_per_token"] is None and rep[arm]["avg_power_w"] is None
        assert "stopped reading mid-run: energy_uj vanished" in rep[arm]["reason"]


def test_always_draft_arm_is_metered_apart():
    """"speculative" is the default (adaptive) arm users get; always-draft is metered apart beside it."""
    gen = MeteredGenerator(FakeGen(), ScriptedMeter())
    for use in (True, "auto", False):
        gen.generate("p", use_draft=use)
    rep = gen.energy_report()
    assert [k for k in rep if isinstance(rep[k], dict)] == ["plain", "speculative", "always"]
    assert rep["always"]["calls"] == 1 and rep["speculative"]["calls"] == 1
