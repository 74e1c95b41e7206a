"""Tier 1: energy meters on recorded sysfs trees / tool output, the metered generator, a vanishing
meter."""

from __future__ import annotations

import shutil
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
    assert [z.name for z in meter.zones] == [
        "intel-rapl:0"
    ]  # the core subzone is not double counted
    (root / "intel-rapl:0" / "energy_uj").write_text("262143000000\n")  # +300 J
    assert meter.read_j() == pytest.approx(300.0)
    (root / "intel-rapl:0" / "energy_uj").write_text("971150\n")  # wrapped past 262143328850
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
    assert rails == pytest.approx(
        {"VDD_IN": 5.072 * 0.944, "VDD_CPU_GPU_CV": 5.064 * 0.128, "VDD_SOC": 5.064 * 0.284}
    )
    assert m.total_power_w(rails) == pytest.approx(5.072 * 0.944)  # the input rail, not the sum


def test_ina_meter_integrates_power(tmp_path):
    root = tmp_path / "hwmon"
    shutil.copytree(DATA / "ina3221" / "orin-nx-hwmon", root)
    rail = root / "hwmon1"
    (rail / "in1_input").write_text("5000\n")  # VDD_IN: 5 V x 1 A = 5 W
    (rail / "curr1_input").write_text("1000\n")
    clock = iter([10.0, 12.0, 13.0, 13.5]).__next__  # scripted sample times (s)
    meter = m.InaMeter(
        root, interval_s=3600, clock=clock
    )  # the sampler thread never wakes in the test
    try:
        assert meter.read_j() == pytest.approx(10.0)  # 2 s at 5 W
        (rail / "curr1_input").write_text("2000\n")  # now 10 W: trapezoid over the next second
        assert meter.read_j() == pytest.approx(10.0 + 7.5)
        (rail / "in2_input").write_text("9000\n")  # another rail: VDD_IN alone is the total
        assert meter.read_j() == pytest.approx(17.5 + 5.0)
    finally:
        meter.close()


def test_ina_meter_absent(tmp_path):
    with pytest.raises(MeterError, match="no INA3221 hwmon"):
        m.InaMeter(tmp_path)


def test_tegrastats_parser_on_recorded_lines():
    nx = (DATA / "tegrastats" / "orin-nx-jp6.log").read_text().splitlines()
    rails = m.parse_tegrastats(nx[1])
    assert rails == {"VDD_IN": 14.962, "VDD_CPU_GPU_CV": 8.125, "VDD_SOC": 3.017}
    assert m.total_power_w(rails) == 14.962
    agx = m.parse_tegrastats((DATA / "tegrastats" / "agx-orin-jp5.log").read_text())
    assert m.total_power_w(agx) == pytest.approx(
        2.389 + 0.398 + 2.916 + 0.502
    )  # no VDD_IN: sum of rails
    assert m.parse_tegrastats("RAM 2956/30536MB CPU [1%@729]") == {}


def test_tegrastats_meter_reads_lines_then_reports_the_end():
    lines = (DATA / "tegrastats" / "orin-nx-jp6.log").read_text().splitlines()
    meter = m.TegrastatsMeter(lines=iter(lines))
    meter.thread.join(timeout=2)  # three lines, then the stream ends
    with pytest.raises(MeterError, match="stopped producing"):
        meter.read_j()
    meter.close()


class FakeNvml:
    """Records a real NVML counter sequence (mJ) and can fail like a GPU that fell off the bus."""

    def __init__(self, readings):
        self.readings, self.calls = list(readings), 0

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

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
    assert meter is None and reason.startswith(
        "no energy meter on this machine (rapl: absent; nvml: absent)"
    )
    assert open_power_meter(False) == (None, "disabled by --no-power")


class ScriptedMeter(m.Meter):
    name, scope = "scripted", "test"

    def __init__(self, fail_after: int | None = None):
        self.reads, self.fail_after, self.closed = 0, fail_after, False

    def read_j(self):
        self.reads += 1
        if self.fail_after is not None and self.reads > self.fail_after:
            raise MeterError("energy_uj vanished")
        return 2.0 * self.reads  # 2 J between consecutive reads

    def close(self):
        self.closed = True


class FakeClock:
    """Seconds that pass only while FakeGen generates."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeGen:
    bundle = "b"

    def __init__(self, clock: FakeClock):
        self.clock, self.calls = clock, 0

    def generate(self, prompt, max_new_tokens=8, draft="auto"):
        self.calls += 1
        self.clock.now += 0.5 * self.calls  # call n takes n/2 scripted seconds
        return SimpleNamespace(stats=SimpleNamespace(new_tokens=4), draft=draft)


def metered(meter):
    clock = FakeClock()
    return MeteredGenerator(FakeGen(clock), meter, clock=clock)


def test_metered_generator_charges_each_arm():
    gen = metered(ScriptedMeter())
    assert gen.bundle == "b"  # everything else passes through
    gen.generate("warm", draft="auto")
    gen.reset()
    for use in ("auto", "none", "none"):  # "auto" (the default) is the speculative arm
        gen.generate("p", draft=use)
    rep = gen.energy_report()
    assert rep["meter"] == "scripted" and rep["reason"] is None
    # 2 J between reads; calls took 1.0 s (speculative) and 1.5 + 2.0 s (plain) after the 0.5 s
    # warm-up
    assert rep["speculative"] == {
        "energy_j_per_token": 0.5,
        "avg_power_w": 2.0,
        "energy_j": 2.0,
        "seconds": 1.0,
        "tokens": 4,
        "calls": 1,
    }
    assert rep["plain"] == {
        "energy_j_per_token": 0.5,
        "avg_power_w": 1.143,
        "energy_j": 4.0,
        "seconds": 3.5,
        "tokens": 8,
        "calls": 2,
    }


def test_vanishing_meter_nulls_the_fields_with_the_reason():
    meter = ScriptedMeter(fail_after=3)
    gen = metered(meter)
    results = [gen.generate("p", draft=use) for use in ("auto", "none", "auto", "none")]
    assert len(results) == 4  # every call still generated
    rep = gen.energy_report()
    assert meter.closed and rep["meter"] is None
    for arm in ("plain", "speculative"):
        assert rep[arm]["energy_j_per_token"] is None and rep[arm]["avg_power_w"] is None
        assert "stopped reading mid-run: energy_uj vanished" in rep[arm]["reason"]


def test_always_draft_arm_is_metered_apart():
    """ "speculative" is the default (adaptive) arm users get; always-draft is metered apart beside
    it."""
    gen = metered(ScriptedMeter())
    for use in ("drafter", "auto", "none"):
        gen.generate("p", draft=use)
    rep = gen.energy_report()
    assert [k for k in rep if isinstance(rep[k], dict)] == ["plain", "speculative", "always"]
    assert rep["always"]["calls"] == 1 and rep["speculative"]["calls"] == 1
