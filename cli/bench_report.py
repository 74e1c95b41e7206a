"""`bench --report DIR` and `bench --power`: report.json, report.md and PNG plots from one bench
run.

Plots (matplotlib, the optional `report` extra, imported only here): tokens/s plain vs speculative
per category, the acceptance-length histogram, acceptance per block position, the step-time
breakdown (draft, target, overhead per token) and, when a meter read, joules per token.

>>> write_report("out/", report, raw)        # doctest: +SKIP   (report: bench's dict with "rows")
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
from collections import Counter
from pathlib import Path

from ..runtime.errors import DflashEdgeError
from ..runtime.power import MeteredGenerator, open_power_meter

PLOTS = (
    "tokens_per_s.png",
    "acceptance_hist.png",
    "acceptance_by_position.png",
    "step_breakdown.png",
)


def add_arguments(p) -> None:
    p.add_argument(
        "--power",
        action="store_true",
        default=True,
        help="measure energy per token where a meter reads (default; null with the reason "
        "elsewhere)",
    )
    p.add_argument(
        "--no-power", dest="power", action="store_false", help="do not read energy meters"
    )
    p.add_argument(
        "--report",
        default=None,
        metavar="DIR",
        help="write report.json, report.md and PNG plots to DIR (needs matplotlib: the `report` "
        "extra)",
    )


def prepare(args, gen) -> MeteredGenerator:
    """Check --report can be written before the bench runs; wrap `gen` so each arm's energy is
    metered."""
    if getattr(args, "report", None):
        _pyplot()
        out = Path(args.report)
        if out.exists() and (
            not out.is_dir() or any(out.iterdir()) and not (out / "report.json").exists()
        ):
            raise DflashEdgeError(
                f"--report {out} exists and is not a bench report; pick an empty or new directory"
            )
    return MeteredGenerator(gen, *open_power_meter(getattr(args, "power", True)))


def finish(args, gen: MeteredGenerator, report: dict, rows: list[dict], raw: list[dict]) -> None:
    """Add the energy fields to `report`; write the --report directory."""
    report["energy"] = gen.energy_report()
    gen.close()
    if getattr(args, "report", None):
        write_report(args.report, {**report, "rows": rows}, raw)


def _pyplot():
    try:
        import matplotlib
    except ImportError as err:
        raise DflashEdgeError(
            "--report draws plots with matplotlib, which is not installed; "
            "pip install 'dflash-edge[report]'"
        ) from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _arm(raw: list[dict], key: str) -> list:
    return [r[key] for r in raw if key in r]


def analyse(report: dict, raw: list[dict]) -> dict:
    """The report's figures: per-category tokens/s, acceptance histogram and per position, step
    breakdown."""
    # speculative = the default (adaptive) arm
    spec, plain = (
        _arm(raw, "default"),
        _arm(raw, "plain"),
    )
    drafted = _arm(raw, "always") or spec  # the drafter's full blocks, where run
    block = report.get("bundle", {}).get("block_size") or 16
    lengths = [n for s in drafted for n in s.acceptance_lengths]
    hist = Counter(lengths)
    cats: dict[str, dict] = {}
    for row in report["rows"]:
        c = cats.setdefault(row.get("category") or "all", {"spec": [], "ar": [], "tau": []})
        c["spec"].append(row["default_tokens_per_s"])
        c["ar"].append(row["plain_tokens_per_s"])
        if row.get("drafter_tokens_per_step") is not None:
            c["tau"].append(row["drafter_tokens_per_step"])

    def breakdown(stats: list) -> dict:
        tokens = sum(max(s.new_tokens - 1, 0) for s in stats) or 1
        draft = sum(s.draft_run_s for s in stats)
        target = sum(s.decode_run_s for s in stats) - draft
        over = sum(s.decode_s - s.decode_run_s for s in stats)
        return {
            k: round(1e3 * v / tokens, 3)
            for k, v in (("draft", draft), ("target", target), ("overhead", over))
        }

    return {
        "per_category": {
            k: {
                "spec_tokens_per_s": round(statistics.median(v["spec"]), 2),
                "ar_tokens_per_s": round(statistics.median(v["ar"]), 2),
                "mean_acceptance_length": round(statistics.mean(v["tau"]), 3) if v["tau"] else None,
                "prompts": len(v["spec"]),
            }
            for k, v in sorted(cats.items())
        },
        "acceptance_histogram": {str(n): hist.get(n, 0) for n in range(1, block + 1)},
        "acceptance_by_position": {
            str(k): round(sum(n > k for n in lengths) / len(lengths), 4) if lengths else None
            for k in range(1, block)
        },
        "ms_per_token": {"speculative": breakdown(spec), "plain": breakdown(plain)},
    }


def plot_all(out: Path, figures: dict, energy: dict | None) -> list[str]:
    """Draw the report's plots into `out` (the energy one where an arm measured it); returns
    their file names."""
    plt = _pyplot()
    plots = [
        (PLOTS[0], (6, 3.2), lambda ax: _speed_plot(ax, figures["per_category"])),
        (PLOTS[1], (6, 3.2), lambda ax: _histogram_plot(ax, figures["acceptance_histogram"])),
        (PLOTS[2], (6, 3.2), lambda ax: _position_plot(ax, figures["acceptance_by_position"])),
        (PLOTS[3], (5, 3.2), lambda ax: _time_plot(ax, figures["ms_per_token"])),
    ]
    arms = [
        a for a, v in (energy or {}).items() if isinstance(v, dict) and v.get("energy_j_per_token")
    ]
    if arms:
        plots.append(("energy.png", (5, 3.2), lambda ax: _energy_plot(ax, energy, arms)))
    for name, size, draw in plots:
        fig, ax = plt.subplots(figsize=size)
        draw(ax)
        fig.tight_layout()
        fig.savefig(out / name, dpi=80)
        plt.close(fig)
    return [name for name, _, _ in plots]


def _speed_plot(ax, cats: dict) -> None:
    xs = range(len(cats))
    plain = [c["ar_tokens_per_s"] for c in cats.values()]
    spec = [c["spec_tokens_per_s"] for c in cats.values()]
    ax.bar([x - 0.2 for x in xs], plain, 0.4, label="plain")
    ax.bar([x + 0.2 for x in xs], spec, 0.4, label="speculative")
    ax.set_xticks(list(xs), list(cats), rotation=20)
    ax.set_ylabel("decode tokens/s (median)")
    ax.set_ylim(0, 1.3 * max(plain + spec))
    ax.set_title("Decode speed per category")
    ax.legend(ncols=2)


def _histogram_plot(ax, hist: dict) -> None:
    ax.bar([int(k) for k in hist], list(hist.values()))
    ax.set_xlabel("tokens committed per verify step")
    ax.set_ylabel("steps")
    ax.set_title("Acceptance length")


def _position_plot(ax, by_position: dict) -> None:
    pos = {int(k): v for k, v in by_position.items() if v is not None}
    ax.plot(list(pos), list(pos.values()), marker="o")
    ax.set_xlabel("draft position in the block")
    ax.set_ylabel("share of steps accepted")
    ax.set_ylim(0, 1)
    ax.set_title("Acceptance per block position")


def _time_plot(ax, parts: dict) -> None:
    bottom = [0.0, 0.0]
    for comp in ("target", "draft", "overhead"):
        vals = [parts["plain"][comp], parts["speculative"][comp]]
        ax.bar(["plain", "speculative"], vals, bottom=bottom, label=comp)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("ms per generated token")
    ax.set_title("Where the time goes")
    ax.legend()


def _energy_plot(ax, energy: dict, arms: list[str]) -> None:
    ax.bar(arms, [energy[a]["energy_j_per_token"] for a in arms])
    ax.set_ylabel(f"J per token ({energy['meter']})")
    ax.set_title("Energy per token")


def markdown(report: dict, figures: dict, plots: list[str]) -> str:
    b, e = report.get("bundle", {}), report.get("energy") or {}
    lines = [
        "# dflash-edge bench report",
        "",
        f"Bundle `{b.get('path')}` (block {b.get('block_size')}), {report.get('prompts')} prompts, "
        f"{report.get('max_new_tokens')} new tokens max, provider {report.get('provider')}, "
        f"{report.get('created')}.",
        f"Machine: {report.get('machine', {}).get('cpu')}, "
        f"{report.get('machine', {}).get('cpus_usable')} CPUs.",
        "",
        f"Speedup (median over prompts) **{report.get('speedup')}x**; plain "
        f"{report.get('ar_tokens_per_s')} tok/s, "
        f"speculative {report.get('spec_tokens_per_s')} tok/s; mean acceptance length "
        f"{report.get('mean_acceptance_length')}; lossless {report.get('lossless')}; peak RSS "
        f"{report.get('peak_rss_mb')} MB.",
        "",
        "| category | prompts | plain tok/s | speculative tok/s | mean acceptance |",
        "|---|---|---|---|---|",
    ]
    for name, c in figures["per_category"].items():
        lines.append(
            f"| {name} | {c['prompts']} | {c['ar_tokens_per_s']} | {c['spec_tokens_per_s']} | "
            f"{c['mean_acceptance_length']} |"
        )
    lines += [
        "",
        "ms per generated token: "
        + "; ".join(
            f"{arm}: " + ", ".join(f"{k} {v}" for k, v in parts.items())
            for arm, parts in figures["ms_per_token"].items()
        ),
        "",
        "## Energy",
        "",
    ]
    for arm, a in ((k, v) for k, v in e.items() if isinstance(v, dict)):
        if a.get("energy_j_per_token") is None:
            lines.append(f"- {arm}: not measured ({a.get('reason')})")
        else:
            lines.append(
                f"- {arm}: {a['energy_j_per_token']} J/token, {a['avg_power_w']} W average "
                f"({e.get('meter')}: {e.get('scope')}; {e.get('covers')})"
            )
    lines += [""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def write_report(out: str | Path, report: dict, raw: list[dict]) -> Path:
    """Write report.json, report.md and the plots into a temp dir, then swap it in as `out`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figures = analyse(report, raw)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        plots = plot_all(tmp, figures, report.get("energy"))
        (tmp / "report.json").write_text(
            json.dumps({**report, "figures": figures, "plots": plots}, indent=2) + "\n"
        )
        (tmp / "report.md").write_text(markdown(report, figures, plots))
        os.chmod(tmp, 0o755)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
